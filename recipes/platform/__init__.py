"""The only place that knows about devices.

``install(tier)`` turns the current process into a process of that tier and must
run before torchtitan is imported.
"""

from __future__ import annotations

import os

from recipes.platform import neuron
from recipes.platform.neuron import neuron_status

#: Run-time settings every tier needs: nothing reaches the Hub.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}

TIERS = ("cpu", "trn2")


def offline_env() -> dict[str, str]:
    return dict(OFFLINE_ENV)


def tier_unavailable(tier: str) -> str | None:
    """Why ``tier`` cannot run on this machine (one line naming what is missing), or None when it can."""
    if tier != "trn2":
        return None

    status = neuron_status()
    if status.ready:
        return None
    return f"--tier trn2 cannot run on this machine: {status.reason()} Use --tier cpu here, or run on a trn2.48xlarge."


def on_neuron(tensor) -> bool:
    """Whether ``tensor`` lives on a NeuronCore (torch-neuronx's ``neuron`` device), where kernels run nkilib."""
    return tensor.device.type == "neuron"


def install(tier: str) -> None:
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    if tier == "cpu":
        from recipes.platform import cpu  # noqa: PLC0415 -- heavy: recipes.platform.cpu imports torch (torch 2.9 s); this module stays light

        cpu.install()
    elif tier == "trn2":
        neuron.install()
    else:
        raise ValueError(f"unknown tier {tier!r}; choose one of {', '.join(TIERS)}")

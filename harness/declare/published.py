"""The tutorial's published numbers and pins: the claims this suite reproduces.

This is the one place the tutorial's numbers are written: goldens files name a
claim (lanes ``published`` and ``proxy``) and take its value from here. Values are
as published, to the precision published.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.base.environment import CPU_LOCK
from recipes.platform import neuron_versions


@dataclass(frozen=True)
class Claim:
    """One published number; with ``recipe`` and ``tier``, what a night on that tier must measure and judge."""

    key: str
    value: object
    what: str
    recipe: str = ""
    tier: str = ""

    @property
    def name(self) -> str:
        """``<recipe>.<tier>.<key>``: the claim's name in goldens, verdicts and the catalogue's judges."""
        return f"{self.recipe}.{self.tier}.{self.key}"


SOURCE = (
    "AWS Machine Learning Blog (Amazon Web Services), tutorial by Josh Longenecker: training Qwen3 "
    "with torchtitan on a single trn2.48xlarge (Transformers v5 backend, native Qwen3, NKI MoE)"
)

CLAIMS = {
    c.key: c
    for c in (
        Claim("step1_loss_hf", 6.54, "step-1 loss, Qwen3-4B-Instruct-2507 published weights"),
        Claim("step1_loss_random", 12.43, "step-1 loss, random init (Qwen3-4B width/vocab)"),
        Claim("rope_q_max_abs_diff", 0.0, "rope_hf vs torchtitan RoPE, float32, q"),
        Claim("rope_k_max_abs_diff", 0.0, "rope_hf vs torchtitan RoPE, float32, k"),
        Claim(
            "export_missing_keys",
            ["lm_head.weight"],
            "HF export load_state_dict missing keys (tied)",
        ),
        Claim("export_unexpected_keys", [], "HF export load_state_dict unexpected keys"),
    )
}

#: The tutorial's versions. The suite's own pins are checked against them (``pin_differences``):
#: requirements-neuron.txt and recipes/platform/neuron_versions.py (trn2) against all of them,
#: requirements-lock.txt (cpu: upstream torchtitan 0.3.0, no Neuron) against ``CPU_SHARED``.
PINS = {
    "torch": "2.14.0",
    "torch-neuronx": "2.14.3",
    "transformers": "5.16.0",
    "torchtitan-neuron": "release-2.33 (0.2.2+neuron.1)",
}
CPU_SHARED = ("torch", "transformers")


def names_release(pin: str, published: str) -> bool:
    """Whether a requirements pin (``2.14.3.0.*``, ``2.14.0``) is the published release or a finer one of it."""
    have = pin.removesuffix(".*").split("+")[0].split(".")
    want = published.split(".")
    return have[: len(want)] == want


def pin_differences(lock: Path | None = None, neuron: Path | None = None) -> list[str]:
    """Where the suite's pins leave the tutorial's, one line each naming the file, the package and both versions."""

    lock, neuron = lock or CPU_LOCK, neuron or neuron_versions.REQUIREMENTS
    wanted = [(lock, name) for name in CPU_SHARED] + [
        (neuron, n) for n in ("torch", "torch-neuronx", "transformers")
    ]
    out = []
    for path, name in wanted:
        pin = neuron_versions.pins(path).get(name)
        if pin is None or not names_release(pin, PINS[name]):
            out.append(
                f"{path.name}: {name} is pinned {pin or 'nowhere'}, the tutorial's is {PINS[name]} "
                f"(harness.declare.published.PINS); pin the tutorial's, or say in the report why not"
            )
    titan = f"{neuron_versions.TORCHTITAN_NEURON_REF} ({neuron_versions.TORCHTITAN_VERSION})"
    if titan != PINS["torchtitan-neuron"]:
        out.append(
            f"recipes/platform/neuron_versions.py: TorchTitan Neuron is {titan}, the tutorial's is "
            f"{PINS['torchtitan-neuron']}"
        )
    return out

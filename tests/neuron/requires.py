"""What a trn2 test needs, one decorator per requirement, as transformers' ``testing_utils`` does.

    @requires_neuron_device
    @requires_nkilib
    def test_rope_hf_matches_torch(): ...

Each decorator is a ``requires(NAME)`` mark; ``tests/neuron/conftest.py`` checks them
before any fixture runs. A missing requirement skips the test with a reason naming
every gap (``pytest -m neuron`` on a laptop says what a trn2 instance would need);
with ``QWEN3_REQUIRE_TRN2=1`` (the nightly) the same gap is a failure.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from recipes.platform import neuron

#: Set by .github/workflows/nightly-trn2.yml: a missing requirement fails instead of skipping.
REQUIRE_ENV = "QWEN3_REQUIRE_TRN2"
#: The trn2 corpus: a directory of {"text": ...} JSON lines (e.g. torchtitan's tests/assets/c4_test).
DATASET_ENV = "QWEN3_DATASET_DIR"

_TRUE, _FALSE = ("1", "true", "yes"), ("", "0", "false", "no")


def require_trn2() -> bool:
    """Whether ``$QWEN3_REQUIRE_TRN2`` turns gaps into failures; a value that is neither is refused."""
    value = os.environ.get(REQUIRE_ENV, "").strip().lower()
    if value not in _TRUE + _FALSE:
        raise pytest.UsageError(
            f"{REQUIRE_ENV}={value!r}: use 1 (missing trn2 requirements fail) or 0 (they skip)"
        )
    return value in _TRUE


def device_gap() -> str | None:
    if neuron.device_nodes():
        return None
    return "no Neuron device (/dev/neuron* is absent: not a trn2 instance)"


def package_gap(name: str) -> str | None:
    if neuron.has_package(name):
        return None
    return f"package '{name}' is not installed ({neuron.NEURON_PACKAGES[name]})"


def dataset_gap() -> str | None:
    """Why ``$QWEN3_DATASET_DIR`` cannot serve as the trn2 corpus (the trn2 tier has no fallback)."""
    value = os.environ.get(DATASET_ENV)
    if not value:
        return (
            f'{DATASET_ENV} is not set (point it at a directory of {{"text": ...}} JSON lines, '
            "e.g. torchtitan's tests/assets/c4_test)"
        )
    path = Path(value)
    if not path.is_dir():
        return f"{DATASET_ENV}={value} is not a directory"
    if not (any(path.glob("*.jsonl")) or any(path.glob("*.json"))):
        return f"{DATASET_ENV}={value} holds no *.jsonl or *.json files"
    return None


def titan_assets_gap() -> str | None:
    """Why the TorchTitan checkout's tests/assets (the as-published lanes' c4_test and tokenizer) are unavailable."""
    from harness.options.lanes import titan_checkout

    return titan_checkout()[1] or None


#: Every requirement a neuron test can name, and how its gap is found.
REQUIREMENTS = {
    "device": device_gap,
    "torch_neuronx": functools.partial(package_gap, "torch_neuronx"),
    "nkilib": functools.partial(package_gap, "nkilib"),
    "weights": neuron.weights_gap,
    "dataset": dataset_gap,
    "titan_assets": titan_assets_gap,
}


def gaps(names: list[str]) -> list[str]:
    """One sentence per unmet requirement, in ``REQUIREMENTS``' order (the device first), whatever the decorators' order."""
    unknown = sorted(set(names) - set(REQUIREMENTS))
    if unknown:
        raise pytest.UsageError(
            f"pytest.mark.requires{tuple(unknown)}: unknown; choose from {sorted(REQUIREMENTS)}"
        )
    return [gap for name, gap_of in REQUIREMENTS.items() if name in names and (gap := gap_of())]


#: A Neuron device (/dev/neuron*): a trn2 instance.
requires_neuron_device = pytest.mark.requires("device")
#: torch-neuronx, the PyTorch Neuron backend.
requires_torch_neuronx = pytest.mark.requires("torch_neuronx")
#: The NKI Library (``nkilib``, shipped in neuronx-cc).
requires_nkilib = pytest.mark.requires("nkilib")
#: Qwen3-4B-Instruct-2507's weights in ``$QWEN3_4B_DIR``.
requires_qwen3_4b_weights = pytest.mark.requires("weights")
#: The trn2 corpus in ``$QWEN3_DATASET_DIR``.
requires_dataset = pytest.mark.requires("dataset")
#: The TorchTitan checkout's tests/assets (make neuron-venv): the as-published lanes' text and tokenizer.
requires_titan_assets = pytest.mark.requires("titan_assets")

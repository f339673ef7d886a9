"""What a trn2 test needs, in one place: a skip interactively, a failure in the nightly.

A neuron test names its needs with ``pytest.mark.requires("device", "weights", ...)``
(names: see ``REQUIREMENTS``). When one is missing, the test is skipped with a
reason naming every gap, so ``pytest -m neuron`` on a laptop says what a trn2
instance would need. With ``QWEN3_REQUIRE_TRN2=1`` (set by the nightly workflow)
the same gap is a failure: a nightly that skips everything proves nothing.
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
        raise pytest.UsageError(f"{REQUIRE_ENV}={value!r}: use 1 (missing trn2 requirements fail) or 0 (they skip)")
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
            f"{DATASET_ENV} is not set (point it at a directory of {{\"text\": ...}} JSON lines, "
            "e.g. torchtitan's tests/assets/c4_test)"
        )
    path = Path(value)
    if not path.is_dir():
        return f"{DATASET_ENV}={value} is not a directory"
    if not (any(path.glob("*.jsonl")) or any(path.glob("*.json"))):
        return f"{DATASET_ENV}={value} holds no *.jsonl or *.json files"
    return None


#: Every requirement a neuron test can name, and how its gap is found.
REQUIREMENTS = {
    "device": device_gap,
    "torch_neuronx": functools.partial(package_gap, "torch_neuronx"),
    "nkilib": functools.partial(package_gap, "nkilib"),
    "weights": neuron.weights_gap,
    "dataset": dataset_gap,
}


def gaps(names: list[str]) -> list[str]:
    """One sentence per unmet requirement, in the order named."""
    unknown = sorted(set(names) - set(REQUIREMENTS))
    if unknown:
        raise pytest.UsageError(f"pytest.mark.requires{tuple(unknown)}: unknown; choose from {sorted(REQUIREMENTS)}")
    return [gap for name in dict.fromkeys(names) if (gap := REQUIREMENTS[name]())]


def pytest_configure(config):
    require_trn2()  # refuse a malformed switch before any test runs
    config.addinivalue_line(
        "markers",
        f"requires(*names): trn2 needs ({', '.join(REQUIREMENTS)}); skip when missing, fail under {REQUIRE_ENV}=1",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before any fixture runs (a 64-rank launch would otherwise start first)."""
    names = [name for mark in item.iter_markers("requires") for name in mark.args]
    missing = gaps(names)
    if not missing:
        return
    reason = "; ".join(missing) + ". Run on a trn2 instance set up with `make neuron-venv`."
    if require_trn2():
        pytest.fail(f"{REQUIRE_ENV}=1 (nightly): the trn2 tier is incomplete: {reason}", pytrace=False)
    pytest.skip(reason)

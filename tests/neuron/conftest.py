"""The trn2 tier's requirement check: a skip interactively, a failure in the nightly.

Tests name their needs with the decorators of ``tests/neuron/requires.py``
(``requires_neuron_device``, ``requires_nkilib``, ...). When one is missing the
test is skipped with a reason naming every gap; with ``QWEN3_REQUIRE_TRN2=1`` (set
by the nightly workflow) the same gap is a failure: a nightly that skips
everything proves nothing.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from neuron_cores import fail_if_device_held
from requires import REQUIRE_ENV, gaps, require_trn2


def pytest_configure(config):
    require_trn2()  # refuse a malformed switch before any test runs


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


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After the test and its fixtures: an open Neuron device here would starve every later launch."""
    fail_if_device_held(item.nodeid)


@pytest.fixture(scope="session")
def shared_dir(pytestconfig) -> Path:
    """The night's launches write their run directories (every rank's log, steps, provenance) inside the
    report directory the workflow uploads: ``<report-dir>/runs/<session>/<launch>``, new for each session."""
    runs = Path(pytestconfig.getoption("--report-dir")) / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="night-", dir=runs))

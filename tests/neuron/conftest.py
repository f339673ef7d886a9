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


def launches_of(item) -> list[str]:
    """The launches a test uses (``@pytest.mark.launch``), each checked against the plan."""
    from harness.night.plan import LAUNCHES

    names = [name for mark in item.iter_markers("launch") for name in mark.args]
    unknown = [name for name in names if name not in LAUNCHES]
    if unknown:
        raise pytest.UsageError(
            f"{item.nodeid}: pytest.mark.launch{tuple(unknown)} is not in harness.night.plan.LAUNCHES"
        )
    return names


def night_order(items: list) -> list:
    """Cheapest first, then the plan's order: every test that starts no 64-rank launch (versions, names and
    hooks, kernel numerics on one core, the fork's config compared: seconds each) runs before the first
    launch, so a failing cheap check never stops the published numbers from being measured; the rest run by
    the last launch they need, in ``harness.night.plan.LAUNCHES`` order, so the launches start in the plan's order;
    the tests that wait for the host reference (``@pytest.mark.host_reference``) run last, so the host scores
    each batch beside the later launches (tests/neuron/lane_runs.py)."""
    from harness.night.plan import LAUNCHES

    plan = list(LAUNCHES)
    position = {id(item): i for i, item in enumerate(items)}

    def key(item):
        names = launches_of(item)
        last = max(plan.index(n) for n in names) if names else 0
        stage = 2 if item.get_closest_marker("host_reference") else 1 if names else 0
        return (stage, last), position[id(item)]

    return sorted(items, key=key)


def pytest_collection_modifyitems(config, items):
    items[:] = night_order(items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before any fixture runs (a 64-rank launch would otherwise start first)."""
    names = [name for mark in item.iter_markers("requires") for name in mark.args]
    missing = gaps(names)
    if not missing:
        return
    reason = "; ".join(missing) + ". Run on a trn2 instance set up with `make neuron-venv`."
    if require_trn2():
        pytest.fail(
            f"{REQUIRE_ENV}=1 (nightly): the trn2 tier is incomplete: {reason}", pytrace=False
        )
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


def pytest_sessionfinish(session, exitstatus):
    """Each launch's measured minutes beside the plan's estimate: ``<report-dir>/launches.md`` and ``.json``."""
    import json

    from lane_runs import HOST, measured

    from harness.night import plan as nightly

    HOST.shutdown(
        wait=True, cancel_futures=True
    )  # a queued reference no test asked for is not scored
    runs = measured()
    if not runs:
        return
    report_dir = Path(session.config.getoption("--report-dir"))
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "launches.json").write_text(json.dumps(runs, indent=1) + "\n")
    (report_dir / "launches.md").write_text("\n".join(nightly.measured_lines(runs)) + "\n")

"""Suite-wide fixtures: shared recipe runs, tier markers, and offline settings.

Launches, not steps, dominate the cpu tier's time, so a run that several tests
assert on is started once per test session and shared across xdist workers
(a file lock around a cache in the session's shared temp dir).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from filelock import FileLock

from recipes.platform import OFFLINE_ENV

for _key, _value in OFFLINE_ENV.items():
    os.environ.setdefault(_key, _value)

pytest_plugins = ["recipes.pytest_report"]

TIER_MARKERS = ("cpu", "neuron")


def pytest_configure(config):
    """On a trn2 instance under xdist, each worker gets its own NeuronCores.

    Single-core kernel tests then run side by side; a 64-rank launch needs the whole
    instance and refuses to start inside a slice (run those serially: -p no:xdist).
    """
    from recipes.platform import neuron

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker or "NEURON_RT_VISIBLE_CORES" in os.environ or not neuron.device_nodes():
        return
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ["NEURON_RT_VISIBLE_CORES"] = neuron.worker_cores(
        int(worker.removeprefix("gw")), workers, neuron.logical_core_count()
    )


def pytest_collection_modifyitems(config, items):
    """Every test carries exactly one tier marker; a test with none or both is an error."""
    bad = []
    for item in items:
        tiers = [m for m in TIER_MARKERS if item.get_closest_marker(m)]
        if len(tiers) != 1:
            bad.append(f"{item.nodeid}: tier markers {tiers or 'none'}")
    if bad:
        raise pytest.UsageError("each test needs exactly one of @pytest.mark.cpu / @pytest.mark.neuron:\n" + "\n".join(bad))


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory) -> Path:
    """A directory all xdist workers of this session share."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    path = root / "shared-runs"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def recipe_run(shared_dir):
    """``recipe_run(name, **options)`` → RunResult dict, launched once per session per name."""
    from recipes.launch import LaunchError, launch
    from recipes.options import RunOptions
    from recipes.preflight import preflight

    def run(name: str, **options) -> dict:
        run_dir = shared_dir / name
        done = shared_dir / f"{name}.json"
        with FileLock(str(shared_dir / f"{name}.lock")):
            if not done.exists():
                opts = preflight(RunOptions(run_dir=run_dir, **options))
                try:
                    result = launch(opts, echo=lambda line: None, timeout_s=900).to_dict()
                except LaunchError as e:
                    result = {"error": str(e)}
                done.write_text(json.dumps(result))
        result = json.loads(done.read_text())
        if "error" in result:
            pytest.fail(f"shared run {name!r} failed (see its rank logs below):\n{result['error']}", pytrace=False)
        return result

    return run


def pytest_addoption(parser):
    parser.addoption(
        "--update-goldens",
        action="store_true",
        help="rewrite the exact-lane cpu goldens from this run's measurements (published values never change)",
    )


@pytest.fixture
def golden(request, record_property):
    """``golden(recipe, tier, key, measured, reason=...)``: record, then assert against the goldens file.

    With ``--update-goldens`` an exact-lane value is rewritten from ``measured``
    instead (NaN/inf refused); published values are always asserted.
    """
    from recipes import goldens

    def check(recipe: str, tier: str, key: str, measured, reason: str = ""):
        record_property(f"{recipe}.{tier}.{key}", measured)
        if request.config.getoption("--update-goldens"):
            _, values = goldens.load(recipe, tier) if goldens.goldens_path(recipe, tier).exists() else ({}, {})
            if key not in values or values[key].lane == "exact":
                goldens.update_exact(recipe, tier, {key: measured}, {key: reason})
                return
        metadata, values = goldens.load(recipe, tier)
        if key not in values:
            pytest.fail(f"{goldens.goldens_path(recipe, tier)} has no golden {key!r}; run `make goldens`", pytrace=False)
        verdict = goldens.compare(key, measured, values, metadata)
        record_property(f"{recipe}.{tier}.{key}.verdict", verdict.kind)
        assert verdict.passed, verdict.message()

    return check

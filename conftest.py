"""Suite-wide fixtures: shared recipe runs, tier markers, and offline settings.

Launches, not steps, dominate the cpu tier's time, so a run that several tests
assert on is started once per test session and shared across xdist workers
(a file lock around a cache in the session's shared temp dir).
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
from filelock import FileLock

from harness.pytest_plugins.tiers import selectable_tiers
from recipes.platform import OFFLINE_ENV

for _key, _value in OFFLINE_ENV.items():
    os.environ.setdefault(_key, _value)

#: torch imports every ``torch.backends`` entry point on ``import torch`` unless this is "0"
#: (torch/__init__.py ``_import_device_backends``); torch_neuronx registers one: "PyTorch loads
#: torch_neuronx automatically when you import torch" (aws-neuron/aws-neuron-sdk
#: torch/reference/api/torch-neuron-module.rst).
AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def import_torch_without_device_backends() -> None:
    """Import torch here, in the pytest process, with no out-of-tree device backend loaded.

    On the trn2 runner torch_neuronx is installed, so the first ``import torch`` of any test
    module would load the Neuron backend into the pytest process, which must never hold a
    NeuronCore (tests/neuron/neuron_cores.py). The runner's setting is restored right after, so
    every child (a ``@neuron_core_body``, a rank) still loads its backend as the runner has it.
    """
    if "torch" in sys.modules:
        raise pytest.UsageError(
            "torch was imported before the root conftest; a device backend may have autoloaded"
        )
    saved = os.environ.get(AUTOLOAD_ENV)
    os.environ[AUTOLOAD_ENV] = "0"
    try:
        import torch  # noqa: F401, PLC0415 -- imported here, with autoload off, is the function's purpose
    finally:
        if saved is None:
            del os.environ[AUTOLOAD_ENV]
        else:
            os.environ[AUTOLOAD_ENV] = saved


import_torch_without_device_backends()

pytest_plugins = ["harness.pytest_plugins.report"]

TIER_MARKERS = ("cpu", "neuron")
#: The tier (recipes.tiers) a test of each marker runs on: its goldens are the only ones it may judge.
TIER_OF_MARKER = {"cpu": "cpu", "neuron": "trn2"}


def pytest_configure(config):
    """On a trn2 instance under xdist, each worker gets its own NeuronCores.

    Single-core kernel tests then run side by side; a 64-rank launch needs the whole
    instance and refuses to start inside a slice (run those serially: -p no:xdist).
    """
    from harness.pytest_plugins import groups as pytest_groups  # noqa: PLC0415 -- the root conftest imports nothing that could import torch before import_torch_without_device_backends: hooks import when they run
    from recipes.platform import neuron  # noqa: PLC0415 -- the root conftest imports nothing that could import torch before import_torch_without_device_backends: hooks import when they run

    pytest_groups.register(config)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if "neuron" not in selectable_tiers(
        config.option.markexpr, TIER_MARKERS
    ):  # the cpu tier holds no core, whatever the host has
        return
    if not worker or "NEURON_RT_VISIBLE_CORES" in os.environ or not neuron.device_nodes():
        return
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ["NEURON_RT_VISIBLE_CORES"] = neuron.worker_cores(
        int(worker.removeprefix("gw")), workers, neuron.logical_core_count()
    )


def pytest_ignore_collect(collection_path, config):
    """A tier folder whose tests the ``-m`` expression cannot select is not collected at all.

    The night (``pytest -m neuron -p no:xdist``) then imports no tests/cpu module: nothing of
    the cpu tier (an xdist-only marker, an import that needs the cpu lock) can stop it at
    collection, and the cpu tier never imports tests/neuron.
    """
    for tier, folder in TIER_FOLDERS.items():
        if Path(collection_path) == folder and tier not in selectable_tiers(
            config.option.markexpr, TIER_MARKERS
        ):
            return True
    return None


#: Session fixtures that launch ranks (a shared run): a test that uses one, directly or through another
#: fixture, is ``slow`` (left to ``make test`` by ``make test-fast``), whatever its own body costs.
LAUNCHING_FIXTURES = frozenset({"recipe_run", "random_init_proxy", "logged_run"})


#: The tier of every test, by the folder it lives in.
TIER_FOLDERS = {
    "cpu": Path(__file__).parent / "tests" / "cpu",
    "neuron": Path(__file__).parent / "tests" / "neuron",
}


@pytest.hookimpl(tryfirst=True)  # before ``-m cpu`` / ``-m neuron`` deselects by marker
def pytest_collection_modifyitems(config, items):
    """Each test gets its folder's tier marker; a test outside both folders, or marked otherwise, is an error."""
    from recipes.tiers import TRN2  # noqa: PLC0415 -- the root conftest imports nothing that could import torch before import_torch_without_device_backends: hooks import when they run

    bad = []
    for item in items:
        path = Path(str(item.path))
        tiers = [tier for tier, folder in TIER_FOLDERS.items() if path.is_relative_to(folder)]
        marked = [m for m in TIER_MARKERS if item.get_closest_marker(m)]
        if len(tiers) != 1 or not set(marked) <= set(tiers):
            bad.append(
                f"{item.nodeid}: in {tiers or 'no tier folder'}, marked {marked or 'nothing'}"
            )
            continue
        item.add_marker(tiers[0])
        if LAUNCHING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if tiers == ["neuron"] and not item.get_closest_marker("timeout"):
            # pytest.ini's 900 s fits the cpu tier; a trn2 test may wait for a cold-cache launch.
            item.add_marker(pytest.mark.timeout(TRN2.launch_timeout_s + 600))
    if bad:
        raise pytest.UsageError(
            "a test's tier is its folder (tests/cpu or tests/neuron), not a marker of another tier:\n"
            + "\n".join(bad)
        )


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
    """``recipe_run(name, **options)`` → RunResult dict, launched once per session per name.

    ``cli_overrides=[...]``: torchtitan's own options on top of the recipe's config
    (``["--checkpoint.interval", "50"]``), as ``python -m harness run`` passes them.
    """
    from harness.checks.preflight import preflight  # noqa: PLC0415 -- the root conftest imports nothing that could import torch before import_torch_without_device_backends: hooks import when they run
    from harness.launch.lifecycle import LaunchError, launch  # noqa: PLC0415 -- the root conftest imports nothing that could import torch before import_torch_without_device_backends: hooks import when they run
    from harness.options.run_options import RunOptions  # noqa: PLC0415 -- the root conftest imports nothing that could import torch before import_torch_without_device_backends: hooks import when they run

    def run(name: str, cli_overrides: list[str] = (), **options) -> dict:
        run_dir = shared_dir / name
        done = shared_dir / f"{name}.json"
        key = json.dumps(
            {**options, **({"cli_overrides": list(cli_overrides)} if cli_overrides else {})},
            sort_keys=True,
            default=str,
        )
        with FileLock(str(shared_dir / f"{name}.lock")):
            asked = shared_dir / f"{name}.options.json"
            if asked.exists() and asked.read_text() != key:
                raise pytest.UsageError(
                    f"shared run {name!r} was asked for with different options:\n  {asked.read_text()}\n  {key}\n"
                    "give one of them another name"
                )
            asked.write_text(key)
            if not done.exists():
                opts = preflight(RunOptions(run_dir=run_dir, **options))
                # A real-width run (--layers: the 151936 x 2560 embedding, ~7-9 GiB resident) takes
                # the machine's memory: two side by side under xdist were OOM-killed on a 24 GiB runner.
                # The tests that need one share the xdist group "real-4b-width" (make test runs
                # --dist loadgroup), so one worker runs them in turn and no worker idles on this lock.
                heavy = (
                    FileLock(str(shared_dir / "real-width.lock"))
                    if options.get("layers")
                    else nullcontext()
                )
                with heavy:
                    try:
                        result = launch(
                            opts,
                            list(cli_overrides),
                            echo=lambda line: None,
                            timeout_s=opts.tier_preset.launch_timeout_s,
                        ).to_dict()
                    except LaunchError as e:
                        result = {"error": str(e)}
                done.write_text(json.dumps(result))
        result = json.loads(done.read_text())
        if "error" in result:
            pytest.fail(
                f"shared run {name!r} failed (see its rank logs below):\n{result['error']}",
                pytrace=False,
            )
        return result

    return run


def pytest_addoption(parser):
    parser.addoption(
        "--update-goldens",
        action="store_true",
        help="list every exact-lane cpu golden this run would change (old → new); published values never change",
    )
    parser.addoption(
        "--accept-goldens",
        action="store_true",
        help="with --update-goldens: write the listed changes into fixtures/goldens/",
    )


def _proposals_file(config) -> Path:
    """One JSON-lines file per session that every xdist worker appends its golden proposals to."""
    root = config._tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    return root / "golden-proposals.jsonl"


def pytest_sessionfinish(session, exitstatus):
    """After ``--update-goldens``: print each change, and write them only with ``--accept-goldens``."""
    config = session.config
    if not config.getoption("--update-goldens") or hasattr(config, "workerinput"):
        return
    from harness.judge import goldens  # noqa: PLC0415 -- the root conftest imports nothing that could import torch before import_torch_without_device_backends: hooks import when they run

    path = _proposals_file(config)
    proposals = (
        [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    )
    changes = goldens.proposed_changes(proposals)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    write = reporter.write_line if reporter else print
    write(goldens.format_changes(changes, len(proposals)))
    if changes and config.getoption("--accept-goldens"):
        for path in goldens.apply_changes(changes, proposals):
            write(f"wrote {path}")
    elif changes:
        write("nothing written: rerun with ACCEPT=1 (make goldens ACCEPT=1) to record these")


@pytest.fixture
def golden(request, record_property):
    """``golden(recipe, tier, key, measured, reason=...)``: record, then assert against the goldens file.

    ``tier`` must be the tier under test (tests/cpu: "cpu", tests/neuron: "trn2"): a cpu test
    that judged a trn2 golden would pass a trn2 claim nobody measured on trn2.

    With ``--update-goldens`` an exact-lane value is proposed instead (NaN/inf refused; the
    session lists old → new and writes only with ``--accept-goldens``); published and proxy
    values are always asserted. ``portable_rtol=`` gives an exact value its own tolerance in
    another environment (measured, stated where the test calls this); the goldens file records
    it and must agree with the test.
    """
    from harness.judge import goldens, verdicts  # noqa: PLC0415 -- the root conftest imports nothing that could import torch before import_torch_without_device_backends: hooks import when they run

    under_test = next(TIER_OF_MARKER[m] for m in TIER_MARKERS if request.node.get_closest_marker(m))

    def check(
        recipe: str,
        tier: str,
        key: str,
        measured,
        reason: str = "",
        portable_rtol: float | None = None,
        inputs: dict | None = None,
    ):
        """``inputs``: the run's input key (harness.config.provenance.input_key) for goldens keyed by inputs."""
        if tier != under_test:
            pytest.fail(
                f"golden({recipe!r}, {tier!r}, {key!r}) in a {under_test} test ({request.node.nodeid}): a test "
                f"records and judges only its own tier's goldens ({under_test!r}); a {tier} value is measured "
                f"by a {tier} test",
                pytrace=False,
            )
        record_property(f"{recipe}.{tier}.{key}", measured)
        if inputs is not None:
            record_property(f"{recipe}.{tier}.{key}.inputs", inputs)
        if request.config.getoption("--update-goldens"):
            _, values = (
                goldens.load(recipe, tier)
                if goldens.goldens_path(recipe, tier).exists()
                else ({}, {})
            )
            if key not in values or values[key].lane == "exact":
                goldens.check_finite(recipe, tier, {key: measured})
                line = json.dumps(
                    {
                        "recipe": recipe,
                        "tier": tier,
                        "key": key,
                        "value": measured,
                        "reason": reason,
                        **({"portable_rtol": portable_rtol} if portable_rtol is not None else {}),
                    }
                )
                path = _proposals_file(request.config)
                with FileLock(str(path) + ".lock"), path.open("a") as f:
                    f.write(line + "\n")
                return
        metadata, values = goldens.load(recipe, tier)
        if key not in values:
            pytest.fail(
                f"{goldens.goldens_path(recipe, tier)} has no golden {key!r}; run `make goldens`",
                pytrace=False,
            )
        if portable_rtol is not None and values[key].portable_rtol != portable_rtol:
            pytest.fail(
                f"{goldens.goldens_path(recipe, tier)}: {key!r} has portable_rtol {values[key].portable_rtol!r}, "
                f"the test states {portable_rtol!r}; run `make goldens`",
                pytrace=False,
            )
        verdict = verdicts.compare(key, measured, values, metadata, inputs=inputs)
        record_property(f"{recipe}.{tier}.{key}.verdict", verdict.kind)
        # "unmeasured" / "inputs differ": neither pass nor fail here; harness.night.ci require-claims
        # fails the nightly for a published claim left so.
        assert verdict.passed is not False, verdict.message()

    return check

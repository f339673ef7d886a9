"""The night collects what it runs and nothing else, with the command the workflow writes.

The first night would have stopped at collection: ``pytest -m neuron -p no:xdist`` imported
every tests/cpu module, four of which use ``xdist_group``, a marker only xdist declares, and
``--strict-markers`` made each use an error (30 of 610 tests collected, none run). The command
is read from .github/workflows/nightly-trn2.yml and the Makefile, never copied here.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.pytest_plugins.tiers import selectable_tiers

ROOT = Path(__file__).resolve().parents[2]
NEURON_TESTS = ROOT / "tests" / "neuron"


def night_pytest_command() -> list[str]:
    """The nightly's pytest step, as argv (its interpreter is replaced by this one)."""
    workflow = yaml.safe_load((ROOT / ".github/workflows/nightly-trn2.yml").read_text())
    runs = [
        step["run"]
        for step in workflow["jobs"]["neuron"]["steps"]
        if "pytest -m neuron" in step.get("run", "")
    ]
    assert len(runs) == 1, (
        f"nightly-trn2.yml has {len(runs)} steps running `pytest -m neuron`, expected one"
    )
    argv = shlex.split(runs[0].replace("\\\n", " "))
    assert argv[0].endswith("/bin/python"), argv
    return [sys.executable, *argv[1:]]


def makefile_pytest_command() -> list[str]:
    """``make test-neuron``'s pytest command, with ``$(PYTEST_ARGS)`` empty."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    recipe = lines[lines.index(next(ln for ln in lines if ln.startswith("test-neuron:"))) + 1]
    argv = shlex.split(recipe.replace("$(PYTEST_ARGS)", ""))
    assert argv[0] == "$(NEURON_VENV_DIR)/bin/python", recipe
    return [sys.executable, *argv[1:]]


def collect(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    argv = [
        a.replace("report/", f"{tmp_path}/report/") if a.startswith("--junitxml=") else a
        for a in argv
    ]
    if "--report-dir" in argv:
        argv[argv.index("--report-dir") + 1] = str(tmp_path / "report")
    return subprocess.run(
        [*argv, "--collect-only", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def neuron_test_ids(out: str) -> list[str]:
    return [line for line in out.splitlines() if "::" in line]


@pytest.mark.parametrize("source", ["workflow", "makefile"])
def test_the_nights_command_collects_every_neuron_test_and_nothing_else(source, tmp_path):
    argv = night_pytest_command() if source == "workflow" else makefile_pytest_command()
    assert "-p" in argv and argv[argv.index("-p") + 1] == "no:xdist", argv
    done = collect(argv, tmp_path)
    assert done.returncode == 0, (
        f"{shlex.join(argv)} --collect-only failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
    )
    ids = neuron_test_ids(done.stdout)
    assert ids and all(i.startswith("tests/neuron/") for i in ids), ids
    assert "deselected" not in done.stdout, (
        "a tests/cpu module was collected (then deselected) by the night"
    )
    assert f"{len(ids)} tests collected" in done.stdout, done.stdout[-500:]


@pytest.mark.slow
@pytest.mark.parametrize(
    "xdist", [["-p", "no:xdist"], ["-n", "2"]], ids=["without-xdist", "with-xdist"]
)
def test_the_cpu_tier_collects_with_and_without_xdist(xdist, tmp_path):
    """An xdist-only marker in a tests/cpu module fails here, whichever way the tier is started."""
    done = collect([sys.executable, "-m", "pytest", "-m", "cpu", *xdist], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "error" not in done.stdout.lower().split("tests collected")[-1], done.stdout[-1000:]


@pytest.mark.parametrize(
    ("markexpr", "tiers"),
    [
        ("", {"cpu", "neuron"}),
        ("neuron", {"neuron"}),
        ("cpu", {"cpu"}),
        ("cpu and not slow", {"cpu"}),
        ("not slow", {"cpu", "neuron"}),
        ("not cpu", {"neuron"}),
        ("neuron or slow", {"cpu", "neuron"}),
        ("cpu and neuron", set()),
    ],
)
def test_a_tier_folder_is_collected_only_when_the_expression_can_select_its_tests(markexpr, tiers):
    assert selectable_tiers(markexpr) == tiers


def night_order(tmp_path: Path) -> list[dict]:
    """Each test of the night, in the order the night's command collects it, with the launches it uses."""
    import json
    import os

    from night_order_probe import PREFIX

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        ),
    }
    argv = [*night_pytest_command(), "-p", "night_order_probe", "--collect-only", "-q"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return [
        json.loads(line[len(PREFIX) :])
        for line in done.stdout.splitlines()
        if line.startswith(PREFIX)
    ]


def lane_run_literals(path: Path) -> dict[str, set[str] | None]:
    """Test functions of a neuron module that call ``lane_run``, with the launch names they pass literally."""
    import ast

    found: dict[str, set[str] | None] = {}
    for fn in ast.parse(path.read_text()).body:
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_"):
            calls = [
                c
                for c in ast.walk(fn)
                if isinstance(c, ast.Call) and getattr(c.func, "id", None) == "lane_run"
            ]
            if calls:
                found[fn.name] = {
                    c.args[0].value for c in calls if isinstance(c.args[0], ast.Constant)
                }
    return found


def test_the_night_runs_cheap_checks_first_then_its_launches_in_the_plans_order(tmp_path):
    from harness.night.plan import LAUNCHES

    order = night_order(tmp_path)
    assert len(order) == len(neuron_test_ids("\n".join(t["id"] for t in order))) > 0
    kinds = ["launch" if t["launches"] else "cheap" for t in order]
    assert kinds == sorted(kinds, key=lambda k: k == "launch"), [t["id"] for t in order]
    started = []
    for test in order:
        first = [name for name in test["launches"] if name not in started]
        # The host reference tests wait for the host worker after the last launch: they never start one.
        assert not (first and test["host_reference"]), (
            f"{test['id']} would start {first} after the last launch"
        )
        started += first
    assert started == [name for name in LAUNCHES if name in started], started
    waiting = [t["host_reference"] for t in order if t["launches"]]
    assert waiting == sorted(waiting) and any(waiting), [t["id"] for t in order]
    assert set(started) == set(LAUNCHES), (
        f"launches of the plan no test uses: {set(LAUNCHES) - set(started)}"
    )
    marks: dict[str, set[str]] = {}
    for t in order:
        marks.setdefault(t["id"].split("[")[0], set()).update(t["launches"])
    for path in NEURON_TESTS.glob("test_*.py"):
        for name, literal in lane_run_literals(path).items():
            test = f"tests/neuron/{path.name}::{name}"
            assert marks.get(test), f"{test} calls lane_run without @pytest.mark.launch"
            assert literal <= marks[test], (
                f"{test} calls lane_run{tuple(literal)} but is marked {marks[test]}"
            )

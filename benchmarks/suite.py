"""Suite wall time: the README's test command on this machine, per test, against the 5-minute goal.

Per-test times come from two places: tests.json (the suite's report plugin;
the *call* phase) and a JUnit file (setup + call + teardown). The difference
matters here: a shared recipe run (conftest's ``recipe_run``) is paid in the
setup of whichever test first needs it, so only the JUnit total shows where
the minutes go.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.common import Goal, Section, log_tail, run_timed
from recipes.platform.neuron import neuron_status

GOAL_S = 300.0
MARKERS = {"cpu": "cpu", "trn2": "neuron"}
SUITE_TIMEOUT_S = 3600
SLOWEST = 10


@dataclass
class PerTest:
    test: str
    outcome: str
    call_s: float | None
    total_s: float | None


def suite_command(tier: str, report_dir: Path) -> list[str]:
    # "--opt=value": a detached value outside the repo would be taken for a test path and move pytest's rootdir.
    return [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        MARKERS[tier],
        "-n",
        "auto",
        "--dist",
        "loadgroup",
        "-q",
        f"--report-dir={report_dir}",
        f"--junitxml={report_dir / 'junit.xml'}",
    ]


def junit_key(nodeid: str) -> tuple[str, str]:
    """A pytest node id as JUnit's (classname, name): ``tests/cpu/t.py::C::f`` → (``tests.cpu.t.C``, ``f``)."""
    parts = nodeid.split("::")
    module = parts[0].removesuffix(".py").replace("/", ".")
    return ".".join([module, *parts[1:-1]]), parts[-1]


def junit_totals(path: Path) -> dict[tuple[str, str], float]:
    if not path.exists():
        return {}
    root = ET.parse(path).getroot()
    return {
        (c.get("classname", ""), c.get("name", "")): float(c.get("time", 0))
        for c in root.iter("testcase")
    }


def per_test_times(report_dir: Path) -> list[PerTest]:
    path = report_dir / "tests.json"
    records = json.loads(path.read_text())["tests"] if path.exists() else []
    totals = junit_totals(report_dir / "junit.xml")
    return [
        PerTest(r["test"], r["outcome"], r["duration_s"], totals.get(junit_key(r["test"])))
        for r in records
    ]


def summarize(proc, times: list[PerTest], tier: str, console: Path) -> Section:
    section = Section("suite")
    outcomes = Counter(t.outcome for t in times)
    section.figures = {
        "command": f"pytest -m {MARKERS[tier]} -n auto",
        "workers": "auto",
        "cpus": os.cpu_count(),
        "wall_s": proc.wall_s,
        "cpu_s": proc.cpu_s,
        "others_cpu_s": proc.others_cpu_s,
        "exit_code": proc.returncode,
        "timed_out": proc.timed_out,
        "outcomes": dict(outcomes),
        "sum_of_test_totals_s": sum(t.total_s or 0 for t in times),
        "tests": [asdict(t) for t in times],
    }
    slowest = sorted(times, key=lambda t: t.total_s or t.call_s or 0, reverse=True)[:SLOWEST]
    section.header = ["test (slowest first)", "outcome", "call s", "total s"]
    section.rows = [[t.test, t.outcome, t.call_s, t.total_s] for t in slowest]
    section.notes.append(
        f"{len(times)} tests: "
        + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items()))
        + f"; pytest exit {proc.returncode}; wall {proc.wall_s:.1f} s on {os.cpu_count()} cores."
    )
    section.notes.append(
        f"CPU: the suite used {proc.cpu_s:.0f} CPU s, other processes {proc.others_cpu_s:.0f} CPU s meanwhile "
        f"(of {proc.wall_s * (os.cpu_count() or 1):.0f} available): the wall time is only comparable at similar contention."
    )
    section.notes.append(
        "call s = the test body (tests.json); total s = setup + call + teardown (JUnit)."
    )
    if proc.returncode not in (0, 1) or not times:
        section.notes.append(f"pytest did not finish normally; last lines:\n{log_tail(console)}")
    if tier == "cpu":
        finished = not proc.timed_out and bool(times)
        section.goals.append(
            Goal(
                "suite wall time",
                f"pytest -m cpu -n auto < {GOAL_S:.0f} s",
                proc.wall_s if finished else None,
                proc.wall_s < GOAL_S if finished else None,
                "" if finished else "the suite did not run to the end",
            )
        )
    return section


def bench_suite(args, echo=print) -> Section:
    if args.tier == "trn2":
        status = neuron_status()
        if not status.ready:
            return Section("suite", skipped=status.reason())
    work = Path(tempfile.mkdtemp(prefix="bench-suite-"))
    try:
        echo(f"  suite: pytest -m {MARKERS[args.tier]} -n auto (several minutes) …")
        console = work / "pytest.log"
        proc = run_timed(
            suite_command(args.tier, work),
            env=dict(os.environ),
            log_path=console,
            timeout_s=SUITE_TIMEOUT_S,
        )
        return summarize(proc, per_test_times(work), args.tier, console)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

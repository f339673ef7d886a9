"""The trn2 night, rehearsed on cpu from .github/workflows/nightly-trn2.yml's own steps.

    python -m rehearsal.night --standins DIR [--night first|later|device-random] [--scratch DIR]   (make rehearse-trn2)

Every step is read from the workflow with pyyaml and run in a scratch workspace as a runner
would (rehearsal/workflow.py), on the machine rehearsal/machine.py makes there (:data:`RUNNER`: what a real
runner would supply, mapped into the scratch dir; the stand-in neuron venv and the stand-ins' settings).
:data:`EXPECTED` is each step's exit code on a first, a later and a device-random night (one whose
preflight finds the device's random ops hang: it must stop there, :data:`STOP_LINE`). What it rehearses is
the source checkout's working tree as it is (:func:`working_tree`), and every way it differs from a real
runner is stated as it starts (:func:`substitutions`). Nothing is written outside the scratch dir: the
source checkout's ``git status`` and /opt are compared after.
A rehearsal is never a trn2 result: every line it prints starts with "rehearsal".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.night import plan
from harness.night.ci import executed
from rehearsal.machine import (
    RUNNER,
    SOURCE,
    RehearsalError,
    Tree,
    check_standins,
    checkout,
    cpu_site_packages,
    prepare,
    working_tree,
)
from rehearsal.workflow import (
    STARTING,
    JobRun,
    StepResult,
    load_job,
    step_name,
    upload_artifact,
)

WORKFLOW = SOURCE / ".github/workflows/nightly-trn2.yml"


#: Each step's exit code on a first night (goldens' inputs still null), a later night, and a device-random night
#: (the stand-in's random ops draw from the CPU generator, QWEN3_STANDIN_DEVICE_RANDOM=0: the preflight stops the
#: night, no launch starts, and the guards after it find no report); None: the step is skipped.
#: A first night's require-claims fails by design: its claims are "unmeasured" until recorded.
EXPECTED: dict[str, tuple[int | None, int | None, int | None]] = {
    "actions/checkout@v4": (0, 0, 0),
    "Previous nights' runs log (artifact runs-history of the latest nightly that uploaded one)": (
        0,
        0,
        0,
    ),
    "Neuron devices, driver and runtime": (0, 0, 0),
    "Install the trn2 tier (requirements-neuron.txt + TorchTitan Neuron release-2.33)": (0, 0, 0),
    "torchtitan names and hooks (recipes/titan.py) against the installed TorchTitan Neuron": (
        0,
        0,
        0,
    ),
    "TorchTitan Neuron ref and commit (recorded by the install; also in the report's versions)": (
        0,
        0,
        0,
    ),
    "Compiler version (keys the NEFF cache)": (0, 0, 0),
    "Persistent NEFF cache, keyed by compiler version": (0, 0, 0),
    "Device randomness before any launch (DTensor trunc_normal_, normal_, uniform_ on one core)": (
        0,
        0,
        1,
    ),
    "Held-device guard can see a held core (a child holding core 0 has a /dev/neuron* open)": (
        0,
        0,
        None,
    ),
    "Neuron tests, serial (a 64-rank job takes the whole instance)": (0, 0, None),
    "NEFF cache hits and misses": (0, 0, 0),
    "Fail when no neuron test actually ran": (0, 0, 1),
    "Fail unless every published trn2 claim was measured": (1, 0, 1),
    "Record the input keys of claims measured for the first time": (0, 0, 1),
    "Append tonight's results to the trend file": (0, 0, 1),
    "Published numbers and speed across nights (python -m harness history)": (0, 0, 2),
    "The night as one page (python -m harness page)": (0, 0, 2),
    "Upload the runs log (tomorrow's nightly downloads it and appends)": (0, 0, 0),
    "Upload the report": (0, 0, 0),
}
NIGHTS = ("first", "later", "device-random")
#: Switches a night sets unless --switch names them: the device-random night is the CPU-generator fallback.
NIGHT_SWITCHES = {"device-random": {"QWEN3_STANDIN_DEVICE_RANDOM": "0"}}
#: The step id of the preflight (nightly-trn2.yml) and the one line a device-random night must stop with.
PREFLIGHT_ID = "device_random"
STOP_LINE = re.compile(
    r"device random: DTensor trunc_normal_ on neuron did not return in \d+ s: .+; no launch started"
)


def expected_codes(workflow: Path, night: str) -> dict[str, int | None]:
    """EXPECTED for every step of ``workflow``, by name; a step the table lacks (or names wrongly) is an error."""

    names = [step_name(s) for s in load_job(workflow)[1].get("steps") or []]
    missing = [n for n in names if n not in EXPECTED]
    extra = [n for n in EXPECTED if n not in names]
    if missing or extra:
        raise RehearsalError(
            f"rehearsal/night.py EXPECTED does not match {workflow}'s steps: no entry for {missing}; "
            f"entries for no step {extra}; give every step its exit code on each of {NIGHTS}"
        )
    return {n: EXPECTED[n][NIGHTS.index(night)] for n in names}


#: Minutes of the rehearsal's own plan, for scaling the job's timeout-minutes: every job step but the launches
#: (offline install into the stand-in venv, names check, preflight, guards, page: 1.0 to 1.7 min measured on this
#: suite's 2-core machine, loaded, rounded up), and each of the plan's launches at the seam's tiny sizes, 2 ranks on
#: cpu (the neuron tests step over its 11 launches: 918 s and 614 s, 83 and 56 s a launch, at 98ff5f9 on that
#: machine; 1.5 min: the larger, rounded up).
REHEARSAL_STEPS_MIN = 4.0
REHEARSAL_LAUNCH_MIN = 1.5


def job_timeout(workflow: Path, night: str) -> tuple[float, str]:
    """(seconds, how) the job's ``timeout-minutes`` is applied: scaled by the rehearsal's plan over the trn2
    plan's (harness/night/plan.py: the workflow's minutes are that plan's cold total with a margin)."""

    minutes = float(load_job(workflow)[1].get("timeout-minutes") or 360)
    launches = 0 if night == "device-random" else sum(s.launches for s in plan.steps(plan.CHANGED))
    own = REHEARSAL_STEPS_MIN + launches * REHEARSAL_LAUNCH_MIN
    trn2 = plan.totals(plan.steps(plan.CHANGED)).cold
    scaled = minutes * own / trn2
    return scaled * 60, (
        f"timeout-minutes {minutes:g} applied as {scaled:.1f} min = {minutes:g} x this rehearsal's plan "
        f"({REHEARSAL_STEPS_MIN:g} min of steps + {launches} launches x {REHEARSAL_LAUNCH_MIN:g} min = {own:g} min) "
        f"/ the trn2 plan's cold total ({trn2:.0f} min)"
    )


def substitutions(tree: Tree, timeout_how: str, step_timeout_s: float) -> list[str]:
    """Every way this rehearsal's job differs from the real runner's, one line each (rehearsal/README.md)."""
    return [
        f"checkout: actions/checkout is a local clone of this checkout's working tree as commit {tree.commit[:12]}"
        + (
            " (HEAD: nothing uncommitted)"
            if tree.commit == tree.head
            else f" (git stash create, untracked files added: {len(tree.uncommitted)} uncommitted file(s) included)"
        ),
        "gh: kept off PATH (it would reach GitHub): the runs-log download loop never runs, tonight starts a new "
        "runs log",
        f"timeout-minutes: {timeout_how}; each step also ends after {step_timeout_s:.0f} s or when the machine's "
        "available memory runs low",
        "uploads: actions/upload-artifact uploads nothing: each artifact's files are checked as the action checks "
        "them (if-no-files-found) and listed in artifacts.json in the scratch dir",
        "machine: /opt paths, HOME, caches and pip in the scratch dir; pip offline from the stand-in wheelhouse; "
        "the fork from a local git repository; Neuron packages, devices and neuron-ls are stand-ins "
        "(RUNNER in rehearsal/machine.py)",
    ]


def snapshot(
    source: Path = SOURCE,
    watched: tuple[str, ...] = tuple(RUNNER.paths),
    opt: str = "/opt",
    venv_site: Path | None = None,
) -> dict:
    """What the rehearsal must leave as it found it: the source's git status, /opt's entries, the mapped paths,
    and the distributions of the cpu venv the stand-in venv is layered on (the fork stand-in installs a
    distribution named ``torchtitan`` on top of it: pip must never touch the cpu venv's own)."""
    status = subprocess.run(
        ["git", "-C", str(source), "status", "--porcelain"], capture_output=True, text=True
    )
    venv_site = cpu_site_packages() if venv_site is None else venv_site
    return {
        "source": str(source),
        "git status": status.stdout,
        "opt": opt,
        "entries": sorted(os.listdir(opt)) if os.path.isdir(opt) else [],
        "mapped": {p: os.path.exists(p) for p in watched},
        "venv": str(venv_site),
        "dists": sorted(p.name for p in venv_site.glob("*.dist-info")),
    }


def writes_outside(before: dict, after: dict) -> list[str]:
    """One line per thing the rehearsal changed outside its scratch dir."""
    found = []
    if before["git status"] != after["git status"]:
        found.append(
            f"the source checkout {before['source']} changed (git status --porcelain before: "
            f"{before['git status']!r}, after: {after['git status']!r})"
        )
    new = sorted(set(after["entries"]) - set(before["entries"]))
    if new:
        found.append(f"{before['opt']} gained {new}")
    found += [
        f"{p} was created"
        for p in after["mapped"]
        if after["mapped"][p] and not before["mapped"][p]
    ]
    if before["dists"] != after["dists"]:
        gone, came = (
            sorted(set(before["dists"]) - set(after["dists"])),
            sorted(set(after["dists"]) - set(before["dists"])),
        )
        found.append(f"the cpu venv {before['venv']} changed: lost {gone}, gained {came}")
    return found


def launches_in(scratch: Path) -> int:
    """The torchrun launches the night made: each writes ``<log-dir>/<run id>/attempt_0`` (torchrun ``--log-dir``;
    harness launches under their run dir, the torchtitan.train launch under its test's tmp dir, which has no
    run.json: counting run dirs missed it)."""
    return sum(
        1 for d in scratch.rglob("attempt_0") if d.is_dir() and d.parent.parent.name == "logs"
    )


def counts(workspace: Path, scratch: Path) -> tuple[int, int, int]:
    """(neuron tests executed, neuron tests skipped, launches): report/tests.json and the launches in scratch."""

    report = workspace / "report/tests.json"
    tests = json.loads(report.read_text())["tests"] if report.is_file() else []
    neuron = [t for t in tests if t["test"].startswith("tests/neuron/")]
    return (
        sum(map(executed, neuron)),
        sum(t["outcome"] == "skipped" for t in neuron),
        launches_in(scratch),
    )


#: The job env variable that names the suite's trn2 venv in every step of the nightly.
VENV_VARIABLE = "NEURON_VENV_DIR"


def collected(job: JobRun) -> tuple[int | None, str]:
    """How many neuron tests the night's own pytest command collects, and its collection errors' summary.

    None when the install never made the suite's venv, which the workflow names in every step with
    :data:`VENV_VARIABLE` (outside the workspace, kept across nights). Any collection error makes the count
    a failure: pytest runs nothing when collection is interrupted."""
    env = {**job.base_env, **job.job_env(), **job.env_from_steps}
    if not env.get(VENV_VARIABLE):
        return (
            None,
            f"the workflow's job env has no {VENV_VARIABLE} (the suite's trn2 venv): update VENV_VARIABLE",
        )
    python = Path(env[VENV_VARIABLE]) / "bin/python"
    if not python.exists():
        return None, f"{python} was never made (${VENV_VARIABLE})"
    out = subprocess.run(
        [str(python), "-m", "pytest", "-m", "neuron", "-p", "no:xdist", "--collect-only", "-q"],
        cwd=job.workspace,
        env=env,
        capture_output=True,
        text=True,
    )
    count = sum(
        1 for line in out.stdout.splitlines() if line.startswith("tests/neuron/") and "::" in line
    )
    errors = sorted(set(re.findall(r"ERROR collecting (\S+)", out.stdout)))
    if out.returncode == 0:
        return count, ""
    return (
        count,
        f"pytest --collect-only exited {out.returncode}; errors collecting {', '.join(errors) or '(none named)'}",
    )


def report_line(result: StepResult, expected: int | None) -> str:
    got = "skipped" if result.exit_code is None else str(result.exit_code)
    want = "skipped" if expected is None else str(expected)
    verdict = "ok" if result.exit_code == expected else "DIFFERS"
    return (
        f"rehearsal: step {result.index:2d} {verdict:7s} expected {want:7s} got {got:7s} "
        f"{result.seconds:7.1f}s  {result.name}" + (f" ({result.note})" if result.note else "")
    )


def stopped_as_expected(results: list[StepResult], workflow: Path = WORKFLOW) -> str:
    """'' when the preflight step's output is exactly one line, :data:`STOP_LINE`; else what it was."""

    steps = load_job(workflow)[1].get("steps") or []
    name = next((step_name(s) for s in steps if s.get("id") == PREFLIGHT_ID), None)
    result = next((r for r in results if r.name == name), None)
    if result is None or result.log is None or not result.log.exists():
        return f"no step with id {PREFLIGHT_ID} ran in {workflow}"
    lines = [x for x in result.log.read_text(errors="replace").splitlines() if x.strip()]
    if len(lines) == 1 and STOP_LINE.fullmatch(lines[0]):
        return ""
    return f"step {result.index} printed {len(lines)} line(s), not one matching {STOP_LINE.pattern!r}: {lines[-3:]}"


def stop_on_signals() -> None:
    """SIGTERM/SIGHUP end the rehearsal as Ctrl-C does: through ``finally``, so the running step's process
    group is ended with it (rehearsal/workflow.py ``JobRun._execute``), never left running."""

    def stop(signum, frame):
        STARTING.stop(signum)  # at once, or once a step being started can be ended with it

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rehearsal.night", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--standins", type=Path, required=True, help="python -m rehearsal.standins build --out DIR"
    )
    parser.add_argument(
        "--night", choices=NIGHTS, default="first", help="which exit codes to expect (EXPECTED)"
    )
    parser.add_argument(
        "--scratch", type=Path, help="a new or empty dir (default: a new temporary dir)"
    )
    parser.add_argument(
        "--python-floor",
        default="%d.%d" % sys.version_info[:2],
        help="scripts/neuron_venv.sh's Python floor for the rehearsal (its real one is 3.12)",
    )
    parser.add_argument(
        "--switch",
        action="append",
        default=[],
        metavar="NAME=0|1",
        help="a stand-in switch (rehearsal/settings.py SWITCHES); the rest take their defaults",
    )
    parser.add_argument("--step-timeout", type=float, default=3600.0, help="seconds per step")
    parser.add_argument(
        "--min-available-gib",
        type=float,
        default=2.0,
        help="end a step when the machine's available memory falls under this (a shared host)",
    )
    parser.add_argument("--echo", action="store_true", help="print every step's output as it runs")
    args = parser.parse_args(argv)
    stop_on_signals()
    start_wall, start_cpu = time.monotonic(), os.times()
    try:
        check_standins(args.standins)
        expected = expected_codes(WORKFLOW, args.night)
        scratch = (args.scratch or Path(tempfile.mkdtemp(prefix="qwen3-rehearsal-"))).resolve()
        scratch.mkdir(parents=True, exist_ok=True)
        if any(scratch.iterdir()):
            raise RehearsalError(
                f"rehearsal: --scratch {scratch} is not empty; give a new or empty dir"
            )
        before = snapshot()
        print(
            f"rehearsal: scratch dir {scratch}; {args.night} night; stand-ins {args.standins}",
            flush=True,
        )
        switches = dict(s.split("=", 1) for s in args.switch if "=" in s)
        if len(switches) != len(args.switch):
            raise RehearsalError(
                f"rehearsal: --switch {args.switch}: write each as NAME=0 or NAME=1"
            )
        switches = {**NIGHT_SWITCHES.get(args.night, {}), **switches}
        print(f"rehearsal: switches {switches or 'all at their defaults'}", flush=True)
        tree = working_tree()
        for line in tree.lines():
            print(line, flush=True)
        timeout_s, timeout_how = job_timeout(WORKFLOW, args.night)
        for line in substitutions(tree, timeout_how, args.step_timeout):
            print(f"rehearsal: substitution: {line}", flush=True)
        context, env = prepare(scratch, args.standins, args.python_floor, switches)
        job = JobRun(
            WORKFLOW,
            context,
            Path(context.github["workspace"]),
            env,
            actions={
                "actions/checkout": checkout(tree),
                "actions/upload-artifact": upload_artifact,
            },
            logs=scratch / "logs",
            echo=args.echo,
            timeout_s=args.step_timeout,
            min_available=int(args.min_available_gib * 2**30),
            job_timeout_s=timeout_s,
        )
        results = job.run(on_step=lambda r: print(report_line(r, expected[r.name]), flush=True))
    except (
        RuntimeError,
        ValueError,
    ) as error:  # RehearsalError, WorkflowError, a git or settings refusal
        print(
            str(error) if str(error).startswith("rehearsal") else f"rehearsal: {error}",
            file=sys.stderr,
        )
        return 2
    differs = [r for r in results if r.exit_code != expected[r.name]]
    (scratch / "artifacts.json").write_text(json.dumps(job.artifacts, indent=2) + "\n")
    for r in differs:
        if r.log and r.log.exists():
            tail = r.log.read_text(errors="replace").splitlines()[-12:]
            print(f"rehearsal: last lines of step {r.index} ({r.log}):\n  " + "\n  ".join(tail))
    outside = writes_outside(before, snapshot())
    for line in outside:
        print(f"rehearsal: wrote outside its scratch dir: {line}")
    ran, skipped, launches = counts(job.workspace, scratch)
    cpu = os.times()
    cpu_s = sum(
        getattr(cpu, k) - getattr(start_cpu, k)
        for k in ("user", "system", "children_user", "children_system")
    )
    timing = (
        f"wall {time.monotonic() - start_wall:.0f} s, CPU {cpu_s:.0f} s; logs in {scratch / 'logs'}"
    )
    if args.night == "device-random":
        stop = stopped_as_expected(results)
        if stop:
            print(f"rehearsal: the preflight did not stop the night as expected: {stop}")
        print(f"rehearsal: {timing}")
        print(
            f"rehearsal: device-random night: {'stopped at its preflight' if not stop else 'NOT stopped at its preflight'}, "
            f"{ran} neuron tests executed, {launches} launches, {len(differs)} steps failed"
        )
        ok = not differs and not outside and not stop and launches == 0 and ran == 0
        return 0 if ok else 1
    n_collected, collect_error = collected(job)
    if collect_error:
        print(f"rehearsal: collection: {collect_error}")
    print(
        f"rehearsal: {n_collected if n_collected is not None else 'no'} neuron tests collected; {timing}"
    )
    print(f"rehearsal: its page (marked a rehearsal) {job.workspace / 'report' / 'index.html'}")
    print(
        f"rehearsal: {ran} neuron tests executed, {skipped} skipped, {launches} launches, {len(differs)} steps failed"
    )
    ok = not differs and not outside and not collect_error and skipped == 0 and ran == n_collected
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

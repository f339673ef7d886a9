"""``python -m benchmarks compare``: issue 27's speed goals, this checkout against a baseline commit.

    python -m benchmarks compare [--baseline 078324c] [--reps 3] [--suite-reps 1] [--only suite,repro,fast,ci]

Every goal is a ratio measured side by side on this machine in one run: the baseline
is checked out into a temporary git worktree (removed at the end) that reuses this
checkout's ``.venv`` (refused unless both have the same requirements-lock.txt), and
each command runs for both checkouts in turn, the order alternating per repetition
(baseline, current; then current, baseline) so drifting load from other users hits
both alike. Each run goes through ``benchmarks/reaper.py``: wall time of the command,
CPU seconds (user + sys) of every process it started, grandchildren and orphans
included (a child subreaper; see its docstring).

Goals (issue 27): ``make test`` at most 0.5x the baseline's in CPU seconds and in wall
time; ``make test-fast`` at most 1/6 of ``make test``'s wall (this checkout); ``make
repro`` at most 0.6x the baseline's wall. Issue 37 (``--only ci --baseline 327d3b6``): what CI runs, the
rehearsal of the night and ``make test``, at most 1.0x the CPU seconds of the baseline's (a checkout without
``rehearse-trn2`` runs ``make test`` alone). Each is printed as the median of the
per-repetition ratios with their min-max, and appended to benchmarks/history.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.common import (
    DEFAULT_OUT_DIR,
    HISTORY,
    Goal,
    append_history,
    commit_of,
    machine,
    machine_busy_s,
    table,
)
from harness.base.environment import versions
from recipes.tiers import REPO_ROOT

DEFAULT_BASELINE = "078324c"
LOCK = "requirements-lock.txt"
#: The Makefile's venv stamp; ``make -o`` keeps make from rebuilding the shared venv in a checkout whose
#: lock file is newer than the stamp (every fresh worktree's is).
STAMP = ".venv/.lock-installed"
REAPER = Path(__file__).resolve().parent / "reaper.py"
#: What each name of ``--only`` measures: make targets of both checkouts, run in order by one make (each checkout
#: runs those its Makefile has).
TARGETS = {
    "fast": ("test-fast",),
    "suite": ("test",),
    "repro": ("repro",),
    "ci": ("rehearse-trn2", "test"),
}
#: The long ones (10-25 min a side): repeated ``--suite-reps`` times, the others ``--reps`` times.
LONG = ("suite", "ci")
#: What ``--only`` measures unless told: ``ci`` (about 25 min a side) only on request.
DEFAULT_ONLY = ("suite", "repro", "fast")
SIDES = ("baseline", "current")
#: Seconds one measured command may take before it is killed (a hung suite still ends the benchmark).
TIMEOUT_S = 3 * 3600
#: Variables of an outer make that must not reach the measured one.
DROPPED_ENV = (
    "MAKEFLAGS",
    "MFLAGS",
    "MAKELEVEL",
    "MAKEOVERRIDES",
    "PYTEST_XDIST_WORKER",
    "PYTEST_CURRENT_TEST",
)

SUITE_RATIO = 0.5
FAST_SHARE = 1 / 6
REPRO_RATIO = 0.6
CI_RATIO = 1.0


class Refusal(Exception):
    """The comparison cannot be made as asked; the message says why and what to do."""


@dataclass
class Checkout:
    side: str
    path: Path
    commit: str
    #: Which of ``TARGETS``' make targets its Makefile has.
    targets: set[str] = field(default_factory=set)


@dataclass
class Measurement:
    """One command of one checkout, one repetition, as ``benchmarks/reaper.py`` measured it."""

    name: str
    side: str
    rep: int
    returncode: int
    wall_s: float
    cpu_s: float
    others_cpu_s: float
    processes: int
    orphans: int
    killed_after_exit: int
    timed_out: bool
    log: str


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise Refusal(
            f"git {' '.join(args)} in {repo} failed: {out.stderr.strip().splitlines()[-1:]}"
        )
    return out.stdout.strip()


def resolve_baseline(repo: Path, rev: str) -> str:
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except Refusal:
        raise Refusal(
            f"--baseline {rev}: not a commit of {repo}; fetch it or name another"
        ) from None


def check_shared_venv(repo: Path, baseline: str) -> Path:
    """The venv both checkouts use: refused unless the baseline's lock is this checkout's and the venv is the lock's."""
    current = (repo / LOCK).read_bytes()
    theirs = subprocess.run(
        ["git", "-C", str(repo), "show", f"{baseline}:{LOCK}"], capture_output=True
    ).stdout
    if theirs != current:
        raise Refusal(
            f"{LOCK} of {baseline[:9]} differs from {repo / LOCK}: the baseline cannot reuse .venv; compare against "
            "a commit with the same lock, or build the baseline's venv in a checkout of it and time it by hand"
        )
    venv = repo / ".venv"
    stamp = repo / STAMP
    if not venv.is_dir():
        raise Refusal(
            f"{venv} does not exist: run `make venv` first (the baseline reuses this checkout's venv)"
        )
    if not stamp.is_file() or stamp.read_bytes() != current:
        raise Refusal(
            f"{stamp} is missing or is not {LOCK}: .venv was not installed from this lock; run `make venv`"
        )
    return venv.resolve()


@contextmanager
def baseline_worktree(repo: Path, commit: str, venv: Path):
    """A temporary worktree of ``commit`` with ``.venv`` linked to ``venv``; removed afterwards, whatever happens."""
    parent = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    path = parent / "checkout"
    git(repo, "worktree", "add", "--detach", "--quiet", str(path), commit)
    try:
        (path / ".venv").symlink_to(venv)
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "remove", "--force", str(path)],
            capture_output=True,
        )
        shutil.rmtree(parent, ignore_errors=True)
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True)


def make_command(targets: list[str]) -> list[str]:
    return ["make", "--no-print-directory", "-o", STAMP, *targets]


def has_target(path: Path, target: str) -> bool:
    """Whether the checkout's Makefile has ``target`` (``make -n``: nothing runs)."""
    out = subprocess.run(
        ["make", "-n", "-o", STAMP, target],
        cwd=path,
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    return "No rule to make target" not in out.stderr


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}


def measure(
    checkout: Checkout, name: str, rep: int, log_dir: Path, timeout_s: float
) -> Measurement:
    """One run of ``make <targets>`` (those of ``name`` the checkout has) in ``checkout`` under the reaper."""
    stem = log_dir / f"{name}-{checkout.side}-{rep + 1}"
    cmd = [
        sys.executable,
        str(REAPER),
        "--out",
        f"{stem}.json",
        "--log",
        f"{stem}.log",
        "--cwd",
        str(checkout.path),
        "--timeout",
        str(timeout_s),
        "--",
        *make_command(ran(checkout, name)),
    ]
    busy = machine_busy_s()
    reaper = subprocess.Popen(cmd, env=clean_env())
    try:
        reaper.wait()
    except BaseException:  # Ctrl-C: the reaper kills and reaps the command's tree before it exits
        reaper.send_signal(signal.SIGTERM)
        reaper.wait()
        raise
    busy = machine_busy_s() - busy
    if reaper.returncode != 0:
        raise RuntimeError(
            f"benchmarks/reaper.py exited {reaper.returncode} measuring {name} in {checkout.path}"
        )
    r = json.loads(Path(f"{stem}.json").read_text())
    return Measurement(
        name,
        checkout.side,
        rep,
        r["returncode"],
        r["wall_s"],
        r["cpu_s"],
        max(0.0, busy - r["cpu_s"]),
        r["processes_reaped"],
        r["orphans_reaped"],
        r["killed_after_linger"],
        r["timed_out"],
        f"{stem}.log",
    )


def ran(checkout: Checkout, name: str) -> list[str]:
    """The make targets of ``name`` that ``checkout`` has, in order."""
    return [t for t in TARGETS[name] if t in checkout.targets]


def plan(only: list[str], reps: int, suite_reps: int) -> list[tuple[str, int, tuple[str, str]]]:
    """(name, rep, order of sides) for every repetition; the order alternates per repetition."""
    return [
        (name, rep, SIDES if rep % 2 == 0 else SIDES[::-1])
        for name in TARGETS
        if name in only
        for rep in range(suite_reps if name in LONG else reps)
    ]


def run_plan(
    checkouts: dict[str, Checkout], steps, log_dir: Path, timeout_s: float, echo
) -> list[Measurement]:
    done = []
    for name, rep, order in steps:
        for side in order:
            checkout = checkouts[side]
            if not ran(checkout, name):
                continue
            m = measure(checkout, name, rep, log_dir, timeout_s)
            echo(
                f"  {name} rep {rep + 1} {side:<8} {m.wall_s:8.1f} s wall {m.cpu_s:8.1f} CPU s "
                f"(others {m.others_cpu_s:.0f} CPU s) exit {m.returncode}"
            )
            done.append(m)
    return done


# ------------------------------------------------------------------------------------- figures and goals


def spread(values: list[float]) -> dict | None:
    """Median and min-max of ``values`` (None when there are none)."""
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def of(measurements: list[Measurement], name: str, side: str) -> list[Measurement]:
    return sorted(
        (m for m in measurements if m.name == name and m.side == side), key=lambda m: m.rep
    )


def ratio_goal(
    title: str, target: float, current: list[Measurement], baseline: list[Measurement], what: str
) -> Goal:
    """current / baseline of ``what`` ("wall_s" or "cpu_s"), one ratio per repetition (the two ran side by side)."""
    label = "CPU seconds" if what == "cpu_s" else "wall time"
    goal_text = f"current / baseline {label} ≤ {target:g}"
    ratios = [
        getattr(c, what) / getattr(b, what)
        for c, b in zip(current, baseline)
        if getattr(b, what) > 0
    ]
    return judged(title, goal_text, target, ratios, current + baseline)


def fast_goal(
    checkouts: dict[str, Checkout], fast: list[Measurement], suite: list[Measurement]
) -> Goal:
    """``make test-fast`` wall / ``make test`` wall, this checkout: each fast run against the median suite run."""
    title, goal_text = (
        "make test-fast vs make test",
        f"test-fast wall / test wall ≤ 1/{round(1 / FAST_SHARE)}",
    )
    if "test-fast" not in checkouts["current"].targets:
        return Goal(title, goal_text, None, None, "not measurable: no test-fast target")
    if not suite:
        return Goal(
            title,
            goal_text,
            None,
            None,
            "not measurable: make test was not measured in this run (--only)",
        )
    suite_wall = statistics.median(m.wall_s for m in suite)
    return judged(title, goal_text, FAST_SHARE, [m.wall_s / suite_wall for m in fast], fast + suite)


def judged(
    title: str, goal_text: str, target: float, ratios: list[float], runs: list[Measurement]
) -> Goal:
    s = spread(ratios)
    if s is None:
        return Goal(title, goal_text, None, None, "not measured")
    failed = sorted(
        {f"{m.side} {m.name} exit {m.returncode}" for m in runs if m.returncode != 0 or m.timed_out}
    )
    if failed:  # a failed command's time says little about the goal: shown, not judged
        return Goal(title, goal_text, s["median"], None, "not judged: " + ", ".join(failed), s)
    return Goal(title, goal_text, s["median"], s["median"] <= target, "", s)


def goals(
    checkouts: dict[str, Checkout], measurements: list[Measurement], only: list[str]
) -> list[Goal]:
    found = []
    if "suite" in only:
        current, baseline = (
            of(measurements, "suite", "current"),
            of(measurements, "suite", "baseline"),
        )
        found.append(ratio_goal("make test CPU", SUITE_RATIO, current, baseline, "cpu_s"))
        found.append(ratio_goal("make test wall", SUITE_RATIO, current, baseline, "wall_s"))
    if "fast" in only:
        found.append(
            fast_goal(
                checkouts, of(measurements, "fast", "current"), of(measurements, "suite", "current")
            )
        )
    if "repro" in only:
        current, baseline = (
            of(measurements, "repro", "current"),
            of(measurements, "repro", "baseline"),
        )
        found.append(ratio_goal("make repro wall", REPRO_RATIO, current, baseline, "wall_s"))
    if "ci" in only:
        current, baseline = of(measurements, "ci", "current"), of(measurements, "ci", "baseline")
        found.append(
            ratio_goal("CI CPU (make rehearse-trn2 test)", CI_RATIO, current, baseline, "cpu_s")
        )
    return found


def rows(measurements: list[Measurement], checkouts: dict[str, Checkout]) -> list[list]:
    """One table row per command and checkout: medians and min-max over its repetitions."""
    out = []
    for name in TARGETS:
        for side in SIDES:
            ms = of(measurements, name, side)
            if ms:
                wall, cpu = spread([m.wall_s for m in ms]), spread([m.cpu_s for m in ms])
                out.append(
                    [
                        f"make {' '.join(ran(checkouts[side], name))}",
                        side,
                        len(ms),
                        wall["median"],
                        f"{wall['min']:.2f}-{wall['max']:.2f}",
                        cpu["median"],
                        f"{cpu['min']:.2f}-{cpu['max']:.2f}",
                        " ".join(str(m.returncode) for m in ms),
                        sum(m.others_cpu_s for m in ms),
                    ]
                )
    return out


def kept_figures(measurements: list[Measurement], checkouts: dict[str, Checkout]) -> dict:
    """Median CPU and wall seconds of each command and side, and the baseline's commit, for the history."""
    out = {"baseline": checkouts["baseline"].commit}
    for name in TARGETS:
        for side in SIDES:
            if ms := of(measurements, name, side):
                out[f"{name}_{side}_cpu_s"] = statistics.median(m.cpu_s for m in ms)
                out[f"{name}_{side}_wall_s"] = statistics.median(m.wall_s for m in ms)
    return out


HEADER = [
    "command",
    "checkout",
    "reps",
    "wall s",
    "wall min-max",
    "CPU s",
    "CPU min-max",
    "exit codes",
    "others' CPU s",
]


# ------------------------------------------------------------------------------------------------- the command


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks compare", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--baseline",
        default=DEFAULT_BASELINE,
        help=f"commit to compare against (default {DEFAULT_BASELINE})",
    )
    parser.add_argument(
        "--reps",
        type=int,
        default=3,
        help="repetitions of repro and test-fast per checkout (default 3)",
    )
    parser.add_argument(
        "--suite-reps",
        type=int,
        default=1,
        help="repetitions of make test (and of ci) per checkout (default 1)",
    )
    parser.add_argument(
        "--only",
        default=",".join(DEFAULT_ONLY),
        help=f"comma-separated subset of {','.join(TARGETS)} (default {','.join(DEFAULT_ONLY)})",
    )
    parser.add_argument(
        "--repo", type=Path, default=REPO_ROOT, help="the current checkout (default: this one)"
    )
    parser.add_argument(
        "--history", type=Path, default=HISTORY, help="JSON-lines file the goals are appended to"
    )
    parser.add_argument(
        "--out", type=Path, help="JSON file (default report/bench/compare-<date>.json)"
    )
    parser.add_argument(
        "--timeout", type=float, default=TIMEOUT_S, help="seconds one command may take"
    )
    args = parser.parse_args(argv)
    args.only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = [x for x in args.only if x not in TARGETS]
    if unknown or not args.only:
        parser.error(f"--only {','.join(unknown) or '(empty)'}: choose from {','.join(TARGETS)}")
    if args.reps < 1 or args.suite_reps < 1:
        parser.error("--reps and --suite-reps must be at least 1")
    return args


def document(
    args, argv: list[str], checkouts, measurements, found: list[Goal], started: str, load
) -> dict:

    judged_goals = [g.met for g in found if g.met is not None]
    return {
        "command": " ".join(["python -m benchmarks compare", *argv]),
        "date": started,
        "tier": "cpu",
        "versions": versions(),
        "machine": machine(),
        "commit": checkouts["current"].commit,
        "checkouts": {
            side: {"path": str(c.path), "commit": c.commit, "targets": sorted(c.targets)}
            for side, c in checkouts.items()
        },
        "figures": {"compare": kept_figures(measurements, checkouts)},
        "goals": [{"benchmark": "compare", **asdict(g)} for g in found],
        "all_goals_met": all(judged_goals)
        if judged_goals and len(judged_goals) == len(found)
        else None,
        "loadavg_before_after": load,
        "measurements": [asdict(m) for m in measurements],
    }


def show(
    doc: dict, measurements: list[Measurement], found: list[Goal], checkouts: dict[str, Checkout]
) -> str:
    m, c = doc["machine"], doc["checkouts"]
    lines = [
        f"baseline {c['baseline']['commit']} vs current {c['current']['commit']}",
        f"machine: {m['cpu_model']}, {m['cpus']} cores, CPU flags {' '.join(m['cpu_flags']) or 'none of interest'}; "
        f"load average {doc['loadavg_before_after'][0]} before, {doc['loadavg_before_after'][1]} after",
        "",
        table(HEADER, rows(measurements, checkouts)) if measurements else "(nothing measured)",
        "",
        "CPU s = user + sys of every process the command started (benchmarks/reaper.py); others' CPU s = what the "
        "rest of the machine used meanwhile (wall times are comparable only at similar contention).",
        "",
    ]
    return "\n".join(lines + [g.line() for g in found]) + "\n"


def compare(args, argv: list[str], echo=print) -> int:
    repo = args.repo.resolve()
    baseline = resolve_baseline(repo, args.baseline)
    venv = check_shared_venv(repo, baseline)
    started, load_before = time.strftime("%Y-%m-%dT%H:%M:%S%z"), round(os.getloadavg()[0], 2)
    log_dir = (
        args.out.parent if args.out else DEFAULT_OUT_DIR
    ) / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    log_dir.mkdir(parents=True, exist_ok=True)
    with baseline_worktree(repo, baseline, venv) as path:
        checkouts = {
            "baseline": Checkout("baseline", path, baseline),
            "current": Checkout("current", repo, commit_of(repo)),
        }
        for checkout in checkouts.values():
            checkout.targets = {
                t for ts in TARGETS.values() for t in ts if has_target(checkout.path, t)
            }
        echo(
            f"compare {args.baseline} ({baseline[:9]}) vs {repo}: {', '.join(args.only)}; logs in {log_dir}"
        )
        measurements = run_plan(
            checkouts, plan(args.only, args.reps, args.suite_reps), log_dir, args.timeout, echo
        )
    found = goals(checkouts, measurements, args.only)
    load = [load_before, round(os.getloadavg()[0], 2)]
    doc = document(args, argv, checkouts, measurements, found, started, load)
    echo(show(doc, measurements, found, checkouts))
    out = args.out or DEFAULT_OUT_DIR / f"compare-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    append_history(args.history, doc)
    echo(f"written: {out}; history: {args.history}")
    return 0


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        return compare(args, argv)
    except Refusal as e:
        print(f"python -m benchmarks compare: error: {e}", file=sys.stderr)
        return 2

"""``python -m benchmarks [suite|overhead|recipes|all|compare]``: figures about the suite, not timed tests.

    compare   issue 27's goals: make test, test-fast, repro here vs a baseline commit (benchmarks/compare.py);
              issue 37's CI ratio with --only ci --baseline 327d3b6
    plan      the trn2 night's plan (harness/night/plan.py): its totals against issue 37's goals (seconds to run)
    overhead  `python -m harness run` vs a bare `torchrun -m torchtitan.train` of the same config
    recipes   per recipe: step time, tokens/s, peak memory (trn2: MFU, compile cold vs warm)
    suite     wall time of `pytest -m cpu -n auto`, per test (several minutes)

Prints a table per benchmark and writes one JSON file (rewritten after each
benchmark, so a long run keeps what it measured). Missed goals are reported,
not errors: the exit code is 1 only when a benchmark could not run at all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

from benchmarks.common import (
    DEFAULT_OUT_DIR,
    HISTORY,
    Section,
    append_history,
    commit_of,
    machine,
    table,
)
from benchmarks.compare import main as compare_main
from benchmarks.plan import bench_plan
from benchmarks.suite import bench_suite
from harness.base.environment import versions
from harness.base.readable import Unreadable, kind_of, text_of
from recipes.tiers import REPO_ROOT

ORDER = ("plan", "overhead", "recipes", "suite")


def benchmark(name: str):
    """The benchmark function for ``name`` (imported late: each pulls in the recipes it measures)."""
    if name == "plan":
        return bench_plan
    if name == "overhead":
        from benchmarks.overhead import bench_overhead  # noqa: PLC0415 -- heavy: benchmarks.overhead imports torch (torch 2.9 s); this module stays light

        return bench_overhead
    if name == "recipes":
        from benchmarks.per_recipe import bench_recipes  # noqa: PLC0415 -- heavy: benchmarks.per_recipe imports torch (torch 2.9 s); this module stays light

        return bench_recipes

    return bench_suite


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("which", nargs="?", default="all", choices=[*ORDER, "all"])
    parser.add_argument("--tier", default="cpu", choices=("cpu", "trn2"))
    parser.add_argument(
        "--out", type=Path, help="JSON file (default: report/bench/<which>-<tier>-<date>.json)"
    )
    parser.add_argument(
        "--steps", type=int, default=10, help="training steps per launch (default 10)"
    )
    parser.add_argument(
        "--seq-len", type=int, help="tokens per sequence (default: the tier's, cpu 256)"
    )
    parser.add_argument(
        "--nproc", type=int, help="processes per launch (default: the tier's, cpu 2)"
    )
    parser.add_argument(
        "--reps", type=int, default=4, help="overhead: launches per path, interleaved (default 4)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary run directories")
    parser.add_argument(
        "--history", type=Path, default=HISTORY, help="JSON-lines file the run is appended to"
    )
    return parser.parse_args(argv)


def run_section(name: str, args) -> Section:
    """Run one benchmark; an unexpected exception becomes the section's error, not a crash."""
    load_before, started = os.getloadavg(), time.perf_counter()
    try:
        section = benchmark(name)(args)
    except Exception:  # noqa: BLE001 - report and go on to the next benchmark
        section = Section(name, error=traceback.format_exc())
    section.context = {
        "bench_wall_s": round(time.perf_counter() - started, 1),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    return section


def document(args, argv: list[str], date: str, sections: list[Section]) -> dict:

    goals = [{"benchmark": s.name, **asdict(g)} for s in sections for g in s.goals]
    measured = [g["met"] for g in goals if g["met"] is not None]
    return {
        "command": " ".join(["python -m benchmarks", *argv]),
        "date": date,
        "tier": args.tier,
        "commit": commit_of(REPO_ROOT),
        "figures": {s.name: s.kept for s in sections if s.kept},
        "versions": versions(),
        "machine": machine(),
        "goals": goals,
        "all_goals_met": all(measured) if measured and len(measured) == len(goals) else None,
        "benchmarks": {s.name: s.to_dict() for s in sections},
    }


def show(section: Section) -> str:
    lines = [f"== {section.name} ==", ""]
    if section.skipped:
        lines.append(f"skipped: {section.skipped}")
    if section.error:
        lines.append(f"ERROR (benchmark did not run):\n{section.error}")
    if section.rows:
        lines += [table(section.header, section.rows), ""]
    lines += [f"  {n}" for n in section.notes]
    lines += [g.line() for g in section.goals]
    ctx = section.context
    if ctx:
        lines.append(
            f"({ctx['bench_wall_s']:.0f} s; load average {ctx['loadavg_before'][0]} before, "
            f"{ctx['loadavg_after'][0]} after, on {os.cpu_count()} cores)"
        )
    return "\n".join(lines) + "\n"


def default_out(which: str, tier: str, stamp: str) -> Path:
    return DEFAULT_OUT_DIR / f"{which}-{tier}-{stamp}.json"


def check_files(args) -> None:
    """``--history`` (appended to) and ``--out`` (written) before any benchmark runs: ``Unreadable``, one line."""
    for flag, path in (("--history", args.history), ("--out", args.out)):
        kind = kind_of(path) if path is not None and os.path.lexists(path) else None
        if kind is not None:
            raise Unreadable(f"{flag} {path} is {kind}, not a file; pass {flag} a file path")
    if os.path.lexists(args.history) and args.history.stat().st_size:
        fix = "pass --history a JSON-lines file of earlier runs, or a new path"
        text = text_of(args.history, "a benchmark history (JSON lines)", fix)
        for number, line in enumerate(text.splitlines(), 1):
            try:
                record = json.loads(line) if line.strip() else {}
            except json.JSONDecodeError:
                record = None
            if not isinstance(record, dict):
                raise Unreadable(
                    f"--history {args.history} line {number} is not a JSON object, so it is not "
                    f"a benchmark history; {fix}"
                )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sys.stdout.reconfigure(line_buffering=True)  # progress shows up live under make/CI too
    if argv[:1] == ["compare"]:
        return compare_main(argv[1:])
    args = parse_args(argv)
    try:
        check_files(args)
    except Unreadable as e:
        print(f"python -m benchmarks: error: {e}", file=sys.stderr)
        return 2
    date = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    out = (args.out or default_out(args.which, args.tier, time.strftime("%Y%m%d-%H%M%S"))).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    names = ORDER if args.which == "all" else (args.which,)
    sections = []
    for name in names:
        print(f"benchmark {name} ({args.tier}) …")
        sections.append(run_section(name, args))
        print(show(sections[-1]))
        out.write_text(
            json.dumps(document(args, argv, date, sections), indent=2, default=str) + "\n"
        )
    doc = document(args, argv, date, sections)
    print("goals:")
    for goal in doc["goals"]:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[goal["met"]]
        measured = "–" if goal["measured"] is None else f"{goal['measured']:.4g}"
        print(
            f"  {goal['benchmark']}: {goal['name']}: measured {measured} vs target {goal['target']}: {verdict}"
        )
    append_history(args.history, doc)
    print(f"written: {out}; history: {args.history}")
    return 1 if any(s.error for s in sections) else 0


if __name__ == "__main__":
    sys.exit(main())

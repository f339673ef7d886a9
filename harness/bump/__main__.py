"""``python -m harness.bump PKGS...``: the rehearsal's steps in order, and its exit status.

The command line and the order of the steps (plan, resolve, venv, baseline, candidate run,
compare, report) live here; what each step does lives in its own module of this package.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from dataclasses import asdict
from pathlib import Path

import harness.bump
from harness.base.environment import pins
from harness.bump.bisect import main as bisect
from harness.bump.candidate import build_venv, moves, resolve
from harness.bump.comparison import compare
from harness.bump.plan import (
    BASELINE_VENV,
    BUMP_REPORTS,
    EXIT_CANNOT_REHEARSE,
    EXIT_OK,
    BumpError,
    Plan,
    plan,
    rel,
    to_stderr,
)
from harness.bump.report import versions_line, write_refusal, write_report
from harness.bump.results import load_run
from harness.bump.tier import BASELINE_MAX_AGE_H, TierRun, baseline_is_current, run_tier


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m harness.bump", description=harness.bump.__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "pins", nargs="*", help="name==version, e.g. transformers==5.23.0 torch==2.15.0"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan; resolve, install and run nothing"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="rebuild the bump report from the last runs"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a report dir with tests.json (and junit.xml) to use as the baseline",
    )
    parser.add_argument(
        "--rerun-baseline",
        action="store_true",
        help="run the baseline even if a current one exists",
    )
    parser.add_argument("--baseline-max-age-h", type=float, default=BASELINE_MAX_AGE_H)
    parser.add_argument(
        "--reports", type=Path, default=BUMP_REPORTS, help="where bump reports go (report/bump)"
    )
    parser.add_argument(
        "--bisect",
        action="store_true",
        help="which package and release move a check "
        "(harness/bump/bisect.py; `--bisect --help` for its options)",
    )
    return parser.parse_args(argv)


def get_baseline(plan: Plan, args: argparse.Namespace, log=print) -> Path:
    """The lock's run: given, reused while current, or run now with ``.venv``."""
    if args.baseline:
        return args.baseline
    recorded = TierRun.load(plan.baseline)
    if not args.rerun_baseline and (
        args.report_only or baseline_is_current(recorded, plan.lock, args.baseline_max_age_h)
    ):
        log(
            f"reusing the baseline in {rel(plan.baseline)} (finished {recorded.finished if recorded else '?'})"
        )
        return plan.baseline
    run_tier(BASELINE_VENV / "bin" / "python", plan.baseline, plan.lock, log)
    return plan.baseline


#: Each "broke" is run this many more times before it is reported (as transformers' check_bad_commit does).
RERUNS = 2


def rerun_broken(python: Path, bump: Plan, tests: list[str], log=print) -> dict[str, list[str]]:
    """Every test that broke, run again ``RERUNS`` times, serially, in the candidate's venv: its outcomes."""
    outcomes: dict[str, list[str]] = {t: [] for t in tests}
    for i in range(1, RERUNS + 1):
        report_dir = bump.candidate_report.parent / f"{bump.candidate_report.name}-rerun-{i}"
        run_tier(python, report_dir, bump.candidate_lock, log, tests=tuple(tests))
        results = load_run(report_dir)[0]
        for test in tests:
            outcomes[test].append(results[test].outcome if test in results else "absent")
    return outcomes


def main(argv: list[str] | None = None, log=print, refuse=to_stderr) -> int:
    """``log``: progress (stdout); ``refuse``: the one line of a refusal (stderr), exit 2."""
    argv = sys.argv[1:] if argv is None else argv
    if (
        "--bisect" in argv
    ):  # which package and release of a candidate set moves a check (harness/bump/bisect.py)
        return bisect([a for a in argv if a != "--bisect"], log, refuse)
    args = parse_args(argv)
    try:
        bump = plan(args.pins, reports=args.reports)
    except BumpError as e:
        refuse(f"bump: {e}")
        return EXIT_CANNOT_REHEARSE
    for line in bump.lines():
        log(line)
    if args.dry_run:
        return EXIT_OK
    try:
        if not args.report_only:
            resolve(bump, log=log)
        elif not bump.candidate_lock.exists():
            raise BumpError(
                f"{rel(bump.candidate_lock)} does not exist: run the rehearsal without --report-only first"
            )
        moved = moves(pins(bump.lock), pins(bump.candidate_lock), bump.pins)
        for m in moved:
            log(f"  {m.line()}")
        if not args.report_only:
            python = build_venv(bump, log)
        baseline_dir = get_baseline(bump, args, log)
        if not args.report_only:
            run_tier(python, bump.candidate_report, bump.candidate_lock, log)
        lock_run, cand_run = load_run(baseline_dir), load_run(bump.candidate_report)
    except BumpError as e:
        refuse(f"bump: not rehearsed: {e}")
        write_refusal(bump, str(e))
        return EXIT_CANNOT_REHEARSE
    comparison = compare(lock_run, cand_run, moved)
    if comparison.broke() and not args.report_only:
        comparison = comparison.with_reruns(rerun_broken(python, bump, comparison.broke(), log))
    runs = {
        label: asdict(TierRun.load(d) or TierRun(python="?", report_dir=str(d)))
        for label, d in (("baseline", baseline_dir), ("candidate", bump.candidate_report))
    }
    meta = {
        "date": dt.date.today().isoformat(),
        "lock_versions": versions_line(lock_run[2]),
        "candidate_versions": versions_line(cand_run[2]),
        **runs,
    }
    write_report(bump, comparison, moved, meta)
    log(
        f"bump report: {rel(bump.report_md)} ({', '.join(f'{k} {v}' for k, v in sorted(comparison.counts().items()))})"
    )
    for b in comparison.published:
        log(f"  BROKEN published check: {b.recipe} {b.key}: {b.verdict}")
    if comparison.broke():
        log(
            f'  which package and release: make bisect BISECT_ARGS="--from-bump {rel(bump.report_json)}"'
        )
    return comparison.exit_code


if __name__ == "__main__":
    sys.exit(main())

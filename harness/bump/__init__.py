"""Rehearse a version bump: what a new torch / transformers / torchtitan would break or fix.

``python -m harness.bump transformers==5.23.0 [torch==2.15.0 ...]`` (``make bump PKGS=...``)

1. **resolve**: ``requirements.in`` with those pins replaced, compiled by pip-tools against
   ``requirements-lock.txt`` (every other pin stays unless it has to move), into a candidate
   lock; what moved is listed. A pin this machine's pip refuses (a ``constraint`` file in
   pip's config, e.g. the torch cap in ``/etc/xdg/pip``) is reported, not worked around.
2. **venv**: ``.venv-bump-<hash>`` from the candidate lock (hashes required, as ``make venv``),
   reused while its candidate lock is unchanged.
3. **run**: the cpu tier (``pytest -m cpu -n auto``) in that venv, and a baseline on the lock
   (``.venv``; reused while lock, code and tests are unchanged and it is recent), each with
   its own ``--report-dir`` under ``report/bump/`` (so ``report/tests.json`` is left alone)
   and a JUnit file for the failure messages.
4. **compare**: ``report/bump/<name>.md`` and ``.json``: one table (each test's verdict on the
   lock and on the candidate), then each canary that flipped, each golden that moved, each
   workaround that broke (``recipes.upstream_shape`` messages).

Exit status: 0; 1 when the candidate breaks a published-number check (a ``published`` or
``proxy`` golden that fails or is no longer measured); 2 when the rehearsal could not run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from dataclasses import asdict
from pathlib import Path

from harness.bump.candidate import Move, build_venv, moves, resolve
from harness.bump.comparison import Comparison, GoldenMove, compare
from harness.bump.plan import BASELINE_VENV, BUMP_REPORTS, EXIT_CANNOT_REHEARSE, EXIT_OK, BumpError, Plan, plan, rel
from harness.bump.results import load_run
from harness.bump.tier import BASELINE_MAX_AGE_H, TierRun, baseline_is_current, run_tier
from harness.lockcheck import pins
from harness.report import md_table

#: How the table orders its rows: what a reader must act on first, unchanged tests last.
CHANGE_ORDER = ("canary flipped", "broke", "fixed", "not run", "new", "expected (the bump)", "same")


# --- the report ---------------------------------------------------------------------------------


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.10g}"
    return "–" if value is None else json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def _golden_cell(value) -> str:
    """A value in the goldens table: a curve as its length and ends, not a hundred numbers."""
    if isinstance(value, list) and len(value) > 4:
        return f"{len(value)} steps: {_fmt(value[0])} … {_fmt(value[-1])}"
    return _fmt(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(plan: Plan, comparison: Comparison, moved: list[Move], meta: dict) -> str:
    """The bump report: one table first, then canaries, goldens, workarounds, published checks."""
    c = comparison
    verdict = ("**breaks a published-number check**" if c.published else "no published-number check broken")
    lines = [
        f"# Bump rehearsal: {' '.join(map(str, plan.pins))}",
        "",
        f"{meta['date']}: {verdict}. Lock {meta['lock_versions']} vs candidate {meta['candidate_versions']}; "
        f"changes: {', '.join(f'{k} {v}' for k, v in sorted(c.counts().items()))}.",
        "",
    ]
    if code_changed(meta):
        lines += ["**The code (recipes/, harness/, tests/, fixtures/) changed between the two runs**: a verdict that changed "
                  "may be the code's doing, not the bump's.", ""]
    order = {change: i for i, change in enumerate(CHANGE_ORDER)}
    rows = sorted(c.rows, key=lambda r: (order.get(r.change, order["same"] - 0.5), r.test))
    lines += md_table(
        ["test", "lock", "candidate", "change", "why (candidate's failure)"],
        [[row.test, row.lock, row.candidate, row.change, _cell(row.message)] for row in rows],
    )
    lines += ["", "## What moved in the lock", ""]
    lines += [f"- {m.line()}" for m in moved] or ["- nothing (the candidate is the lock)"]
    lines += ["", "## Canaries that flipped", ""]
    lines += [f"- `{f.test}`: {f.lock} → {f.candidate}: {f.meaning}. {_cell(f.message)}" for f in c.canaries] or [
        "- none: every upstream defect a workaround exists for is in the same state on the candidate"]
    lines += ["", "## Goldens that moved", ""]
    def golden_table(moves: list[GoldenMove]) -> list[str]:
        header = ["recipe", "tier", "value", "lane", "lock", "candidate", "difference (new − old)", "candidate verdict"]
        return md_table(header, [
            [g.recipe, g.tier, g.key, g.lane or "–", _golden_cell(g.old), _golden_cell(g.new), _fmt(g.difference),
             g.verdict or "not measured"]
            for g in moves
        ])  # fmt: skip

    moved_goldens = [g for g in c.goldens if g.old is not None and g.new is not None]
    one_sided = [g for g in c.goldens if g.old is None or g.new is None]
    lines += golden_table(moved_goldens) if moved_goldens else [
        "- none: every golden value measured in both runs is bitwise the same"]
    if one_sided:
        lines += ["", "Measured in one run only (– : not measured there; a new test, a test that failed first, "
                  "or the code changed between the runs):", ""] + golden_table(one_sided)
    lines += ["", "## Workarounds that broke", ""]
    lines += [f"- {_cell(w.message)} ({len(w.tests)} test(s): {', '.join(w.tests[:3])}"
              f"{', …' if len(w.tests) > 3 else ''})" for w in c.workarounds] or [
        "- none: every workaround found the upstream shape it relies on"]
    lines += ["", "## Published-number checks the candidate breaks", ""]
    lines += [f"- {b.recipe} {b.key} ({b.lane}): published {_fmt(b.published)}, measured {_fmt(b.measured)}: {b.verdict}"
              for b in c.published] or ["- none"]
    lines += ["", "## Runs", ""]
    for label in ("baseline", "candidate"):
        run = meta[label]
        if run.get("finished") is None:  # --baseline DIR from another run: no run.json of ours beside it
            lines.append(f"- {label}: the report in {run['report_dir']} (given with --baseline; how it ran is not recorded)")
            continue
        lines.append(f"- {label}: `{run['python']}`, {run['summary']} in {run['seconds']} s "
                     f"(finished {run['finished']}; report {run['report_dir']})")
    return "\n".join(lines) + "\n"


def code_changed(meta: dict) -> bool:
    """Whether the baseline and the candidate ran different code (both hashes known and unequal)."""
    hashes = [meta.get(label, {}).get("code_sha256") for label in ("baseline", "candidate")]
    return None not in hashes and hashes[0] != hashes[1]


def versions_line(versions: dict) -> str:
    return ", ".join(f"{k} {versions.get(k)}" for k in ("torch", "transformers", "torchtitan"))


def write_report(plan: Plan, comparison: Comparison, moved: list[Move], meta: dict) -> None:
    plan.report_md.write_text(markdown(plan, comparison, moved, meta))
    data = {
        "bump": [str(p) for p in plan.pins],
        **meta,
        "exit_code": comparison.exit_code,
        "code_changed_between_runs": code_changed(meta),
        "moved": [asdict(m) for m in moved],
        "counts": comparison.counts(),
        "tests": [asdict(r) for r in comparison.rows],
        "canaries_flipped": [asdict(f) for f in comparison.canaries],
        "goldens_moved": [asdict(g) for g in comparison.goldens],
        "workarounds_broke": [asdict(w) for w in comparison.workarounds],
        "published_broken": [asdict(b) for b in comparison.published],
    }
    plan.report_json.write_text(json.dumps(data, indent=2, default=str) + "\n")


def write_refusal(plan: Plan, reason: str) -> None:
    """A rehearsal that could not run still leaves a report saying why (the README table cites it)."""
    plan.report_md.parent.mkdir(parents=True, exist_ok=True)
    date = dt.date.today().isoformat()
    plan.report_md.write_text(f"# Bump rehearsal: {' '.join(map(str, plan.pins))}\n\n{date}: not rehearsed: {reason}\n")
    plan.report_json.write_text(json.dumps({"bump": [str(p) for p in plan.pins], "date": date,
                                            "exit_code": EXIT_CANNOT_REHEARSE, "not_rehearsed": reason}, indent=2) + "\n")


# --- the command --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.bump", description=__doc__.split("\n\n")[0])
    parser.add_argument("pins", nargs="*", help="name==version, e.g. transformers==5.23.0 torch==2.15.0")
    parser.add_argument("--dry-run", action="store_true", help="print the plan; resolve, install and run nothing")
    parser.add_argument("--report-only", action="store_true", help="rebuild the bump report from the last runs")
    parser.add_argument("--baseline", type=Path, help="a report dir with tests.json (and junit.xml) to use as the baseline")
    parser.add_argument("--rerun-baseline", action="store_true", help="run the baseline even if a current one exists")
    parser.add_argument("--baseline-max-age-h", type=float, default=BASELINE_MAX_AGE_H)
    parser.add_argument("--reports", type=Path, default=BUMP_REPORTS, help="where bump reports go (report/bump)")
    return parser.parse_args(argv)


def get_baseline(plan: Plan, args: argparse.Namespace, log=print) -> Path:
    """The lock's run: given, reused while current, or run now with ``.venv``."""
    if args.baseline:
        return args.baseline
    recorded = TierRun.load(plan.baseline)
    if not args.rerun_baseline and (args.report_only or baseline_is_current(recorded, plan.lock, args.baseline_max_age_h)):
        log(f"reusing the baseline in {rel(plan.baseline)} (finished {recorded.finished if recorded else '?'})")
        return plan.baseline
    run_tier(BASELINE_VENV / "bin" / "python", plan.baseline, plan.lock, log)
    return plan.baseline


def main(argv: list[str] | None = None, log=print) -> int:
    args = parse_args(argv)
    try:
        bump = plan(args.pins, reports=args.reports)
    except BumpError as e:
        log(f"bump: {e}")
        return EXIT_CANNOT_REHEARSE
    for line in bump.lines():
        log(line)
    if args.dry_run:
        return EXIT_OK
    try:
        if not args.report_only:
            resolve(bump, log=log)
        elif not bump.candidate_lock.exists():
            raise BumpError(f"{rel(bump.candidate_lock)} does not exist: run the rehearsal without --report-only first")
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
        log(f"bump: not rehearsed: {e}")
        write_refusal(bump, str(e))
        return EXIT_CANNOT_REHEARSE
    comparison = compare(lock_run, cand_run, moved)
    runs = {label: asdict(TierRun.load(d) or TierRun(python="?", report_dir=str(d)))
            for label, d in (("baseline", baseline_dir), ("candidate", bump.candidate_report))}
    meta = {
        "date": dt.date.today().isoformat(),
        "lock_versions": versions_line(lock_run[2]),
        "candidate_versions": versions_line(cand_run[2]),
        **runs,
    }
    write_report(bump, comparison, moved, meta)
    log(f"bump report: {rel(bump.report_md)} ({', '.join(f'{k} {v}' for k, v in sorted(comparison.counts().items()))})")
    for b in comparison.published:
        log(f"  BROKEN published check: {b.recipe} {b.key}: {b.verdict}")
    return comparison.exit_code


if __name__ == "__main__":
    sys.exit(main())

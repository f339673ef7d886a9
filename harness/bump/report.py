"""The bump report: ``report/bump/<name>.md`` and ``.json`` from a comparison of two runs.

One table first (each test's verdict on the lock and on the candidate, what a reader must act
on first), then what moved in the lock, the canaries that flipped, the goldens that moved, the
workarounds that broke and the published-number checks broken. A rehearsal that could not run
still leaves a report saying why (:func:`write_refusal`).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict

from harness.bump.candidate import Move
from harness.bump.comparison import Comparison, GoldenMove
from harness.bump.plan import EXIT_CANNOT_REHEARSE, Plan
from harness.report.markdown import md_table

#: How the table orders its rows: what a reader must act on first, unchanged tests last.
CHANGE_ORDER = ("canary flipped", "broke", "fixed", "not run", "new", "expected (the bump)", "same")


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.10g}"
    return (
        "–"
        if value is None
        else json.dumps(value)
        if isinstance(value, (list, dict))
        else str(value)
    )


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
    verdict = (
        "**breaks a published-number check**" if c.published else "no published-number check broken"
    )
    lines = [
        f"# Bump rehearsal: {' '.join(map(str, plan.pins))}",
        "",
        f"{meta['date']}: {verdict}. Lock {meta['lock_versions']} vs candidate {meta['candidate_versions']}; "
        f"changes: {', '.join(f'{k} {v}' for k, v in sorted(c.counts().items()))}.",
        "",
    ]
    if code_changed(meta):
        lines += [
            "**The code (recipes/, harness/, tests/, fixtures/) changed between the two runs**: a verdict that changed "
            "may be the code's doing, not the bump's.",
            "",
        ]
    order = {change: i for i, change in enumerate(CHANGE_ORDER)}
    rows = sorted(c.rows, key=lambda r: (order.get(r.change, order["same"] - 0.5), r.test))
    lines += md_table(
        ["test", "lock", "candidate", "change", "why (candidate's failure)"],
        [[row.test, row.lock, row.candidate, row.change, _cell(row.message)] for row in rows],
    )
    lines += ["", "## What moved in the lock", ""]
    lines += [f"- {m.line()}" for m in moved] or ["- nothing (the candidate is the lock)"]
    lines += ["", "## Canaries that flipped", ""]
    lines += [
        f"- `{f.test}`: {f.lock} → {f.candidate}: {f.meaning}. {_cell(f.message)}"
        for f in c.canaries
    ] or [
        "- none: every upstream defect a workaround exists for is in the same state on the candidate"
    ]
    lines += ["", "## Goldens that moved", ""]

    def golden_table(moves: list[GoldenMove]) -> list[str]:
        header = [
            "recipe",
            "tier",
            "value",
            "lane",
            "lock",
            "candidate",
            "difference (new − old)",
            "candidate verdict",
        ]
        return md_table(
            header,
            [
                [
                    g.recipe,
                    g.tier,
                    g.key,
                    g.lane or "–",
                    _golden_cell(g.old),
                    _golden_cell(g.new),
                    _fmt(g.difference),
                    g.verdict or "not measured",
                ]
                for g in moves
            ],
        )

    moved_goldens = [g for g in c.goldens if g.old is not None and g.new is not None]
    one_sided = [g for g in c.goldens if g.old is None or g.new is None]
    lines += (
        golden_table(moved_goldens)
        if moved_goldens
        else ["- none: every golden value measured in both runs is bitwise the same"]
    )
    if one_sided:
        lines += [
            "",
            "Measured in one run only (– : not measured there; a new test, a test that failed first, "
            "or the code changed between the runs):",
            "",
        ] + golden_table(one_sided)
    lines += ["", "## Workarounds that broke", ""]
    lines += [
        f"- {_cell(w.message)} ({len(w.tests)} test(s): {', '.join(w.tests[:3])}"
        f"{', …' if len(w.tests) > 3 else ''})"
        for w in c.workarounds
    ] or ["- none: every workaround found the upstream shape it relies on"]
    lines += ["", "## Published-number checks the candidate breaks", ""]
    lines += [
        f"- {b.recipe} {b.key} ({b.lane}): published {_fmt(b.published)}, measured {_fmt(b.measured)}: {b.verdict}"
        for b in c.published
    ] or ["- none"]
    lines += ["", "## Runs", ""]
    for label in ("baseline", "candidate"):
        run = meta[label]
        if (
            run.get("finished") is None
        ):  # --baseline DIR from another run: no run.json of ours beside it
            lines.append(
                f"- {label}: the report in {run['report_dir']} (given with --baseline; how it ran is not recorded)"
            )
            continue
        lines.append(
            f"- {label}: `{run['python']}`, {run['summary']} in {run['seconds']} s "
            f"(finished {run['finished']}; report {run['report_dir']})"
        )
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
    plan.report_md.write_text(
        f"# Bump rehearsal: {' '.join(map(str, plan.pins))}\n\n{date}: not rehearsed: {reason}\n"
    )
    plan.report_json.write_text(
        json.dumps(
            {
                "bump": [str(p) for p in plan.pins],
                "date": date,
                "exit_code": EXIT_CANNOT_REHEARSE,
                "not_rehearsed": reason,
            },
            indent=2,
        )
        + "\n"
    )

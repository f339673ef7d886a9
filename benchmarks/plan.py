"""The trn2 night's plan against issue 37's goals: its totals, kept commit over commit.

The figures are the plan's estimates (harness/night/plan.py, each constant with its basis), not a
night's measurements: what a change to the catalogue or the estimates does to the night shows
here, in benchmarks/history.jsonl, before a chip is booked. The real night's measured minutes
sit beside these estimates in its own report (``harness.night.plan.measured_lines``).
"""

from __future__ import annotations

from benchmarks.common import Goal, Section
from harness.night import plan as nightly

#: Issue 37 goal 1, in minutes (launches for the last).
STABLE_WARM_MAX = 100
CHANGED_WARM_MAX = 150
COLD_MAX = 300
FIRST_VERDICT_WARM_MAX = 30
STABLE_LAUNCHES_MAX = 8


def _at_most(name: str, measured: float, target: float, unit: str = "min") -> Goal:
    return Goal(
        name, f"≤ {target:g} {unit} (by the plan's estimates)", measured, measured <= target
    )


def bench_plan(args) -> Section:
    section = Section("plan")
    nights = {}
    for night in (nightly.STABLE, nightly.CHANGED):
        plan = nightly.steps(night)
        total = nightly.totals(plan)
        nights[night] = {
            "launches": sum(s.launches for s in plan),
            "warm_min": total.warm,
            "cold_min": total.cold,
            "host_reference_min": total.parts["host reference"],
        }
    first, at = nightly.first_published_verdict()
    timeout = nightly.workflow_timeout_minutes()
    section.header = [
        "night",
        "64-rank launches",
        "warm min",
        "cold min",
        "host reference min (beside)",
    ]
    section.rows = [
        [night, n["launches"], n["warm_min"], n["cold_min"], n["host_reference_min"]]
        for night, n in nights.items()
    ]
    section.figures = {
        "nights": nights,
        "first_published_verdict": {"launch": first, "warm_min": at.warm, "cold_min": at.cold},
        "workflow_timeout_minutes": timeout,
    }
    stable, changed = nights[nightly.STABLE], nights[nightly.CHANGED]
    section.kept = {
        **{f"{night}_{key}": value for night, n in nights.items() for key, value in n.items()},
        "first_verdict_warm_min": at.warm,
        "first_verdict_cold_min": at.cold,
        "workflow_timeout_min": timeout,
    }
    section.goals = [
        _at_most("stable night warm", stable["warm_min"], STABLE_WARM_MAX),
        _at_most("changed night warm", changed["warm_min"], CHANGED_WARM_MAX),
        _at_most("changed night cold (the first night)", changed["cold_min"], COLD_MAX),
        _at_most("first published verdict, warm", at.warm, FIRST_VERDICT_WARM_MAX),
        _at_most(
            "64-rank launches on a stable night",
            stable["launches"],
            STABLE_LAUNCHES_MAX,
            "launches",
        ),
    ]
    section.notes = [
        f"first published verdict after {first}: {at.warm:.0f} min warm, {at.cold:.0f} cold; workflow "
        f"timeout-minutes {timeout}.",
        "estimates, not measurements: harness/night/plan.py says what each constant is based on.",
    ]
    return section

"""Issue 37 goal 3: ``python -m benchmarks plan`` keeps the night's plan totals, commit over commit."""

from __future__ import annotations

import json

import pytest

from benchmarks import __main__ as bench
from benchmarks.common import commit_of
from harness.declare import catalogue
from harness.night import plan as nightly
from recipes.tiers import REPO_ROOT


def run_plan(tmp_path) -> tuple[dict, dict]:
    """(the report written to report/bench's place, the history line appended)."""
    out, history = tmp_path / "plan.json", tmp_path / "history.jsonl"
    assert bench.main(["plan", "--out", str(out), "--history", str(history)]) == 0
    (line,) = [json.loads(x) for x in history.read_text().splitlines()]
    return json.loads(out.read_text()), line


def test_the_plan_section_keeps_each_nights_totals_with_the_commit(tmp_path):
    doc, line = run_plan(tmp_path)
    kept = line["figures"]["plan"]
    every_night = [x for x in catalogue.LAUNCHES.values() if x.when == catalogue.EVERY_NIGHT]
    assert kept["stable_launches"] == len(every_night) and kept["changed_launches"] == len(
        catalogue.LAUNCHES
    )
    assert (
        kept["changed_cold_min"]
        == doc["benchmarks"]["plan"]["figures"]["nights"]["changed"]["cold_min"]
    )
    assert kept["workflow_timeout_min"] == nightly.workflow_timeout_minutes()
    assert line["commit"] == commit_of(REPO_ROOT) and len(line["commit"].split()[0]) == 40
    goals = {g["name"]: g for g in line["goals"]}
    assert goals["changed night cold (the first night)"]["measured"] == kept["changed_cold_min"]
    assert goals["changed night cold (the first night)"]["met"] == (kept["changed_cold_min"] <= 300)


@pytest.mark.parametrize("cold_compile_min, cold_met", [(30.0, True), (60.0, False)])
def test_the_cold_goal_follows_the_plans_estimates(
    cold_compile_min, cold_met, tmp_path, monkeypatch
):
    """Four compile families: 30 min each keeps the first night under 300 min, 60 each does not."""
    monkeypatch.setattr(nightly, "COMPILE_COLD_MIN", cold_compile_min)
    _, line = run_plan(tmp_path)
    (cold,) = [g for g in line["goals"] if g["name"] == "changed night cold (the first night)"]
    assert (
        cold["met"] is cold_met and cold["measured"] == line["figures"]["plan"]["changed_cold_min"]
    )

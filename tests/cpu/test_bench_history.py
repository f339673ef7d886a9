"""The benchmark history: one JSON line per run, appended, never rewritten."""

from __future__ import annotations

import json

from benchmarks.__main__ import append_history


def test_each_benchmark_run_appends_one_line_with_goals_versions_and_machine(tmp_path):
    history = tmp_path / "history.jsonl"
    history.write_text('{"date": "earlier"}\n')
    doc = {
        "date": "2026-12-03T08:00:00+0000",
        "command": "python -m benchmarks overhead",
        "tier": "cpu",
        "versions": {"torch": "2.14.0"},
        "machine": {"cpu": "x"},
        "all_goals_met": False,
        "goals": [
            {
                "benchmark": "overhead",
                "name": "ratio",
                "target": "<= 1.10",
                "measured": 1.6,
                "met": False,
            }
        ],
        "benchmarks": {"overhead": {"rows": ["not kept in the history"]}},
        "commit": "0123abc",
        "figures": {"overhead": {"harness_run_cpu_s_per_launch": 6.1}},
    }
    append_history(history, doc)
    lines = [json.loads(line) for line in history.read_text().splitlines()]
    assert lines[0] == {"date": "earlier"}
    assert lines[1]["goals"][0]["measured"] == 1.6 and lines[1]["versions"] == {"torch": "2.14.0"}
    assert "benchmarks" not in lines[1]
    assert (
        lines[1]["commit"] == "0123abc"
        and lines[1]["figures"]["overhead"]["harness_run_cpu_s_per_launch"] == 6.1
    )

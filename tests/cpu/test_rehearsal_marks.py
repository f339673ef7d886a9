"""A rehearsal is never a trn2 result: every record it writes says so, and no real night's history reads it.

The rehearsal (rehearsal/night.py) runs the night's own steps in a scratch workspace, so its goldens,
trend and runs log never land where a real night reads them; these marks make that hold even when a
file is carried over by hand (an artifact downloaded into the wrong place).
"""

from __future__ import annotations

import json

import pytest

from harness.launch import speed
from harness.night import ci
from harness.pytest_plugins import report as pytest_report
from harness.report import history
from recipes.tiers import REHEARSAL_MARK, REHEARSAL_SETTINGS_ENV


def result(night_loss: float = 12.4) -> dict:
    return {
        "run_dir": "/r/runs/native_qwen3-trn2-random-1",
        "recipe": "native_qwen3",
        "tier": "trn2",
        "init": "random",
        "nproc": 2,
        "seq_len": 256,
        "local_batch_size": 1,
        "returncode": 0,
        "steps": [{"loss": night_loss}],
        "losses": [night_loss],
        "speed": {"step_time_s": 1.0},
    }


@pytest.fixture
def in_a_rehearsal(monkeypatch, tmp_path):
    monkeypatch.setenv(REHEARSAL_SETTINGS_ENV, str(tmp_path / "settings.json"))


def test_a_rehearsals_runs_log_line_says_so_and_a_real_nights_does_not(in_a_rehearsal, monkeypatch):
    assert speed.run_record(result(), versions={}, night="n")["rehearsal"] == REHEARSAL_MARK
    monkeypatch.delenv(REHEARSAL_SETTINGS_ENV)
    assert "rehearsal" not in speed.run_record(result(), versions={}, night="n")


def test_a_history_never_mixes_a_rehearsal_with_real_nights(tmp_path, monkeypatch):
    log = tmp_path / "runs.jsonl"
    speed.append_record(log, speed.run_record(result(12.4), versions={}, night="real-night"))
    monkeypatch.setenv(REHEARSAL_SETTINGS_ENV, str(tmp_path / "settings.json"))
    speed.append_record(log, speed.run_record(result(9.9), versions={}, night="rehearsed-night"))
    assert history.write(log, tmp_path / "rehearsal-plots")["nights"] == ["rehearsed-night"]
    monkeypatch.delenv(REHEARSAL_SETTINGS_ENV)
    assert history.write(log, tmp_path / "plots")["nights"] == ["real-night"]
    only_rehearsal = tmp_path / "rehearsal.jsonl"
    only_rehearsal.write_text(log.read_text().splitlines()[1] + "\n")
    with pytest.raises(
        history.HistoryError, match="a rehearsal and a real night never share a history"
    ):
        history.write(only_rehearsal, tmp_path / "none")


def test_a_rehearsals_trend_line_and_report_say_so(in_a_rehearsal, tmp_path):
    report = tmp_path / "tests.json"
    report.write_text(
        json.dumps({"rehearsal": REHEARSAL_MARK, "versions": {}, "goldens": [], "tests": []})
    )
    trend = tmp_path / "trend.jsonl"
    assert ci.append_trend(report, trend) == 0
    assert json.loads(trend.read_text())["rehearsal"] == REHEARSAL_MARK
    text = pytest_report.markdown(
        [
            {
                "test": "tests/neuron/t.py::t",
                "outcome": "passed",
                "duration_s": 1.0,
                "properties": {},
            }
        ],
        [],
    )
    assert REHEARSAL_MARK.upper() in text.splitlines()[2]

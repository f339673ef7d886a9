"""On-change results (harness.night.standing): due when anything they depend on moved, else carried from the runs log.

Issue 37: the diagnosis lanes, the as-published lanes' suspects and the torchtitan.train check re-run only
when the versions, the inputs, the suite's launch code or the number they explain changed.
"""

from __future__ import annotations

import json
import math

import pytest

from harness.night import ci, standing

VERSIONS = {
    "torch": "2.14.0",
    "transformers": "5.16.0",
    "neuronx-cc": "2.33.1",
    "torchtitan-neuron": "release-2.33 @ a",
}
INPUTS = {
    "weights": {"model.safetensors": "ab" * 32},
    "allow_mismatch": [],
    "kept_defects": ["inv_freq"],
}


def night(log, launch, fp, explains=None, rehearsal=False):
    line = {
        "date": "2026-12-01T03:00:00Z",
        "standing": {
            launch: {
                "fingerprint": fp,
                "result": {"difference": 0.001},
                "explains": explains,
                "measured": "2026-12-01",
            }
        },
    }
    if rehearsal:
        line["rehearsal"] = {"standins": True}
    with log.open("a") as f:
        f.write(json.dumps(line) + "\n")


def test_with_no_runs_log_or_no_record_every_result_is_due(tmp_path, monkeypatch):
    monkeypatch.delenv(standing.RERUN_ENV, raising=False)
    fp = standing.fingerprint(VERSIONS, INPUTS, "c0de")
    assert standing.decide("config1-tokenizer_fixed", fp, log=tmp_path / "absent.jsonl").due
    log = tmp_path / "runs.jsonl"
    night(log, "config2-torchtitan-train", fp)
    due = standing.decide("config1-tokenizer_fixed", fp, 6.54, 0.02, log=log)
    assert due.due and due.why == f"no standing result in the runs log {log}"


def test_nothing_moved_carries_the_standing_result_and_the_night_it_was_measured(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(standing.RERUN_ENV, raising=False)
    log = tmp_path / "runs.jsonl"
    fp = standing.fingerprint(VERSIONS, INPUTS, "c0de")
    night(log, "config1-tokenizer_fixed", fp, explains=6.541)
    due = standing.decide("config1-tokenizer_fixed", fp, 6.55, 0.02, log=log)
    assert (due.due, due.standing["result"]) == (False, {"difference": 0.001}), due
    assert due.why == "carried from 2026-12-01: nothing it depends on moved"
    carried = standing.record(due, {"ignored": True})
    assert (
        carried["measured"] == "2026-12-01"
        and carried["result"] == {"difference": 0.001}
        and "carried" in carried
    )
    monkeypatch.setenv(standing.RERUN_ENV, "1")
    assert standing.decide("config1-tokenizer_fixed", fp, 6.55, 0.02, log=log).due


@pytest.mark.parametrize(
    "change, why",
    [
        (
            {"versions": {**VERSIONS, "transformers": "5.17.0"}},
            "version transformers: '5.16.0' → '5.17.0'",
        ),
        ({"inputs": {**INPUTS, "kept_defects": []}}, "inputs changed (sha256)"),
        ({"code": "beef"}, "the suite's launch or recipe code changed"),
        ({"explains": 6.60}, "the number it explains moved: 6.541 → 6.6 (tolerance 0.02)"),
        ({"explains": math.nan}, "the number it explains moved: 6.541 → nan (tolerance 0.02)"),
    ],
)
def test_anything_it_depends_on_moving_makes_it_due_and_says_what(
    tmp_path, monkeypatch, change, why
):
    monkeypatch.delenv(standing.RERUN_ENV, raising=False)
    log = tmp_path / "runs.jsonl"
    night(
        log,
        "config1-inv_freq_fixed",
        standing.fingerprint(VERSIONS, INPUTS, "c0de"),
        explains=6.541,
    )
    fp = standing.fingerprint(
        change.get("versions", VERSIONS), change.get("inputs", INPUTS), change.get("code", "c0de")
    )
    due = standing.decide(
        "config1-inv_freq_fixed", fp, change.get("explains", 6.541), 0.02, log=log
    )
    assert due.due and due.why == why, due


def test_a_compiler_bump_alone_is_a_stable_night_and_two_nan_stops_are_the_same_number(
    tmp_path, monkeypatch
):
    """The cold night (a new neuronx-cc empties the NEFF cache) re-runs no diagnosis unless the number moved."""
    monkeypatch.delenv(standing.RERUN_ENV, raising=False)
    log = tmp_path / "runs.jsonl"
    night(
        log,
        "config1-as_published",
        standing.fingerprint(VERSIONS, INPUTS, "c0de"),
        explains=math.nan,
    )
    bumped = standing.fingerprint({**VERSIONS, "neuronx-cc": "2.34.0"}, INPUTS, "c0de")
    assert not standing.decide("config1-as_published", bumped, math.nan, 0.02, log=log).due
    assert standing.decide("config1-as_published", bumped, 6.54, 0.02, log=log).due


def test_a_rehearsals_runs_log_lines_are_never_read_as_a_nights(tmp_path, monkeypatch):
    monkeypatch.delenv(standing.RERUN_ENV, raising=False)
    log = tmp_path / "runs.jsonl"
    fp = standing.fingerprint(VERSIONS, INPUTS, "c0de")
    night(log, "config2-torchtitan-train", fp, rehearsal=True)
    assert standing.decide("config2-torchtitan-train", fp, log=log).due


def test_the_trend_step_carries_tonights_standing_records_to_the_runs_log_and_the_next_night_reads_them(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(standing.RERUN_ENV, raising=False)
    fp = standing.fingerprint(VERSIONS, INPUTS, "c0de")
    measured = standing.record(
        standing.Due("config2-torchtitan-train", True, "no standing result", fp),
        {"step1_loss": 6.5, "difference": 0.002},
    )
    report = tmp_path / "tests.json"
    report.write_text(
        json.dumps(
            {
                "versions": VERSIONS,
                "goldens": [],
                "tests": [
                    {
                        "test": "t::ran",
                        "outcome": "passed",
                        "markers": ["neuron"],
                        "properties": {"standing.config2-torchtitan-train": measured, "other": 1},
                    },
                    {
                        "test": "t::skipped",
                        "outcome": "skipped",
                        "markers": ["neuron"],
                        "properties": {"standing.config1-tokenizer_fixed": measured},
                    },
                ],
            }
        )
    )
    log = tmp_path / "history/runs.jsonl"
    assert ci.append_trend(report, log) == 0
    assert list(json.loads(log.read_text())["standing"]) == [
        "config2-torchtitan-train"
    ]  # a skipped test's: not
    due = standing.decide("config2-torchtitan-train", fp, log=log)
    assert not due.due and due.standing["result"] == {"step1_loss": 6.5, "difference": 0.002}


def test_the_suite_code_digest_follows_the_recipes_and_the_launch(tmp_path):
    for entry in standing.SUITE_CODE:
        path = tmp_path / entry
        if entry.endswith(".py"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x = 1\n")
        else:
            path.mkdir(parents=True)
            (path / "a.py").write_text("x = 1\n")
    before = standing.suite_code_sha256(tmp_path)
    (tmp_path / "recipes/a.py").write_text("x = 2\n")
    assert standing.suite_code_sha256(tmp_path) != before
    (tmp_path / "recipes/a.py").write_text("x = 1\n")
    (tmp_path / "recipes/notes.md").write_text("not code")
    assert standing.suite_code_sha256(tmp_path) == before

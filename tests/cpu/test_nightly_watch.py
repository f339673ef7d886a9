"""The nightly is watched: an alarm when the trn2 nightly stops judging (harness/night/watch.py).

The runs are shaped as ``gh run view ID --json databaseId,createdAt,status,conclusion,url,jobs`` prints
them; the judging step's name is read from the real nightly-trn2.yml, so renaming it there is noticed.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from harness.night import watch as nightly_watch

NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.timezone.utc)
STEP = nightly_watch.judging_step()


def run(
    run_id: int,
    hours_ago: float,
    claims: str | None,
    conclusion: str = "failure",
    status: str = "completed",
) -> dict:
    """One night: ``claims`` is the require-claims step's conclusion (None: the job never reached it)."""
    steps = [
        {
            "name": "Neuron tests, serial (a 64-rank job takes the whole instance)",
            "status": "completed",
            "conclusion": "success",
            "number": 10,
        }
    ]
    if claims is not None:
        steps.append({"name": STEP, "status": "completed", "conclusion": claims, "number": 13})
    created = (NOW - dt.timedelta(hours=hours_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "databaseId": run_id,
        "createdAt": created,
        "status": status,
        "conclusion": conclusion,
        "url": f"https://github.com/o/r/actions/runs/{run_id}",
        "jobs": [{"name": "neuron", "status": status, "conclusion": conclusion, "steps": steps}],
    }


def watch(tmp_path, runs: list[dict], capsys) -> tuple[int, str]:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    code = nightly_watch.main(["--runs", str(path), "--now", NOW.isoformat()])
    return code, capsys.readouterr().out


@pytest.mark.parametrize(
    ("runs", "code", "says"),
    [
        ([run(3, 10, "success", "success")], 0, "judged 10.0 h ago"),
        (
            [run(3, 10, "failure")],
            0,
            "judged 10.0 h ago",
        ),  # a first night fails require-claims by design: it judged
        (
            [run(3, 50, "success", "success")],
            1,
            "::error::the newest nightly-trn2 run that judged the published claims is 50 h old",
        ),
        (
            [
                run(6, 2, "skipped"),
                run(5, 26, None, "cancelled"),
                run(4, 50, "cancelled"),
                run(3, 74, "success"),
            ],
            1,
            "::error::the last 3 nightly-trn2 runs all ended before judging",
        ),
        (
            [run(6, 2, "skipped"), run(5, 26, None, "cancelled"), run(4, 50, "skipped")],
            0,
            "(a warning until the first night has judged)",
        ),
        ([], 0, "::warning::insufficient data: 0 completed nightly-trn2 run(s)"),
        (
            [
                run(7, 1, None, None, "in_progress"),
                run(6, 2, "skipped"),
                run(5, 26, "skipped"),
                run(4, 30, "success"),
            ],
            0,
            "judged 30.0 h ago",
        ),
    ],
    ids=[
        "judged",
        "first-night",
        "too-old",
        "cut-off-thrice",
        "cut-off-never-judged",
        "no-runs",
        "in-progress-ignored",
    ],
)
def test_the_watch_alarms_when_the_nightly_stops_judging(tmp_path, capsys, runs, code, says):
    got, out = watch(tmp_path, runs, capsys)
    assert (got, says in out) == (code, True), out


def test_the_judging_step_is_the_workflows_require_claims_step():
    assert "require-claims" not in STEP and STEP.startswith(
        "Fail unless every published trn2 claim"
    )

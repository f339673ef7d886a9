"""An alarm when the trn2 nightly stops judging: a self-hosted night that silently stops running is green forever.

    python -m harness.night.watch [--runs FILE] [--now ISO]

Fails when the newest nightly-trn2 run that judged the published claims is older than 48 hours, or
when the last three nights all ended before judging; until the first night has judged, the same
findings are warnings ("insufficient data" is said as such), as pytorch/test-infra's regression alerts
do. A night *judged* when its require-claims step ran to a conclusion (success or failure: a first
night fails it by design); a night cut off before it (cancelled, timed out, a step before it failed
and it was skipped) ended before judging. Runs still in progress are not counted.

The runs are ``gh run view ID --json databaseId,createdAt,status,conclusion,url,jobs`` objects (GitHub
CLI manual, gh run view "JSON fields"; each job's ``steps`` carry ``name`` and ``conclusion`` as the REST
API's workflow job does). ``--runs FILE`` reads a recorded list of them (the tests); without it, ``gh``
lists and views the workflow's recent runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from recipes.tiers import REPO_ROOT

WORKFLOW = REPO_ROOT / ".github/workflows/nightly-trn2.yml"
MAX_AGE = dt.timedelta(hours=48)
#: How many nights in a row may end before judging.
CUT_OFF_IN_A_ROW = 3
#: Step conclusions that mean the step ran (GitHub: success, failure; skipped/cancelled mean it did not).
RAN = ("success", "failure")


def judging_step(workflow: Path = WORKFLOW) -> str:
    """The name of the step that judges the published claims (``harness.night.ci require-claims``), read from the workflow."""
    steps = yaml.safe_load(workflow.read_text())["jobs"]["neuron"]["steps"]
    (name,) = [s["name"] for s in steps if "harness.night.ci require-claims" in s.get("run", "")]
    return name


@dataclass(frozen=True)
class Night:
    run_id: int
    created: dt.datetime
    url: str
    judged: bool
    conclusion: str | None

    def line(self) -> str:
        return (
            f"run {self.run_id} of {self.created:%Y-%m-%d %H:%M}Z ({self.conclusion}): {self.url}"
        )


def _when(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def nights(runs: list[dict], step: str) -> list[Night]:
    """The completed runs as nights, newest first, each judged or not."""
    found = []
    for run in runs:
        if run.get("status") != "completed":
            continue
        steps = [s for job in run.get("jobs") or [] for s in job.get("steps") or []]
        judged = any(s.get("name") == step and s.get("conclusion") in RAN for s in steps)
        found.append(
            Night(
                run["databaseId"],
                _when(run["createdAt"]),
                run.get("url", ""),
                judged,
                run.get("conclusion"),
            )
        )
    return sorted(found, key=lambda n: n.created, reverse=True)


@dataclass(frozen=True)
class Alarm:
    """``level``: "ok", "warning" or "failure"; ``message`` says which finding and names the runs."""

    level: str
    message: str


def alarm(found: list[Night], now: dt.datetime) -> Alarm:
    judged = [n for n in found if n.judged]
    latest = found[:CUT_OFF_IN_A_ROW]
    cut_off = len(latest) == CUT_OFF_IN_A_ROW and not any(n.judged for n in latest)
    level = "failure" if judged else "warning"
    if cut_off:
        return Alarm(
            level,
            f"the last {CUT_OFF_IN_A_ROW} nightly-trn2 runs all ended before judging the published "
            "claims:\n"
            + "\n".join(f"  {n.line()}" for n in latest)
            + ("" if judged else "\n(a warning until the first night has judged)"),
        )
    if not judged:
        return Alarm(
            "warning",
            f"insufficient data: {len(found)} completed nightly-trn2 run(s), none has judged the "
            "published claims yet",
        )
    age = now - judged[0].created
    if age > MAX_AGE:
        return Alarm(
            "failure",
            f"the newest nightly-trn2 run that judged the published claims is {age.total_seconds() / 3600:.0f} h "
            f"old (more than {MAX_AGE.total_seconds() / 3600:.0f} h): {judged[0].line()}",
        )
    return Alarm(
        "ok",
        f"the published claims were judged {age.total_seconds() / 3600:.1f} h ago: {judged[0].line()}",
    )


def gh_runs(limit: int = 10) -> list[dict]:
    """The workflow's recent runs with their jobs and steps, from the GitHub API through ``gh``."""
    listed = subprocess.run(
        [
            "gh",
            "run",
            "list",
            "--workflow",
            WORKFLOW.name,
            "--limit",
            str(limit),
            "--json",
            "databaseId",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    runs = []
    for run_id in (r["databaseId"] for r in json.loads(listed.stdout)):
        viewed = subprocess.run(
            [
                "gh",
                "run",
                "view",
                str(run_id),
                "--json",
                "databaseId,createdAt,status,conclusion,url,jobs",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        runs.append(json.loads(viewed.stdout))
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.night.watch", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--runs", type=Path, help="a recorded JSON list of `gh run view --json ...` objects"
    )
    parser.add_argument("--now", help="the time to judge at (ISO 8601; default: now)")
    args = parser.parse_args(argv)
    try:
        runs = json.loads(args.runs.read_text()) if args.runs else gh_runs()
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError) as e:
        print(
            f"::error::cannot read the nightly's runs ({e}); the watch itself failed",
            file=sys.stderr,
        )
        return 1
    now = _when(args.now) if args.now else dt.datetime.now(dt.timezone.utc)
    found = alarm(nights(runs, judging_step()), now)
    prefix = {"ok": "", "warning": "::warning::", "failure": "::error::"}[found.level]
    print(prefix + found.message)
    return 1 if found.level == "failure" else 0


if __name__ == "__main__":
    sys.exit(main())

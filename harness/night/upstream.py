"""A ready upstream report for every failing published or exact claim: ``<report-dir>/upstream/<claim>.md``.

Written so that pasting it into the upstream tracker is the whole job: what moved (expected, measured,
tolerance, lane), the exact versions and the lock, the inputs the run used, the one command that
reproduces it, what the host reference said, where the two models first part ways (harness.reference.localize)
and which release moved it when those ran, and the first night it moved (from the runs log). Each section says plainly
when it has nothing (never an empty heading).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from harness.judge import goldens
from harness.launch.speed import RUNS_LOG_ENV, git_commit
from recipes.tiers import REPO_ROOT

#: Lanes whose failure is a report upstream: the tutorial's numbers, their cpu proxies, and exact values.
REPORTED_LANES = ("published", "proxy", "exact")
#: Verdicts that are a failure (a rehearsal prefixes "rehearsal, ").
FAILING = ("regression", "stale golden")
#: Where ``make bisect`` (harness.bump.bisect.BISECT_REPORTS) writes its reports.
BISECT_REPORTS = REPO_ROOT / "report" / "bisect"
#: Golden keys the runs log records per night (harness.launch.speed.run_record: step 1 by init).
RUNS_LOG_KEYS = {"step1_loss_hf": "hf", "step1_loss_random": "random"}


def failing(row: dict) -> bool:
    return (
        row.get("lane") in REPORTED_LANES and str(row.get("verdict", "")).split(", ")[-1] in FAILING
    )


def _claim(row: dict) -> str:
    return f"{row['recipe']}.{row['tier']}.{row['key']}"


def first_night_moved(row: dict, log: Path | None) -> str:
    """The first night whose step-1 loss of this claim's run left the golden's tolerance, from the runs log."""
    init = RUNS_LOG_KEYS.get(row["key"])
    if init is None:
        return f"not in the runs log: it records step-1 losses per night ({', '.join(RUNS_LOG_KEYS)}) only"
    if log is None or not log.is_file():
        return f"no runs log here (${RUNS_LOG_ENV} unset or missing); the nightly keeps one as the artifact runs-history"
    expected = row.get("published") if row.get("published") is not None else row.get("golden")
    tolerance = row.get("tolerance") or 0.0
    nights = []
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a killed run
        if (record.get("recipe"), record.get("tier"), record.get("init")) == (
            row["recipe"],
            row["tier"],
            init,
        ):
            nights.append(record)
    moved = [
        r
        for r in nights
        if isinstance(r.get("step1_loss"), (int, float))
        and not (math.isfinite(r["step1_loss"]) and abs(r["step1_loss"] - expected) <= tolerance)
    ]
    if not moved:
        return f"no night in {log} ({len(nights)} of this run) left the tolerance before this one"
    first = moved[0]
    return (
        f"night {first.get('night')} (commit {first.get('commit')}): step 1 {first['step1_loss']!r}, "
        f"versions {json.dumps(first.get('versions', {}), sort_keys=True)}"
    )


def _without_localization(value):
    return (
        {k: v for k, v in value.items() if k != "localization"}
        if isinstance(value, dict)
        else value
    )


def first_diverging(references: dict) -> list[str]:
    """Where torchtitan's model and transformers' first part ways, from each host reference's localization."""
    lines = []
    for key, value in sorted(references.items()):
        loc = value.get("localization") if isinstance(value, dict) else None
        if loc:
            lines.append(f"- `{key}`: {loc['summary']}")
    return lines or [
        "not run for this claim: no host reference here recorded a localization (harness.reference.localize runs "
        "when step 1 disagrees with the reference, or with `--localize`; by hand: "
        "`python -m harness.reference.diagnosis RUN_DIR --localize`)"
    ]


def release_that_moved(row: dict, bisections: Path | None) -> list[str]:
    """Each ``make bisect`` report (``report/bisect/*.json``) whose tests hold this claim's test or whose moved
    values hold this claim: its headline (which package, between which releases). Else how to run one."""
    claim, found = _claim(row), []
    for path in sorted(bisections.glob("*.json")) if bisections and bisections.is_dir() else []:
        try:
            finding = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # a report cut short: not this section's to judge
        tests = finding.get("tests") or []
        moved = [m[0] for m in finding.get("moved") or [] if m]
        if claim in moved or any(
            t == row["test"] or t.startswith(row["test"] + "[") for t in tests
        ):
            found.append(f"- `{path.name}`: {finding.get('headline', 'no headline')}")
    return found or [
        f"not bisected: no report in {bisections} names this test; "
        f'`make bisect BISECT_ARGS="--from-bump report/bump/<name>.json"` after a `make bump`, or '
        f'`make bisect PKGS="name==version" TEST="{row["test"]}"`'
    ]


def markdown(
    row: dict, record: dict, versions: dict, log: Path | None, bisections: Path | None = None
) -> str:
    claim, props = _claim(row), record.get("properties", {})
    expected = row.get("published") if row.get("published") is not None else row.get("golden")
    marker = "neuron" if row["test"].startswith("tests/neuron/") else "cpu"
    inputs = props.get(f"{claim}.inputs")
    references = {k: v for k, v in props.items() if k.endswith(".reference")}
    lines = [
        f"# {claim} moved: {row['verdict']}",
        "",
        "| expected | measured | tolerance | lane | test |",
        "|---|---|---|---|---|",
        f"| {expected!r} | {row.get('measured')!r} | {row.get('tolerance')!r} | {row.get('lane')} | `{row['test']}` |",
        "",
        "## Versions",
        "",
        *[f"- {name} {version}" for name, version in sorted(versions.items())],
        f"- lock sha256 {goldens.lock_sha256()} (requirements-lock.txt), suite commit {git_commit()}",
        "",
        "## Inputs",
        "",
        f"```json\n{json.dumps(inputs, indent=1, sort_keys=True)}\n```"
        if inputs
        else "the cpu tier's fixtures at the suite commit above (fixtures/: tokenizer, corpus, tiny checkpoints)",
        "",
        "## Reproduce",
        "",
        f"```\npython -m pytest '{row['test']}' -m {marker} -p no:xdist\n```",
        "",
        "## Host reference",
        "",
        *(
            [
                f"- `{k}`: {json.dumps(_without_localization(v), sort_keys=True, default=str)[:2000]}"
                for k, v in sorted(references.items())
            ]
            or [
                "not run by this test (the reference check of a run: `python -m harness.reference.diagnosis RUN_DIR`)"
            ]
        ),
        "",
        "## First diverging layer",
        "",
        *first_diverging(references),
        "",
        "## Release that moved it",
        "",
        *release_that_moved(row, bisections),
        "",
        "## First night it moved",
        "",
        first_night_moved(row, log),
        "",
    ]
    return "\n".join(lines)


def write(
    report_dir: Path,
    rows: list[dict],
    records: list[dict],
    versions: dict,
    bisections: Path | None = BISECT_REPORTS,
) -> list[Path]:
    """One ``upstream/<claim>.md`` per failing claim row; returns the files written. ``bisections``: where
    ``make bisect`` writes its reports."""
    by_test = {r["test"]: r for r in records}
    log = Path(os.environ[RUNS_LOG_ENV]) if os.environ.get(RUNS_LOG_ENV) else None
    written = []
    for row in filter(failing, rows):
        path = report_dir / "upstream" / f"{_claim(row)}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(markdown(row, by_test.get(row["test"], {}), versions, log, bisections))
        written.append(path)
    return written

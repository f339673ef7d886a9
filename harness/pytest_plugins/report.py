"""pytest plugin: every value a test records with ``record_property`` lands in the report, pass or fail.

Writes ``<report-dir>/tests.json`` and ``<report-dir>/tests.md`` (published vs
measured vs tolerance vs verdict for golden checks, then every other recorded
value), appends the markdown to ``$GITHUB_STEP_SUMMARY`` when set. JUnit XML
(``--junitxml``) carries the same properties through pytest's own writer.
Works under xdist: workers ship ``user_properties`` to the controller, which
alone writes the files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.base.environment import versions
from harness.judge import goldens, unmeasured
from harness.night import upstream
from harness.report.markdown import lanes_section, md_table
from harness.report.results import VERDICT_SUFFIX
from recipes.tiers import REPO_ROOT, rehearsal_mark

#: A test's per-config summary of the trn2 lanes (harness.report.markdown.lane_summary), one per recipe.
LANES_SUFFIX = ".lanes"


def pytest_addoption(parser):
    parser.addoption(
        "--report-dir",
        default=os.environ.get("QWEN3_REPRO_REPORT_DIR", str(REPO_ROOT / "report")),
        help="where tests.json / tests.md are written (default: report/)",
    )


#: One entry per test (its call phase, or a failed/skipped setup), filled on the controller.
_RECORDS: list[dict] = []


def pytest_runtest_logreport(report):
    if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
        return
    properties = {name: value for name, value in report.user_properties}
    if report.skipped and isinstance(report.longrepr, tuple):
        properties["skip_reason"] = report.longrepr[2]
    _RECORDS.append(
        {
            "test": report.nodeid,
            "outcome": report.outcome,
            # "setup": the test failed or skipped before its body ran (a fixture, a missing
            # requirement under QWEN3_REQUIRE_TRN2=1); it executed nothing (harness.night.ci require-ran).
            "phase": report.when,
            "duration_s": round(report.duration, 3),
            "properties": properties,
        }
    )


#: Every warning pytest captured (deprecations first of all: a suite about version drift
#: needs the first sign of it), one entry per distinct (category, message, location).
_WARNINGS: dict[tuple[str, str, str], dict] = {}


def pytest_warning_recorded(warning_message, when, nodeid, location):
    """Runs on the controller too under xdist (workers forward their warnings)."""
    category = warning_message.category.__name__
    where = f"{warning_message.filename}:{warning_message.lineno}"
    key = (category, str(warning_message.message), where)
    entry = _WARNINGS.setdefault(
        key,
        {
            "category": category,
            "message": str(warning_message.message),
            "where": where,
            "tests": [],
        },
    )
    if nodeid and nodeid not in entry["tests"]:
        entry["tests"].append(nodeid)


def _is_controller(config) -> bool:
    return not hasattr(config, "workerinput")


def _golden_rows(records: list[dict]) -> list[dict]:
    """Rows for recorded golden checks: '<recipe>.<tier>.<key>' with a '.verdict' sibling."""

    rows = []
    for record in records:
        props = record["properties"]
        for name, verdict in props.items():
            if not name.endswith(VERDICT_SUFFIX):
                continue
            key = name[: -len(VERDICT_SUFFIX)]
            recipe, tier, golden_key = key.split(".", 2)
            try:
                _, values = goldens.load(recipe, tier)
                g = values[golden_key]
                lane, tolerance = g.lane, g.tolerance
                published, golden = (g.value, None) if g.claim else (None, g.value)
            except (goldens.GoldenError, KeyError):
                published, golden, tolerance, lane = None, None, None, None
            rows.append(
                {
                    "recipe": recipe,
                    "tier": tier,
                    "key": golden_key,
                    "lane": lane,
                    "published": published,
                    "golden": golden,
                    "measured": props.get(key),
                    "tolerance": tolerance,
                    "verdict": f"rehearsal, {verdict}" if rehearsal_mark() else verdict,
                    "test": record["test"],
                    **rehearsal_mark(),
                }
            )
    return rows


def lane_summaries(records: list[dict]) -> list[dict]:
    """Every ``<recipe>.trn2.lanes`` summary a test recorded (the last one per recipe)."""
    found = {}
    for record in records:
        for name, value in record["properties"].items():
            if name.endswith(LANES_SUFFIX) and isinstance(value, dict):
                found[value.get("recipe", name)] = value
    return [found[k] for k in sorted(found)]


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return (
        "–"
        if value is None
        else json.dumps(value)
        if isinstance(value, (list, dict))
        else str(value)
    )


def markdown(records: list[dict], rows: list[dict], warnings: list[dict] = ()) -> str:
    lines = ["# qwen3-trn-repro test report", ""]
    if rehearsal_mark():
        lines += [
            f"**{rehearsal_mark()['rehearsal'].upper()}**: every value below was measured on stand-ins.",
            "",
        ]
    if warnings:
        lines += ["## Warnings (deprecations are the first sign of version drift)", ""]
        cells = [
            [
                w["category"],
                w["message"].replace("|", "\\|").replace("\n", " "),
                w["where"],
                len(w["tests"]),
            ]
            for w in warnings
        ]
        lines += md_table(["category", "message", "where", "tests"], cells) + [""]
    if rows:
        header = [
            "recipe",
            "tier",
            "value",
            "lane",
            "published (tutorial)",
            "golden (this lock)",
            "measured",
            "tolerance",
            "verdict",
        ]
        cells = [
            [
                r["recipe"],
                r["tier"],
                r["key"],
                r["lane"] or "–",
                _fmt(r["published"]),
                _fmt(r["golden"]),
                _fmt(r["measured"]),
                _fmt(r["tolerance"]),
                r["verdict"],
            ]
            for r in rows
        ]
        lines += md_table(header, cells) + [""]
    lines += lanes_section(lane_summaries(records))
    if any(
        r["test"].startswith("tests/neuron/") for r in records
    ):  # the night: what tonight could not fail
        lines += unmeasured.lines("trn2") + [""]
    tests = []
    for record in sorted(records, key=lambda r: r["test"]):
        values = ", ".join(
            f"{k}={_fmt(v)}"
            for k, v in record["properties"].items()
            if not k.endswith(VERDICT_SUFFIX)
        )
        tests.append([record["test"], record["outcome"], record["duration_s"], values])
    lines += md_table(["test", "outcome", "s", "recorded values"], tests)
    return "\n".join(lines) + "\n"


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if not _is_controller(config) or not _RECORDS:
        return

    report_dir = Path(config.getoption("--report-dir"))
    report_dir.mkdir(parents=True, exist_ok=True)
    rows = _golden_rows(_RECORDS)
    warnings = sorted(_WARNINGS.values(), key=lambda w: (w["category"], w["where"]))
    data = {
        **rehearsal_mark(),
        "versions": versions(),
        "goldens": rows,
        "lanes": lane_summaries(_RECORDS),
        "warnings": warnings,
        "tests": sorted(_RECORDS, key=lambda r: r["test"]),
    }
    (report_dir / "tests.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    text = markdown(_RECORDS, rows, warnings)
    (report_dir / "tests.md").write_text(text)

    for path in upstream.write(
        report_dir, rows, _RECORDS, data["versions"]
    ):  # every failing claim, ready to file
        print(f"\nupstream report: {path}")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a") as f:
            f.write(text)

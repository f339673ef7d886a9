"""CI helpers over the test report: the zero-tests guard, the claims guard, input records and the trend file.

    python -m harness.night.ci require-ran report/tests.json --marker neuron
    python -m harness.night.ci require-claims report/tests.json --tier trn2
    python -m harness.night.ci record-inputs report/tests.json [--replace]
    python -m harness.night.ci trend report/tests.json trend.jsonl

What fails the nightly (``require-claims``), per published claim of the tier:

* **not measured**: no test that reached its assertion judged it (skipped, failed in
  setup or before measuring, not run, or never compared);
* **not judged**: measured, but "unmeasured" (its inputs are not recorded yet,
  or its tolerance is not measured yet) or "inputs differ from the recorded run".
  A published claim that was not judged does not pass silently: the night's value and
  why it was not judged are listed, and ``record-inputs`` says how to record.

A measured claim that failed its check (regression, stale golden) is "measured": its
own test is red, and this guard lists its verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from harness.base.readable import Unreadable, json_object_of, kind_of
from harness.declare.claims import published_claims
from harness.judge import gate, goldens, unmeasured
from harness.launch.speed import NIGHT_ENV
from harness.night.standing import PROPERTY_PREFIX
from harness.report.results import VERDICT_SUFFIX


def executed(test: dict) -> bool:
    """A test whose body ran: passed, or failed in its call phase. A failure in setup (a fixture, a
    missing trn2 requirement under QWEN3_REQUIRE_TRN2=1) ran nothing, and a skip ran nothing."""
    return test["outcome"] == "passed" or (
        test["outcome"] == "failed" and test.get("phase", "call") == "call"
    )


def ran_tests(report: dict, marker: str) -> list[dict]:
    """Tests of ``tests/<marker>/`` that actually executed (:func:`executed`)."""
    prefix = f"tests/{marker}/"
    return [t for t in report["tests"] if t["test"].startswith(prefix) and executed(t)]


def read_report(path: Path) -> dict:
    """A pytest session's report (tests.json: a "tests" list); else ``Unreadable``, one line."""
    what, fix = "a pytest report (tests.json)", "pass the tests.json a pytest session wrote"
    report = json_object_of(path, what, fix)
    tests = report.get("tests")
    if not isinstance(tests, list) or not all(
        isinstance(t, dict) and "test" in t and "outcome" in t for t in tests
    ):
        raise Unreadable(f'{path} has no "tests" list of test records, so it is not {what}; {fix}')
    return report


def require_ran(report_path: Path, marker: str) -> int:
    if not report_path.exists():
        print(
            f"harness.night.ci: {report_path} does not exist: the test run wrote no report",
            file=sys.stderr,
        )
        return 1
    report = read_report(report_path)
    ran = ran_tests(report, marker)
    selected = [t for t in report["tests"] if t["test"].startswith(f"tests/{marker}/")]
    if not ran:
        reasons = sorted({t["properties"].get("skip_reason", "") for t in selected} - {""})
        in_setup = sum(
            1 for t in selected if t["outcome"] == "failed" and t.get("phase") == "setup"
        )
        print(
            f"harness.night.ci: 0 of {len(selected)} {marker} tests actually ran ({in_setup} failed in setup, "
            f"the rest skipped); a nightly that runs nothing proves nothing. {' '.join(reasons)}",
            file=sys.stderr,
        )
        return 1
    print(f"{len(ran)} of {len(selected)} {marker} tests ran")
    return 0


def measured_verdicts(report: dict) -> dict[str, tuple[str, str]]:
    """``recipe.tier.key`` -> (verdict, test) for every golden a test that ran has judged.

    The ``golden`` fixture records ``<recipe>.<tier>.<key>.verdict`` after comparing a
    measurement; a skipped test measured nothing, whatever it recorded.
    """
    found = {}
    for test in report.get("tests", []):
        if not executed(test):
            continue
        for name, verdict in test.get("properties", {}).items():
            if name.endswith(VERDICT_SUFFIX):
                found[name[: -len(VERDICT_SUFFIX)]] = (verdict, test["test"])
    return found


def require_claims(report_path: Path, tier: str, goldens_dir: Path | None = None) -> int:
    """Non-zero unless every published claim of ``tier`` has a measured verdict in the report."""
    claims = published_claims(tier)
    if not claims:
        print(
            f"harness.night.ci: no published claim is declared for tier {tier!r} (harness/declare/catalogue.py); "
            "nothing to require (check --tier)",
            file=sys.stderr,
        )
        return 1
    disagree = gate.disagreements(tier, goldens_dir)
    if disagree:
        print("\n".join(f"harness.night.ci: {line}" for line in disagree), file=sys.stderr)
        return 1
    if not report_path.exists():
        print(
            f"harness.night.ci: {report_path} does not exist: the test run wrote no report, so none of "
            f"{len(claims)} published {tier} claims was measured",
            file=sys.stderr,
        )
        return 1
    report = read_report(report_path)
    verdicts = measured_verdicts(report)
    missing = [c for c in claims if c.name not in verdicts]
    unjudged = [
        c for c in claims if c.name in verdicts and verdicts[c.name][0] in goldens.UNJUDGED_KINDS
    ]
    for claim in claims:
        if claim.name in verdicts and claim not in unjudged:
            verdict, test = verdicts[claim.name]
            print(f"measured      {claim.name} (published {claim.value!r}): {verdict}  [{test}]")
    if missing:
        print(
            f"harness.night.ci: {len(missing)} of {len(claims)} published {tier} claims were not measured "
            "(their test was skipped, failed in setup or before measuring, or did not run):\n"
            + "\n".join(f"  NOT MEASURED  {c.name} (published {c.value!r})" for c in missing),
            file=sys.stderr,
        )
    if unjudged:
        values = measured_values(report)
        print(
            f"harness.night.ci: {len(unjudged)} of {len(claims)} published {tier} claims were measured but not judged "
            "(`python -m harness.night.ci record-inputs REPORT` records a night's inputs; a changed input is re-recorded "
            "only with --replace):\n"
            + "\n".join(
                f"  {UNJUDGED_LABELS[verdicts[c.name][0]]:<13} {c.name} (published {c.value!r}): measured "
                f"{values.get(c.name)!r}, {why_unjudged(c.name, verdicts[c.name][0], tier, goldens_dir)}  "
                f"[{verdicts[c.name][1]}]"
                for c in unjudged
            ),
            file=sys.stderr,
        )
    print("\n".join(unmeasured.lines(tier)))
    if missing or unjudged:
        return 1
    print(f"all {len(claims)} published {tier} claims were measured and judged")
    return 0


#: How require-claims lists a claim measured but not judged, by its verdict.
UNJUDGED_LABELS = {goldens.NOT_JUDGED: "UNMEASURED", goldens.INPUTS_DIFFER: "INPUTS DIFFER"}


def why_unjudged(claim: str, kind: str, tier: str, goldens_dir: Path | None = None) -> str:
    """The verdict and why this claim cannot be judged yet, from its golden (never the bare verdict)."""
    if kind == goldens.INPUTS_DIFFER:
        return f"{kind}: re-record with `python -m harness.night.ci record-inputs --replace` only if the new inputs are meant"
    recipe, _, key = claim.split(".", 2)
    _, values = goldens.load(
        recipe, tier, (goldens_dir or goldens.GOLDENS_DIR) / recipe / f"{tier}.json"
    )
    return f"{kind}: {goldens.why_not_judged(values[key])}"


def measured_values(report: dict) -> dict[str, object]:
    """``recipe.tier.key`` -> the value a test that ran recorded beside its verdict."""
    found = {}
    for test in report.get("tests", []):
        if executed(test):
            props = test.get("properties", {})
            found.update(
                {
                    name[: -len(VERDICT_SUFFIX)]: props.get(name[: -len(VERDICT_SUFFIX)])
                    for name in props
                    if name.endswith(VERDICT_SUFFIX)
                }
            )
    return found


#: The property the ``golden`` fixture records a measurement's input key under.
INPUTS_SUFFIX = ".inputs"


def record_inputs(report_path: Path, replace: bool = False, goldens_dir: Path | None = None) -> int:
    """Write each measured golden's input key into its goldens file, where none is recorded yet.

    Only entries keyed by inputs (``"inputs": null``) are written; a recorded key is kept
    unless ``replace`` (new weights or data on purpose). Prints every file it changes.
    """
    goldens_dir = goldens_dir or goldens.GOLDENS_DIR
    report = read_report(report_path)
    found: dict[tuple[str, str], dict[str, dict]] = {}
    for test in report.get("tests", []):
        if not executed(test):
            continue
        for name, value in test.get("properties", {}).items():
            if name.endswith(INPUTS_SUFFIX) and isinstance(value, dict):
                recipe, tier, key = name[: -len(INPUTS_SUFFIX)].split(".", 2)
                found.setdefault((recipe, tier), {})[key] = value
    written = 0
    for (recipe, tier), keys in sorted(found.items()):
        path = goldens_dir / recipe / f"{tier}.json"
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        changed = []
        for key, inputs in sorted(keys.items()):
            entry = data.get("values", {}).get(key)
            if (
                entry is None
                or "inputs" not in entry
                or (entry["inputs"] is not None and not replace)
            ):
                continue
            if entry["inputs"] != inputs:
                entry["inputs"] = inputs
                changed.append(key)
        if changed:
            path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
            goldens.load(recipe, tier, path)  # what was written must load
            print(f"recorded the inputs of {', '.join(changed)} in {path}")
            written += len(changed)
    print(
        f"{written} input key(s) recorded"
        + ("" if written else " (nothing unrecorded was measured)")
    )
    return 0


def standing_results(report: dict) -> dict[str, dict]:
    """``launch`` -> tonight's standing record (``harness.night.standing``), from the tests that ran."""

    return {
        name[len(PROPERTY_PREFIX) :]: value
        for test in report.get("tests", [])
        if executed(test)
        for name, value in test.get("properties", {}).items()
        if name.startswith(PROPERTY_PREFIX)
    }


def append_trend(report_path: Path, trend_path: Path) -> int:
    """One line per night: date, versions, and every golden measurement with its verdict."""
    report = read_report(report_path)
    kind = kind_of(trend_path) if os.path.lexists(trend_path) else None
    if kind is not None:
        raise Unreadable(
            f"{trend_path} is {kind}, not a trend file; pass a JSON-lines file to append the night to"
        )
    night = os.environ.get(
        NIGHT_ENV
    )  # set by the nightly: the night's run records share it (harness history)
    line = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **({"night": night} if night else {}),
        "versions": report.get("versions", {}),
        "goldens": report.get("goldens", []),
        "outcomes": {t["test"]: t["outcome"] for t in report["tests"]},
        "standing": standing_results(report),
        **(
            {"rehearsal": report["rehearsal"]} if "rehearsal" in report else {}
        ),  # never read as a real night
    }
    trend_path.parent.mkdir(parents=True, exist_ok=True)
    with trend_path.open("a") as f:
        f.write(json.dumps(line, default=str) + "\n")
    print(f"appended {len(line['goldens'])} golden measurement(s) to {trend_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.night.ci", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    guard = sub.add_parser("require-ran", help="fail when no test of the marker's folder executed")
    guard.add_argument("report", type=Path)
    guard.add_argument("--marker", default="neuron")
    claims = sub.add_parser(
        "require-claims", help="fail unless every published claim of the tier was measured"
    )
    claims.add_argument("report", type=Path)
    claims.add_argument("--tier", default="trn2")
    record = sub.add_parser(
        "record-inputs", help="write measured input keys into goldens that have none yet"
    )
    record.add_argument("report", type=Path)
    record.add_argument(
        "--replace", action="store_true", help="also overwrite input keys already recorded"
    )
    trend = sub.add_parser("trend", help="append the night's results to a JSON-lines trend file")
    trend.add_argument("report", type=Path)
    trend.add_argument("trend_file", type=Path)
    args = parser.parse_args(argv)
    if args.command in ("record-inputs", "trend") and not args.report.is_file():
        print(
            f"harness.night.ci {args.command}: {args.report} does not exist: the test run wrote no report "
            "(a night stopped before its tests): nothing to record",
            file=sys.stderr,
        )
        return 1
    try:
        if args.command == "require-ran":
            return require_ran(args.report, args.marker)
        if args.command == "require-claims":
            return require_claims(args.report, args.tier)
        if args.command == "record-inputs":
            return record_inputs(args.report, args.replace)
        return append_trend(args.report, args.trend_file)
    except Unreadable as e:
        print(f"python -m harness.night.ci: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""CI helpers over the test report: the zero-tests guard, the claims guard and the nightly trend file.

    python -m harness.ci require-ran report/tests.json --marker neuron
    python -m harness.ci require-claims report/tests.json --tier trn2
    python -m harness.ci trend report/tests.json trend.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness import goldens
from harness.pytest_report import VERDICT_SUFFIX


def ran_tests(report: dict, marker: str) -> list[dict]:
    """Tests of ``tests/<marker>/`` that actually executed (passed or failed, not skipped)."""
    prefix = f"tests/{marker}/"
    return [t for t in report["tests"] if t["test"].startswith(prefix) and t["outcome"] in ("passed", "failed")]


def require_ran(report_path: Path, marker: str) -> int:
    if not report_path.exists():
        print(f"harness.ci: {report_path} does not exist: the test run wrote no report", file=sys.stderr)
        return 1
    report = json.loads(report_path.read_text())
    ran = ran_tests(report, marker)
    selected = [t for t in report["tests"] if t["test"].startswith(f"tests/{marker}/")]
    if not ran:
        reasons = sorted({t["properties"].get("skip_reason", "") for t in selected} - {""})
        print(
            f"harness.ci: 0 of {len(selected)} {marker} tests actually ran (all skipped); "
            f"a nightly that skips everything proves nothing. {' '.join(reasons)}",
            file=sys.stderr,
        )
        return 1
    print(f"{len(ran)} of {len(selected)} {marker} tests ran")
    return 0


@dataclass(frozen=True)
class Claim:
    """One published-lane golden: what a night on ``tier`` must measure."""

    recipe: str
    tier: str
    key: str
    value: object

    @property
    def name(self) -> str:
        return f"{self.recipe}.{self.tier}.{self.key}"


def published_claims(tier: str, goldens_dir: Path | None = None) -> list[Claim]:
    """Every published-lane value of ``<goldens_dir>/*/<tier>.json``, in file order."""
    goldens_dir = goldens_dir or goldens.GOLDENS_DIR
    claims = []
    for path in sorted(goldens_dir.glob(f"*/{tier}.json")):
        recipe = path.parent.name
        _, values = goldens.load(recipe, tier, path)
        claims += [Claim(recipe, tier, g.key, g.value) for g in values.values() if g.lane == "published"]
    return claims


def measured_verdicts(report: dict) -> dict[str, tuple[str, str]]:
    """``recipe.tier.key`` -> (verdict, test) for every golden a test that ran has judged.

    The ``golden`` fixture records ``<recipe>.<tier>.<key>.verdict`` after comparing a
    measurement; a skipped test measured nothing, whatever it recorded.
    """
    found = {}
    for test in report.get("tests", []):
        if test.get("outcome") not in ("passed", "failed"):
            continue
        for name, verdict in test.get("properties", {}).items():
            if name.endswith(VERDICT_SUFFIX):
                found[name[: -len(VERDICT_SUFFIX)]] = (verdict, test["test"])
    return found


def require_claims(report_path: Path, tier: str, goldens_dir: Path | None = None) -> int:
    """Non-zero unless every published claim of ``tier`` has a measured verdict in the report."""
    claims = published_claims(tier, goldens_dir)
    if not claims:
        print(f"harness.ci: no published-lane goldens for tier {tier!r} in {goldens_dir or goldens.GOLDENS_DIR}; "
              "nothing to require (check --tier)", file=sys.stderr)  # fmt: skip
        return 1
    if not report_path.exists():
        print(f"harness.ci: {report_path} does not exist: the test run wrote no report, so none of "
              f"{len(claims)} published {tier} claims was measured", file=sys.stderr)  # fmt: skip
        return 1
    verdicts = measured_verdicts(json.loads(report_path.read_text()))
    missing = [c for c in claims if c.name not in verdicts]
    for claim in claims:
        if claim.name in verdicts:
            verdict, test = verdicts[claim.name]
            print(f"measured      {claim.name} (published {claim.value!r}): {verdict}  [{test}]")
    if missing:
        print(
            f"harness.ci: {len(missing)} of {len(claims)} published {tier} claims were not measured "
            "(their test was skipped, failed before measuring, or did not run):\n"
            + "\n".join(f"  NOT MEASURED  {c.name} (published {c.value!r})" for c in missing),
            file=sys.stderr,
        )
        return 1
    print(f"all {len(claims)} published {tier} claims were measured")
    return 0


def append_trend(report_path: Path, trend_path: Path) -> int:
    """One line per night: date, versions, and every golden measurement with its verdict."""
    report = json.loads(report_path.read_text())
    line = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": report.get("versions", {}),
        "goldens": report.get("goldens", []),
        "outcomes": {t["test"]: t["outcome"] for t in report["tests"]},
    }
    trend_path.parent.mkdir(parents=True, exist_ok=True)
    with trend_path.open("a") as f:
        f.write(json.dumps(line, default=str) + "\n")
    print(f"appended {len(line['goldens'])} golden measurement(s) to {trend_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.ci", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    guard = sub.add_parser("require-ran", help="fail when no test of the marker's folder executed")
    guard.add_argument("report", type=Path)
    guard.add_argument("--marker", default="neuron")
    claims = sub.add_parser("require-claims", help="fail unless every published claim of the tier was measured")
    claims.add_argument("report", type=Path)
    claims.add_argument("--tier", default="trn2")
    trend = sub.add_parser("trend", help="append the night's results to a JSON-lines trend file")
    trend.add_argument("report", type=Path)
    trend.add_argument("trend_file", type=Path)
    args = parser.parse_args(argv)
    if args.command == "require-ran":
        return require_ran(args.report, args.marker)
    if args.command == "require-claims":
        return require_claims(args.report, args.tier)
    return append_trend(args.report, args.trend_file)


if __name__ == "__main__":
    sys.exit(main())

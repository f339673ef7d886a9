"""CI helpers over the test report: the zero-tests guard and the nightly trend file.

    python -m recipes.ci require-ran report/tests.json --marker neuron
    python -m recipes.ci trend report/tests.json trend.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def ran_tests(report: dict, marker: str) -> list[dict]:
    """Tests of ``tests/<marker>/`` that actually executed (passed or failed, not skipped)."""
    prefix = f"tests/{marker}/"
    return [t for t in report["tests"] if t["test"].startswith(prefix) and t["outcome"] in ("passed", "failed")]


def require_ran(report_path: Path, marker: str) -> int:
    if not report_path.exists():
        print(f"recipes.ci: {report_path} does not exist: the test run wrote no report", file=sys.stderr)
        return 1
    report = json.loads(report_path.read_text())
    ran = ran_tests(report, marker)
    selected = [t for t in report["tests"] if t["test"].startswith(f"tests/{marker}/")]
    if not ran:
        reasons = sorted({t["properties"].get("skip_reason", "") for t in selected} - {""})
        print(
            f"recipes.ci: 0 of {len(selected)} {marker} tests actually ran (all skipped); "
            f"a nightly that skips everything proves nothing. {' '.join(reasons)}",
            file=sys.stderr,
        )
        return 1
    print(f"{len(ran)} of {len(selected)} {marker} tests ran")
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
    parser = argparse.ArgumentParser(prog="python -m recipes.ci", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    guard = sub.add_parser("require-ran", help="fail when no test of the marker's folder executed")
    guard.add_argument("report", type=Path)
    guard.add_argument("--marker", default="neuron")
    trend = sub.add_parser("trend", help="append the night's results to a JSON-lines trend file")
    trend.add_argument("report", type=Path)
    trend.add_argument("trend_file", type=Path)
    args = parser.parse_args(argv)
    if args.command == "require-ran":
        return require_ran(args.report, args.marker)
    return append_trend(args.report, args.trend_file)


if __name__ == "__main__":
    sys.exit(main())

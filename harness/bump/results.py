"""Reading one run of the cpu tier back: each test's outcome, failure text and recorded values.

``tests.json`` (harness.pytest_plugins.report) has the outcomes, goldens and versions; the failure
text comes from pytest's ``junit.xml``, and :func:`first_line` picks the one line of it that
says what went wrong, for the report's table.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from harness.bump.plan import BumpError, rel
from recipes.upstream_shape import MARKER


@dataclass(frozen=True)
class Result:
    """One test's outcome in one run, with its failure message (first line) and recorded values."""

    outcome: str  # passed, failed, skipped, absent
    message: str = ""
    properties: dict = field(default_factory=dict)


def junit_key(nodeid: str) -> tuple[str, str]:
    """(classname, name) pytest's JUnit writer gives ``nodeid``."""
    path, *parts = nodeid.split("::")
    module = path.removesuffix(".py").replace("/", ".")
    return ".".join([module, *parts[:-1]]), parts[-1] if parts else path


def junit_messages(path: Path) -> dict[tuple[str, str], str]:
    """The failure/error text of each failed test case in a JUnit file."""
    if not path.exists():
        return {}
    messages = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        for tag in ("failure", "error"):
            node = case.find(tag)
            if node is not None:
                text = "\n".join(t for t in (node.get("message", ""), node.text or "") if t)
                key = (case.get("classname", ""), case.get("name", ""))
                messages[key] = (messages.get(key, "") + "\n" + text).strip()
    return messages


def load_run(report_dir: Path) -> tuple[dict[str, Result], list[dict], dict]:
    """(results by test id, golden rows, versions) of one run's tests.json and junit.xml."""
    path = report_dir / "tests.json"
    if not path.exists():
        raise BumpError(
            f"{rel(path)} does not exist: that cpu-tier run wrote no report (see {rel(report_dir)}/pytest.log)"
        )
    data = json.loads(path.read_text())
    messages = junit_messages(report_dir / "junit.xml")
    results = {
        t["test"]: Result(
            t["outcome"], messages.get(junit_key(t["test"]), ""), t.get("properties", {})
        )
        for t in data["tests"]
    }
    return results, data.get("goldens", []), data.get("versions", {})


#: Where a failure says what went wrong, most telling first: the launcher's "rank N failed first:
#: Exc: msg", an exception a rank raised, then pytest's first "E   Exc: msg" line.
TELLING_LINES = (
    re.compile(r"failed first: (.*)"),
    re.compile(r"\[rank\d+\]: (\w+(?:Error|Exception|Exit)\b.*)"),
    re.compile(r"^E\s+(\w+(?:Error|Exception)\b.*)"),
    re.compile(r"^E\s+(.*)"),
)


def first_line(text: str, limit: int = 240) -> str:
    """The most telling line of a failure: a shape message (whole), else :data:`TELLING_LINES`, else line 1."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if MARKER in line:
            return shape_line(line)  # whole: it is the answer
    for pattern in TELLING_LINES:
        for line in lines:
            match = pattern.search(line)
            if match and match.group(1).strip():
                return match.group(1).strip()[:limit]
    return (lines[0] if lines else "")[:limit]


def shape_line(line: str) -> str:
    """The ``<package> <version> no longer fits workaround ...`` sentence inside a failure line."""
    match = re.search(r"([A-Za-z0-9_.\-]+ \S+ " + re.escape(MARKER) + r" .*)", line)
    return (match.group(1) if match else line).strip().rstrip("'\")")

"""Comparing the lock's run of the cpu tier with the candidate's: what the bump breaks or fixes.

Each test's verdict in both runs and how it changed; the canaries that flipped (an upstream
defect a workaround exists for came or went); the goldens that moved; the workarounds whose
upstream shape is gone (``recipes.upstream_shape`` messages); and the published-number checks
the candidate breaks, which decide the exit code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from harness.base.environment import normalize
from harness.bump.candidate import Move
from harness.bump.plan import EXIT_OK, EXIT_PUBLISHED_BROKEN
from harness.bump.results import Result, first_line, shape_line
from recipes.upstream_shape import MARKER

#: Canaries: a test that passes while an upstream defect a workaround exists for is still there.
CANARY_FILES = ("tests/cpu/test_hf_compat_canaries.py", "tests/cpu/test_platform.py")
#: This test fails in any bump by design (the venv is not the lock); expected when it names only moved packages.
LOCK_DRIFT_TEST = "tests/cpu/test_versions.py::test_installed_packages_match_the_lock"
#: Unit tests of the lock check that take the installed versions to be the lock's (they write
#: ``transformers==5.16.0`` into a fake lock and expect no drift): in a bump that moves one of
#: those packages they fail by construction; expected when their failure names a moved package.
LOCK_COUPLED_TESTS = (
    "tests/cpu/test_versions.py::test_drift_names_each_package",
    "tests/cpu/test_versions.py::test_a_shadowing_copy_on_pythonpath_is_named",
)
CLAIM_LANES = ("published", "proxy")
PASSING_VERDICTS = ("pass", "pass, other environment")


@dataclass(frozen=True)
class Row:
    test: str
    lock: str
    candidate: str
    change: str
    message: str = ""


@dataclass(frozen=True)
class CanaryFlip:
    test: str
    lock: str
    candidate: str
    meaning: str
    message: str


@dataclass(frozen=True)
class GoldenMove:
    recipe: str
    tier: str
    key: str
    lane: str | None
    old: object
    new: object
    difference: float | None
    verdict: str | None


@dataclass(frozen=True)
class BrokenWorkaround:
    message: str
    tests: tuple[str, ...]


@dataclass(frozen=True)
class BrokenClaim:
    recipe: str
    key: str
    lane: str | None
    published: object
    measured: object
    verdict: str


@dataclass
class Comparison:
    rows: list[Row]
    canaries: list[CanaryFlip]
    goldens: list[GoldenMove]
    workarounds: list[BrokenWorkaround]
    published: list[BrokenClaim]

    @property
    def exit_code(self) -> int:
        return EXIT_PUBLISHED_BROKEN if self.published else EXIT_OK

    def with_reruns(self, reruns: dict[str, list[str]]) -> "Comparison":
        """Each "broke" judged again on its re-runs' outcomes: one that passed on any re-run is "flaky", not the
        candidate's break; one that failed every re-run stays "broke" and says so."""
        rows = []
        for row in self.rows:
            outcomes = reruns.get(row.test)
            if row.change == "broke" and outcomes:
                passed = outcomes.count("passed")
                change = (
                    f"flaky (passed {passed} of {len(outcomes)} re-runs)" if passed else "broke"
                )
                message = (
                    row.message
                    if passed
                    else f"{row.message} (failed {len(outcomes)} of {len(outcomes)} re-runs)"
                )
                row = replace(row, change=change, message=message)
            rows.append(row)
        return replace(self, rows=rows)

    def broke(self) -> list[str]:
        return [row.test for row in self.rows if row.change == "broke"]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.rows:
            out[row.change] = out.get(row.change, 0) + 1
        return out


def is_canary(test: str) -> bool:
    path, _, name = test.partition("::")
    return path in CANARY_FILES and name.startswith("test_canary")


def drift_is_the_bump(result: Result, moved: list[Move]) -> bool:
    """The lock-drift test failed only because of the packages the bump moved."""
    problems = result.properties.get("lock_drift") or []
    names = {m.name for m in moved}
    return bool(problems) and all(normalize(p.split(":", 1)[0]) in names for p in problems)


def change(test: str, lock: Result, candidate: Result, moved: list[Move]) -> str:
    """How a test's verdict changed from the lock to the candidate, in a word or two."""
    if (
        test == LOCK_DRIFT_TEST
        and candidate.outcome == "failed"
        and drift_is_the_bump(candidate, moved)
    ):
        return "expected (the bump)"
    if (
        test in LOCK_COUPLED_TESTS
        and candidate.outcome == "failed"
        and lock.outcome == "passed"
        and any(re.search(rf"\b{re.escape(m.name)}\b", candidate.message) for m in moved)
    ):
        return "expected (the bump)"
    if lock.outcome == candidate.outcome:
        return "same"
    if is_canary(test):
        return "canary flipped"
    if lock.outcome == "passed" and candidate.outcome == "failed":
        return "broke"
    if lock.outcome == "failed" and candidate.outcome == "passed":
        return "fixed"
    if candidate.outcome == "absent":
        return "not run"
    if lock.outcome == "absent":
        return "new"
    return f"{lock.outcome} → {candidate.outcome}"


def canary_meaning(lock: str, candidate: str) -> str:
    if lock == "passed" and candidate == "failed":
        return (
            "the defect is gone upstream (or the canary cannot tell any more): "
            "its workaround can go, once the message below confirms it"
        )
    if lock == "failed" and candidate == "passed":
        return "the defect is back upstream: keep (or restore) its workaround"
    return f"{lock} → {candidate}"


def golden_key(row: dict) -> tuple[str, str, str]:
    return row["recipe"], row["tier"], row["key"]


def difference(old, new) -> float | None:
    """new − old for numbers; for two curves of one length, the largest per-step |new − old|."""
    numbers = (int, float)
    if isinstance(old, numbers) and isinstance(new, numbers) and not isinstance(old, bool):
        return new - old
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new) and old:
        steps = [
            b - a for a, b in zip(old, new) if isinstance(a, numbers) and isinstance(b, numbers)
        ]
        return max(steps, key=abs) if len(steps) == len(old) else None
    return None


def compare(lock_run: tuple, candidate_run: tuple, moved: list[Move]) -> Comparison:
    """Compare two loaded runs (``load_run`` results) of the cpu tier."""
    lock_results, lock_goldens, _ = lock_run
    cand_results, cand_goldens, _ = candidate_run
    absent = Result("absent")
    rows, canaries = [], []
    for test in sorted(set(lock_results) | set(cand_results)):
        lock, cand = lock_results.get(test, absent), cand_results.get(test, absent)
        what = change(test, lock, cand, moved)
        message = first_line(cand.message if cand.outcome == "failed" else lock.message)
        rows.append(Row(test, lock.outcome, cand.outcome, what, message if what != "same" else ""))
        if what == "canary flipped":
            canaries.append(
                CanaryFlip(
                    test,
                    lock.outcome,
                    cand.outcome,
                    canary_meaning(lock.outcome, cand.outcome),
                    first_line(cand.message or lock.message),
                )
            )

    old = {golden_key(r): r for r in lock_goldens}
    new = {golden_key(r): r for r in cand_goldens}
    golden_moves = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, {}), new.get(key, {})
        if a.get("measured") != b.get("measured"):
            golden_moves.append(
                GoldenMove(
                    *key,
                    lane=b.get("lane") or a.get("lane"),
                    old=a.get("measured"),
                    new=b.get("measured"),
                    difference=difference(a.get("measured"), b.get("measured")),
                    verdict=b.get("verdict"),
                )
            )

    published = [
        BrokenClaim(
            r["recipe"],
            r["key"],
            r.get("lane"),
            r.get("published"),
            r.get("measured"),
            r["verdict"],
        )
        for r in cand_goldens
        if r.get("lane") in CLAIM_LANES and r.get("verdict") not in PASSING_VERDICTS
    ]
    published += [
        BrokenClaim(
            r["recipe"],
            r["key"],
            r.get("lane"),
            r.get("published"),
            None,
            "not measured on the candidate",
        )
        for key, r in old.items()
        if r.get("lane") in CLAIM_LANES and key not in new
    ]

    by_message: dict[str, list[str]] = {}
    for test, result in cand_results.items():
        for line in result.message.splitlines():
            if MARKER in line:
                by_message.setdefault(shape_line(line), []).append(test)
    workarounds = [
        BrokenWorkaround(m, tuple(sorted(set(t)))) for m, t in sorted(by_message.items())
    ]
    return Comparison(rows, canaries, golden_moves, workarounds, published)

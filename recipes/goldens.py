"""Goldens: recorded values per recipe and tier, each with its tolerance and the reason for it.

``fixtures/goldens/<recipe>/<tier>.json``::

    {"metadata": {"lock_sha256": ..., "versions": {...}, "machine": ...},
     "values": {"step1_loss_hf": {"value": 1.49, "tolerance": 0.0, "lane": "exact",
                                  "reason": "...", "source": "..."}}}

Two lanes: ``exact`` (cpu, deterministic on the pinned lock; regenerated from a
real run) and ``published`` (the tutorial's claims; never regenerated). A
mismatch is a "stale golden" when the recorded metadata differs from the running
environment and a "regression" when it matches.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from recipes.errors import RecipeError
from recipes.tiers import FIXTURES, REPO_ROOT

GOLDENS_DIR = FIXTURES / "goldens"
LOCK_FILE = REPO_ROOT / "requirements-lock.txt"
LANES = ("exact", "published")
ENTRY_KEYS = {"value", "tolerance", "lane", "reason", "source"}
VERSION_KEYS = ("torch", "torchtitan", "transformers", "torch-neuronx")


class GoldenError(RecipeError):
    """A goldens file that cannot be trusted: names the file, the key and the problem."""


@dataclass(frozen=True)
class Golden:
    key: str
    value: object
    tolerance: float
    lane: str
    reason: str
    source: str = ""


@dataclass(frozen=True)
class Verdict:
    key: str
    measured: object
    golden: Golden
    passed: bool
    kind: str  # "pass", "regression" or "stale golden"

    def message(self) -> str:
        g = self.golden
        return (
            f"{self.kind}: {self.key} measured {self.measured!r}, golden {g.value!r} "
            f"± {g.tolerance} ({g.lane}: {g.reason})"
        )


def lock_sha256(path: Path = LOCK_FILE) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def environment_metadata() -> dict:
    from recipes.report import versions

    found = versions()
    return {
        "lock_sha256": lock_sha256(),
        "versions": {k: found.get(k) for k in VERSION_KEYS},
        "machine": found["machine"],
    }


def goldens_path(recipe: str, tier: str) -> Path:
    return GOLDENS_DIR / recipe / f"{tier}.json"


def _finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def _parse_entry(path: Path, key: str, entry: dict) -> Golden:
    if not isinstance(entry, dict):
        raise GoldenError(f"{path}: {key!r} must be an object with value/tolerance/lane/reason")
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise GoldenError(f"{path}: {key!r} has unknown field(s) {sorted(unknown)}; allowed: {sorted(ENTRY_KEYS)}")
    for required in ("value", "tolerance", "lane", "reason"):
        if required not in entry:
            raise GoldenError(f"{path}: {key!r} has no {required!r}; every golden states it")
    if entry["lane"] not in LANES:
        raise GoldenError(f"{path}: {key!r} lane {entry['lane']!r} is not one of {LANES}")
    tolerance = entry["tolerance"]
    if not isinstance(tolerance, (int, float)) or not math.isfinite(tolerance) or tolerance < 0:
        raise GoldenError(f"{path}: {key!r} tolerance {tolerance!r} must be a finite number ≥ 0")
    if not _finite(entry["value"]):
        raise GoldenError(f"{path}: {key!r} value {entry['value']!r} is not finite; goldens never hold NaN/inf")
    return Golden(key=key, value=entry["value"], tolerance=float(tolerance), lane=entry["lane"],
                  reason=entry["reason"], source=entry.get("source", ""))


def load(recipe: str, tier: str, path: Path | None = None) -> tuple[dict, dict[str, Golden]]:
    """(metadata, goldens) of one recipe and tier; raises GoldenError on a bad file."""
    path = path or goldens_path(recipe, tier)
    try:
        data = json.loads(path.read_text(), parse_constant=lambda c: float(c))
    except FileNotFoundError:
        raise GoldenError(f"{path} does not exist; regenerate cpu goldens with `make goldens`") from None
    unknown = set(data) - {"metadata", "values"}
    if unknown:
        raise GoldenError(f"{path}: unknown top-level key(s) {sorted(unknown)}")
    values = {k: _parse_entry(path, k, v) for k, v in data.get("values", {}).items()}
    return data.get("metadata", {}), values


def _within(measured, golden: Golden) -> bool:
    if isinstance(golden.value, (int, float)) and isinstance(measured, (int, float)):
        return math.isfinite(measured) and abs(measured - golden.value) <= golden.tolerance
    return measured == golden.value


def compare(key: str, measured, goldens: dict[str, Golden], metadata: dict, env: dict | None = None) -> Verdict:
    """Measured vs golden; a failure is 'stale golden' if the recorded environment differs."""
    golden = goldens[key]
    passed = _within(measured, golden)
    if passed:
        kind = "pass"
    elif golden.lane == "exact" and metadata != (env or environment_metadata()):
        kind = "stale golden"
    else:
        kind = "regression"
    return Verdict(key=key, measured=measured, golden=golden, passed=passed, kind=kind)


def update_exact(recipe: str, tier: str, measured: dict[str, object], reasons: dict[str, str]) -> Path:
    """Rewrite the exact-lane values of a goldens file from a real run; published values stay."""
    bad = [k for k, v in measured.items() if not _finite(v)]
    if bad:
        raise GoldenError(f"refusing to record non-finite golden(s) {bad} for {recipe}/{tier}")
    path = goldens_path(recipe, tier)
    data = json.loads(path.read_text()) if path.exists() else {"values": {}}
    for key, value in measured.items():
        entry = data["values"].get(key)
        if entry is not None and entry.get("lane") == "published":
            raise GoldenError(f"{path}: {key!r} is a published value and is never regenerated")
        data["values"][key] = {"value": value, "tolerance": 0.0, "lane": "exact", "reason": reasons[key]}
    data["metadata"] = environment_metadata()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path

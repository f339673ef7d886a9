"""Goldens: recorded values per recipe and tier, each with its tolerance and the reason for it.

``fixtures/goldens/<recipe>/<tier>.json``::

    {"metadata": {"lock_sha256": ..., "versions": {...}, "machine": ..., "cpu": {...}},
     "values": {"step1_loss_hf": {"value": 1.49, "tolerance": 0.0, "lane": "exact", "reason": "..."},
                "step1_loss_random": {"claim": "step1_loss_random", "tolerance": 0.03,
                                      "lane": "published", "reason": "..."}}}

Three lanes:

* ``published``: a tutorial number, measured where the tutorial measured it (trn2).
* ``proxy``: a cpu measurement that stands in for a tutorial number (e.g. the random-init
  loss at the real 4B width with one layer); judged against that number.
* ``exact``: a value this lock gives on the cpu tier, regenerated from a real run.

``published`` and ``proxy`` entries name a claim of :mod:`recipes.published`, the one
place the tutorial's numbers are written, and carry no value of their own.

An exact value is bitwise only in the environment that recorded it (versions, lock, CPU
model, ISA, BLAS build). Elsewhere it is held to :data:`PORTABLE_RTOL` instead, and a
miss reads "stale golden" (with how to regenerate), not "regression".
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from recipes.errors import RecipeError
from recipes.tiers import FIXTURES, REPO_ROOT

#: ``QWEN3_GOLDENS_DIR`` points a run at another set (a bump rehearsal, a test of a failing check).
GOLDENS_DIR = Path(os.environ.get("QWEN3_GOLDENS_DIR") or FIXTURES / "goldens")
LOCK_FILE = REPO_ROOT / "requirements-lock.txt"
LANES = ("exact", "proxy", "published")
CLAIM_LANES = ("proxy", "published")
ENTRY_KEYS = {"value", "claim", "tolerance", "lane", "reason"}

#: Relative tolerance of an exact-lane float recorded in another environment. Measured: the
#: fixture's step-1 loss moves by 1.2e-7 (one fp32 ulp at 1.5) between AVX2 and SSE4.2 kernels
#: on one machine; 1e-6 is 8 ulps, far below any effect a golden here guards (≥ 1e-4).
PORTABLE_RTOL = 1e-6

REGENERATE = "`make goldens` lists every change (old → new); `make goldens ACCEPT=1` writes them"
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
    #: The claim of recipes.published a published/proxy entry stands for.
    claim: str | None = None


@dataclass(frozen=True)
class Verdict:
    key: str
    measured: object
    golden: Golden
    passed: bool
    kind: str  # "pass", "pass, other environment", "regression" or "stale golden"
    #: Environment fields that differ from the ones the golden was recorded in.
    differs: tuple[str, ...] = ()

    def message(self) -> str:
        g = self.golden
        text = (
            f"{self.kind}: {self.key} measured {self.measured!r}, golden {g.value!r} "
            f"± {g.tolerance} ({g.lane}: {g.reason})"
        )
        if self.kind == "stale golden":
            text += f". Recorded in another environment (differs in {', '.join(self.differs)}); {REGENERATE}"
        return text


def lock_sha256(path: Path = LOCK_FILE) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def environment_metadata() -> dict:
    """What decides the bits of an exact-lane value: lock, versions, machine and CPU kernels."""
    from recipes.report import cpu_fingerprint, versions

    found = versions()
    return {
        "lock_sha256": lock_sha256(),
        "versions": {k: found.get(k) for k in VERSION_KEYS},
        "machine": found["machine"],
        "cpu": cpu_fingerprint(),
    }


def environment_differences(recorded: dict, here: dict) -> tuple[str, ...]:
    """Dotted names of the fields where two environment records disagree."""
    out = []
    for key in sorted(set(recorded) | set(here)):
        a, b = recorded.get(key), here.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{key}.{sub}" for sub in environment_differences(a, b)]
        elif a != b:
            out.append(key)
    return tuple(out)


def goldens_path(recipe: str, tier: str) -> Path:
    return GOLDENS_DIR / recipe / f"{tier}.json"


def _finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def _parse_entry(path: Path, key: str, entry: dict) -> Golden:
    from recipes.published import CLAIMS

    if not isinstance(entry, dict):
        raise GoldenError(f"{path}: {key!r} must be an object with value/tolerance/lane/reason")
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise GoldenError(f"{path}: {key!r} has unknown field(s) {sorted(unknown)}; allowed: {sorted(ENTRY_KEYS)}")
    for required in ("tolerance", "lane", "reason"):
        if required not in entry:
            raise GoldenError(f"{path}: {key!r} has no {required!r}; every golden states it")
    lane = entry["lane"]
    if lane not in LANES:
        raise GoldenError(f"{path}: {key!r} lane {lane!r} is not one of {LANES}")
    if lane in CLAIM_LANES:
        if "value" in entry:
            raise GoldenError(
                f"{path}: {key!r} is a {lane} entry with its own 'value'; the tutorial's numbers are "
                "written only in recipes/published.py: name one with 'claim' instead"
            )
        claim = entry.get("claim")
        if claim not in CLAIMS:
            raise GoldenError(f"{path}: {key!r} claim {claim!r} is not one of recipes.published.CLAIMS {sorted(CLAIMS)}")
        value = CLAIMS[claim].value
    else:
        if "claim" in entry:
            raise GoldenError(f"{path}: {key!r} is an exact entry and cannot name a claim; use lane 'proxy'")
        if "value" not in entry:
            raise GoldenError(f"{path}: {key!r} has no 'value'; every exact golden states it")
        value, claim = entry["value"], None
    tolerance = entry["tolerance"]
    if not isinstance(tolerance, (int, float)) or not math.isfinite(tolerance) or tolerance < 0:
        raise GoldenError(f"{path}: {key!r} tolerance {tolerance!r} must be a finite number ≥ 0")
    if not _finite(value):
        raise GoldenError(f"{path}: {key!r} value {value!r} is not finite; goldens never hold NaN/inf")
    return Golden(key=key, value=value, tolerance=float(tolerance), lane=lane, reason=entry["reason"], claim=claim)


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


def _within(measured, golden: Golden, rtol: float = 0.0) -> bool:
    if isinstance(golden.value, (int, float)) and isinstance(measured, (int, float)):
        allowed = max(golden.tolerance, rtol * abs(golden.value))
        return math.isfinite(measured) and abs(measured - golden.value) <= allowed
    return measured == golden.value


def compare(key: str, measured, goldens: dict[str, Golden], metadata: dict, env: dict | None = None) -> Verdict:
    """Measured vs golden. An exact value from another environment is held to PORTABLE_RTOL."""
    golden = goldens[key]
    differs = environment_differences(metadata, env or environment_metadata()) if golden.lane == "exact" else ()
    if _within(measured, golden):
        kind, passed = "pass", True
    elif differs and _within(measured, golden, PORTABLE_RTOL):
        kind, passed = "pass, other environment", True
    else:
        kind, passed = ("stale golden" if differs else "regression"), False
    return Verdict(key=key, measured=measured, golden=golden, passed=passed, kind=kind, differs=differs)


def check_finite(recipe: str, tier: str, measured: dict[str, object]) -> None:
    bad = [k for k, v in measured.items() if not _finite(v)]
    if bad:
        raise GoldenError(f"refusing to record non-finite golden(s) {bad} for {recipe}/{tier}")


def update_exact(recipe: str, tier: str, measured: dict[str, object], reasons: dict[str, str]) -> Path:
    """Rewrite the exact-lane values of a goldens file from a real run; published values stay."""
    check_finite(recipe, tier, measured)
    path = goldens_path(recipe, tier)
    data = json.loads(path.read_text()) if path.exists() else {"values": {}}
    for key, value in measured.items():
        entry = data["values"].get(key)
        if entry is not None and entry.get("lane") in CLAIM_LANES:
            raise GoldenError(f"{path}: {key!r} is a {entry['lane']} entry (a tutorial claim) and is never regenerated")
        reason = reasons.get(key) or (entry or {}).get("reason") or ""
        if not reason:
            raise GoldenError(f"{path}: new golden {key!r} needs a reason (pass reason=... to golden())")
        data["values"][key] = {"value": value, "tolerance": 0.0, "lane": "exact", "reason": reason}
    data["metadata"] = environment_metadata()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


@dataclass(frozen=True)
class Change:
    recipe: str
    tier: str
    key: str
    old: object  # None for a new golden
    new: object
    reason: str

    def line(self) -> str:
        where = f"{self.recipe}/{self.tier} {self.key}"
        if self.old is None:
            return f"  new      {where} = {self.new!r}"
        diff = ""
        if isinstance(self.old, (int, float)) and isinstance(self.new, (int, float)):
            diff = f"  (Δ {self.new - self.old:+.3g})"
        return f"  changed  {where}: {self.old!r} → {self.new!r}{diff}"


def proposed_changes(proposals: list[dict]) -> list[Change]:
    """Proposals that differ from what the goldens files hold (the environment is always rewritten)."""
    changes = []
    for p in sorted(proposals, key=lambda p: (p["recipe"], p["tier"], p["key"])):
        path = goldens_path(p["recipe"], p["tier"])
        _, values = load(p["recipe"], p["tier"]) if path.exists() else ({}, {})
        old = values[p["key"]].value if p["key"] in values else None
        if old != p["value"]:
            changes.append(Change(p["recipe"], p["tier"], p["key"], old, p["value"], p.get("reason", "")))
    return changes


def format_changes(changes: list[Change], measured: int) -> str:
    head = f"goldens: {measured} exact value(s) measured, {len(changes)} would change"
    return "\n".join([head, *(c.line() for c in changes)])


def apply_changes(changes: list[Change]) -> list[Path]:
    by_file: dict[tuple[str, str], list[Change]] = {}
    for c in changes:
        by_file.setdefault((c.recipe, c.tier), []).append(c)
    return [
        update_exact(recipe, tier, {c.key: c.new for c in group}, {c.key: c.reason for c in group})
        for (recipe, tier), group in sorted(by_file.items())
    ]

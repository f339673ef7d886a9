"""Goldens: recorded values per recipe and tier, each with its tolerance and the reason for it.

``fixtures/goldens/<recipe>/<tier>.json``::

    {"metadata": {"lock_sha256": ..., "versions": {...}, "machine": ..., "cpu": {...}},
     "values": {"step1_loss_hf": {"value": 1.49, "tolerance": 0.0, "lane": "exact", "reason": "..."},
                "step1_loss_random": {"claim": "step1_loss_random", "tolerance": 0.03,
                                      "lane": "published", "reason": "..."}}}

Four lanes:

* ``published``: a tutorial number, measured where the tutorial measured it (trn2).
* ``proxy``: a cpu measurement that stands in for a tutorial number (e.g. the random-init
  loss at the real 4B width with one layer); judged against that number.
* ``exact``: a value this lock gives on the cpu tier, regenerated from a real run.
* ``band``: a per-step curve from repeated runs where runs are not bitwise repeatable
  (trn2): ``value`` holds the per-step mean, ``tolerance`` the per-step half-width
  (k·std over N runs, at least a stated floor), ``band`` how it was made. Written only
  by ``python -m harness.judge.band``, never by ``make goldens``.

``published`` and ``proxy`` entries name a claim of :mod:`harness.declare.published`, the one
place the tutorial's numbers are written, and carry no value of their own.

Two optional fields keep a number from being judged on the wrong footing (trn2), and either
makes the verdict "unmeasured" (recorded with why, neither pass nor fail; ``python -m harness.night.ci
require-claims`` fails the nightly for a published claim left so, or left "inputs differ"):

* ``inputs``: the run's input key (sha256 of every weights, config.json, tokenizer and dataset
  file, allowed mismatches, kept defects: :func:`harness.config.provenance.input_key`); ``null`` until
  ``python -m harness.night.ci record-inputs`` writes a night's key in. A night whose inputs differ
  reads "inputs differ from the recorded run": a number judged on other weights proves nothing.
* ``unmeasured``: the tolerance is a stated allowance no run has measured yet (why, and what
  will measure it), removed once a night's measurement replaces it.

A value may be a list (a loss curve: one element per step); every rule below then
applies element by element.

An exact value is bitwise only in the environment that recorded it (versions, lock, CPU
model, ISA, BLAS build). Elsewhere it is held to :data:`PORTABLE_RTOL` instead, or to the
entry's own ``portable_rtol`` where a measurement showed the value moves more between
environments (a 100-step curve does), and a miss reads "stale golden" (with how to
regenerate), not "regression".
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
LANES = ("exact", "proxy", "published", "band")
CLAIM_LANES = ("proxy", "published")
ENTRY_KEYS = {
    "value",
    "claim",
    "tolerance",
    "lane",
    "reason",
    "portable_rtol",
    "band",
    "inputs",
    "unmeasured",
}
#: Verdicts that neither pass nor fail (``harness.judge.verdicts.Verdict.passed`` is None): the value is recorded with why it cannot be judged yet.
NOT_JUDGED = "unmeasured"
INPUTS_DIFFER = "inputs differ from the recorded run"
UNJUDGED_KINDS = (NOT_JUDGED, INPUTS_DIFFER)
#: What a band entry's ``band`` record must state (harness.judge.band writes it).
BAND_KEYS = {"n", "k", "min_halfwidth", "std", "runs", "command", "environment"}

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
    #: The claim of harness.declare.published a published/proxy entry stands for.
    claim: str | None = None
    #: Exact lane: relative tolerance in another environment, when not PORTABLE_RTOL.
    portable_rtol: float | None = None
    #: Band lane: how the band was made (N, k, floor, per-step std, the runs, command, environment).
    band: dict | None = None
    #: Whether the key includes the run's inputs (the entry has an ``inputs`` field), and the
    #: recorded ones (None: not recorded yet).
    keyed_by_inputs: bool = False
    inputs: dict | None = None
    #: Why the tolerance is not a measurement yet (None: it is one, or is derived and cited).
    unmeasured: str | None = None


def why_not_judged(golden: "Golden") -> str:
    """Why a golden cannot judge a measurement yet: its tolerance is unmeasured, or no night's inputs are recorded."""
    if golden.unmeasured:
        return golden.unmeasured
    return (
        "no night's inputs are recorded for it yet: the first night measures them, "
        "`python -m harness.night.ci record-inputs` records them, and later nights are judged on them"
    )


def lock_sha256(path: Path = LOCK_FILE) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def environment_metadata() -> dict:
    """What decides the bits of an exact-lane value: lock, versions, machine and CPU kernels."""
    from harness.base.environment import cpu_fingerprint, versions  # noqa: PLC0415 -- --help stays fast: harness.base.environment 20 ms (on python -m harness's import path)

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


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def is_curve(value) -> bool:
    """A list of numbers (a loss curve), judged element by element."""
    return isinstance(value, list) and bool(value) and all(is_number(v) for v in value)


def _tolerance_ok(t) -> bool:
    return is_number(t) and math.isfinite(t) and t >= 0


def _parse_entry(path: Path, key: str, entry: dict) -> Golden:
    from harness.declare.published import CLAIMS  # noqa: PLC0415 -- --help stays fast: harness.declare.published (on python -m harness's import path)

    if not isinstance(entry, dict):
        raise GoldenError(f"{path}: {key!r} must be an object with value/tolerance/lane/reason")
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise GoldenError(
            f"{path}: {key!r} has unknown field(s) {sorted(unknown)}; allowed: {sorted(ENTRY_KEYS)}"
        )
    for required in ("tolerance", "lane", "reason"):
        if required not in entry:
            raise GoldenError(f"{path}: {key!r} has no {required!r}; every golden states it")
    lane = entry["lane"]
    if lane not in LANES:
        raise GoldenError(f"{path}: {key!r} lane {lane!r} is not one of {LANES}")
    if "portable_rtol" in entry and lane != "exact":
        raise GoldenError(
            f"{path}: {key!r} is a {lane} entry; only exact values have a 'portable_rtol'"
        )
    if "band" in entry and lane != "band":
        raise GoldenError(
            f"{path}: {key!r} is a {lane} entry; only lane 'band' has a 'band' record"
        )
    if lane in CLAIM_LANES:
        if "value" in entry:
            raise GoldenError(
                f"{path}: {key!r} is a {lane} entry with its own 'value'; the tutorial's numbers are "
                "written only in harness/declare/published.py: name one with 'claim' instead"
            )
        claim = entry.get("claim")
        if claim not in CLAIMS:
            raise GoldenError(
                f"{path}: {key!r} claim {claim!r} is not one of harness.declare.published.CLAIMS {sorted(CLAIMS)}"
            )
        value = CLAIMS[claim].value
    else:
        if "claim" in entry:
            article = "an" if lane == "exact" else "a"
            raise GoldenError(
                f"{path}: {key!r} is {article} {lane} entry and cannot name a claim; use lane 'proxy'"
            )
        if "value" not in entry:
            raise GoldenError(f"{path}: {key!r} has no 'value'; every {lane} golden states it")
        value, claim = entry["value"], None
    tolerance = entry["tolerance"]
    if not _finite(value):
        raise GoldenError(
            f"{path}: {key!r} value {value!r} is not finite; goldens never hold NaN/inf"
        )
    band = None
    if lane == "band":
        band = _parse_band(path, key, entry, value, tolerance)
        tolerance = [float(t) for t in tolerance]
    elif not _tolerance_ok(tolerance):
        raise GoldenError(f"{path}: {key!r} tolerance {tolerance!r} must be a finite number ≥ 0")
    else:
        tolerance = float(tolerance)
    portable = entry.get("portable_rtol")
    if portable is not None and not _tolerance_ok(portable):
        raise GoldenError(f"{path}: {key!r} portable_rtol {portable!r} must be a finite number ≥ 0")
    inputs = entry.get("inputs")
    if inputs is not None and not isinstance(inputs, dict):
        raise GoldenError(
            f"{path}: {key!r} inputs must be null (not recorded yet) or the recorded input key"
        )
    unmeasured = entry.get("unmeasured")
    if unmeasured is not None and not (isinstance(unmeasured, str) and len(unmeasured) > 20):
        raise GoldenError(
            f"{path}: {key!r} unmeasured must say why the tolerance is not measured and what will"
        )
    return Golden(
        key=key,
        value=value,
        tolerance=tolerance,
        lane=lane,
        reason=entry["reason"],
        claim=claim,
        portable_rtol=None if portable is None else float(portable),
        band=band,
        keyed_by_inputs="inputs" in entry,
        inputs=inputs,
        unmeasured=unmeasured,
    )


def _parse_band(path: Path, key: str, entry: dict, value, tolerance) -> dict:
    """A band entry: per-step means, per-step half-widths of the same length, and how they were made."""
    if not is_curve(value):
        raise GoldenError(
            f"{path}: {key!r} is a band: 'value' must be the per-step means (a list of numbers)"
        )
    if not (
        isinstance(tolerance, list)
        and len(tolerance) == len(value)
        and all(_tolerance_ok(t) for t in tolerance)
    ):
        raise GoldenError(
            f"{path}: {key!r} is a band: 'tolerance' must be one finite half-width ≥ 0 per step ({len(value)})"
        )
    band = entry.get("band")
    if not isinstance(band, dict) or BAND_KEYS - set(band):
        missing = sorted(BAND_KEYS - set(band)) if isinstance(band, dict) else sorted(BAND_KEYS)
        raise GoldenError(
            f"{path}: {key!r} is a band without how it was made: 'band' lacks {missing}"
        )
    if not (isinstance(band["n"], int) and band["n"] >= 2 and len(band["runs"]) == band["n"]):
        raise GoldenError(
            f"{path}: {key!r} band n={band['n']!r} must be ≥ 2 and count its runs ({len(band['runs'])})"
        )
    return band


def load(recipe: str, tier: str, path: Path | None = None) -> tuple[dict, dict[str, Golden]]:
    """(metadata, goldens) of one recipe and tier; raises GoldenError on a bad file."""
    path = path or goldens_path(recipe, tier)
    try:
        data = json.loads(path.read_text(), parse_constant=lambda c: float(c))
    except FileNotFoundError:
        raise GoldenError(
            f"{path} does not exist; regenerate cpu goldens with `make goldens`"
        ) from None
    unknown = set(data) - {"metadata", "values"}
    if unknown:
        raise GoldenError(f"{path}: unknown top-level key(s) {sorted(unknown)}")
    values = {k: _parse_entry(path, k, v) for k, v in data.get("values", {}).items()}
    return data.get("metadata", {}), values


def check_finite(recipe: str, tier: str, measured: dict[str, object]) -> None:
    bad = [k for k, v in measured.items() if not _finite(v)]
    if bad:
        raise GoldenError(f"refusing to record non-finite golden(s) {bad} for {recipe}/{tier}")


def update_exact(
    recipe: str,
    tier: str,
    measured: dict[str, object],
    reasons: dict[str, str],
    portable_rtols: dict[str, float | None] | None = None,
    unchanged: tuple[str, ...] | list[str] = (),
) -> Path:
    """Rewrite the exact-lane values of a goldens file from a real run; published values stay.

    ``portable_rtols`` sets an entry's own cross-environment tolerance; an entry not named
    there keeps the one it has. ``unchanged``: keys this run measured equal to the file's. The
    file's environment speaks for all its exact values: stamping one this run did not measure is refused.
    """
    check_finite(recipe, tier, measured)
    portable_rtols = portable_rtols or {}
    path = goldens_path(recipe, tier)
    data = json.loads(path.read_text()) if path.exists() else {"values": {}}
    done = {*measured, *unchanged}
    stale = sorted(
        k for k, e in data["values"].items() if e.get("lane") == "exact" and k not in done
    )
    differs = environment_differences(data.get("metadata") or {}, environment_metadata())
    if stale and differs:
        raise GoldenError(
            f"{path}: exact golden(s) {stale} were not measured in this run and the file's environment "
            f"differs ({', '.join(differs)}): writing would stamp them as measured here. Measure them in "
            "the same run (`make goldens`: the whole cpu tier), or remove them"
        )
    for key, value in measured.items():
        entry = data["values"].get(key)
        if entry is not None and entry.get("lane") in CLAIM_LANES:
            raise GoldenError(
                f"{path}: {key!r} is a {entry['lane']} entry (a tutorial claim) and is never regenerated"
            )
        if entry is not None and entry.get("lane") == "band":
            raise GoldenError(
                f"{path}: {key!r} is a band; only `python -m harness.judge.band` writes it"
            )
        reason = reasons.get(key) or (entry or {}).get("reason") or ""
        if not reason:
            raise GoldenError(
                f"{path}: new golden {key!r} needs a reason (pass reason=... to golden())"
            )
        new = {"value": value, "tolerance": 0.0, "lane": "exact", "reason": reason}
        portable = portable_rtols.get(key, (entry or {}).get("portable_rtol"))
        if portable is not None:
            new["portable_rtol"] = portable
        data["values"][key] = new
    data["metadata"] = environment_metadata()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def short_value(value) -> str:
    """A value for one line: a curve as its length and ends, anything else as repr."""
    if is_curve(value) and len(value) > 4:
        return f"[{len(value)} steps: {value[0]!r}, {value[1]!r}, …, {value[-1]!r}]"
    return repr(value)


@dataclass(frozen=True)
class Change:
    recipe: str
    tier: str
    key: str
    old: object  # None for a new golden
    new: object
    reason: str
    #: The entry's own cross-environment tolerance (None: keep the file's, or PORTABLE_RTOL).
    portable_rtol: float | None = None
    old_portable_rtol: float | None = None

    def line(self) -> str:
        where = f"{self.recipe}/{self.tier} {self.key}"
        portable = ""
        if self.portable_rtol is not None and self.portable_rtol != self.old_portable_rtol:
            portable = f"  (portable_rtol {self.old_portable_rtol!r} → {self.portable_rtol!r})"
        if self.old is None:
            return f"  new      {where} = {short_value(self.new)}{portable}"
        if self.old == self.new:
            return f"  changed  {where}: value unchanged{portable}"
        diff = ""
        if is_number(self.old) and is_number(self.new):
            diff = f"  (Δ {self.new - self.old:+.3g})"
        elif is_curve(self.old) and is_curve(self.new) and len(self.old) == len(self.new):
            steps = [i for i, (a, b) in enumerate(zip(self.old, self.new)) if a != b]
            worst = max(abs(b - a) for a, b in zip(self.old, self.new))
            diff = f"  ({len(steps)} of {len(self.new)} steps differ, from step {steps[0] + 1}; max |Δ| {worst:.3g})"
        elif is_curve(self.old) and is_curve(self.new):
            diff = f"  ({len(self.old)} → {len(self.new)} steps)"
        return (
            f"  changed  {where}: {short_value(self.old)} → {short_value(self.new)}{diff}{portable}"
        )


def proposed_changes(proposals: list[dict]) -> list[Change]:
    """Proposals that differ from what the goldens files hold (the environment is always rewritten)."""
    changes = []
    for p in sorted(proposals, key=lambda p: (p["recipe"], p["tier"], p["key"])):
        path = goldens_path(p["recipe"], p["tier"])
        _, values = load(p["recipe"], p["tier"]) if path.exists() else ({}, {})
        known = values.get(p["key"])
        old = known.value if known else None
        old_portable = known.portable_rtol if known else None
        portable = p.get("portable_rtol")
        if old != p["value"] or (portable is not None and portable != old_portable):
            changes.append(
                Change(
                    p["recipe"],
                    p["tier"],
                    p["key"],
                    old,
                    p["value"],
                    p.get("reason", ""),
                    portable,
                    old_portable,
                )
            )
    return changes


def format_changes(changes: list[Change], measured: int) -> str:
    head = f"goldens: {measured} exact value(s) measured, {len(changes)} would change"
    return "\n".join([head, *(c.line() for c in changes)])


def apply_changes(changes: list[Change], proposals: list[dict] = ()) -> list[Path]:
    by_file: dict[tuple[str, str], list[Change]] = {}
    for c in changes:
        by_file.setdefault((c.recipe, c.tier), []).append(c)
    return [
        update_exact(
            recipe,
            tier,
            {c.key: c.new for c in group},
            {c.key: c.reason for c in group},
            {c.key: c.portable_rtol for c in group if c.portable_rtol is not None},
            unchanged=[p["key"] for p in proposals if (p["recipe"], p["tier"]) == (recipe, tier)],
        )
        for (recipe, tier), group in sorted(by_file.items())
    ]

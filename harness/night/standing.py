"""Whether an on-change result is due tonight, or the standing one (the night that measured it) is carried.

A diagnosis (a lane that fixes one upstream defect, or the host reference's suspects) explains the
as-published number; the torchtitan.train launch checks the harness's launch against torchtitan's
own. Each depends only on what its :func:`fingerprint` holds: the versions of the Python stack, the
suite's own launch and recipe code, and the launch's input sha256s (``provenance.input_key``); a
diagnosis also on the as-published number it explains. Left out on purpose: the Neuron compiler,
which changes every lane alike (a compiler bump empties the NEFF cache: the cold night), and whose
effect on the explained number re-opens the explanation through that number. So a night re-runs one
only when something it depends on moved since its standing result, read from the runs log
(``$QWEN3_RUNS_LOG``, the nightly's artifact runs-history: ``harness.night.ci trend`` appends each night's
``standing.<launch>`` records to it). No runs log, no standing result: due.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.launch.speed import RUNS_LOG_ENV
from recipes.tiers import REPO_ROOT

#: The property a neuron test records a standing result under (``harness.night.ci trend`` carries it to the runs log).
PROPERTY_PREFIX = "standing."
#: Not in the fingerprint: the compiler (see the module's docstring).
NOT_DEPENDED_ON = ("neuronx-cc",)
#: The suite's own code an on-change result depends on: the recipes, the rank entry, the launch and the lanes
#: (how a lane runs: harness/options/lanes.py; which lanes each recipe has: harness/declare/catalogue.py).
SUITE_CODE = (
    "recipes",
    "harness/rank/train.py",
    "harness/launch",
    "harness/options/lanes.py",
    "harness/declare/catalogue.py",
)
#: Set to 1 to re-run every on-change launch tonight (a workflow_dispatch input, or by hand).
RERUN_ENV = "QWEN3_RERUN_ALL"


def suite_code_sha256(root: Path = REPO_ROOT) -> str:
    """One sha256 over the suite code an on-change result depends on (file contents, not git: the night may
    run from an exported tree)."""
    digest = hashlib.sha256()
    for entry in SUITE_CODE:
        path = root / entry
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            if file.is_file():
                digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def fingerprint(versions: dict, inputs: dict, code: str) -> dict:
    """What an on-change result depends on, as recorded beside it."""
    return {
        "versions": {k: v for k, v in sorted(versions.items()) if k not in NOT_DEPENDED_ON},
        "inputs": inputs,
        "code": code,
    }


@dataclass(frozen=True)
class Due:
    """Tonight's decision for one on-change result, and why."""

    launch: str
    due: bool
    why: str
    fingerprint: dict
    #: The standing record carried when not due (None when due).
    standing: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def standing_records(log: Path | None, launch: str) -> list[dict]:
    """Every standing record of ``launch`` in the runs log, newest last (a rehearsal's lines are never read)."""
    if log is None or not log.is_file():
        return []
    found = []
    for line in log.read_text().splitlines():
        try:
            night = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(night, dict)
            and "rehearsal" not in night
            and launch in (night.get("standing") or {})
        ):
            found.append(night["standing"][launch])
    return found


def _moved(old: dict, new: dict, what: str) -> list[str]:
    keys = sorted(set(old) | set(new))
    return [
        f"{what} {k}: {old.get(k)!r} → {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)
    ]


def _same_number(then: float | None, now: float, tolerance: float) -> bool:
    """Within ``tolerance``; two non-finite stops (NaN: torchtitan stopped at step 1) are the same number."""
    if then is None:
        return False
    if math.isnan(then) or math.isnan(now):
        return math.isnan(then) and math.isnan(now)
    return abs(now - then) <= tolerance


def decide(
    launch: str,
    fp: dict,
    explains: float | None = None,
    tolerance: float = 0.0,
    log: Path | None = None,
) -> Due:
    """Due unless the newest standing record of ``launch`` has the same fingerprint and, for a diagnosis, explains
    a number within ``tolerance`` of tonight's (``explains``)."""
    if os.environ.get(RERUN_ENV) == "1":
        return Due(launch, True, f"${RERUN_ENV}=1: every on-change launch re-runs tonight", fp)
    if log is None:
        env = os.environ.get(RUNS_LOG_ENV)
        log = Path(env) if env else None
    records = standing_records(log, launch)
    if not records:
        where = (
            f"the runs log {log}"
            if log is not None and log.is_file()
            else f"no runs log (${RUNS_LOG_ENV})"
        )
        return Due(launch, True, f"no standing result in {where}", fp)
    last = records[-1]
    moved = _moved(last["fingerprint"]["versions"], fp["versions"], "version")
    moved += ["inputs changed (sha256)"] * (last["fingerprint"]["inputs"] != fp["inputs"])
    moved += ["the suite's launch or recipe code changed"] * (
        last["fingerprint"]["code"] != fp["code"]
    )
    then = last.get("explains")
    if explains is not None and not _same_number(then, explains, tolerance):
        moved.append(f"the number it explains moved: {then} → {explains} (tolerance {tolerance:g})")
    if moved:
        return Due(launch, True, "; ".join(moved), fp)
    return Due(
        launch, False, f"carried from {last['measured']}: nothing it depends on moved", fp, last
    )


def record(due: Due, result: dict, explains: float | None = None) -> dict:
    """Tonight's standing record of ``due.launch``: measured now, or carried (keeping the night it was measured)."""
    if not due.due and due.standing is not None:
        return {**due.standing, "carried": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return {
        "fingerprint": due.fingerprint,
        "result": result,
        "explains": explains,
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }

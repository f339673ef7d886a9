"""The files of one run's directory: who writes each, who reads it, and what a reader makes of a missing one.

The launcher claims the directory (:func:`claim`: exclusive create, so two launches never
share one) and writes ``run.json`` (the checked, resolved options) before any rank starts;
rank 0 writes ``steps.jsonl``, ``provenance.json``, ``final_state.json`` and the HF export;
every rank of a weights-loaded run writes its first batch; torch elastic writes
``error.json``. Judging and the report read them back after every rank has ended, through
the readers here, which take a missing or partial file as a named state (a run whose ranks
died early is reported with what is known, never a ``KeyError`` in a later report). The
names live here, below every stage, so no stage reaches up into another for a file name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.base import marker

RUN_FILE = "run.json"
STEPS_FILE = "steps.jsonl"
PROVENANCE_FILE = "provenance.json"
ERROR_FILE = "error.json"
CONSOLE_FILE = "console.log"
#: torchrun's ``--log-dir``: each rank's stdout and stderr.
LOGS_DIR = "logs"
#: Where a run keeps its step-1 batches: ``rank00000.safetensors`` per rank (``harness.rank.first_batch``).
RECORD_DIR = "first_batch"
#: Per-tensor sha256 of the trained model as rank 0 saw it after the last step (``harness.rank.export``).
FINAL_STATE_FILE = "final_state.json"
#: The completed HF export of the run (``harness.rank.export``).
EXPORT_DIR_NAME = "hf_export"
#: A forward-only step 1's score (``harness.rank.step1_forward``, rank 0) and, with ``--initial-state``, the
#: per-tensor sha256 of the weights it started from.
STEP1_FORWARD_FILE = "step1_forward.json"
INITIAL_STATE_FILE = "initial_state.json"
#: torchtitan's checkpoints, ``step-N`` each: the ``checkpoint.folder`` the recipes set (recipes/tutorial.py).
CHECKPOINT_DIR = "checkpoint"
#: Each rank's heartbeat, ``rank<R>.json`` (``harness.launch.watchdog.beat``): its pid, phase and last step.
HEARTBEAT_DIR = "heartbeat"
#: A stalled launch's Python stacks, ``rank<R>.txt`` per rank (``harness.launch.watchdog.dump_stacks``).
STACKS_DIR = "stacks"
#: The run's environment marker for the launcher's children (torchrun, the forkserver, the ranks).
RUN_DIR_ENV = "QWEN3_RUN_DIR"

#: What rank 0 writes into provenance.json (``harness.config.provenance.provenance``); the launcher adds "inputs".
RANK_PROVENANCE_KEYS = (
    "tokenizer",
    "weights",
    "model",
    "data",
    "seed",
    "dtype",
    "allowed_mismatches",
)
#: The named state of a run whose ranks ended before rank 0 wrote provenance.json.
NO_PROVENANCE = "ranks failed before provenance was written"


#: Each claimed run directory, with the directories :func:`claim` made for it (itself first, then new parents).
_MADE: dict[Path, list[Path]] = {}


def claim(parent: Path, name: str) -> Path:
    """``parent/name``, made here and only here (``os.mkdir`` without exist_ok); taken: ``name-2``, ``name-3``, ...

    Unique by construction, not by the clock: two launches in the same second get two
    directories. Where ``parent`` cannot be made or written, the path is returned unmade and
    the run-directory check (``harness.checks.preflight.check_run_dir``) refuses it in one line.
    """
    new_parents = [p for p in (parent, *parent.parents) if not p.exists()]
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return parent / name
    for n in range(1, 10_000):
        path = parent / (name if n == 1 else f"{name}-{n}")
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        except FileNotFoundError:  # another launch's release removed the empty parent just now
            try:
                parent.mkdir(parents=True, exist_ok=True)
                os.mkdir(path)
            except FileExistsError:
                continue
            except OSError:
                return path
        except OSError:
            return path
        _MADE[path] = [path, *new_parents]
        marker.mark(path, marker.RUN)
        return path
    raise FileExistsError(
        f"{parent} already holds {name} and 9,999 numbered siblings; clear out old runs"
    )


def release(path: Path) -> None:
    """Undo :func:`claim` for a run that never started (refused, interrupted): the directories it made, if empty.

    Only ``rmdir`` (an empty directory, never anything in it), and only what ``claim`` itself
    made: a report directory the user made stays, even empty.
    """
    made_here = _MADE.pop(path, [])
    if made_here and [p.name for p in path.iterdir()] == [marker.MARKER]:
        (path / marker.MARKER).unlink()
    for made in made_here:
        try:
            made.rmdir()
        except OSError:
            return  # not empty: a run (or another launch) wrote there


def read_steps(run_dir: Path) -> list[dict]:
    """Rank 0's step records, in order (none before its first step; a line cut short by a killed rank is not a step)."""
    path = Path(run_dir) / STEPS_FILE
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    steps = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # only the last line can be partial: rank 0 appends one record per step
        if isinstance(record, dict):
            steps.append(record)
    return steps


def read_provenance(run_dir: Path) -> dict:
    """What rank 0 recorded the run used; ``{}`` when it wrote nothing (or less than one JSON object)."""
    return _read_object(Path(run_dir) / PROVENANCE_FILE)


def read_run_json(run_dir: Path) -> dict:
    """The options the launcher wrote (``run.json``) as a dict; ``{}`` when missing or partial."""
    return _read_object(Path(run_dir) / RUN_FILE)


def _read_object(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def vanished(run_dir: Path | str | None) -> str | None:
    """'the report directory P vanished during the run' when ``run_dir`` (REPORT/runs/NAME) no longer exists.

    The report directory is named when it is gone too (or the run directory is not under a runs/ of one).
    """
    if run_dir is None or Path(run_dir).is_dir():
        return None
    run_dir = Path(run_dir)
    report = run_dir.parent.parent if run_dir.parent.name == "runs" else None
    if report is not None and report.is_dir():
        return f"the run directory {run_dir} vanished during the run"
    return f"the report directory {report or run_dir.parent} vanished during the run"


def provenance_state(provenance: dict | None, run_dir: Path | str | None = None) -> str | None:
    """None when rank 0's provenance is complete, else its named state (for the report and the readers);
    ``run_dir``: the run's directory, named when it vanished (:func:`vanished`)."""
    provenance = provenance or {}
    missing = [k for k in RANK_PROVENANCE_KEYS if k not in provenance]
    if not missing:
        return None
    if len(missing) == len(RANK_PROVENANCE_KEYS):
        return vanished(run_dir) or NO_PROVENANCE
    return f"provenance.json is partial (no {', '.join(missing)})"

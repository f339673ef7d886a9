"""The files of one run's directory: who writes each, who reads it.

The launcher writes ``run.json`` (the checked, resolved options, and what the checks
established) before any rank starts; rank 0 writes ``steps.jsonl`` and
``provenance.json``; torch elastic writes ``error.json``. Judging and the report read
them back after every rank has ended. The names live here, below every stage, so no
stage reaches up into another for a file name.
"""

from __future__ import annotations

import json
from pathlib import Path

RUN_FILE = "run.json"
STEPS_FILE = "steps.jsonl"
PROVENANCE_FILE = "provenance.json"
ERROR_FILE = "error.json"
#: The run's directory, in the environment of the launcher's children (torchrun, the forkserver, the ranks).
RUN_DIR_ENV = "QWEN3_RUN_DIR"


def read_steps(run_dir: Path) -> list[dict]:
    """Rank 0's step records, in order (none before its first step)."""
    path = Path(run_dir) / STEPS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_provenance(run_dir: Path) -> dict:
    """What rank 0 recorded the run used ({} before it wrote it)."""
    path = Path(run_dir) / PROVENANCE_FILE
    return json.loads(path.read_text()) if path.is_file() else {}

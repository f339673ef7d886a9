"""Where a launch of torchtitan's own entry on a config function keeps its run: ``outputs/<config>/run-N``.

torchtitan resumes from the newest ``step-N`` under ``dump_folder/checkpoint`` and then
ignores ``initial_load_path`` (torchtitan/components/checkpointer/dcp.py ``_load``). Its
resume reads every step folder as a full DCP checkpoint, but the tutorial's last save is
model-only and HF-format (``last_save_in_hf``): relaunching the README's command died
with ``metadata is None``, and with one shared ``./outputs`` a second recipe resumed from
the first one's steps. So each config function has its own folder, and a run whose last
save cannot be resumed (it finished) is never reopened: the next launch starts a new
``run-N`` beside it, from the recipe's own weights, and the earlier export stays. A run
stopped before its end keeps its folder, so relaunching it (or torchrun's own restart)
resumes from its last full DCP step, as torchtitan's fault tolerance intends.

The folder is chosen from what is on disk, not created exclusively (as
``harness.base.run_dir.claim`` does for ``python -m harness run``): every rank calls the config
function, and again on each torchrun restart, and all must reach the same folder. Only a
finished run changes the answer, and no run finishes before all its ranks have started.
"""

from __future__ import annotations

import re
from pathlib import Path

#: torchtitan's default ``dump_folder``, relative to the directory the entry runs in.
OUTPUTS = Path("outputs")
RUN_PREFIX = "run-"
#: A step folder torchtitan takes as a checkpoint: DCP's metadata or an HF index (dcp.py ``_find_load_step``).
DCP_METADATA = ".metadata"
HF_INDEX = "model.safetensors.index.json"
#: The state key torchtitan's trainer saves its step under; a model-only save has none.
TRAIN_STATE = "train_state"


def entry_dump_folder(config_name: str, checkpoint_folder: str, outputs: Path = OUTPUTS) -> Path:
    """``outputs/<config_name>/run-N``: the newest run unless it finished, then the next ``N`` (``run-1`` first)."""
    base = outputs / config_name
    numbers = [
        int(m.group(1)) for p in _dirs(base) if (m := re.fullmatch(rf"{RUN_PREFIX}(\d+)", p.name))
    ]
    newest = max(numbers, default=1)
    run = base / f"{RUN_PREFIX}{newest}"
    if finished(run / checkpoint_folder):
        run = base / f"{RUN_PREFIX}{newest + 1}"
    return run


def finished(checkpoint_dir: Path) -> bool:
    """True when torchtitan's newest step folder in ``checkpoint_dir`` holds no training state to resume.

    That is the last step's model-only save (HF safetensors, or DCP without ``train_state``).
    Step 0 is a seed checkpoint, which torchtitan loads as model-only by design.
    """
    steps = {}
    for path in _dirs(checkpoint_dir):
        m = re.fullmatch(r"step-(\d+)", path.name)
        if m and ((path / DCP_METADATA).is_file() or (path / HF_INDEX).is_file()):
            steps[int(m.group(1))] = path
    if not steps:
        return False
    step = max(steps)
    return step != 0 and not _holds_training_state(steps[step])


def _holds_training_state(step_dir: Path) -> bool:
    if not (step_dir / DCP_METADATA).is_file():
        return False
    from torch.distributed.checkpoint import FileSystemReader  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light

    keys = FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata
    return any(k == TRAIN_STATE or k.startswith(TRAIN_STATE + ".") for k in keys)


def _dirs(path: Path) -> list[Path]:
    return [p for p in path.iterdir() if p.is_dir()] if path.is_dir() else []

"""recipes.entry_folder: which ``outputs/<config>/run-N`` a launch of torchtitan's entry dumps into.

Checkpoints here are written by DCP itself (``torch.distributed.checkpoint.save``, one process) and,
for the last save, in the file layout torchtitan's HF save leaves (safetensors and its index).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from recipes.entry_folder import entry_dump_folder, finished

CONFIG = "native_qwen3_cpu_hf"


def _full_step(checkpoint: Path, step: int) -> None:
    """What torchtitan saves at an interval: model, optimizer and the trainer's ``train_state``."""
    dcp.save(
        {"tok_embeddings.weight": torch.ones(2, 2), "train_state": {"step": torch.tensor(step)}},
        checkpoint_id=str(checkpoint / f"step-{step}"),
        no_dist=True,
    )


def _model_only_step(checkpoint: Path, step: int) -> None:
    dcp.save(
        {"tok_embeddings.weight": torch.ones(2, 2)},
        checkpoint_id=str(checkpoint / f"step-{step}"),
        no_dist=True,
    )


def _hf_step(checkpoint: Path, step: int) -> None:
    """The tutorial's last save (``last_save_in_hf``): safetensors and their index, no DCP metadata."""
    folder = checkpoint / f"step-{step}"
    folder.mkdir(parents=True)
    save_file(
        {"model.embed_tokens.weight": torch.ones(2, 2)}, folder / "model-00001-of-00001.safetensors"
    )
    index = {
        "metadata": {},
        "weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"},
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _checkpoint(tmp_path: Path, run: int) -> Path:
    return tmp_path / CONFIG / f"run-{run}" / "checkpoint"


def test_a_first_launch_gets_run_1_of_its_own_config(tmp_path):
    assert entry_dump_folder(CONFIG, "checkpoint", tmp_path) == tmp_path / CONFIG / "run-1"
    assert (
        entry_dump_folder("nki_moe_cpu_random", "checkpoint", tmp_path)
        == tmp_path / "nki_moe_cpu_random" / "run-1"
    )


def test_a_finished_run_is_never_reopened(tmp_path):
    checkpoint = _checkpoint(tmp_path, 1)
    _full_step(checkpoint, 5)
    _hf_step(checkpoint, 10)
    assert finished(checkpoint)
    assert entry_dump_folder(CONFIG, "checkpoint", tmp_path) == tmp_path / CONFIG / "run-2"


def test_a_model_only_dcp_last_save_is_finished_too(tmp_path):
    """``--checkpoint.last_save_in_hf False``: the last step is DCP, but without the state a resume needs."""
    checkpoint = _checkpoint(tmp_path, 3)
    _model_only_step(checkpoint, 4)
    assert finished(checkpoint)
    assert entry_dump_folder(CONFIG, "checkpoint", tmp_path) == tmp_path / CONFIG / "run-4"


def test_an_interrupted_run_is_resumed_in_its_own_folder(tmp_path):
    """Its newest step is a full DCP save (a later step folder without metadata is a save cut short)."""
    _hf_step(_checkpoint(tmp_path, 1), 3)
    checkpoint = _checkpoint(tmp_path, 2)
    _full_step(checkpoint, 5)
    (checkpoint / "step-10").mkdir()
    assert not finished(checkpoint)
    assert entry_dump_folder(CONFIG, "checkpoint", tmp_path) == tmp_path / CONFIG / "run-2"


def test_a_run_without_a_checkpoint_yet_is_the_same_run(tmp_path):
    """A rank that starts after another rank made the folder (its logs) must choose the same folder."""
    (tmp_path / CONFIG / "run-1" / "structured_logs").mkdir(parents=True)
    assert entry_dump_folder(CONFIG, "checkpoint", tmp_path) == tmp_path / CONFIG / "run-1"


def test_a_seed_checkpoint_is_loaded_not_skipped(tmp_path):
    """Step 0 (``create_seed_checkpoint``) is model-only by design: torchtitan loads it as the start."""
    checkpoint = _checkpoint(tmp_path, 1)
    _model_only_step(checkpoint, 0)
    assert not finished(checkpoint)

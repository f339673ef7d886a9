"""Turn torchtitan's ``last_save_in_hf`` checkpoint into a model directory users can open.

torchtitan writes safetensors and an index, but no config.json and no
tokenizer, so ``AutoModelForCausalLM.from_pretrained(export)`` fails. Here the
export gets a config.json describing the model that was trained, the tokenizer
the run used, and is published atomically: a reader sees the previous complete
export or the new complete one, never a half-written directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from harness.base import marker
from harness.base.run_dir import CHECKPOINT_DIR, EXPORT_DIR_NAME, FINAL_STATE_FILE  # noqa: F401 -- the run directory's names (harness.base.run_dir)
from harness.options.run_options import RunOptions
from recipes.hf_config import read_hf_config
from recipes.specs import model_dims

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
    "chat_template.jinja",
)


def tensor_sha256(tensor) -> str:
    """sha256 of a tensor's bytes (any dtype, bf16 included), as stored in safetensors."""

    return hashlib.sha256(
        tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
    ).hexdigest()


def record_final_state(trainer, path: Path, rank: int) -> None:
    """Hash every trained tensor, in the export's names and dtype, into ``path`` (rank 0 writes).

    The export must hold these weights, not the source checkpoint's or step 0's. Every rank
    takes part (``full_tensor`` gathers one parameter at a time, so memory stays one tensor).
    """

    checkpointer = trainer.checkpointer
    hashes = {}
    for name, value in trainer.model_parts[0].state_dict().items():
        full = value.full_tensor() if isinstance(value, DTensor) else value
        if rank == 0:
            for hf_name, tensor in checkpointer.sd_adapter.to_hf({name: full}).items():
                hashes[hf_name] = tensor_sha256(tensor.to(checkpointer.export_dtype))
    if rank == 0:
        path.write_text(json.dumps(hashes, indent=2, sort_keys=True) + "\n")


def hf_config(spec, torch_dtype: str) -> dict:
    """A transformers config.json for the model a torchtitan Qwen3 spec builds."""

    dims = model_dims(spec)
    layer = spec.model.layers[0]
    moe = getattr(layer, "moe", None)
    config = {
        **{k: v for k, v in dims.items() if k not in ("rope_theta", "max_seq_len")},
        "max_position_embeddings": dims["max_seq_len"],
        "rope_parameters": {"rope_type": "default", "rope_theta": dims["rope_theta"]},
        "rms_norm_eps": spec.model.norm.eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": torch_dtype,
    }
    if moe is None:
        config.update(
            architectures=["Qwen3ForCausalLM"],
            model_type="qwen3",
            intermediate_size=layer.feed_forward.w1.out_features,
        )
    else:
        experts = moe.routed_experts
        config.update(
            architectures=["Qwen3MoeForCausalLM"],
            model_type="qwen3_moe",
            num_experts=moe.num_experts,
            num_experts_per_tok=moe.router.top_k,
            norm_topk_prob=bool(moe.router.route_norm),
            moe_intermediate_size=experts.inner_experts.hidden_dim,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    return config


def source_hf_config(model_dir: Path, layers: int | None, torch_dtype: str) -> dict:
    """The config.json of a model the HF backend trained: the source model's own.

    The backend builds exactly what the source config.json describes, so only
    what the run changed is updated: the export dtype and, with ``--layers``,
    the layer count.
    """
    config = read_hf_config(model_dir)
    config.pop("torch_dtype", None)
    config["dtype"] = torch_dtype
    if layers is not None:
        config["num_hidden_layers"] = layers
        if "layer_types" in config:
            config["layer_types"] = config["layer_types"][:layers]
    return config


def export_hf_config(opts: RunOptions, config) -> dict:
    """config.json for the export: the source's for the HF backend, else derived from the spec."""
    dtype = config.checkpoint.export_dtype
    if hasattr(config, "hf_model"):
        return source_hf_config(Path(config.hf_model), opts.layers, dtype)
    return hf_config(config.model_spec, dtype)


def last_checkpoint(run_dir: Path) -> Path:
    """The newest ``checkpoint/step-N`` folder of a run."""
    steps = sorted(
        (p for p in (run_dir / CHECKPOINT_DIR).glob("step-*") if p.is_dir()),
        key=lambda p: int(p.name.split("-")[1]),
    )
    if not steps:
        raise FileNotFoundError(f"{run_dir / CHECKPOINT_DIR} holds no step-N checkpoint")
    return steps[-1]


def publish(source: Path, target: Path, overwrite: bool) -> None:
    """Copy a complete export to ``target`` atomically (rename of a sibling temp dir)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        shutil.copytree(source, staging, dirs_exist_ok=True)
        if target.exists():
            if any(target.iterdir()) and not overwrite:
                raise FileExistsError(f"{target} is not empty; pass --overwrite to replace it")
            foreign = marker.foreign_files(target)
            if any(target.iterdir()) and (marker.kind(target) != marker.EXPORT or foreign):
                raise FileExistsError(
                    f"{target} is not a previous export the suite wrote (see {target / marker.MARKER}"
                    f"{f'; e.g. {foreign[0]} is not listed there' if foreign else ''}); --overwrite "
                    "replaces only a previous export: choose a new --export-dir"
                )
            retired = target.with_name(f".{target.name}.old")
            shutil.rmtree(retired, ignore_errors=True)
            os.replace(target, retired)
            os.replace(staging, target)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def finish_export(opts: RunOptions, config) -> Path:
    """Complete the run's HF export in ``run_dir/hf_export``; publish it to ``--export-dir``."""
    run_dir = Path(config.dump_folder)
    checkpoint = last_checkpoint(run_dir)
    export = run_dir / EXPORT_DIR_NAME
    staging = run_dir / f".{EXPORT_DIR_NAME}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    # "sharded/" holds the per-rank pieces torchtitan consolidated into the model files.
    shutil.copytree(checkpoint, staging, ignore=shutil.ignore_patterns("sharded"))
    hf = export_hf_config(opts, config)
    (staging / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    tokenizer_dir = Path(config.hf_assets_path)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, staging / name)
    marker.mark_export(staging)
    shutil.rmtree(export, ignore_errors=True)
    os.replace(staging, export)
    if opts.export_dir is not None:
        publish(export, opts.export_dir, opts.overwrite)
    return export

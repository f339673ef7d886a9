"""Refuse a bad run before any rank starts: one message that names the value and the fix."""

from __future__ import annotations

import json
from pathlib import Path

from recipes.errors import RecipeError
from recipes.options import INITS, RunOptions
from recipes.tiers import TIERS


class PreflightError(RecipeError):
    """A run that cannot start; the message says what is wrong and how to fix it."""


def check_names(opts: RunOptions) -> None:
    from recipes.registry import RECIPES

    if opts.recipe not in RECIPES:
        raise PreflightError(
            f"unknown recipe {opts.recipe!r}; choose one of: {', '.join(RECIPES)} "
            "(see `python -m recipes list`)"
        )
    if opts.tier not in TIERS:
        raise PreflightError(f"unknown tier {opts.tier!r}; choose one of: {', '.join(TIERS)}")
    if opts.init not in INITS:
        raise PreflightError(f"unknown --init {opts.init!r}; choose one of: {', '.join(INITS)}")
    supported = RECIPES[opts.recipe].inits
    if opts.init not in supported:
        raise PreflightError(
            f"recipe {opts.recipe!r} does not support --init {opts.init}; use --init {' or '.join(supported)}"
        )


def check_tier(opts: RunOptions) -> None:
    if opts.tier != "trn2":
        return
    from recipes.platform.neuron import neuron_status

    status = neuron_status()
    if not status.ready:
        raise PreflightError(
            f"--tier trn2 cannot run on this machine: {status.reason()} "
            "Use --tier cpu here, or run on a trn2.48xlarge."
        )


def check_sizes(opts: RunOptions) -> None:
    for name in ("nproc", "steps", "seq_len", "local_batch_size", "layers"):
        value = getattr(opts, name)
        if value is not None and value < 1:
            raise PreflightError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")


def read_hf_config(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PreflightError(
            f"--model-dir {model_dir} has no config.json; point --model-dir at a Hugging Face "
            "model directory (config.json + *.safetensors), e.g. a local copy of "
            "Qwen/Qwen3-4B-Instruct-2507"
        ) from None
    except json.JSONDecodeError as e:
        raise PreflightError(f"{path} is not valid JSON ({e}); re-copy the model directory") from None


def check_model_dir(opts: RunOptions) -> None:
    """With ``--init hf`` the weights directory must exist and hold safetensors."""
    if opts.init != "hf":
        return
    model_dir = opts.model_dir
    if model_dir is None:
        raise PreflightError(
            f"--init hf needs weights: pass --model-dir DIR (for --tier {opts.tier} set "
            "QWEN3_4B_DIR to a local Qwen3-4B-Instruct-2507 directory), or use --init random"
        )
    if not model_dir.is_dir():
        raise PreflightError(f"--model-dir {model_dir} does not exist or is not a directory")
    read_hf_config(model_dir)
    if not sorted(model_dir.glob("*.safetensors")):
        raise PreflightError(
            f"--model-dir {model_dir} holds no *.safetensors weights; the recipes load only "
            "safetensors (never pickled .bin files)"
        )


def check_model_matches(opts: RunOptions, built_dims: dict) -> None:
    """The checkpoint's config.json must describe the model the recipe builds."""
    if opts.init != "hf" or opts.model_dir is None:
        return
    hf = read_hf_config(opts.model_dir)
    mismatched = [
        f"{key}: config.json says {hf[key]!r}, the recipe builds {value!r}"
        for key, value in built_dims.items()
        if key in hf and key not in ("rope_theta", "max_position_embeddings") and hf[key] != value
    ]
    if mismatched:
        raise PreflightError(
            f"{opts.model_dir / 'config.json'} does not match recipe {opts.recipe!r} on tier "
            f"{opts.tier!r}: " + "; ".join(mismatched) + ". Point --model-dir at weights of "
            "this model (or choose the recipe/tier that builds it)."
        )


def check_dataset_dir(opts: RunOptions) -> None:
    data = opts.dataset_dir
    if data is None or not data.is_dir():
        raise PreflightError(
            f"--dataset-dir {data} does not exist; point it at a directory of *.jsonl files "
            'with one {"text": ...} object per line'
        )
    if not any(data.glob("*.jsonl")) and not any(data.glob("*.json")) and not any(data.glob("*.parquet")):
        raise PreflightError(
            f"--dataset-dir {data} holds no *.jsonl, *.json or *.parquet data files; "
            'put the corpus there as one {"text": ...} object per line'
        )


def check_export_dir(opts: RunOptions) -> None:
    export_dir = opts.export_dir
    if export_dir is None:
        return
    if not opts.export:
        raise PreflightError(f"--export-dir {export_dir} and --no-export contradict each other; drop one")
    if opts.model_dir is not None:
        source = opts.model_dir.resolve()
        target = export_dir.resolve()
        if target == source or source in target.parents:
            raise PreflightError(
                f"--export-dir {export_dir} is inside the source --model-dir {opts.model_dir}; "
                "the source weights are never written to: choose another directory"
            )
    if export_dir.exists() and not export_dir.is_dir():
        raise PreflightError(f"--export-dir {export_dir} exists and is not a directory")
    if export_dir.is_dir() and any(export_dir.iterdir()) and not opts.overwrite:
        raise PreflightError(
            f"--export-dir {export_dir} is not empty; pass --overwrite to replace it, "
            "or choose a new directory"
        )


def check_recipe(opts: RunOptions) -> None:
    """The recipe's own checks: ``preflight_check(opts)`` in its module, if it defines one."""
    import importlib

    from recipes.registry import get_recipe

    check = getattr(importlib.import_module(get_recipe(opts.recipe).module), "preflight_check", None)
    if check is not None:
        check(opts)


def preflight(opts: RunOptions) -> RunOptions:
    """Every check that needs no device; returns the resolved options."""
    check_names(opts)
    check_sizes(opts)
    resolved = opts.resolved()
    check_tier(resolved)
    check_recipe(resolved)
    check_model_dir(resolved)
    check_dataset_dir(resolved)
    check_export_dir(resolved)
    return resolved

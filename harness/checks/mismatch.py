"""Refusals of a built config whose pieces disagree: tokenizer, weights and the model the recipe builds.

A step-1 loss is only comparable when the tokenizer, the weights and the model hyper-parameters are the
ones the user believes. ``check`` refuses a run whose pieces disagree before any rank starts, unless the
user names the mismatch with ``--allow-mismatch NAME``; then it is a warning, and the rank's provenance
(harness/config/provenance.py, which records and refuses nothing) repeats it in the report.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from harness.options.run_options import RunOptions
from recipes.errors import RecipeError
from recipes.specs import model_dims, read_hf_dims

#: config.json keys compared with the model the recipe builds.
COMPARED_DIMS = (
    "rope_theta",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
)
#: Names ``--allow-mismatch`` accepts.
MISMATCH_NAMES = ("tokenizer", "vocab", *COMPARED_DIMS, "seq_len", "rms_norm_eps", "rope_scaling")
#: torchtitan's RoPE ``scaling`` under its config.json ``rope_type`` name.
ROPE_TYPES = {"none": "default", "llama": "llama3", "yarn": "yarn"}


class MismatchError(RecipeError):
    """The run's tokenizer, weights or model hyper-parameters disagree."""


@dataclass(frozen=True)
class Mismatch:
    name: str
    message: str


def checkpoint_config(opts: RunOptions) -> dict | None:
    """The weights' own config.json, when the run has a model dir that holds one."""
    if opts.model_dir is None or not (opts.model_dir / "config.json").is_file():
        return None
    return read_hf_dims(opts.model_dir)


def built_dims(config) -> dict:
    """The hyper-parameters of the model the config builds, named as in config.json."""

    if hasattr(config, "hf_model"):  # the HF backend builds what the checkpoint's config.json says
        return config_json_dims(config)
    return model_dims(config.model_spec)


def config_json_dims(config) -> dict:
    hf = read_hf_dims(Path(config.hf_model))
    dims = {key: hf.get(key) for key in COMPARED_DIMS}
    dims["max_seq_len"] = hf.get("max_position_embeddings")
    # --layers keeps the first N: the backend's model config carries the count it builds.
    dims["num_hidden_layers"] = (
        getattr(config.model_spec.model, "num_hidden_layers", None) or dims["num_hidden_layers"]
    )
    return dims


def tokenizer_vocab(tokenizer_dir: Path) -> int:

    return Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()


def mismatches(opts: RunOptions, config) -> list[Mismatch]:
    """Every disagreement between tokenizer, weights and the model the recipe builds."""
    found = []
    dims = built_dims(config)
    tokenizer_dir = Path(config.hf_assets_path).resolve()
    vocab = tokenizer_vocab(tokenizer_dir)
    if vocab > dims["vocab_size"]:
        found.append(
            Mismatch(
                "vocab",
                f"the tokenizer in {tokenizer_dir} has {vocab} tokens, more than the "
                f"model's {dims['vocab_size']} embedding rows",
            )
        )
    if (
        opts.init == "hf"
        and opts.model_dir is not None
        and tokenizer_dir != opts.model_dir.resolve()
    ):
        found.append(
            Mismatch(
                "tokenizer",
                f"weights come from {opts.model_dir} but the tokenizer from "
                f"{tokenizer_dir}; the weights were trained with their own tokenizer",
            )
        )
    hf = checkpoint_config(opts) if opts.init == "hf" else None
    return found + (size_mismatches(opts, config, hf, dims) if hf is not None else [])


def size_mismatches(opts: RunOptions, config, hf: dict, dims: dict | None = None) -> list[Mismatch]:
    """config.json (``hf``) against the model the recipe builds: every compared size, the norm and RoPE, seq_len."""
    dims = built_dims(config) if dims is None else dims
    found = [
        Mismatch(
            key,
            f"{key}: {opts.model_dir / 'config.json'} says {hf[key]!r}, recipe {opts.recipe!r} builds {dims[key]!r}",
        )
        for key in COMPARED_DIMS
        if key in hf and key in dims and hf[key] != dims[key]
    ]
    found += norm_and_rope_mismatches(opts, config, hf)
    limit = hf.get("max_position_embeddings")
    if limit and config.training.seq_len > limit:
        found.append(
            Mismatch(
                "seq_len",
                f"seq_len {config.training.seq_len} is above max_position_embeddings {limit}",
            )
        )
    return found


def norm_and_rope(config) -> dict:
    """The built torchtitan model's ``rms_norm_eps`` and RoPE ``rope_type``, named as in config.json.

    {} for the HF backend, which builds both from config.json itself.
    """
    model = getattr(config.model_spec, "model", None) if not hasattr(config, "hf_model") else None
    norm, layers = getattr(model, "norm", None), getattr(model, "layers", None)
    if norm is None or not layers:
        return {}
    rope = layers[0].attention.rope
    rope_type = ROPE_TYPES.get(rope.scaling, rope.scaling)
    if (
        rope_type == "yarn" and rope.rope_factor <= 1.0
    ):  # torchtitan applies yarn only above factor 1
        rope_type = "default"
    return {"rms_norm_eps": norm.eps, "rope_type": rope_type}


def config_rope_type(hf: dict) -> tuple[str, str]:
    """config.json's RoPE scaling: its ``rope_type`` (transformers 5 ``rope_parameters``, 4.x ``rope_scaling``)
    and the key that says it."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = hf.get(key)
        if isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type")):
            factor = f", factor {rope['factor']}" if "factor" in rope else ""
            return str(rope.get("rope_type") or rope.get("type")), f"{key}.rope_type{factor}"
    return "default", "no rope scaling"


def norm_and_rope_mismatches(opts: RunOptions, config, hf: dict) -> list[Mismatch]:
    """config.json's RMSNorm epsilon and RoPE scaling against the model the recipe builds, each named as itself.

    Neither is a size: a wrong one trains and is only seen as a reference mismatch the suspects
    misname (yarn scaling read as "inv_freq as left by to_empty()"; an epsilon as "none of the suspects").
    """
    built = norm_and_rope(config)
    if not built:
        return []
    path = opts.model_dir / "config.json"
    found = []
    eps = hf.get("rms_norm_eps")
    if eps is not None and eps != built["rms_norm_eps"]:
        found.append(
            Mismatch(
                "rms_norm_eps",
                f"rms_norm_eps: {path} says {eps!r}, recipe {opts.recipe!r} builds "
                f"RMSNorm eps {built['rms_norm_eps']!r}",
            )
        )
    rope_type, said = config_rope_type(hf)
    if rope_type != built["rope_type"]:
        found.append(
            Mismatch(
                "rope_scaling",
                f"RoPE scaling: {path} says rope_type {rope_type!r} ({said}), recipe "
                f"{opts.recipe!r} builds {built['rope_type']!r} RoPE",
            )
        )
    return found


def refuse(found: list[Mismatch], opts: RunOptions) -> list[Mismatch]:
    """Refuse the mismatches ``--allow-mismatch`` does not name (one message naming each); return the allowed."""
    refused = [m for m in found if m.name not in opts.allow_mismatch]
    if refused:
        raise MismatchError(
            "; ".join(m.message for m in refused)
            + ". Fix the inputs, or accept with "
            + " ".join(
                f"--allow-mismatch {name}" for name in dict.fromkeys(m.name for m in refused)
            )
        )
    return [m for m in found if m.name in opts.allow_mismatch]


def check(opts: RunOptions, config) -> list[Mismatch]:
    """Refuse unallowed mismatches of the built config; warn about, and return, the allowed ones."""
    allowed = refuse(mismatches(opts, config), opts)
    for m in allowed:
        print(f"warning: allowed mismatch {m.name}: {m.message}", file=sys.stderr)
    return allowed

"""config.json against the shapes of its own weights, from the safetensors headers alone.

A config.json copied from another model beside these weights builds a model whose tensors
do not fit them: the HF backend (which builds what config.json says) fails on every rank
at load, a native recipe is refused as a mismatch with the recipe ("--allow-mismatch"),
which is the wrong fix. The disagreement is the config.json's: each size is read back
from the tensor that fixes it (never loading a tensor) and a differing key is refused,
naming the tensor, its shape and the fix. A leaf: imports only the error type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from harness.checks.errors import PreflightError

#: A layer's tensors are found in whichever layer has them (a MoE model may keep dense layers).
LAYER = r"model\.layers\.(\d+)\."


@dataclass(frozen=True)
class Size:
    """One config.json size and the tensor (a regex of its HF name) whose shape fixes it."""

    key: str
    tensor: str
    #: The size from the tensor's shape and the sizes read before it (head_dim for the head counts).
    read: object
    #: How the shape gives the size, for the message.
    how: object


SIZES = (
    Size(
        "hidden_size", r"model\.embed_tokens\.weight", lambda s, _: s[1], lambda s, _: "its columns"
    ),
    Size("vocab_size", r"model\.embed_tokens\.weight", lambda s, _: s[0], lambda s, _: "its rows"),
    Size(
        "head_dim",
        LAYER + r"self_attn\.q_norm\.weight",
        lambda s, _: s[0],
        lambda s, _: "its length (the per-head norm)",
    ),
    Size(
        "num_attention_heads",
        LAYER + r"self_attn\.q_proj\.weight",
        lambda s, d: s[0] / d["head_dim"],
        lambda s, d: f"{s[0]} rows / head_dim {d['head_dim']}",
    ),
    Size(
        "num_key_value_heads",
        LAYER + r"self_attn\.k_proj\.weight",
        lambda s, d: s[0] / d["head_dim"],
        lambda s, d: f"{s[0]} rows / head_dim {d['head_dim']}",
    ),
    Size(
        "intermediate_size",
        LAYER + r"mlp\.gate_proj\.weight",
        lambda s, _: s[0],
        lambda s, _: "its rows",
    ),
    Size(
        "moe_intermediate_size",
        LAYER + r"mlp\.experts\.\d+\.gate_proj\.weight",
        lambda s, _: s[0],
        lambda s, _: "its rows",
    ),
    Size(
        "num_local_experts",
        LAYER + r"mlp\.gate\.weight",
        lambda s, _: s[0],
        lambda s, _: "the router's rows",
    ),
    Size(
        "num_experts",
        LAYER + r"mlp\.gate\.weight",
        lambda s, _: s[0],
        lambda s, _: "the router's rows",
    ),
)


def tensors_of(headers: dict[str, dict]) -> dict[str, tuple[str, list[int]]]:
    """``{tensor: (file name, shape)}`` over every shard's header."""
    return {
        key: (name, shape) for name, header in headers.items() for key, (_, shape) in header.items()
    }


def first(tensors: dict, pattern: str) -> str | None:
    """The tensor matching ``pattern`` in the lowest-numbered layer that has one (or the one global tensor)."""
    found = [key for key in tensors if re.fullmatch(pattern, key)]
    numbered = [(int(m.group(1)) if (m := re.match(LAYER, key)) else -1, key) for key in found]
    return min(numbered)[1] if numbered else None


def weights_sizes(headers: dict[str, dict]) -> dict[str, tuple[int | float, str]]:
    """Each size the weights fix: ``{config key: (value, why)}``, why naming the tensor, its file and shape."""
    tensors = tensors_of(headers)
    sizes: dict[str, int | float] = {}
    why: dict[str, str] = {}
    for size in SIZES:
        key = first(tensors, size.tensor)
        if key is None or ("heads" in size.key and "head_dim" not in sizes):
            continue
        name, shape = tensors[key]
        sizes[size.key] = size.read(shape, sizes)
        why[size.key] = (
            f"{key} in {name} has shape {list(shape)}; {size.key} = {size.how(shape, sizes)}"
        )
    layers = {int(m.group(1)) for key in tensors if (m := re.match(LAYER, key))}
    if layers:
        sizes["num_hidden_layers"] = max(layers) + 1
        why["num_hidden_layers"] = f"the weights hold layers 0..{max(layers)}"
    return {key: (value, why[key]) for key, value in sizes.items()}


def check_config_matches_weights(config_path: Path, hf: dict, headers: dict[str, dict]) -> None:
    """Every size config.json states is the one its weights' shapes fix; else one line naming both."""
    for key, (held, why) in weights_sizes(headers).items():
        said = hf.get(key)
        if (
            said is None
            or isinstance(said, bool)
            or not isinstance(said, (int, float))
            or said == held
        ):
            continue
        shown = int(held) if float(held).is_integer() else round(held, 3)
        raise PreflightError(
            f"{config_path}: {key} is {said}, but the weights beside it hold {shown} ({why}); config.json and the "
            "weights come from different models: re-copy config.json from the source of these weights"
        )

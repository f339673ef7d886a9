"""Qwen3 model specs as the tutorial names them, plus the tiny cpu-tier sizes.

Every spec comes from torchtitan's own ``model_registry`` so the parallelize
function, state-dict adapter and init schemes are upstream's. The cpu tier only
swaps the model config for one with tiny dims built from torchtitan's public
config builders.
"""

from __future__ import annotations

import copy
import dataclasses
import types
from functools import partial
from pathlib import Path

import torch.nn as nn

from recipes.errors import RecipeError
from recipes.hf_config import read_hf_config
from recipes.tiers import FIXTURES, DenseDims, MoEDims

#: Qwen3-4B-Instruct-2507's real config.json (public hyper-parameters, no weights, no tokenizer):
#: the real sizes wherever they are needed without weights (the trn2 dry run, tests).
QWEN3_4B_INSTRUCT_2507 = FIXTURES / "qwen3-4b-instruct-2507"


def read_hf_dims(model_dir: Path) -> dict:
    """config.json with RoPE theta also at ``rope_theta`` (transformers 5 keeps it in ``rope_parameters``).

    What the suite compares a built model against, the same way for either layout.
    """
    hf = read_hf_config(model_dir)
    rope = hf.get("rope_parameters") or {}
    if "rope_theta" not in hf and "rope_theta" in rope:
        hf["rope_theta"] = rope["rope_theta"]
    return hf


_LINEAR_INIT = {"weight": partial(nn.init.normal_, std=0.02), "bias": nn.init.zeros_}


def sdpa_attention(spec):
    """Give every layer SDPA attention: what ``attn_backend="sdpa"`` means in the tutorial.

    torchtitan-neuron accepts ``model_registry(..., attn_backend="sdpa")``;
    torchtitan 0.3.0 rejects "sdpa" for language models (it wants per-document
    masks), so there the same wiring is done here: causal SDPA in every layer.
    """
    from recipes.titan import ScaledDotProductAttention  # noqa: PLC0415 -- lazy: recipes.titan resolves torchtitan names on first use, after recipes.platform.install

    for layer in spec.model.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return spec


def qwen3_spec(flavor: str, attn_backend: str = "sdpa"):
    """``model_registry(flavor, attn_backend=...)``, with SDPA where upstream refuses it."""
    from recipes.titan import model_registry  # noqa: PLC0415 -- lazy: recipes.titan resolves torchtitan names on first use, after recipes.platform.install

    try:
        return model_registry(flavor, attn_backend=attn_backend)
    except ValueError:
        if attn_backend != "sdpa":
            raise
        return sdpa_attention(model_registry(flavor, attn_backend="flex"))


def _norm(dim: int, eps: float):
    from recipes.titan import RMSNorm  # noqa: PLC0415 -- lazy: recipes.titan resolves torchtitan names on first use, after recipes.platform.install

    return RMSNorm.Config(normalized_shape=dim, eps=eps, param_init={"weight": nn.init.ones_})


def _attention(dims: DenseDims, rope, inner_attention, wo_init):
    from recipes.titan import make_gqa_config  # noqa: PLC0415 -- lazy: recipes.titan resolves torchtitan names on first use, after recipes.platform.install

    return make_gqa_config(
        dim=dims.hidden_size,
        n_heads=dims.num_attention_heads,
        n_kv_heads=dims.num_key_value_heads,
        head_dim=dims.head_dim,
        wqkv_param_init=_LINEAR_INIT,
        wo_param_init=wo_init,
        inner_attention=inner_attention,
        fuse_qkv=True,
        rope=rope,
        qk_norm=_norm(dims.head_dim, dims.rms_norm_eps),
    )


def _moe(dims: MoEDims):
    from recipes.titan import make_moe_config, make_routed_experts_config, make_router_config  # noqa: PLC0415 -- lazy: recipes.titan resolves torchtitan names on first use, after recipes.platform.install

    return make_moe_config(
        num_experts=dims.num_experts,
        router=make_router_config(
            dim=dims.hidden_size,
            num_experts=dims.num_experts,
            gate_param_init=_LINEAR_INIT,
            top_k=dims.num_experts_per_tok,
            score_func="softmax",
            route_norm=dims.norm_topk_prob,
        ),
        routed_experts=make_routed_experts_config(
            dim=dims.hidden_size,
            hidden_dim=dims.moe_intermediate_size,
            num_experts=dims.num_experts,
            top_k=dims.num_experts_per_tok,
            param_init={name: _LINEAR_INIT["weight"] for name in ("w1_EFD", "w2_EDF", "w3_EFD")},
            comm_backend="standard",
        ),
    )


def sized_spec(base_flavor: str, dims: DenseDims, name: str):
    """A ``model_registry(base_flavor)`` spec whose model has ``dims`` instead.

    Used for the cpu tier: same model class, adapter and parallelize function
    as the real flavor, with every size taken from ``dims``.
    """
    from recipes.titan import (  # noqa: PLC0415 -- lazy: recipes.titan resolves torchtitan names on first use, after recipes.platform.install
        CosSinRoPE,
        Embedding,
        Linear,
        Qwen3Model,
        Qwen3TransformerBlock,
        make_ffn_config,
        skip_param_init,
    )

    spec = qwen3_spec(base_flavor)
    inner_attention = copy.deepcopy(spec.model.layers[0].attention.inner_attention)
    rope = CosSinRoPE.Config(
        dim=dims.head_dim, max_seq_len=dims.max_position_embeddings, theta=dims.rope_theta
    )
    layers = []
    for _ in range(dims.num_hidden_layers):
        block = Qwen3TransformerBlock.Config(
            attention_norm=_norm(dims.hidden_size, dims.rms_norm_eps),
            ffn_norm=_norm(dims.hidden_size, dims.rms_norm_eps),
            attention=_attention(dims, rope, copy.deepcopy(inner_attention), _LINEAR_INIT),
        )
        if isinstance(dims, MoEDims):
            block.moe = _moe(dims)
        else:
            block.feed_forward = make_ffn_config(
                dim=dims.hidden_size,
                hidden_dim=dims.intermediate_size,
                w1_param_init=_LINEAR_INIT,
                w2w3_param_init=_LINEAR_INIT,
            )
        layers.append(block)
    embed_init = {"weight": skip_param_init} if dims.tie_word_embeddings else _LINEAR_INIT
    spec.model = Qwen3Model.Config(
        vocab_size=dims.vocab_size,
        dim=dims.hidden_size,
        norm=_norm(dims.hidden_size, dims.rms_norm_eps),
        enable_weight_tying=dims.tie_word_embeddings,
        tok_embeddings=Embedding.Config(
            num_embeddings=dims.vocab_size,
            embedding_dim=dims.hidden_size,
            param_init={"weight": embed_init["weight"]},
        ),
        lm_head=Linear.Config(
            in_features=dims.hidden_size, out_features=dims.vocab_size, param_init=_LINEAR_INIT
        ),
        layers=layers,
    )
    spec.flavor = name
    return spec


#: Which of a Qwen3-MoE's sizes each size field of a model config tree may carry (torchtitan 0.3.0's Qwen3Model,
#: GQAttention, FusedQKVLinear, Linear, Embedding, RMSNorm, CosSinRoPE, MoE, GroupedExperts, router and dispatcher
#: configs); a field of another name is not a size and is left alone.
_SIZE_FIELDS = {
    "vocab_size": ("vocab",),
    "num_embeddings": ("vocab",),
    "dim": ("hidden", "head_dim"),
    "embedding_dim": ("hidden",),
    "normalized_shape": ("hidden", "head_dim"),
    "in_features": ("hidden", "attn_out"),
    "out_features": ("vocab", "hidden", "qkv_out", "experts"),
    "head_dim": ("head_dim",),
    "n_heads": ("heads",),
    "n_kv_heads": ("kv_heads",),
    "hidden_dim": ("moe_hidden",),
    "max_seq_len": ("max_pos",),
    "num_experts": ("experts",),
    "top_k": ("top_k",),
}


def _sizes(d: MoEDims) -> dict[str, int]:
    return {
        "vocab": d.vocab_size,
        "hidden": d.hidden_size,
        "head_dim": d.head_dim,
        "heads": d.num_attention_heads,
        "kv_heads": d.num_key_value_heads,
        "qkv_out": (d.num_attention_heads + 2 * d.num_key_value_heads) * d.head_dim,
        "attn_out": d.num_attention_heads * d.head_dim,
        "moe_hidden": d.moe_intermediate_size,
        "max_pos": d.max_position_embeddings,
        "experts": d.num_experts,
        "top_k": d.num_experts_per_tok,
        "heads_per_kv": d.num_attention_heads // d.num_key_value_heads,
    }


#: Sizes an init function may close over (torchtitan 0.3.0 models/common/config_utils.py ``_fused_qkv_param_init``:
#: the fused wqkv's init draws q, k, v at the sizes it was built with).
_SIZE_CELLS = {
    "n_heads": "heads",
    "n_kv_heads": "kv_heads",
    "head_dim": "head_dim",
    "heads_per_kv": "heads_per_kv",
}


def _shrunk_init(fn, big: dict, tiny: dict):
    """``fn`` again, each size it closes over (:data:`_SIZE_CELLS`) at ``tiny``'s value; ``fn`` when it has none."""

    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    sized = {
        name: cell
        for name, cell in cells.items()
        if name in _SIZE_CELLS and cell.cell_contents == big[_SIZE_CELLS[name]]
    }
    if not sized:
        return fn
    closure = tuple(
        types.CellType(tiny[_SIZE_CELLS[name]]) if name in sized else cell
        for name, cell in cells.items()
    )
    new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, closure)
    new.__qualname__, new.__kwdefaults__ = fn.__qualname__, fn.__kwdefaults__
    return new


def shrink_model(model_config, full: MoEDims, small: MoEDims, path: str = "model") -> None:
    """In place: every size ``full`` has in ``model_config``'s tree becomes ``small``'s, every class kept.

    A rehearsal shrinks whichever config a recipe gets this way (config 3 from the fork's own function,
    whose sizes are 30B-A3B's): the modules the night launches are the fork's, at the seam's sizes, and so are the
    sizes an init function closes over (the fused wqkv's). A size field holding none of ``full``'s sizes is refused
    by its path: the rehearsal would not know its value.
    """

    if isinstance(model_config, list):
        for i, item in enumerate(model_config):
            shrink_model(item, full, small, f"{path}[{i}]")
        return
    if not dataclasses.is_dataclass(model_config) or isinstance(model_config, type):
        return
    big, tiny = _sizes(full), _sizes(small)
    for f in dataclasses.fields(model_config):
        value = getattr(model_config, f.name)
        if f.name in _SIZE_FIELDS and isinstance(value, int) and not isinstance(value, bool):
            names = [q for q in _SIZE_FIELDS[f.name] if big[q] == value]
            if not names:
                raise RecipeError(
                    f"{path}.{f.name}={value}: none of the full-size model's "
                    f"{', '.join(f'{q}={big[q]}' for q in _SIZE_FIELDS[f.name])}; cannot shrink it"
                )
            setattr(model_config, f.name, tiny[names[0]])
        elif f.name == "param_init" and isinstance(value, dict):
            setattr(
                model_config,
                f.name,
                {
                    k: _shrunk_init(v, big, tiny) if isinstance(v, types.FunctionType) else v
                    for k, v in value.items()
                },
            )
        elif dataclasses.is_dataclass(value) or isinstance(value, list):
            shrink_model(value, full, small, f"{path}.{f.name}")


def truncated_spec(flavor: str, n_layers: int, attn_backend: str = "sdpa"):
    """The real flavor's widths and vocab with only the first ``n_layers`` layers."""
    spec = qwen3_spec(flavor, attn_backend)
    spec.model.layers = spec.model.layers[:n_layers]
    spec.flavor = f"{flavor}[:{n_layers} layers]"
    return spec


def model_dims(spec) -> dict:
    """The hyper-parameters a spec builds, named as in config.json.

    ``max_seq_len`` is the RoPE table length: torchtitan sets it to the run's
    seq_len when the trainer is built.
    """
    model = spec.model
    attention = model.layers[0].attention
    return {
        "vocab_size": model.vocab_size,
        "hidden_size": model.dim,
        "num_hidden_layers": len(model.layers),
        "num_attention_heads": attention.n_heads,
        "num_key_value_heads": attention.n_kv_heads,
        "head_dim": attention.head_dim,
        "rope_theta": attention.rope.theta,
        "max_seq_len": attention.rope.max_seq_len,
        "tie_word_embeddings": bool(model.enable_weight_tying),
    }

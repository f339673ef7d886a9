"""Workarounds for torchtitan 0.3.0's Transformers modeling backend, all in one place.

The backend (``torchtitan.experiments.transformers_modeling_backend``) wraps a
transformers ``*ForCausalLM``. In torchtitan 0.3.0 (with transformers 5.x) it
has these defects on every device; each workaround below is the smallest
change that gives transformers' own numerics back, names its upstream cause,
and has a canary in ``tests/cpu/test_hf_compat_canaries.py`` that fails once
upstream is fixed, so the workaround can be deleted:

1. RoPE ``inv_freq`` is left uninitialised  -> ``init_rotary_embeddings``
2. swapped-in MoE left uninitialised         -> ``init_swapped_moe``
3. HF MoE checkpoints do not load            -> ``CompatStateDictAdapter``
4. flex attention, no CPU backward           -> ``causal_sdpa_attention``
5. transformers patched process-wide         -> ``scope_init_patch``
6. tied head drawn, then discarded (time)    -> ``skip_tied_head_draw``

The recipe uses them through ``compat_model_spec``: the spec builds
``CompatHFTransformerModel`` (upstream's model with 1, 2, 4, 5 and 6 fixed) and
carries the fixed state-dict adapter (3). 6 changes no value, only the time; its
canary is ``test_tied_head_draw_is_skipped_and_every_weight_stays_upstreams`` in
``tests/cpu/test_hf_backend.py``. Nothing in torchtitan or transformers is
monkeypatched (5 undoes upstream's own patch).

Each workaround first checks the upstream shape it relies on (a signature, an
attribute) with ``recipes.upstream_shape.require``: after a version bump that
moved it, it fails with one line naming the package, its version and the
workaround (``transformers 5.x no longer fits workaround ...``), never with a
``TypeError`` from inside it; ``make bump`` lists those lines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import types
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from transformers.modeling_utils import AttentionInterface, PreTrainedModel

from recipes.hf_rope import ROPE_WORKAROUND, rope_parameters
from recipes.titan import (
    HFTransformerModel,
    HFTransformerStateDictAdapter,
    TitanModelConfig,
    TitanMoeModelConfig,
)
from recipes.upstream_shape import accepts, describe, require, require_attributes

try:  # checked where it is used (causal_sdpa_attention), so a move reads as one line, not an ImportError
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
except ImportError:
    sdpa_attention_forward = None

#: The HF attention implementation name the compat model registers and uses.
ATTN_IMPLEMENTATION = "sdpa_causal_torchtitan"


# --- 1. RoPE ----------------------------------------------------------------


#: Where the shape checks of each workaround point (package, workaround).
MOE_INIT_WORKAROUND = "recipes.hf_compat.init_swapped_moe"
ADAPTER_WORKAROUND = "recipes.hf_compat.CompatStateDictAdapter"
ATTENTION_WORKAROUND = "recipes.hf_compat.causal_sdpa_attention"
INIT_PATCH_WORKAROUND = "recipes.hf_compat.scope_init_patch"
TIED_HEAD_WORKAROUND = "recipes.hf_compat.skip_tied_head_draw"


def rotary_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """transformers' rotary embeddings in ``model`` (``Qwen3RotaryEmbedding``, ``Qwen3MoeRotaryEmbedding``...)."""
    return [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]


def init_rotary_embeddings(model: torch.nn.Module) -> None:
    """Recompute every HF rotary embedding's ``inv_freq`` exactly as its ``__init__`` does.

    Upstream cause: the model is built on the meta device and materialised with
    ``to_empty()``; ``HFTransformerModel.init_states`` only recomputes rotary
    modules that have ``rope_init_fn``, which transformers 5.x rotary classes
    (``Qwen3RotaryEmbedding``...) no longer have, so ``inv_freq`` keeps whatever
    memory ``to_empty()`` returned: step-1 loss differs run to run, NaN follows.
    The rope init function is called as every transformers seen accepts it
    (``recipes.hf_rope``: 5.16's ``(config, device=None)``, 5.23's ``(config, **kwargs)``).
    """
    rotaries = rotary_modules(model)
    require(
        bool(rotaries),
        "transformers",
        ROPE_WORKAROUND,
        f"a *RotaryEmbedding module in {type(model).__name__}",
    )
    for module in rotaries:
        inv_freq, module.attention_scaling = rope_parameters(module)
        module.inv_freq.copy_(inv_freq)
        if hasattr(module, "original_inv_freq"):
            module.original_inv_freq.copy_(inv_freq)


# --- 2. MoE init --------------------------------------------------------------


def init_swapped_moe(model: HFTransformerModel, buffer_device: torch.device | None) -> None:
    """Initialise the torchtitan MoE modules the backend swapped in for HF's MoE blocks.

    Upstream cause: ``build_and_swap_native_moe`` (at parallelize time)
    initialises each torchtitan ``MoE`` on CPU, then the trainer's model-wide
    ``to_empty()`` discards those values, and ``HFTransformerModel.init_states``
    only runs HF's ``_init_weights``, which does not know torchtitan's MoE:
    experts and router stay uninitialised (values like 1e37).
    """
    require(
        hasattr(model, "layers") and hasattr(model.layers, "values"),
        "torchtitan",
        MOE_INIT_WORKAROUND,
        f"{type(model).__name__}.layers, a ModuleDict of decoder layers",
    )
    for layer in model.layers.values():
        moe = getattr(layer, "moe", None)
        if moe is not None:
            init = getattr(moe, "init_states", None)
            require(
                init is not None and accepts(init, buffer_device=buffer_device),
                "torchtitan",
                MOE_INIT_WORKAROUND,
                f"{type(moe).__name__}.init_states(buffer_device=...)",
            )
            init(buffer_device=buffer_device)


# --- 3. MoE checkpoints --------------------------------------------------------

#: torchtitan ``GroupedExperts`` parameter -> the per-expert HF projection it stacks.
EXPERT_PROJECTIONS = {"w1_EFD": "gate_proj", "w3_EFD": "up_proj", "w2_EDF": "down_proj"}
_GROUPED_EXPERTS = re.compile(r"^(.*\.mlp)\.routed_experts\.inner_experts\.(w1_EFD|w3_EFD|w2_EDF)$")
_HF_EXPERT = re.compile(r"^(.*\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_TITAN_ROUTER = re.compile(r"^(.*\.mlp)\.router\.gate\.weight$")
_HF_ROUTER = re.compile(r"^(.*\.mlp)\.gate\.weight$")


class CompatStateDictAdapter(HFTransformerStateDictAdapter):
    """Upstream's adapter plus the MoE layout of HF checkpoints on disk.

    Upstream cause: ``HFTransformerStateDictAdapter`` only adds/strips the
    ``model.`` prefix, so the swapped-in torchtitan MoE's keys
    (``mlp.router.gate.weight``, ``mlp.routed_experts.inner_experts.w1_EFD`` ...)
    are not in an HF MoE checkpoint, which stores ``mlp.gate.weight`` and one
    ``mlp.experts.<e>.{gate,up,down}_proj.weight`` per expert, and loading
    fails. (The module's ``hf_to_titan_moe_state_dict`` is never called, and
    converts to transformers' in-memory fused ``gate_up_proj``, which is not
    what checkpoints hold either.) Dense keys pass through unchanged.

    Each rank reads and writes only its own experts: the per-expert tensors are
    views of the local shard of the grouped weight.
    """

    def __init__(self, model_config, hf_assets_path: str | None) -> None:
        base = HFTransformerStateDictAdapter
        require_attributes(
            base, ("to_hf", "from_hf"), "torchtitan", ADAPTER_WORKAROUND, base.__name__
        )
        require(
            accepts(base.__init__, self, model_config, hf_assets_path),
            "torchtitan",
            ADAPTER_WORKAROUND,
            f"{base.__name__}(model_config, hf_assets_path), found {describe(base.__init__)}",
        )
        super().__init__(model_config, hf_assets_path)
        self._grouped_layouts: dict[str, tuple] = {}

    def to_hf(self, state_dict: dict) -> dict:
        hf_state_dict = {}
        for key, value in super().to_hf(state_dict).items():
            grouped = _GROUPED_EXPERTS.match(key)
            if grouped:
                hf_state_dict.update(
                    self._split_experts(key, value, grouped[1], EXPERT_PROJECTIONS[grouped[2]])
                )
            else:
                hf_state_dict[_TITAN_ROUTER.sub(r"\1.gate.weight", key)] = value
        return hf_state_dict

    def from_hf(self, hf_state_dict: dict) -> dict:
        state_dict, experts = {}, defaultdict(dict)
        titan_names = {hf: titan for titan, hf in EXPERT_PROJECTIONS.items()}
        for key, value in hf_state_dict.items():
            expert = _HF_EXPERT.match(key)
            if expert:
                grouped_key = f"{expert[1]}.routed_experts.inner_experts.{titan_names[expert[3]]}"
                experts[grouped_key][int(expert[2])] = value
            else:
                state_dict[_HF_ROUTER.sub(r"\1.router.gate.weight", key)] = value
        for key, by_id in experts.items():
            state_dict[key] = self._stack_experts(key, [by_id[e] for e in sorted(by_id)])
        return super().from_hf(state_dict)

    def _split_experts(self, key: str, grouped, mlp: str, projection: str) -> dict:
        first, local = 0, grouped
        if isinstance(grouped, DTensor):
            self._grouped_layouts[key] = (
                grouped.device_mesh,
                grouped.placements,
                grouped.shape,
                grouped.stride(),
            )
            _, offset = compute_local_shape_and_global_offset(
                grouped.shape, grouped.device_mesh, grouped.placements
            )
            first, local = offset[0], grouped.to_local()
        return {
            f"{mlp}.experts.{first + i}.{projection}.weight": local[i]
            for i in range(local.shape[0])
        }

    def _stack_experts(self, key: str, tensors: list[torch.Tensor]) -> torch.Tensor:
        local = torch.stack(tensors)
        if key not in self._grouped_layouts:
            return local
        mesh, placements, shape, stride = self._grouped_layouts[key]
        return DTensor.from_local(
            local, mesh, placements, run_check=False, shape=shape, stride=stride
        )


# --- 4. attention --------------------------------------------------------------


def causal_sdpa_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' own SDPA attention, causal through ``is_causal`` (no mask tensor).

    Upstream cause: the backend hard-wires ``_attn_implementation =
    "flex_torchtitan"`` (FlexAttention), which has no backward on CPU in torch
    2.14, and builds a compiled BlockMask every step. For the causal mask the
    recipe trains with, this is exactly what ``AutoModelForCausalLM`` runs with
    ``attn_implementation="sdpa"`` and no padding mask.
    """
    if attention_mask is not None:
        raise ValueError(
            f"{ATTN_IMPLEMENTATION} applies a causal mask itself; got an explicit attention mask"
        )
    return sdpa_attention_forward(module, query, key, value, None, **kwargs)


def check_attention_shape() -> None:
    """What ``causal_sdpa_attention`` and its registration rely on, checked before a model is built."""
    where = "transformers.integrations.sdpa_attention.sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)"
    require(sdpa_attention_forward is not None, "transformers", ATTENTION_WORKAROUND, where)
    require(
        accepts(sdpa_attention_forward, None, None, None, None, None),
        "transformers",
        ATTENTION_WORKAROUND,
        f"{where}, found {describe(sdpa_attention_forward)}",
    )
    require(
        hasattr(AttentionInterface, "register"),
        "transformers",
        ATTENTION_WORKAROUND,
        "AttentionInterface.register",
    )


# --- 5. process-wide init patch ---------------------------------------------------

#: The ``PreTrainedModel`` methods upstream replaces with its torchtitan-style init.
PATCHED_INIT_METHODS = ("_init_weights", "_initialize_weights")


def scope_init_patch(model: PreTrainedModel, originals: dict) -> None:
    """Move upstream's init patch from ``transformers.PreTrainedModel`` onto ``model`` alone.

    Upstream cause: ``HFTransformerModel._patch_hf_llama_like`` assigns its
    init functions to ``PreTrainedModel`` itself, so every transformers model
    loaded later in the process uses them, and ``from_pretrained`` then leaves
    RoPE's ``inv_freq`` at 0. ``originals`` are the methods from before the
    build; ``model`` keeps upstream's (same functions, same numerics).
    """
    for name, original in originals.items():
        setattr(model, name, types.MethodType(getattr(PreTrainedModel, name), model))
        setattr(PreTrainedModel, name, original)


def pristine_init_methods() -> dict:
    """``PreTrainedModel``'s own init methods, before upstream's build replaces them."""
    require_attributes(
        PreTrainedModel,
        PATCHED_INIT_METHODS,
        "transformers",
        INIT_PATCH_WORKAROUND,
        "PreTrainedModel",
    )
    return {name: getattr(PreTrainedModel, name) for name in PATCHED_INIT_METHODS}


# --- 6. tied head drawn, then discarded ------------------------------------------------

#: What ``PreTrainedModel.tie_weights`` ties the head to (target -> source), transformers 5.x.
TIED_HEAD = ("lm_head.weight", "model.embed_tokens.weight")


def head_draw_is_discarded(model: HFTransformerModel) -> bool:
    """``init_states`` ties the head to the embedding, and nothing draws from the generator after the head.

    The head is the last module ``model.apply`` initialises (post-order: ``model`` first, then
    ``lm_head``); a swapped-in MoE (workaround 2) draws after it, so MoE models keep the draw.
    A head already sharing the embedding's parameter (no ``to_empty`` in between) is not
    skipped either: its draw would overwrite the embedding's and be the one kept.
    """
    hf = model.model
    require(
        hasattr(hf, "get_expanded_tied_weights_keys"),
        "transformers",
        TIED_HEAD_WORKAROUND,
        "PreTrainedModel.get_expanded_tied_weights_keys (the tie_weights mapping)",
    )
    tied = hf.get_expanded_tied_weights_keys(all_submodels=True).get(TIED_HEAD[0]) == TIED_HEAD[1]
    moe = any(getattr(layer, "moe", None) is not None for layer in model.layers.values())
    last = list(hf.children())[-1] is hf.lm_head
    shared = hf.lm_head.weight is hf.get_input_embeddings().weight
    return tied and last and not moe and not shared


@contextlib.contextmanager
def skip_tied_head_draw(model: HFTransformerModel):
    """Leave ``lm_head`` out of upstream's init pass when the tie right after it discards its draw.

    Upstream cause: ``HFTransformerModel.init_states`` initialises every module, ``lm_head``
    included (a ±3σ truncated normal as large as the embedding: 151936 × 2560 at the 4B width,
    four full-size normal draws in torch 2.14's rejection sampler, measured 25-30 of the
    4B-width random-init proxy's 60-75 CPU-s), then calls ``tie_weights()``, which makes
    ``lm_head.weight`` the embedding's parameter. The head's draw is the init's last, so
    every weight stays bitwise as upstream
    leaves it; only the CPU generator's state after init differs, which nothing in a dense
    model's training draws from (``tests/cpu/test_curves.py`` holds 100 steps bitwise to the
    golden). The tie is checked after the pass: an untied head would keep uninitialised memory.
    """
    if not head_draw_is_discarded(model):
        yield
        return
    hf = model.model
    init_weights = hf._init_weights

    def init_all_but_the_head(module):
        if module is not hf.lm_head:
            init_weights(module)

    hf._init_weights = init_all_but_the_head
    try:
        yield
    finally:
        hf._init_weights = init_weights
    require(
        hf.lm_head.weight is hf.get_input_embeddings().weight,
        "torchtitan",
        TIED_HEAD_WORKAROUND,
        "HFTransformerModel.init_states ending with tie_weights() (lm_head.weight is the embedding's)",
    )


class CompatHFTransformerModel(HFTransformerModel):
    """``HFTransformerModel`` with workarounds 1, 2, 4, 5 and 6; everything else is upstream's."""

    @dataclass(kw_only=True, slots=True, init=False, repr=False, eq=False)
    class Config(HFTransformerModel.Config):
        """Upstream's config, routing attention through ``causal_sdpa_attention``."""

        def __init__(self, model_config, **kwargs) -> None:
            # transformers wraps a config subclass without its own __init__ in a
            # strict dataclass __init__; keep upstream's.
            HFTransformerModel.Config.__init__(self, model_config, **kwargs)

        def _configure_hf_attention(self) -> None:
            check_attention_shape()
            require(
                isinstance(getattr(self, "_titan_injected_model_args", None), dict),
                "torchtitan",
                ATTENTION_WORKAROUND,
                "HFTransformerModel.Config._titan_injected_model_args (a dict)",
            )
            AttentionInterface.register(ATTN_IMPLEMENTATION, causal_sdpa_attention)
            self._titan_injected_model_args["attn_implementation"] = ATTN_IMPLEMENTATION
            self.attn_implementation = ATTN_IMPLEMENTATION
            self._attn_implementation = ATTN_IMPLEMENTATION

    def __init__(self, config: "CompatHFTransformerModel.Config") -> None:
        originals = pristine_init_methods()
        super().__init__(config)
        scope_init_patch(self.model, originals)

    def get_attention_masks(self, positions: torch.Tensor):
        """No BlockMask: ``causal_sdpa_attention`` is causal by itself (and sees whole sequences)."""
        mask_type = getattr(self.model.config, "attn_mask_type", "causal")
        if mask_type != "causal":
            raise ValueError(
                f"{ATTN_IMPLEMENTATION} supports attn_mask_type='causal' only, got {mask_type!r}"
            )
        if self.cp_mesh is not None:
            raise ValueError(
                f"{ATTN_IMPLEMENTATION} does not gather k/v for context parallelism; use degree 1"
            )
        return None

    def init_states(self, *, buffer_device: torch.device | None = None) -> None:
        with skip_tied_head_draw(self):
            super().init_states(buffer_device=buffer_device)
        init_rotary_embeddings(self.model)
        init_swapped_moe(self, buffer_device)


# --- the spec the recipe uses --------------------------------------------------------


def compat_model_config(
    hf_config: dict, layers: int | None = None
) -> CompatHFTransformerModel.Config:
    """The backend's "full" flavor (every size from the HF config) for this HF config.

    Qwen3-MoE gets ``TitanMoeModelConfig`` without torchtitan's
    auxiliary-loss-free expert bias: Qwen3-MoE has none, so an HF checkpoint
    cannot provide it and an HF export could not keep it.
    """
    base = TitanMoeModelConfig(load_balance_coeff=None) if is_moe(hf_config) else TitanModelConfig()
    if layers is not None:
        base = dataclasses.replace(base, n_layers=layers)
    return CompatHFTransformerModel.Config(model_config=base)


def compat_model_spec(spec, hf_config: dict, layers: int | None = None):
    """``spec`` (upstream's ``model_registry`` spec) building the compat model, with the compat adapter."""
    return dataclasses.replace(
        spec,
        model=compat_model_config(hf_config, layers),
        state_dict_adapter=CompatStateDictAdapter,
    )


def is_moe(hf_config: dict) -> bool:
    """An HF MoE config (transformers 5 writes Qwen3-MoE's expert count as ``num_local_experts``)."""
    return "num_experts" in hf_config or "num_local_experts" in hf_config

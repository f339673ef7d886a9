"""Canaries for recipes/hf_compat.py: each backend defect is still there upstream.

Each test builds torchtitan 0.3.0's Transformers modeling backend *without*
the compat module and asserts the defect its workaround exists for. A canary
that fails means upstream fixed that defect: delete the named workaround from
``recipes/hf_compat.py`` (and the canary), then rerun ``tests/cpu/test_hf_backend.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers.modeling_utils import PreTrainedModel

from recipes.tiers import FIXTURES

DENSE_DIR = FIXTURES / "qwen3-tiny"
MOE_DIR = FIXTURES / "qwen3-moe-tiny"
SEQ_LEN = 32
#: What parallelize tells the MoE swap: no expert or tensor parallelism.
NO_EP_TP = SimpleNamespace(ep_enabled=False, tp_enabled=False)
#: transformers' own init methods, before any backend model is built in this process.
PRISTINE_INIT = {
    name: getattr(PreTrainedModel, name) for name in ("_init_weights", "_initialize_weights")
}


@pytest.fixture(autouse=True)
def restore_transformers_init():
    """Undo upstream's process-wide patch after each canary, so later tests see transformers as shipped."""
    yield
    for name, original in PRISTINE_INIT.items():
        setattr(PreTrainedModel, name, original)


def upstream_model(model_dir, *, materialize: bool = True):
    """The backend's "full" flavor for ``model_dir``, exactly as upstream builds it.

    Materialised like the trainer does (``to_empty`` then ``init_states``), with
    every tensor first set to NaN so "left uninitialised" is deterministic.
    """
    from torchtitan.experiments.transformers_modeling_backend import (
        HFTransformerModel,
        TitanMoeModelConfig,
    )
    from torchtitan.experiments.transformers_modeling_backend.config_registry import (
        transformers_modeling_backend_full,
    )
    from torchtitan.experiments.transformers_modeling_backend.moe_replacement import (
        build_and_swap_native_moe,
    )

    config = transformers_modeling_backend_full()
    config.hf_model = str(model_dir)
    config.training.seq_len = SEQ_LEN
    if model_dir == MOE_DIR:
        config.model_spec.model = HFTransformerModel.Config(model_config=TitanMoeModelConfig())
    config.model_spec.model.update_from_config(config=config)
    with torch.device("meta"):
        model = config.model_spec.model.build()
    if model_dir == MOE_DIR:
        build_and_swap_native_moe(model, NO_EP_TP)  # what parallelize_hf_transformers does first
    if materialize:
        model.to_empty(device="cpu")
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                tensor.fill_(float("nan") if tensor.is_floating_point() else 0)
            model.init_states()
    return model


def test_canary_rope_inv_freq_still_left_uninitialised():
    """Workaround 1 (``init_rotary_embeddings``): upstream ``init_states`` skips transformers 5.x rotary modules."""
    rotary = upstream_model(DENSE_DIR).model.model.rotary_emb
    assert not hasattr(rotary, "rope_init_fn"), "transformers' rotary module has rope_init_fn again"
    assert torch.isnan(rotary.inv_freq).all(), (
        "upstream now initialises inv_freq after to_empty(): drop init_rotary_embeddings from recipes/hf_compat.py"
    )


def test_canary_swapped_moe_still_left_uninitialised():
    """Workaround 2 (``init_swapped_moe``): to_empty() wipes the MoE built at parallelize time."""
    moe = upstream_model(MOE_DIR).layers["0"].moe
    assert all(torch.isnan(p).all() for p in moe.parameters()), (
        "upstream now initialises the swapped-in MoE: drop init_swapped_moe from recipes/hf_compat.py"
    )


def test_canary_hf_moe_checkpoint_still_does_not_load():
    """Workaround 3 (``CompatStateDictAdapter``): upstream's adapter asks an HF MoE checkpoint for keys it lacks."""
    from safetensors import safe_open
    from torchtitan.experiments.transformers_modeling_backend.state_dict_adapter import (
        HFTransformerStateDictAdapter,
    )

    model = upstream_model(MOE_DIR, materialize=False)
    with safe_open(MOE_DIR / "model.safetensors", "pt") as checkpoint:
        on_disk = set(checkpoint.keys())
    upstream = HFTransformerStateDictAdapter(model.model.config, None)
    not_in_checkpoint = set(upstream.to_hf(model.state_dict())) - on_disk
    assert "model.layers.0.mlp.routed_experts.inner_experts.w1_EFD" in not_in_checkpoint, (
        "upstream's adapter now maps MoE experts to HF keys: drop CompatStateDictAdapter from recipes/hf_compat.py"
    )


def test_canary_flex_attention_still_has_no_cpu_backward():
    """Workaround 4 (``causal_sdpa_attention``): upstream forces flex attention, which cannot train on CPU."""
    model = upstream_model(DENSE_DIR)
    assert model.model.config._attn_implementation == "flex_torchtitan"
    tokens = torch.zeros(1, SEQ_LEN, dtype=torch.long)
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        model(tokens).sum().backward()


def test_canary_building_the_backend_still_patches_transformers_process_wide():
    """Workaround 5 (``scope_init_patch``): upstream replaces ``PreTrainedModel``'s init for the whole process."""
    upstream_model(DENSE_DIR, materialize=False)
    patched = [
        name
        for name, original in PRISTINE_INIT.items()
        if getattr(PreTrainedModel, name) is not original
    ]
    assert patched == list(PRISTINE_INIT), (
        "upstream no longer patches transformers.PreTrainedModel: drop scope_init_patch from recipes/hf_compat.py"
    )

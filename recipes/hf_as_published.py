"""Tutorial config 1 with an upstream defect kept: the "as published" lanes of the trn2 nightly.

The recipe (``recipes.hf_backend``) works around the Transformers backend's defects
(``recipes.hf_compat``), so its step-1 loss is what the weights score. The tutorial
ran torchtitan's backend as shipped. To report both, a run can keep a defect:

* ``inv_freq`` -- set ``QWEN3_HF_KEEP_DEFECTS=inv_freq`` in the launcher's environment
  (every rank inherits it): the model's ``init_states`` is upstream's, which leaves the
  rotary ``inv_freq`` as ``to_empty()`` memory under transformers 5.x
  (pytorch/torchtitan issue 4783, fix PR 4817 open; ``HFTransformerModel.init_states`` in
  torchtitan/experiments/transformers_modeling_backend/model.py only recomputes modules
  with ``rope_init_fn``). Every other workaround stays (SDPA instead of FlexAttention
  computes the same causal attention; MoE init and loading are not in config 1).
* the tokenizer -- not an environment switch but a run option: upstream's
  ``transformers_modeling_backend_full()`` (…/transformers_modeling_backend/config_registry.py)
  sets no ``hf_assets_path``, so ``Trainer.Config.hf_assets_path`` keeps its default
  ``./tests/assets/tokenizer`` (torchtitan/trainer.py), torchtitan's 2,020-id test BPE.
  Reproduce it with ``--tokenizer-dir <torchtitan checkout>/tests/assets/tokenizer
  --allow-mismatch tokenizer`` (provenance then records it as an allowed mismatch).

The first-batch record (``harness.reference.diagnosis``) stores which defects a run kept.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch

from recipes.errors import RecipeError
from recipes.hf_compat import (
    CompatHFTransformerModel,
    CompatStateDictAdapter,
    init_swapped_moe,
    is_moe,
)
from recipes.titan import HFTransformerModel, TitanModelConfig, TitanMoeModelConfig

#: The environment switch: a comma-separated list of KEEPABLE_DEFECTS names.
KEEP_DEFECTS_ENV = "QWEN3_HF_KEEP_DEFECTS"
KEEPABLE_DEFECTS = {
    "inv_freq": "RoPE inv_freq left as to_empty() memory (torchtitan issue 4783): recipes.hf_compat workaround 1 off",
}


def kept_defects() -> list[str]:
    """The defects ``$QWEN3_HF_KEEP_DEFECTS`` asks to keep; an unknown name is refused."""

    names = [n.strip() for n in os.environ.get(KEEP_DEFECTS_ENV, "").split(",") if n.strip()]
    unknown = [n for n in names if n not in KEEPABLE_DEFECTS]
    if unknown:
        raise RecipeError(
            f"{KEEP_DEFECTS_ENV}={os.environ[KEEP_DEFECTS_ENV]!r}: unknown defect(s) {unknown}; "
            f"keepable: {', '.join(KEEPABLE_DEFECTS)} (the tokenizer defect is --tokenizer-dir + --allow-mismatch tokenizer)"
        )
    return names


class UpstreamRopeInitModel(CompatHFTransformerModel):
    """The recipe's backend model with upstream's ``init_states``: ``inv_freq`` stays as allocated."""

    @dataclass(kw_only=True, slots=True, init=False, repr=False, eq=False)
    class Config(CompatHFTransformerModel.Config):
        def __init__(self, model_config, **kwargs) -> None:
            CompatHFTransformerModel.Config.__init__(self, model_config, **kwargs)

    def init_states(self, *, buffer_device: torch.device | None = None) -> None:
        HFTransformerModel.init_states(self, buffer_device=buffer_device)
        init_swapped_moe(self, buffer_device)


def keep_inv_freq_defect(spec, hf_config: dict, layers: int | None = None):
    """``spec`` (the recipe's compat spec) building :class:`UpstreamRopeInitModel` instead."""
    base = TitanMoeModelConfig(load_balance_coeff=None) if is_moe(hf_config) else TitanModelConfig()
    if layers is not None:
        base = dataclasses.replace(base, n_layers=layers)
    return dataclasses.replace(
        spec,
        model=UpstreamRopeInitModel.Config(model_config=base),
        state_dict_adapter=CompatStateDictAdapter,
    )

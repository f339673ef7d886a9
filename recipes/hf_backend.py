"""Tutorial config 1: torchtitan's Transformers modeling backend on Qwen3-4B-Instruct-2507.

Starts from ``transformers_modeling_backend_full()`` and sets ``hf_model`` to
``--model-dir`` (trn2 default: ``QWEN3_4B_DIR``), else the tutorial's Hub ID.
The "full" flavor takes every size from that model's config.json, so the cpu
tier trains the fixture checkpoint itself; ``--layers N`` keeps its first N
layers. Data, seq_len, batch, parallelism and checkpoints are the tier's,
shared with native Qwen3 through ``recipes.tutorial.tutorial_settings``.

The backend's defects are worked around in ``recipes.hf_compat``; this recipe
only swaps in its spec. ``QWEN3_HF_KEEP_DEFECTS=inv_freq`` keeps upstream's RoPE
init instead, to measure the tutorial as published (``recipes.hf_as_published``).
"""

from __future__ import annotations

import os

from recipes.tutorial import RecipeInputs, tier_config, tutorial_settings

#: The model tutorial config 1 trains.
HUB_ID = "Qwen/Qwen3-4B-Instruct-2507"

#: ``architectures`` this recipe trains: Qwen3 causal LMs, dense or MoE.
ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


def hf_model(inputs: RecipeInputs) -> str:
    """What the backend reads its config from (and the checkpoint its weights)."""
    return str(inputs.model_dir) if inputs.model_dir is not None else HUB_ID


def hf_backend(inputs: RecipeInputs):
    """``transformers_modeling_backend_full()`` with ``hf_model`` = ``--model-dir``."""
    from transformers import PretrainedConfig  # noqa: PLC0415 -- heavy: transformers 1.8 s; this module stays light

    from recipes.hf_compat import compat_model_spec  # noqa: PLC0415 -- heavy: recipes.hf_compat imports torchtitan (torchtitan+torch 2.9 s); this module stays light
    from recipes.titan import transformers_modeling_backend_full  # noqa: PLC0415 -- lazy: recipes.titan resolves torchtitan names on first use, after recipes.platform.install

    config = transformers_modeling_backend_full()
    config.hf_model = hf_model(inputs)
    hf_config, _ = PretrainedConfig.get_config_dict(config.hf_model)
    config.model_spec = compat_model_spec(config.model_spec, hf_config, inputs.layers)
    if os.environ.get("QWEN3_HF_KEEP_DEFECTS"):
        from recipes.hf_as_published import keep_inv_freq_defect, kept_defects  # noqa: PLC0415 -- heavy: recipes.hf_as_published imports torchtitan (torchtitan+torch 2.9 s); this module stays light

        if "inv_freq" in kept_defects():
            config.model_spec = keep_inv_freq_defect(config.model_spec, hf_config, inputs.layers)
    return tutorial_settings(config, inputs)


# --- zero-argument config functions (torchtitan's ``--module recipes.hf_backend --config NAME``) ---


def hf_backend_trn2():
    """Config 1 as the tutorial runs it: ``hf_model`` = ``$QWEN3_4B_DIR``, 64 ranks, DP sharding."""
    return tier_config("hf_backend", "trn2")


def hf_backend_cpu():
    """Config 1 on the cpu tier with the tiny fixture checkpoint as ``hf_model``."""
    return tier_config("hf_backend", "cpu")

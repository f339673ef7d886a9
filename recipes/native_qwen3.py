"""Tutorial config 2: torchtitan's native Qwen3, the 32B config with the 4B model.

The tutorial's torchtitan build has no ``qwen3_4b()``, so it starts from
``qwen3_32b()`` and replaces ``model_spec`` with ``model_registry("4B",
attn_backend="sdpa")``. The cpu tier keeps that structure with tiny dims.
"""

from __future__ import annotations

from recipes.specs import qwen3_spec, sized_spec, truncated_spec
from recipes.tiers import TIERS, TINY_DENSE
from recipes.tutorial import RecipeInputs, tier_config, tutorial_settings

#: The model the tutorial trains, and the one its published numbers are about.
FLAVOR = "4B"


def model_spec(tier: str, layers: int | None = None):
    """The 4B spec with SDPA; on cpu tiny dims unless ``layers`` asks for the real width.

    ``layers`` keeps the first N layers of the real 4B model: the cpu tier uses
    it to measure the random-init loss of the real width and vocab.
    """
    if layers is not None:
        return truncated_spec(FLAVOR, layers, attn_backend="sdpa")
    if TIERS[tier].full_size_models:
        return qwen3_spec(FLAVOR, attn_backend="sdpa")
    return sized_spec(FLAVOR, TINY_DENSE, name="cpu-tiny")


def native_qwen3(inputs: RecipeInputs):
    """``qwen3_32b()`` with ``config.model_spec = model_registry("4B", attn_backend="sdpa")``."""
    from recipes.titan import qwen3_32b  # noqa: PLC0415 -- lazy: recipes.titan resolves torchtitan names on first use, after recipes.platform.install

    config = qwen3_32b()
    config.model_spec = model_spec(inputs.tier, inputs.layers)
    return tutorial_settings(config, inputs)


# --- zero-argument config functions (torchtitan's ``--module recipes.native_qwen3 --config NAME``) ---


def native_qwen3_trn2():
    """Config 2 as the tutorial runs it: 4B from ``$QWEN3_4B_DIR``'s weights, 64 ranks, DP sharding.

    ``model_registry("4B")`` builds RoPE theta 1e6 while Qwen3-4B-Instruct-2507's config.json
    says 5e6; the tutorial trains with 1e6 (the harness refuses that mismatch unless
    ``--allow-mismatch rope_theta``; torchtitan's own entry checks nothing).
    """
    return tier_config("native_qwen3", "trn2")


def native_qwen3_trn2_random_init():
    """Config 2 from random init (the tutorial's 12.43)."""
    return tier_config("native_qwen3", "trn2", init="random")


def native_qwen3_cpu():
    """Config 2's structure at tiny dims on the cpu tier, from the fixture checkpoint."""
    return tier_config("native_qwen3", "cpu")

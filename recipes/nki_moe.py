"""Tutorial config 3: Qwen3-30B-A3B shrunk to one instance, MoE through NKI grouped experts.

``qwen3_nki_moe_config("30B-A3B", n_layers=4, num_experts=64, top_k=4)``: the
native 30B-A3B widths with 4 layers, 64 experts and top-4 routing, the grouped
experts replaced by the NKI implementation, SDPA attention, "RoPE without gather"
(torchtitan's own CosSinRoPE on its sliced-cache path: :class:`SlicedCosSinRoPE`),
eager mode (``CompileConfig(enable=False)``), data-parallel sharding only: TP=1, no
expert parallel. The cpu tier keeps 4 layers / 64 experts / top-4 with tiny widths.

nkilib's ``rope_hf`` is not part of config 3: it is the tutorial's separate example
of mounting a kernel through the override registry, opt-in on any recipe with
``--override rope_hf[=GLOB]``.

The tutorial calls the fork's *own* ``qwen3_nki_moe_config`` (TorchTitan Neuron's
recipes, package ``torchtitan_neuron``; not public, so not read here). On the trn2
tier config 3 is built from that function with the tutorial's arguments whenever it
is importable (:func:`fork_config`); :func:`qwen3_nki_moe_config` below is the suite's
twin of it, rebuilt from upstream names, and the only config 3 of the cpu tier. Which
one a run built is :func:`config_source`; the harness compares the two. A rehearsal of the night takes the
fork's function too (rehearsal/fork.py's stand-in) and shrinks what it returns to the seam's sizes
(:func:`shrunk_for_tier`).
"""

from __future__ import annotations

from dataclasses import replace

from recipes.kernels.rope import sliced_rope
from recipes.overrides import apply_override_specs
from recipes.specs import shrink_model, sized_spec
from recipes.tiers import AS_PUBLISHED, TIERS, MoEDims
from recipes.titan import BY_NAME, optional
from recipes.tutorial import RecipeInputs, tier_config, tutorial_settings

#: Qwen3-30B-A3B's own widths (config.json of Qwen/Qwen3-30B-A3B).
QWEN3_30B_A3B = MoEDims(
    vocab_size=151936,
    hidden_size=2048,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    intermediate_size=6144,
    rope_theta=1_000_000.0,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
    moe_intermediate_size=768,
    num_experts=128,
    num_experts_per_tok=8,
)

#: The kernels the tutorial's MoE recipe runs, as ``--override`` specs (every matching node).
KERNEL_OVERRIDES = ("grouped_experts",)


def moe_dims(
    tier: str, n_layers: int, num_experts: int, top_k: int, *, as_published: bool = False
) -> MoEDims:
    """30B-A3B shrunk to fit one instance; tiny widths on the cpu tier (and in a rehearsal, unless ``as_published``)."""
    spec = AS_PUBLISHED[tier] if as_published else TIERS[tier]
    base = QWEN3_30B_A3B if spec.full_size_models else spec.tiny_moe
    return replace(
        base, num_hidden_layers=n_layers, num_experts=num_experts, num_experts_per_tok=top_k
    )


def use_sliced_rope(model_config) -> None:
    """Every layer's RoPE on torchtitan's gather-free (sliced cache) path, same theta and sizes."""
    for layer in model_config.layers:
        layer.attention.rope = sliced_rope(layer.attention.rope)


def qwen3_nki_moe_config(
    flavor: str = "30B-A3B",
    *,
    tier: str = "trn2",
    n_layers: int = 4,
    num_experts: int = 64,
    top_k: int = 4,
    as_published: bool = False,
):
    """The tutorial's MoE ``Trainer.Config`` before run options (data, batch, checkpoint)."""
    from recipes.titan import CompileConfig, qwen3_30b_a3b  # noqa: PLC0415 -- lazy: recipes.titan resolves torchtitan names on first use, after recipes.platform.install

    if flavor != "30B-A3B":
        raise ValueError(
            f"qwen3_nki_moe_config reproduces the tutorial's 30B-A3B only, got {flavor!r}"
        )
    config = qwen3_30b_a3b()
    dims = moe_dims(tier, n_layers, num_experts, top_k, as_published=as_published)
    config.model_spec = sized_spec(
        flavor, dims, name=f"{flavor}[{n_layers}L,{num_experts}E,top{top_k}]"
    )
    use_sliced_rope(config.model_spec.model)
    config.compile = CompileConfig(enable=False)
    config.parallelism.expert_parallel_degree = 1
    apply_override_specs(config, KERNEL_OVERRIDES)
    return config


#: The tutorial's call: ``qwen3_nki_moe_config("30B-A3B", n_layers=4, num_experts=64, top_k=4)``.
TUTORIAL_FLAVOR = "30B-A3B"
TUTORIAL_KWARGS = {"n_layers": 4, "num_experts": 64, "top_k": 4}
TWIN = "recipes.nki_moe.qwen3_nki_moe_config (the suite's twin, from upstream names)"


def fork_config():
    """``(config, "")`` from the fork's own function with the tutorial's arguments, or ``(None, why)``.

    Only a missing name is "absent" (a finding the report shows); a fork function that
    exists but raises is an error and propagates.
    """

    function, why = optional("qwen3_nki_moe_config")
    if function is None:
        return None, why
    return function(TUTORIAL_FLAVOR, **TUTORIAL_KWARGS), ""


def twin_config(tier: str, *, as_published: bool = False):
    """The suite's own config 3 on ``tier``; ``as_published``: at the tier's published sizes even in a rehearsal
    (the fork's function knows no rehearsal: what it returns is compared with this)."""
    return qwen3_nki_moe_config(
        TUTORIAL_FLAVOR, tier=tier, as_published=as_published, **TUTORIAL_KWARGS
    )


def uses_fork(tier: str) -> bool:
    """Config 3 comes from the fork's function on the full-size (trn2) tier whenever it is importable, in a
    rehearsal too (which shrinks it: :func:`nki_moe`), as the real night does: the tier is read as published."""
    return AS_PUBLISHED[tier].full_size_models and optional("qwen3_nki_moe_config")[0] is not None


def shrunk_for_tier(config, tier: str):
    """``config`` (the fork's, at 30B-A3B's widths) at ``tier``'s sizes: unchanged where the tier builds the
    full-size models, the seam's tiny MoE in a rehearsal (every module class the fork chose kept)."""
    if TIERS[tier].full_size_models:
        return config
    full = moe_dims(tier, as_published=True, **TUTORIAL_KWARGS)
    small = moe_dims(tier, **TUTORIAL_KWARGS)
    shrink_model(config.model_spec.model, full, small)
    return config


def config_source(tier: str) -> str:
    """Which function built config 3 on ``tier`` (provenance, report)."""

    return BY_NAME["qwen3_nki_moe_config"].qualified if uses_fork(tier) else TWIN


def nki_moe(inputs: RecipeInputs):
    """``qwen3_nki_moe_config("30B-A3B", n_layers=4, num_experts=64, top_k=4)`` at the tutorial's launch.

    On trn2 the fork's own function when importable (shrunk to the seam's sizes in a rehearsal), else (and
    always on cpu) the twin.
    """
    config = fork_config()[0] if uses_fork(inputs.tier) else None
    if config is not None:
        config = shrunk_for_tier(config, inputs.tier)
    return tutorial_settings(config if config is not None else twin_config(inputs.tier), inputs)


# --- zero-argument config functions (torchtitan's ``--module recipes.nki_moe --config NAME``) ---


def nki_moe_trn2():
    """Config 3 as the tutorial runs it: 4 layers, 64 experts, top-4, NKI grouped experts, eager, random init."""
    return tier_config("nki_moe", "trn2", init="random")


def nki_moe_cpu():
    """Config 3's structure at tiny dims on the cpu tier (grouped experts' torch path)."""
    return tier_config("nki_moe", "cpu", init="random")

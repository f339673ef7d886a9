"""The built config's refusals: inputs against the model, compile on the tier, kernel shape rules.

Run by the launcher (:func:`harness.config.checked_config`) and the dry run, once, before
any rank starts. Each takes the ``Trainer.Config`` the ranks will build; none builds it.
"""

from __future__ import annotations

import os
import sys

from harness.options import RunOptions


def check_inputs(opts: RunOptions, config) -> None:
    """Refuse a tokenizer, weights or sizes that disagree with the model the recipe builds."""
    from harness import provenance
    from harness.checks import check_checkpoint_tensors

    provenance.check(opts, config)
    if not hasattr(config, "hf_model"):  # the HF backend builds what config.json describes
        check_checkpoint_tensors(opts, config.model_spec)


def tier_lnc(tier: str) -> int:
    """The LNC the ranks of ``tier`` run with: ``NEURON_LOGICAL_NC_CONFIG`` if set, else the tier's launch env."""
    from recipes.platform.neuron import logical_neuron_cores
    from recipes.tiers import TIERS

    if "NEURON_LOGICAL_NC_CONFIG" in os.environ or tier not in TIERS:
        return logical_neuron_cores()
    return int(TIERS[tier].extra_env.get("NEURON_LOGICAL_NC_CONFIG", logical_neuron_cores()))


def check_kernel_constraints(config, tier: str = "cpu") -> list[str]:
    """Refuse, before any rank trains, a shape an enabled NKI kernel cannot take; name what was checked.

    A kernel's nodes can only be in the config if its module was imported (its
    override made them), so a config without kernels imports no kernel module.
    rope_hf's seq_len rule is checked on every tier (``enforce_kernel_constraints``);
    the grouped-experts shapes where nkilib runs them (``Tier.runs_nki_kernels``: trn2).

    Sources: rope_hf asserts ``seq_len % (128 * LNC) == 0`` in ``_validate_apply_rope_inputs``
    (aws-neuron/nki-library src/nkilib_src/nkilib/core/embeddings/rope_hf.py); the MoE
    kernels' rules and their sources are ``recipes.kernels.grouped_experts.MOE_CONSTRAINTS``.
    """
    from recipes.tiers import TIERS

    checked = []
    rope = sys.modules.get("recipes.kernels.rope")
    if rope is not None:
        ropes = [cfg for _, cfg, _, _ in config.traverse(rope.NKIRoPE.Config) if cfg.enforce_kernel_constraints]
        if ropes:
            lnc = tier_lnc(tier)
            rope.check_seq_len(config.training.seq_len, lnc)
            checked.append(f"rope_hf: seq_len {config.training.seq_len} % (128 x LNC {lnc}) == 0 ({len(ropes)} nodes)")
    experts = sys.modules.get("recipes.kernels.grouped_experts")
    if experts is not None and TIERS[tier].runs_nki_kernels:
        nodes = [cfg for _, cfg, _, _ in config.traverse(experts.TrnGroupedExperts.Config)]
        lnc = tier_lnc(tier)
        for shape in sorted({(cfg.dim, cfg.hidden_dim) for cfg in nodes}):
            experts.check_moe_shapes(*shape, lnc)
            checked.append(f"grouped_experts: dim {shape[0]}, hidden_dim {shape[1]} at LNC {lnc} ({len(nodes)} nodes)")
    return checked


def check_built(opts: RunOptions, config) -> list[str]:
    """The checks of the config as built, whatever it loads: compile backend on the tier, kernel shapes."""
    from recipes.tutorial import check_compile

    check_compile(config, opts.tier)
    return [f"compile: {'off' if not config.compile.enable else config.compile.backend}"] + check_kernel_constraints(
        config, opts.tier
    )


def check_config(opts: RunOptions, config) -> list[str]:
    """Every check of the built config; what was checked, for the dry run's report."""
    check_inputs(opts, config)
    return check_built(opts, config)

"""The NKI kernels' refusals before launch: a shape a kernel would assert on, refused with its fix.

The kernels (``recipes/kernels``) keep only what the device asserts itself: rope_hf's
``S % (128 * LNC) == 0`` and the MoE kernels' :data:`recipes.kernels.grouped_experts.MOE_CONSTRAINTS`.
Here those same rules refuse a run before any rank starts, in one line that names the flag to change.
"""

from __future__ import annotations

import os
import sys

from harness.checks.errors import PreflightError
from recipes.platform.neuron import VALID_LNC, logical_neuron_cores
from recipes.tiers import TIERS


def tier_lnc(tier: str) -> int:
    """The LNC the ranks of ``tier`` run with: ``NEURON_LOGICAL_NC_CONFIG`` if set, else the tier's launch env."""

    if "NEURON_LOGICAL_NC_CONFIG" in os.environ or tier not in TIERS:
        return logical_neuron_cores()
    return int(TIERS[tier].extra_env.get("NEURON_LOGICAL_NC_CONFIG", logical_neuron_cores()))


def check_seq_len(seq_len: int, lnc: int) -> None:
    """Refuse a ``seq_len`` that is not a multiple of 128 × LNC, naming the nearest lengths that are.

    rope_hf splits the sequence evenly across the LNC physical cores of a logical
    NeuronCore, each in 128-row tiles (``recipes.kernels.rope.SEQ_TILE``).
    """

    if lnc not in VALID_LNC:
        raise PreflightError(
            f"LNC={lnc!r} is not a logical NeuronCore size trn2 supports; use 1 or 2 (NEURON_LOGICAL_NC_CONFIG)."
        )
    multiple = 128 * lnc
    if seq_len > 0 and seq_len % multiple == 0:
        return
    below = (seq_len // multiple) * multiple
    above = below + multiple
    suggestion = f"{below} or {above}" if below > 0 else f"{above}"
    hint = " or run with NEURON_LOGICAL_NC_CONFIG=1 (multiples of 128)" if lnc == 2 else ""
    raise PreflightError(
        f"seq_len={seq_len} is not a multiple of 128×LNC={multiple} (LNC={lnc}); "
        f"use {suggestion}. nkilib's rope_hf gives each of the {lnc} core(s) of a "
        f"logical NeuronCore whole 128-row tiles of the sequence: set "
        f"training.seq_len to a multiple of {multiple}{hint}."
    )


def check_moe_shapes(dim: int, hidden_dim: int, lnc: int, block_size: int | None = None) -> None:
    """Refuse expert shapes moe_cte / blockwise_mm_bwd assert on; name each failing rule and its source."""
    from recipes.kernels.grouped_experts import BLOCK_SIZE, failed_constraints  # noqa: PLC0415 -- heavy: recipes.kernels.grouped_experts imports torchtitan (torchtitan+torch 2.9 s); this module stays light

    block_size = BLOCK_SIZE if block_size is None else block_size
    failed = failed_constraints(dim, hidden_dim, lnc, block_size)
    if failed:
        raise PreflightError(
            f"grouped_experts on trn2 cannot run H={dim}, I={hidden_dim}, block size {block_size}, LNC={lnc}: "
            + "; ".join(f"{c.kernel} needs {c.rule} ({c.source})" for c in failed)
            + ". Use the stock GroupedExperts for this model (drop the grouped_experts override)."
        )


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

    checked = []
    rope = sys.modules.get("recipes.kernels.rope")
    if rope is not None:
        ropes = [
            cfg
            for _, cfg, _, _ in config.traverse(rope.NKIRoPE.Config)
            if cfg.enforce_kernel_constraints
        ]
        if ropes:
            lnc = tier_lnc(tier)
            check_seq_len(config.training.seq_len, lnc)
            checked.append(
                f"rope_hf: seq_len {config.training.seq_len} % (128 x LNC {lnc}) == 0 ({len(ropes)} nodes)"
            )
    experts = sys.modules.get("recipes.kernels.grouped_experts")
    if experts is not None and TIERS[tier].runs_nki_kernels:
        nodes = [cfg for _, cfg, _, _ in config.traverse(experts.TrnGroupedExperts.Config)]
        lnc = tier_lnc(tier)
        for shape in sorted({(cfg.dim, cfg.hidden_dim) for cfg in nodes}):
            check_moe_shapes(*shape, lnc)
            checked.append(
                f"grouped_experts: dim {shape[0]}, hidden_dim {shape[1]} at LNC {lnc} ({len(nodes)} nodes)"
            )
    return checked

"""Kernels the tutorial swaps in: nkilib on trn2, the same custom-op path in torch on cpu.

* :mod:`recipes.kernels.rope` — ``rope_hf``: RoPE through ``qwen3_trn_repro::rope_hf``
  (``NKIRoPE`` replaces ``CosSinRoPE``; seq_len must be a multiple of 128 × LNC).
* :mod:`recipes.kernels.grouped_experts` — ``grouped_experts``: routed experts through
  nkilib's blockwise MoE on trn2, an fp32 per-expert loop on cpu.

Neuron packages are imported only inside the functions that run on the device (and by
:mod:`recipes.kernels.moe_cte_checkpointed`, which only such a function imports). Each
kernel's custom op is a :class:`recipes.kernels.kernel_op.KernelOp`: torch_neuronx's
``nki_op`` on trn2, defined on first use.
Users select these by name and scope with :mod:`recipes.overrides`.
:func:`rope_in_use` names the RoPE of every layer without importing a kernel module.
"""

from __future__ import annotations

#: What each RoPE config a run can build stands for, by config class (``Owner.Config``).
ROPE_DESCRIPTIONS = {
    "CosSinRoPE.Config": "torchtitan CosSinRoPE (cache gathered per position)",
    "SlicedCosSinRoPE.Config": "torchtitan CosSinRoPE, sliced cache (positions dropped: no gather)",
    "NKIRoPE.Config": "rope_hf custom op (nkilib rope_hf on trn2), cos/sin from positions x inv_freq",
}


def rope_in_use(config) -> dict[str, list[int]]:
    """``{description: [layer indices]}`` of the RoPE every layer of ``config``'s model builds.

    Empty when the model has no torchtitan RoPE node (the HF backend builds transformers'
    own rotary embedding).
    """
    from recipes.titan import RoPE

    used: dict[str, list[int]] = {}
    for fqn, cfg, _, _ in config.traverse(RoPE.Config):
        name = type(cfg).__qualname__
        described = ROPE_DESCRIPTIONS.get(name, name)
        if getattr(cfg, "drop_positions", False):
            described += ", positions dropped (as config 3's sliced RoPE)"
        layer = next((int(part) for part in fqn.split(".") if part.isdigit()), -1)
        used.setdefault(described, []).append(layer)
    return used

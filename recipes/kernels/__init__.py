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
:func:`rope_in_use` names the RoPE of every layer, :func:`experts_in_use` its routed experts, without
importing a kernel module.
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
    from recipes.titan import RoPE  # noqa: PLC0415 -- lazy: recipes.titan resolves torchtitan names on first use, after recipes.platform.install

    used: dict[str, list[int]] = {}
    for fqn, cfg, _, _ in config.traverse(RoPE.Config):
        name = type(cfg).__qualname__
        described = ROPE_DESCRIPTIONS.get(name, name)
        if getattr(cfg, "drop_positions", False):
            described += ", positions dropped (as config 3's sliced RoPE)"
        layer = next((int(part) for part in fqn.split(".") if part.isdigit()), -1)
        used.setdefault(described, []).append(layer)
    return used


def experts_in_use(config) -> dict[str, list[int]]:
    """``{experts config class: [layer indices]}`` of every routed-experts node of ``config``'s model.

    Config 3 runs NKI grouped experts (the tutorial); torchtitan's stock ``GroupedExperts.Config`` in a layer
    means its MoE block was not replaced. Empty for a dense model.
    """
    from recipes.titan import GroupedExperts  # noqa: PLC0415 -- lazy: recipes.titan resolves torchtitan names on first use, after recipes.platform.install

    used: dict[str, list[int]] = {}
    for fqn, cfg, _, _ in config.traverse(GroupedExperts.Config):
        layer = next((int(part) for part in fqn.split(".") if part.isdigit()), -1)
        used.setdefault(type(cfg).__qualname__, []).append(layer)
    return used


#: aten ops that read rows of a table by index: a RoPE that runs one of these gathers its cos/sin per position.
GATHER_OPS = frozenset({"index", "index_select", "gather", "embedding", "take", "take_along_dim"})


def rope_gathers(config, probe_len: int = 256) -> dict[str, list[str]]:
    """``{description: [gathering aten ops]}`` of each RoPE ``config``'s model builds (as :func:`rope_in_use` names them).

    Whatever the RoPE's class (the suite's own, or one a TorchTitan fork builds), it is built on
    the meta device and called as an attention layer calls it, with explicit positions; every
    aten op it dispatches is recorded, and those in :data:`GATHER_OPS` are returned. "RoPE without
    gather" (config 3) holds when every list is empty. Nothing is computed: meta tensors only.
    """
    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light
    from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light

    from recipes.titan import RoPE  # noqa: PLC0415 -- lazy: recipes.titan resolves torchtitan names on first use, after recipes.platform.install

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    probed: dict[str, list[str]] = {}
    described_by_layer = {layer: d for d, layers in rope_in_use(config).items() for layer in layers}
    for fqn, cfg, _, _ in config.traverse(RoPE.Config):
        layer = next((int(part) for part in fqn.split(".") if part.isdigit()), -1)
        described = described_by_layer[layer]
        if described in probed:
            continue
        seq = min(probe_len, cfg.max_seq_len)
        with torch.device("meta"):
            rope = cfg.build()
            q, k = torch.empty(1, seq, 2, cfg.dim), torch.empty(1, seq, 1, cfg.dim)
            positions = torch.arange(seq).unsqueeze(0)
        with Ops() as ops:
            rope(q, k, positions)
        probed[described] = sorted(ops.names & GATHER_OPS)
    return probed

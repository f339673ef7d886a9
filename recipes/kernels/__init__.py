"""Kernels the tutorial swaps in: nkilib on trn2, the same custom-op path in torch on cpu.

* :mod:`recipes.kernels.rope` — ``rope_hf``: RoPE through ``qwen3_trn_repro::rope_hf``
  (``NKIRoPE`` replaces ``CosSinRoPE``; seq_len must be a multiple of 128 × LNC).
* :mod:`recipes.kernels.grouped_experts` — ``grouped_experts``: routed experts through
  nkilib's blockwise MoE on trn2, an fp32 per-expert loop on cpu.

Neuron packages are imported only inside the functions that run on the device.
Users select these by name and scope with :mod:`recipes.overrides`.
"""

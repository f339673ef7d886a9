"""Claim (trn2): nkilib's rope_hf on the neuron device equals torchtitan's CosSinRoPE.

The published "rope diff 0.0": the real kernel, reached through the same custom op
the cpu tier tests, against the stock module on the same device in float32.
Forward must be exact; the backward (rope_hf with backward=True) is compared with
autograd through the stock module within a stated tolerance.

The measurement runs in a child process on NeuronCore 0 (``tests/neuron/neuron_cores.py``):
the pytest process never opens the device, so the 64-rank launches after this test get
every core.
"""

from __future__ import annotations

import pytest
import torch
from neuron_cores import CountingKernel, neuron_core_body, neuron_device, on_neuron_cores
from requires import requires_neuron_device, requires_nkilib, requires_torch_neuronx

pytestmark = [requires_neuron_device, requires_torch_neuronx, requires_nkilib]

B, NQ, NKV, H = 2, 32, 8, 128  # Qwen3-4B attention: 32 q heads, 8 kv heads, head_dim 128
SEQ_LEN = 512  # a multiple of 128 × LNC for LNC 1 and 2
SEED = 1234

#: The kernel's backward and autograd's graph for CosSinRoPE do the same float32
#: multiplies and adds, but the compiler may fuse the autograd graph differently
#: (e.g. multiply-add contraction), so allow a few float32 ulps of O(1) values.
BACKWARD_ATOL = 1e-6


def _qk(device):
    g = torch.Generator().manual_seed(SEED)
    q = torch.randn(B, SEQ_LEN, NQ, H, generator=g)
    k = torch.randn(B, SEQ_LEN, NKV, H, generator=g)
    return q.to(device), k.to(device)


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@neuron_core_body
def measure_rope_hf() -> dict:
    """On one NeuronCore: stock CosSinRoPE and the rope_hf override, forward then backward, kernel launches counted."""
    device = neuron_device()
    from recipes.kernels import rope as rope_module
    from recipes.platform.neuron import logical_neuron_cores
    from recipes.titan import CosSinRoPE

    counting = CountingKernel(rope_module._rope_hf_kernel())
    rope_module._rope_hf_kernel = lambda: (
        counting
    )  # this child's module only; it dies with the child
    cfg = CosSinRoPE.Config(dim=H, max_seq_len=4096, theta=1_000_000.0)
    with torch.device(device):
        ref, new = cfg.build(), rope_module.rope_hf(cfg).build()

    q, k = _qk(device)
    q_ref, k_ref = ref(q, k)
    q_new, k_new = new(q, k)
    forward = {
        "q": _max_abs_diff(q_new, q_ref),
        "k": _max_abs_diff(k_new, k_ref),
        "launches": len(counting.grids),
    }

    g = torch.Generator().manual_seed(SEED + 1)
    grad_q = torch.randn(q.shape, generator=g).to(device)
    grad_k = torch.randn(k.shape, generator=g).to(device)
    grads = []
    for module in (ref, new):
        q_in, k_in = q.clone().requires_grad_(), k.clone().requires_grad_()
        torch.autograd.backward(module(q_in, k_in), (grad_q, grad_k))
        grads.append((q_in.grad, k_in.grad))
    (dq_ref, dk_ref), (dq_new, dk_new) = grads
    backward = {
        "dq": _max_abs_diff(dq_new, dq_ref),
        "dk": _max_abs_diff(dk_new, dk_ref),
        "launches": len(counting.grids) - forward["launches"],
    }
    return {
        "lnc": logical_neuron_cores(),
        "grids": counting.grids,
        "op": rope_module.rope_hf_op.flavour,
        "forward": forward,
        "backward": backward,
    }


@pytest.fixture(scope="module")
def rope_hf_on_a_neuroncore() -> dict:
    """One child on NeuronCore 0 measures both directions (one device open, one kernel compile)."""
    return on_neuron_cores(measure_rope_hf)


def test_rope_hf_forward_equals_cossinrope(rope_hf_on_a_neuroncore, golden, record_property):
    measured = rope_hf_on_a_neuroncore
    record_property("rope_lnc", measured["lnc"])
    record_property("rope_op", measured["op"])
    assert measured["op"] == "torch_neuronx.nki_hop.nki_op", (
        "the tutorial's nki_op, not torch.library.custom_op"
    )
    forward = measured["forward"]
    assert forward["launches"] == 1, (
        "nkilib rope_hf did not run exactly once for the forward (a torch fallback?)"
    )
    assert measured["grids"][0] == [measured["lnc"]], measured["grids"]
    golden("nki_moe", "trn2", "rope_q_max_abs_diff", forward["q"])
    golden("nki_moe", "trn2", "rope_k_max_abs_diff", forward["k"])


def test_rope_hf_backward_matches_autograd(rope_hf_on_a_neuroncore, record_property):
    backward = rope_hf_on_a_neuroncore["backward"]
    record_property("rope_dq_max_abs_diff", backward["dq"])
    record_property("rope_dk_max_abs_diff", backward["dk"])
    # the override's forward and its backward (rope_hf with backward=True): one launch each
    assert backward["launches"] == 2, "rope_hf(backward=True) was not called"
    assert backward["dq"] <= BACKWARD_ATOL and backward["dk"] <= BACKWARD_ATOL

"""Claim (trn2): nkilib's rope_hf on the neuron device equals torchtitan's CosSinRoPE.

The published "rope diff 0.0": the real kernel, reached through the same custom op
the cpu tier tests, against the stock module on the same device in float32.
Forward must be exact; the backward (rope_hf with backward=True) is compared with
autograd through the stock module within a stated tolerance.
"""

from __future__ import annotations

import pytest
import torch

from recipes.platform.neuron import logical_neuron_cores
from requires import requires_neuron_device, requires_nkilib, requires_torch_neuronx

pytestmark = [requires_neuron_device, requires_torch_neuronx, requires_nkilib]

B, NQ, NKV, H = 2, 32, 8, 128  # Qwen3-4B attention: 32 q heads, 8 kv heads, head_dim 128
SEQ_LEN = 512  # a multiple of 128 × LNC for LNC 1 and 2
SEED = 1234

#: The kernel's backward and autograd's graph for CosSinRoPE do the same float32
#: multiplies and adds, but the compiler may fuse the autograd graph differently
#: (e.g. multiply-add contraction), so allow a few float32 ulps of O(1) values.
BACKWARD_ATOL = 1e-6


@pytest.fixture(scope="module")
def device():
    import torch_neuronx  # noqa: F401  (registers the "neuron" device)

    return torch.device("neuron")


@pytest.fixture
def modules(device):
    from torchtitan.models.common.rope import CosSinRoPE

    from recipes.kernels.rope import rope_hf

    cfg = CosSinRoPE.Config(dim=H, max_seq_len=4096, theta=1_000_000.0)
    with torch.device(device):
        return cfg.build(), rope_hf(cfg).build()


@pytest.fixture
def kernel_calls(monkeypatch):
    """Count calls into nkilib's rope_hf, so a silent torch fallback cannot pass."""
    from recipes.kernels import rope as rope_module

    calls = []
    kernel = rope_module._rope_hf_kernel()

    class Counting:  # counts launches (kernel[grid](...)), recording each grid
        def __getitem__(self, grid):
            launch = kernel[grid]

            def call(*args, **kwargs):
                calls.append(grid)
                return launch(*args, **kwargs)

            return call

    monkeypatch.setattr(rope_module, "_rope_hf_kernel", Counting)
    return calls


def _qk(device):
    g = torch.Generator().manual_seed(SEED)
    q = torch.randn(B, SEQ_LEN, NQ, H, generator=g)
    k = torch.randn(B, SEQ_LEN, NKV, H, generator=g)
    return q.to(device), k.to(device)


def test_rope_hf_forward_equals_cossinrope(device, modules, kernel_calls, golden, record_property):
    ref, new = modules
    q, k = _qk(device)
    q_ref, k_ref = ref(q, k)
    q_new, k_new = new(q, k)
    q_diff = (q_new - q_ref).abs().max().item()
    k_diff = (k_new - k_ref).abs().max().item()
    record_property("rope_lnc", logical_neuron_cores())
    assert kernel_calls, "nkilib rope_hf was not called"
    golden("nki_moe", "trn2", "rope_q_max_abs_diff", q_diff)
    golden("nki_moe", "trn2", "rope_k_max_abs_diff", k_diff)


def test_rope_hf_backward_matches_autograd(device, modules, kernel_calls, record_property):
    ref, new = modules
    q, k = _qk(device)
    g = torch.Generator().manual_seed(SEED + 1)
    grad_q = torch.randn(q.shape, generator=g).to(device)
    grad_k = torch.randn(k.shape, generator=g).to(device)
    grads = []
    for module in (ref, new):
        q_in, k_in = q.clone().requires_grad_(), k.clone().requires_grad_()
        torch.autograd.backward(module(q_in, k_in), (grad_q, grad_k))
        grads.append((q_in.grad, k_in.grad))
    (dq_ref, dk_ref), (dq_new, dk_new) = grads
    dq_diff = (dq_new - dq_ref).abs().max().item()
    dk_diff = (dk_new - dk_ref).abs().max().item()
    record_property("rope_dq_max_abs_diff", dq_diff)
    record_property("rope_dk_max_abs_diff", dk_diff)
    assert len(kernel_calls) >= 2, "rope_hf(backward=True) was not called"
    assert dq_diff <= BACKWARD_ATOL and dk_diff <= BACKWARD_ATOL

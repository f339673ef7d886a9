"""Tutorial config 3 on a trn2.48xlarge: the NKI MoE path on one NeuronCore, then 64 ranks eager,
once with config 3's own gather-free RoPE and once with nkilib's rope_hf in every layer.

The one-core check compares ``TrnGroupedExperts`` (nkilib ``moe_cte`` forward,
``blockwise_mm_bwd`` backward) with torchtitan's stock ``GroupedExperts`` at the
tutorial's expert shapes (H 2048, I 768), forward and backward, and counts the kernel
calls through this suite's launch wrappers, so a silent fallback cannot pass. Both
one-core checks run in a child process on NeuronCore 0 (``tests/neuron/neuron_cores.py``):
the pytest process never opens the device, so the 64-rank runs below get every core.
"""

from __future__ import annotations

import math

import pytest
import torch

from neuron_cores import CountingKernel, neuron_core_body, neuron_device, on_neuron_cores
from requires import (
    requires_dataset,
    requires_neuron_device,
    requires_nkilib,
    requires_qwen3_4b_weights,
    requires_torch_neuronx,
)

H, I = 2048, 768  # Qwen3-30B-A3B hidden_size and moe_intermediate_size
EXPERTS, ROWS = 16, 1024  # rows = tokens × top-k, already sorted by expert as torchtitan hands them
SEED = 0

#: Both sides round x, the weights and the SwiGLU product to bf16 (unit roundoff 2^-9 each)
#: and accumulate in fp32 in different orders (nkilib by 128-row tiles and LNC shards,
#: torch._grouped_mm per expert), so they agree to a few bf16 roundings of the largest
#: value: 2^-6 of max |reference|, as the cpu tier's fp32-loop-vs-stock check
#: (tests/cpu/test_overrides.py). The backward chains two more bf16 matmuls on bf16
#: checkpointed activations: one more factor of two.
FORWARD_RTOL = 2**-6
BACKWARD_RTOL = 2**-5


def _experts_and_inputs():
    from recipes.kernels.grouped_experts import grouped_experts
    from recipes.titan import GroupedExperts

    g = torch.Generator().manual_seed(SEED)
    cfg = GroupedExperts.Config(dim=H, hidden_dim=I, num_experts=EXPERTS)
    stock = cfg.build()
    with torch.no_grad():
        for p in stock.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    ours = grouped_experts(cfg).build()
    ours.load_state_dict(stock.state_dict())
    counts = torch.multinomial(torch.ones(EXPERTS), ROWS, replacement=True, generator=g).bincount(minlength=EXPERTS)
    counts[3] = 0  # an idle expert, as routing produces
    counts[0] += ROWS - int(counts.sum())
    x = torch.randn(ROWS, H, generator=g)
    grad_out = torch.randn(ROWS, H, generator=g)
    return stock, ours, counts, x, grad_out


def _run(module, x, counts, grad_out):
    x = x.clone().requires_grad_()
    out = module(x, counts)
    out.backward(grad_out)
    return out.detach().float().cpu(), x.grad.float().cpu(), [p.grad.float().cpu() for p in module.parameters()]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@neuron_core_body
def measure_grouped_experts() -> dict:
    """On one NeuronCore: TrnGroupedExperts (nkilib) against stock GroupedExperts on the host, launches counted."""
    device = neuron_device()
    from recipes.kernels import grouped_experts as ge

    moe_cte, bwd = (CountingKernel(kernel) for kernel in ge._kernels())
    ge._kernels = lambda: (moe_cte, bwd)  # this child's module only; it dies with the child
    stock, ours, counts, x, grad_out = _experts_and_inputs()
    # Stock runs where torch._grouped_mm is known to work (the host); ours on the NeuronCore.
    ref_out, ref_dx, ref_dw = _run(stock, x, counts, grad_out)
    ours = ours.to(device)
    out, dx, dw = _run(ours, x.to(device), counts.to(device), grad_out.to(device))
    backward = {"dx": _rel(dx, ref_dx)}
    backward.update({f"d{n}": _rel(a, b) for (n, _), a, b in zip(stock.named_parameters(), dw, ref_dw)})
    return {
        "module": type(ours).__name__,
        "launches": {"moe_cte": moe_cte.grids, "blockwise_mm_bwd": bwd.grids},
        "forward": _rel(out, ref_out),
        "backward": backward,
    }


@neuron_core_body
def refusal_of_a_shape_the_kernels_cannot_take() -> dict:
    """On one NeuronCore: H=256 is below moe_cte's 512; what happens must be an error, never the cpu loop."""
    device = neuron_device()
    from recipes.kernels.grouped_experts import grouped_experts
    from recipes.titan import GroupedExperts

    experts = grouped_experts(GroupedExperts.Config(dim=256, hidden_dim=96, num_experts=4)).build().to(device)
    try:
        out = experts(torch.zeros(8, 256, device=device), torch.tensor([2, 2, 2, 2], device=device))
    except Exception as e:  # the test asserts which
        return {"error": type(e).__name__, "message": str(e)}
    return {"error": None, "output_device": str(out.device)}


@requires_neuron_device
@requires_torch_neuronx
@requires_nkilib
def test_nki_grouped_experts_match_stock_on_one_neuroncore(record_property):
    measured = on_neuron_cores(measure_grouped_experts)
    launches = measured["launches"]
    record_property("nki_moe_kernel_calls", {name: len(grids) for name, grids in launches.items()})
    record_property("nki_moe_forward_max_rel_diff", measured["forward"])
    record_property("nki_moe_backward_max_rel_diff", measured["backward"])
    assert measured["module"] == "TrnGroupedExperts"
    assert (len(launches["moe_cte"]), len(launches["blockwise_mm_bwd"])) == (1, 1), (
        f"the nkilib kernels did not run exactly once each: {launches}"
    )
    forward, backward = measured["forward"], measured["backward"]
    assert all(math.isfinite(v) for v in (forward, *backward.values()))
    assert forward <= FORWARD_RTOL, forward
    assert max(backward.values()) <= BACKWARD_RTOL, backward


@requires_neuron_device
@requires_torch_neuronx
@requires_nkilib
def test_no_cpu_fallback_for_shapes_the_kernels_refuse(record_property):
    """On the device a shape moe_cte cannot take is an error, never the cpu loop."""
    measured = on_neuron_cores(refusal_of_a_shape_the_kernels_cannot_take)
    record_property("nki_moe_refusal", measured)
    assert measured["error"] == "MoEShapeError", measured
    assert "512 <= H <= 8192" in measured["message"], measured["message"]


# "weights": random init, but the trn2 tokenizer is Qwen3-4B's own, read from $QWEN3_4B_DIR.
@requires_neuron_device
@requires_torch_neuronx
@requires_nkilib
@requires_qwen3_4b_weights
@requires_dataset
def test_nki_moe_trains_in_eager_mode_on_64_ranks(recipe_run, record_property):
    run = recipe_run("trn2-nki-moe", recipe="nki_moe", tier="trn2", nproc=64, steps=5, init="random", seed=0)
    losses = run["losses"]
    record_property("trn2_nki_moe_losses", losses)
    record_property("trn2_nki_moe_tokens_per_s", [s["tokens_per_s"] for s in run["steps"]])
    assert run["provenance"]["rope"] == {
        "torchtitan CosSinRoPE, sliced cache (positions dropped: no gather)": [0, 1, 2, 3]
    }
    assert len(losses) == 5
    assert all(math.isfinite(x) for x in losses), losses


#: Config 3's RoPE, the other reading: the tutorial says "RoPE without gather" and also shows
#: nkilib's rope_hf as a custom kernel. The nightly runs both: the default above (torchtitan's
#: gather-free sliced RoPE) and this one, rope_hf in every layer through ``--override rope_hf``.
#: rope_hf asserts seq_len % (128 × LNC) == 0 (aws-neuron/nki-library
#: src/nkilib_src/nkilib/core/embeddings/rope_hf.py, _validate_apply_rope_inputs): 2048 = 8 × 256 at LNC=2.
ROPE_HF_SEQ_LEN = 2048


# "weights": the trn2 tier reads the tokenizer from $QWEN3_4B_DIR even for a random-init run.
@requires_neuron_device
@requires_torch_neuronx
@requires_nkilib
@requires_qwen3_4b_weights
@requires_dataset
def test_nki_moe_with_rope_hf_in_every_layer_trains_on_64_ranks(recipe_run, record_property):
    from recipes.kernels import ROPE_DESCRIPTIONS

    run = recipe_run(
        "trn2-nki-moe-rope-hf", recipe="nki_moe", tier="trn2", nproc=64, steps=1, init="random", seed=0,
        seq_len=ROPE_HF_SEQ_LEN, overrides=["rope_hf"],
    )  # fmt: skip
    losses = run["losses"]
    record_property("trn2_nki_moe_rope_hf_losses", losses)
    rope = run["provenance"]["rope"]
    record_property("trn2_nki_moe_rope_hf_rope", rope)
    assert len(rope) == 1, rope
    (described, layers), = rope.items()
    assert described.startswith(ROPE_DESCRIPTIONS["NKIRoPE.Config"]), described
    assert layers == [0, 1, 2, 3]
    assert [s["step"] for s in run["steps"]] == [1], run["steps"]
    assert math.isfinite(losses[0]), losses

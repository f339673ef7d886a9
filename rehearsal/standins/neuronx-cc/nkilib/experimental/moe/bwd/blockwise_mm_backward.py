"""Stand-in of ``blockwise_mm_bwd`` (aws-neuron/nki-library src/nkilib_src/nkilib/experimental/moe/bwd/blockwise_mm_backward.py).

Same signature; returns ``(hidden_states_grad, expert_affinities_masked_grad,
gate_up_proj_weight_grad, down_proj_weight_grad)`` without bias. Computes, from the checkpoints the
moe_cte stand-in writes (pre-activation gate/up ``[N, 2, I, B]``, down output ``[N, B, H]``), the
gradients of ``out[t] += a[t, e] * (silu(x W_g) * (x W_u)) W_d`` by hand, in fp32.
"""

from __future__ import annotations

from enum import Enum

import nki
import nki.language as nl
import torch

from nkilib import faulty
from nkilib.core.moe.moe_cte.moe_cte import SkipMode
from nkilib.core.utils.common_types import ActFnType
from nkilib.core.utils.kernel_assert import assert_packed, assert_shape, kernel_assert

calls = 0


class ShardOption(Enum):
    """nki-library experimental/moe/bwd/moe_bwd_parameters.py"""

    SHARD_ON_HIDDEN = 0
    SHARD_ON_INTERMEDIATE = 1
    SHARD_ON_BLOCK = 2


class AffinityOption(Enum):
    AFFINITY_ON_H = 0
    AFFINITY_ON_I = 1


class KernelTypeOption(Enum):
    DROPLESS = 0
    DROPPING = 1


class ClampLimits:
    def __init__(self, *limits) -> None:
        self.limits = limits


#: Where the checks below are, in aws-neuron/nki-library (tag 2.29 = main d2ad3a5), src/nkilib_src/nkilib/
#: experimental/moe/bwd/: ``blockwise_mm_bwd`` (blockwise_mm_backward.py:161-162) calls ``MOEBwdParameters.validate``
#: and ``validate_sharding(nl.num_programs(axes=0))`` (moe_bwd_parameters.py:334-375), whose T, H come from
#: hidden_states, E, I_TP from down_proj_weight and N = len(token_position_to_id) // block_size (lines 328-332).
#: "docstring" marks the Args (blockwise_mm_backward.py:73-81), which the kernel relies on unasserted.


def _validate(
    hidden,
    affinities,
    gate_up,
    down,
    gate_up_act_T,
    down_act,
    token_ids,
    block_to_expert,
    grad_out,
    B,
    shards,
):
    """Every input check of blockwise_mm_bwd, in the real kernel's words, cited by line."""
    T, H = hidden.shape[0], hidden.shape[-1]
    E, I_TP = down.shape[0], down.shape[1] if len(down.shape) > 1 else 0
    # moe_bwd_parameters.py:341-344
    kernel_assert(B in (128, 256, 512, 1024), f"block_size must be 128, 256, 512, or 1024, got {B}")
    # moe_bwd_parameters.py:345
    kernel_assert(I_TP % 2 == 0, f"I_TP must be divisible by 2, got {I_TP}")
    # moe_bwd_parameters.py:346
    kernel_assert(H % 2 == 0, f"H must be divisible by 2, got {H}")
    # moe_bwd_parameters.py:358-361
    kernel_assert(
        H % shards == 0,
        f"Hidden dim H={H} must be divisible by num_shards={shards} to initialize the gradients",
    )
    # moe_bwd_parameters.py:363-368
    kernel_assert(
        (H // shards) % 32 == 0,
        f"H dim when sharded by num_shards={shards} must be divisible by 32 for DMA transpose, "
        f"got sharded H as {H // shards}",
    )
    # moe_bwd_parameters.py:370-375
    kernel_assert(
        (I_TP // shards) % 32 == 0,
        f"I_TP dim when sharded by num_shards={shards} must be divisible by 32 for DMA transpose, "
        f"got sharded I_TP as {I_TP // shards}",
    )
    # docstring blockwise_mm_backward.py:79 ([N * B]); N as moe_bwd_parameters.py:332 derives it
    kernel_assert(
        len(token_ids.shape) == 1 and token_ids.shape[0] % B == 0,
        f"token_position_to_id must be [N * B] with B={B}, got {tuple(token_ids.shape)} (docstring, "
        "blockwise_mm_backward.py:79)",
    )
    N = token_ids.shape[0] // B
    # docstring blockwise_mm_backward.py:73-81
    assert_shape(hidden, (T, H), "hidden_states", "[T, H] (blockwise_mm_backward.py:73)")
    assert_shape(
        affinities,
        (T * E, 1),
        "expert_affinities_masked",
        "[T * E, 1] (blockwise_mm_backward.py:74)",
    )
    assert_shape(
        gate_up,
        (E, H, 2, I_TP),
        "gate_up_proj_weight",
        "[E, H, 2, I_TP] (blockwise_mm_backward.py:75)",
    )
    assert_shape(
        down, (E, I_TP, H), "down_proj_weight", "[E, I_TP, H] (blockwise_mm_backward.py:76)"
    )
    assert_shape(
        gate_up_act_T,
        (N, 2, I_TP, B),
        "gate_up_proj_act_checkpoint_T",
        "[N, 2, I_TP, B] (blockwise_mm_backward.py:77)",
    )
    assert_shape(
        down_act, (N, B, H), "down_proj_act_checkpoint", "[N, B, H] (blockwise_mm_backward.py:78)"
    )
    assert_shape(block_to_expert, (N, 1), "block_to_expert", "[N, 1] (blockwise_mm_backward.py:80)")
    assert_shape(
        grad_out, (T, H), "output_hidden_states_grad", "[T, H] (blockwise_mm_backward.py:81)"
    )
    # layout: read and written through .ap() patterns from the shapes (bwmm_bwd_dropless.py:49, 141-154, 305-309)
    assert_packed(
        "blockwise_mm_bwd",
        hidden_states=hidden,
        expert_affinities_masked=affinities,
        gate_up_proj_weight=gate_up,
        down_proj_weight=down,
        gate_up_proj_act_checkpoint_T=gate_up_act_T,
        down_proj_act_checkpoint=down_act,
        token_position_to_id=token_ids,
        block_to_expert=block_to_expert,
        output_hidden_states_grad=grad_out,
    )


@nki.jit
def blockwise_mm_bwd(
    hidden_states: nl.ndarray,
    expert_affinities_masked: nl.ndarray,
    gate_up_proj_weight: nl.ndarray,
    down_proj_weight: nl.ndarray,
    gate_up_proj_act_checkpoint_T: nl.ndarray,
    down_proj_act_checkpoint: nl.ndarray,
    token_position_to_id: nl.ndarray,
    block_to_expert: nl.ndarray,
    output_hidden_states_grad: nl.ndarray,
    block_size: int,
    skip_dma: SkipMode = None,
    compute_dtype=nl.bfloat16,
    is_tensor_update_accumulating: bool = True,
    shard_option: ShardOption = ShardOption.SHARD_ON_HIDDEN,
    affinity_option: AffinityOption = AffinityOption.AFFINITY_ON_H,
    kernel_type_option: KernelTypeOption = KernelTypeOption.DROPLESS,
    clamp_limits: ClampLimits = None,
    bias: bool = False,
    activation_type: ActFnType = ActFnType.SiLU,
    block_tile_size: int = None,
) -> tuple:
    """Gradients of the blockwise MoE layer from its checkpointed activations."""
    global calls
    calls += 1
    _validate(
        hidden_states,
        expert_affinities_masked,
        gate_up_proj_weight,
        down_proj_weight,
        gate_up_proj_act_checkpoint_T,
        down_proj_act_checkpoint,
        token_position_to_id,
        block_to_expert,
        output_hidden_states_grad,
        block_size,
        nl.num_programs(axes=0),
    )
    if (
        bias
        or activation_type is not ActFnType.SiLU
        or affinity_option is not AffinityOption.AFFINITY_ON_H
    ):
        raise NotImplementedError(
            "the blockwise_mm_bwd stand-in computes SiLU, affinity on H, no bias only"
        )
    num_experts = gate_up_proj_weight.shape[0]
    x_all = hidden_states.float()
    grad_out = output_hidden_states_grad.float()
    affinity = expert_affinities_masked.float().reshape(-1, num_experts)
    d_x = torch.zeros_like(x_all)
    d_aff = torch.zeros_like(affinity)
    d_gate_up = torch.zeros_like(gate_up_proj_weight, dtype=torch.float32)
    d_down = torch.zeros_like(down_proj_weight, dtype=torch.float32)
    ids_per_block = token_position_to_id.long().reshape(-1, block_size)
    pad_id = hidden_states.shape[0] - 1
    # Padding slots (row T) add exactly nothing when row T's output gradient is zero, as it is when the caller
    # drops that row: then only a block's token rows are computed.
    pad_adds_nothing = not grad_out[pad_id].any()
    for n, expert in enumerate(block_to_expert.long().reshape(-1).tolist()):
        ids = ids_per_block[n]
        rows = ids != pad_id if pad_adds_nothing else torch.ones_like(ids, dtype=torch.bool)
        if not rows.any():
            continue
        ids = ids[rows]
        x = x_all.index_select(0, ids)
        g_out = grad_out.index_select(0, ids)
        a = affinity[ids, expert].unsqueeze(1)
        gate = gate_up_proj_act_checkpoint_T[n, 0].float().t()[rows]  # [B, I]
        up = gate_up_proj_act_checkpoint_T[n, 1].float().t()[rows]
        d = down_proj_act_checkpoint[n].float()[rows]  # [B, H]
        d_aff[ids, expert] += (g_out * d).sum(dim=1)
        g_d = g_out * a
        sig = torch.sigmoid(gate)
        act = gate * sig * up
        d_down[expert] += act.t() @ g_d
        g_act = g_d @ down_proj_weight[expert].float().t()
        g_up = g_act * gate * sig
        g_gate = g_act * up * sig * (1 + gate * (1 - sig))
        d_gate_up[expert, :, 0] += x.t() @ g_gate
        d_gate_up[expert, :, 1] += x.t() @ g_up
        w = gate_up_proj_weight[expert].float()
        d_x.index_add_(0, ids, g_gate @ w[:, 0].t() + g_up @ w[:, 1].t())
    if faulty("blockwise_mm_bwd"):
        d_x = d_x * 2
    return (
        d_x.to(hidden_states.dtype),
        d_aff.reshape(expert_affinities_masked.shape).to(expert_affinities_masked.dtype),
        d_gate_up.to(gate_up_proj_weight.dtype),
        d_down.to(down_proj_weight.dtype),
    )

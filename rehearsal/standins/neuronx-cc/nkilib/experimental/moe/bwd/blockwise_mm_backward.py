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
    assert block_size in (128, 256, 512, 1024), (
        f"block_size {block_size} not in (128, 256, 512, 1024)"
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

"""Stand-in of ``moe_cte`` and its spec (aws-neuron/nki-library src/nkilib_src/nkilib/core/moe/moe_cte/moe_cte.py).

Signature, enums and (non-frozen, so unhashable) config dataclasses as there. Computed: the
``shard_on_i`` implementation with ``checkpoint_activation=True`` and affinities on H (the only
spec the suite builds, recipes/kernels/moe_cte_checkpointed.py); any other spec raises.
Layouts per the docstring: hidden ``[T+1, H]``, affinities ``[(T+1)*E, 1]``, gate_up
``[E, H, 2, I]`` (0 gate, 1 up), down ``[E, I, H]``, token ids ``[N*B]`` (pad id T), block_to_expert
``[N, 1]``. For each block of expert e: ``gu = x @ gate_up[e]`` (pre-activation, checkpointed
transposed as ``[2, I, B]``), ``d = (silu(gate) * up) @ down[e]`` (checkpointed ``[B, H]``), and
``out[token] += affinity[token, e] * d`` (POST_SCALE). Matmuls in fp32 from the input dtype, on a
block's token rows only: its padding slots all hold row T, whose result is computed once per expert.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional

import nki
import nki.language as nl
import torch
import torch.nn.functional as F

from nkilib import faulty
from nkilib.core.utils.common_types import ActFnType, ExpertAffinityScaleMode

calls = 0

#: nki-library core/moe/moe_cte/moe_cte_utils.py
SkipMode = namedtuple("SkipMode", ["skip_token", "skip_weight"])


class BlockShardStrategy(Enum):
    PING_PONG = 0
    HI_LO = 1


class MoECTEImplementation(Enum):
    shard_on_block = 0
    shard_on_i = 1
    shard_on_i_hybrid = 2
    shard_on_i_dropping = 3
    shard_on_block_mx = 4
    shard_on_i_mx = 5
    shard_on_i_mx_hybrid = 6


@dataclass
class QuantizationConfig(nl.NKIObject):
    gate_up_proj_scale: Optional[nl.ndarray] = None
    down_proj_scale: Optional[nl.ndarray] = None


@dataclass
class ShardOnBlockConfig(nl.NKIObject):
    n_block_per_iter: int = 1
    block_sharding_strategy: BlockShardStrategy = BlockShardStrategy.PING_PONG
    n_static_blocks: int = -1
    n_dynamic_blocks: int = 55


@dataclass
class ShardOnIConfig(nl.NKIObject):
    checkpoint_activation: bool = False
    expert_affinity_multiply_on_I: bool = False
    num_static_block: Optional[int] = None


@dataclass
class MoECTESpec(nl.NKIObject):
    implementation: MoECTEImplementation
    shard_on_block: Optional[ShardOnBlockConfig] = None
    shard_on_I: Optional[ShardOnIConfig] = None

    def __post_init__(self):
        """Default config for the implementation's family, as the real spec fills it in."""
        impl = self.implementation.name
        if impl.startswith("shard_on_block") and self.shard_on_block is None:
            self.shard_on_block = ShardOnBlockConfig()
        elif (
            impl in ("shard_on_i", "shard_on_i_hybrid", "shard_on_i_dropping")
            and self.shard_on_I is None
        ):
            self.shard_on_I = ShardOnIConfig()


def _blocks(token_position_to_id, block_to_expert, block_size):
    """(expert, token ids of the block) per block."""
    ids = token_position_to_id.long().reshape(-1, block_size)
    return list(zip(block_to_expert.long().reshape(-1).tolist(), ids.unbind(0)))


def _expert_mlp(x, gate_up, down):
    """``(x @ gate_up, (silu(gate) * up) @ down)`` in fp32 for the rows ``x`` of one expert."""
    gu = torch.einsum("bh,hgi->bgi", x, gate_up.float())
    gate, up = (gu[:, 1], gu[:, 0]) if faulty("moe_cte") else (gu[:, 0], gu[:, 1])
    return gu, (F.silu(gate) * up) @ down.float()


@nki.jit(mode="trace")
def moe_cte(
    hidden_states: nl.ndarray,
    expert_affinities_masked: nl.ndarray,
    gate_up_proj_weight: nl.ndarray,
    down_proj_weight: nl.ndarray,
    token_position_to_id: nl.ndarray,
    block_to_expert: nl.ndarray,
    block_size: int,
    spec: MoECTESpec,
    conditions: Optional[nl.ndarray] = None,
    gate_and_up_proj_bias: Optional[nl.ndarray] = None,
    down_proj_bias: Optional[nl.ndarray] = None,
    quantization_config: Optional[QuantizationConfig] = None,
    gate_up_activations_T: Optional[nl.ndarray] = None,
    down_activations: Optional[nl.ndarray] = None,
    activation_function: ActFnType = ActFnType.SiLU,
    skip_dma: SkipMode = SkipMode(False, False),
    compute_dtype: Any = nl.bfloat16,
    is_tensor_update_accumulating: bool = True,
    expert_affinities_scaling_mode: ExpertAffinityScaleMode = ExpertAffinityScaleMode.POST_SCALE,
    gate_clamp_upper_limit: Optional[float] = None,
    gate_clamp_lower_limit: Optional[float] = None,
    up_clamp_upper_limit: Optional[float] = None,
    up_clamp_lower_limit: Optional[float] = None,
):
    """Blockwise MoE forward; ``(output, gate_up_activations_T, down_activations)`` when checkpointing."""
    global calls
    calls += 1
    cfg = spec.shard_on_I
    supported = (
        spec.implementation is MoECTEImplementation.shard_on_i
        and cfg.checkpoint_activation
        and not cfg.expert_affinity_multiply_on_I
        and activation_function is ActFnType.SiLU
        and expert_affinities_scaling_mode is ExpertAffinityScaleMode.POST_SCALE
        and gate_and_up_proj_bias is None
        and down_proj_bias is None
    )
    if not supported:
        raise NotImplementedError(
            f"the moe_cte stand-in computes shard_on_i + checkpointing + POST_SCALE only, got {spec}"
        )
    hidden_dim = hidden_states.shape[1]
    num_experts = gate_up_proj_weight.shape[0]
    pad_id = hidden_states.shape[0] - 1
    x_all = hidden_states.float()
    affinity = expert_affinities_masked.float().reshape(-1, num_experts)
    out = torch.zeros_like(x_all)
    gate_up_T, down_act = [], []
    pad_rows = {}  # expert -> its MLP of the padding row: computed once, as every padding slot holds the same row
    for expert, ids in _blocks(token_position_to_id, block_to_expert, block_size):
        real = ids != pad_id
        gu = x_all.new_empty(block_size, 2, gate_up_proj_weight.shape[-1])
        d = x_all.new_empty(block_size, hidden_dim)
        if real.any():
            gu[real], d[real] = _expert_mlp(
                x_all.index_select(0, ids[real]),
                gate_up_proj_weight[expert],
                down_proj_weight[expert],
            )
        if not real.all():
            if expert not in pad_rows:
                pad_rows[expert] = _expert_mlp(
                    x_all[pad_id:], gate_up_proj_weight[expert], down_proj_weight[expert]
                )
            gu[~real], d[~real] = pad_rows[expert]
        out.index_add_(0, ids, d * affinity[ids, expert].unsqueeze(1))
        gate_up_T.append(gu.permute(1, 2, 0))
        down_act.append(d)
    dtype = hidden_states.dtype
    return (
        out.to(dtype),
        torch.stack(gate_up_T).to(dtype),
        torch.stack(down_act).to(dtype).reshape(-1, block_size, hidden_dim),
    )

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
from nkilib.core.utils.kernel_assert import assert_packed, assert_shape, kernel_assert

#: nki-library core/moe/moe_cte/moe_cte_utils.py:58
PSUM_SIZE = 512

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


#: Where the checks below are, in aws-neuron/nki-library (tag 2.29 = main d2ad3a5), src/nkilib_src/nkilib/core/moe/
#: moe_cte/: ``moe_cte`` (moe_cte.py:377-403) hands shard_on_i to ``blockwise_mm_baseline_shard_intermediate``
#: (bwmm_shard_on_I.py:87), which derives T, H from hidden_states, E, I_TP from down_proj_weight and
#: N = len(token_position_to_id) // B (lines 251-257) and asserts ``check_blockwise_mm_shard_I_kernel_compatibility``
#: (lines 581-588). "docstring" marks its Args and Notes (lines 140-146, 180-181), which it relies on unasserted.
_SHARD_ON_I = "bwmm_shard_on_I.py"


def _check_shard_on_i(
    hidden, affinities, gate_up, down, token_ids, block_to_expert, block_size, skip_dma, shards
):
    """Every input check of moe_cte's shard_on_i path, in the real kernel's words, cited by line."""
    T1, H = hidden.shape[0], hidden.shape[-1]
    E, I_TP = down.shape[0], down.shape[1] if len(down.shape) > 1 else 0
    B = block_size
    # bwmm_shard_on_I.py:582
    kernel_assert(B % 256 == 0, "Blocksize must be a multiple of 256")
    # bwmm_shard_on_I.py:583
    kernel_assert(512 <= H <= 8192, f"Hidden dims must be between 512 and 8192, found {H}")
    # bwmm_shard_on_I.py:584 (PSUM_SIZE = 512, moe_cte_utils.py:58)
    kernel_assert(
        H % PSUM_SIZE == 0, f"Hidden dim size must be multiples of {PSUM_SIZE}, found {H} "
    )
    # bwmm_shard_on_I.py:585
    kernel_assert(
        I_TP % 16 == 0, f"down_proj_weight I must be divisible by 16, found {I_TP} . Please pad it"
    )
    # bwmm_shard_on_I.py:586-588
    kernel_assert(
        not skip_dma.skip_weight,
        "DMA weight skipping is not yet supported by the BWMM shard on I kernel",
    )
    # bwmm_shard_on_I.py:310-315: a core barrier over 1 or 2 shards, else kernel_assert(False, ...)
    kernel_assert(shards in (1, 2), "unsupported NUM_SHARDS")
    # docstring bwmm_shard_on_I.py:145 ([N * B]) and moe_cte_utils.py:361 (the same rule, asserted by the
    # dynamic-block loader): whole blocks of token ids
    kernel_assert(
        len(token_ids.shape) == 1,
        f"token_position_to_id must be [N * B], got {tuple(token_ids.shape)}",
    )
    kernel_assert(token_ids.shape[0] % B == 0, "token_position_to_id shape must be divisible by B")
    N = token_ids.shape[0] // B
    # docstring bwmm_shard_on_I.py:140-146: the layouts
    assert_shape(hidden, (T1, H), "hidden_states", "[T+1, H] (docstring, bwmm_shard_on_I.py:140)")
    assert_shape(
        affinities,
        (T1 * E, 1),
        "expert_affinities_masked",
        "[(T+1) * E, 1] (bwmm_shard_on_I.py:141)",
    )
    assert_shape(
        gate_up, (E, H, 2, I_TP), "gate_up_proj_weight", "[E, H, 2, I_TP] (bwmm_shard_on_I.py:142)"
    )
    assert_shape(down, (E, I_TP, H), "down_proj_weight", "[E, I_TP, H] (bwmm_shard_on_I.py:143)")
    assert_shape(block_to_expert, (N, 1), "block_to_expert", "[N, 1] (bwmm_shard_on_I.py:146)")
    # docstring bwmm_shard_on_I.py:180
    dtypes = {t.dtype for t in (hidden, affinities, gate_up, down)}
    kernel_assert(
        len(dtypes) == 1 and next(iter(dtypes)).is_floating_point,
        f"All input/output tensors must have the same floating point dtype, got {sorted(map(str, dtypes))} "
        "(docstring, bwmm_shard_on_I.py:180)",
    )
    # docstring bwmm_shard_on_I.py:181
    kernel_assert(
        token_ids.dtype == torch.int32 and block_to_expert.dtype == torch.int32,
        f"token_position_to_id and block_to_expert must be nl.int32 tensors, got {token_ids.dtype}, "
        f"{block_to_expert.dtype} (docstring, bwmm_shard_on_I.py:181)",
    )
    # layout: read through .ap() patterns from the shapes (bwmm_shard_on_I.py:648-649, 671, 728)
    assert_packed(
        "moe_cte",
        hidden_states=hidden,
        expert_affinities_masked=affinities,
        gate_up_proj_weight=gate_up,
        down_proj_weight=down,
        token_position_to_id=token_ids,
        block_to_expert=block_to_expert,
    )


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
    _check_shard_on_i(
        hidden_states,
        expert_affinities_masked,
        gate_up_proj_weight,
        down_proj_weight,
        token_position_to_id,
        block_to_expert,
        block_size,
        skip_dma,
        nl.num_programs(axes=0),
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

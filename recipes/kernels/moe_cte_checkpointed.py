"""nkilib's ``moe_cte`` as config 3 runs it, with its ``MoECTESpec`` built inside the kernel (trn2 only).

``moe_cte(..., block_size, spec: MoECTESpec, ...)`` takes its configuration as a
``@dataclass`` that is not frozen (aws-neuron/nki-library
src/nkilib_src/nkilib/core/moe/moe_cte/moe_cte.py), so instances have ``__hash__ = None``.
Through ``wrap_nki`` every non-tensor argument is a constant that torch_neuronx hashes
into the kernel's cache key (recipes/kernels/kernel_op.py ``require_hashable``): passing
the spec there would be config 3's first failure on the chip. This kernel takes only
tensors, an int and an enum, and builds the spec while it is traced, the way vLLM
Neuron's ``_torch_compatible_moe_cte_kernel`` does
(Infinity-AI-Institute/vllm-neuron vllm_neuron/functional/moe/moe_cte.py).

The spec: ``shard_on_i`` with activations checkpointed and affinities applied on H, so
the kernel returns ``(output [T+1, H], gate_up_activations_T [N, 2, I, B],
down_activations [N, B, H])`` for ``blockwise_mm_bwd`` (core/moe/moe_cte/bwmm_shard_on_I.py).

Open question (no public torchtitan-neuron or torch-neuronx source decides it): that NKI's
trace mode takes a kernel defined outside nkilib which calls ``moe_cte`` and constructs its
spec is shown only by vLLM Neuron's kernel above; the trn2 one-core MoE test is its first run here.

Imports nki and nkilib at module level: imported only by
``recipes.kernels.grouped_experts._kernels`` on the neuron device.
"""

from __future__ import annotations

import nki
from nkilib.core.moe.moe_cte import MoECTEImplementation, MoECTESpec, ShardOnIConfig, moe_cte
from nkilib.core.utils.common_types import ExpertAffinityScaleMode


@nki.jit(mode="trace")
def moe_cte_shard_on_i_checkpointed(
    hidden_states,
    expert_affinities_masked,
    gate_up_proj_weight,
    down_proj_weight,
    token_position_to_id,
    block_to_expert,
    block_size: int,
    expert_affinities_scaling_mode: ExpertAffinityScaleMode,
):
    """``moe_cte`` with ``MoECTESpec(shard_on_i, ShardOnIConfig(checkpoint_activation=True))``, argument order kept."""
    spec = MoECTESpec(
        implementation=MoECTEImplementation.shard_on_i,
        shard_on_I=ShardOnIConfig(checkpoint_activation=True, expert_affinity_multiply_on_I=False),
    )
    return moe_cte(
        hidden_states,
        expert_affinities_masked,
        gate_up_proj_weight,
        down_proj_weight,
        token_position_to_id,
        block_to_expert,
        block_size=block_size,
        spec=spec,
        expert_affinities_scaling_mode=expert_affinities_scaling_mode,
    )

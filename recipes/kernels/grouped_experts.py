"""Routed experts for both tiers: nkilib's blockwise MoE on trn2, a per-expert loop on cpu.

``TrnGroupedExperts`` is torchtitan's ``GroupedExperts`` with the same parameters
(``w1_EFD``, ``w2_EDF``, ``w3_EFD``: names, shapes, init, sharding), so
checkpoints and the HF state-dict adapter work unchanged. It is selected with
torchtitan's ``@override(target=GroupedExperts.Config)`` (see
:func:`grouped_experts`, or ``--override grouped_experts`` through
``recipes.overrides``).

* cpu: a plain fp32 loop over experts. Stock ``GroupedExperts`` casts to bf16 for
  ``torch._grouped_mm``, which is slow on CPU; the fp32 loop is faster there and
  agrees within bf16 rounding (see tests/cpu/test_overrides.py).
* trn2: nkilib's MoE context-encoding kernel ``moe_cte`` (blockwise matmul,
  ``shard_on_I``, activations checkpointed) forward and ``blockwise_mm_bwd``
  (module ``nkilib.experimental.moe.bwd.blockwise_mm_backward``) backward,
  through the custom op ``qwen3_trn_repro::moe_blockwise``. On the neuron
  device there is no fallback: a shape the kernels cannot take, or a missing
  nkilib, is an error. torchtitan hands the experts tokens
  already sorted by expert plus per-expert counts; :func:`blockwise_inputs`
  turns that into the kernel's blocks (``token_position_to_id``,
  ``block_to_expert``) and weight layout (``[E, H, 2, I]`` / ``[E, I, H]``).
  Routing scores are applied by torchtitan's dispatcher, so expert affinities
  are 1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from recipes.errors import RecipeError
from recipes.kernels.kernel_op import KernelOp, require_hashable
from recipes.platform import on_neuron
from recipes.platform.neuron import logical_neuron_cores
from recipes.titan import GroupedExperts, derive, override

__all__ = [
    "BLOCK_SIZE",
    "BlockwiseInputs",
    "GROUPED_EXPERTS_OVERRIDE",
    "MOE_CONSTRAINTS",
    "MoEConstraint",
    "MoEShape",
    "MoEShapeError",
    "TrnGroupedExperts",
    "block_layout",
    "blockwise_inputs",
    "assert_moe_shapes",
    "expert_loop",
    "failed_constraints",
    "grouped_experts",
    "launch_blockwise_mm_bwd",
    "launch_moe_cte",
    "moe_blockwise_op",
    "nki_grouped_experts",
]

#: Tokens per block: moe_cte's shard_on_I needs a multiple of 256, blockwise_mm_bwd one of
#: 128/256/512/1024 (see :data:`MOE_CONSTRAINTS`); 256 satisfies both.
BLOCK_SIZE = 256

MOE_OP_NAME = "qwen3_trn_repro::moe_blockwise"

#: Where the constraints below are asserted, in aws-neuron/nki-library (branches 2.28,
#: 2.29_release and main agree).
MOE_CTE_SOURCE = (
    "aws-neuron/nki-library src/nkilib_src/nkilib/core/moe/moe_cte/bwmm_shard_on_I.py "
    "(check_blockwise_mm_shard_I_kernel_compatibility)"
)
MOE_BWD_SOURCE = (
    "aws-neuron/nki-library src/nkilib_src/nkilib/experimental/moe/bwd/moe_bwd_parameters.py "
    "(MOEBwdParameters.validate, validate_sharding)"
)


class MoEShapeError(RecipeError):
    """Expert sizes nkilib's blockwise MoE kernels do not support."""


@dataclass(frozen=True)
class MoEShape:
    """What the kernels see: H (model dim), I (expert hidden dim), block size, LNC shards."""

    dim: int
    hidden_dim: int
    block_size: int
    lnc: int


@dataclass(frozen=True)
class MoEConstraint:
    """One shape assertion of an nkilib MoE kernel, checked before the kernel compiles."""

    kernel: str
    rule: str
    holds: Callable[[MoEShape], bool]
    source: str


MOE_CONSTRAINTS: tuple[MoEConstraint, ...] = (
    MoEConstraint(
        "moe_cte", "block size % 256 == 0", lambda s: s.block_size % 256 == 0, MOE_CTE_SOURCE
    ),
    MoEConstraint("moe_cte", "512 <= H <= 8192", lambda s: 512 <= s.dim <= 8192, MOE_CTE_SOURCE),
    # PSUM_SIZE = 512 (nkilib/core/moe/moe_cte/moe_cte_utils.py)
    MoEConstraint("moe_cte", "H % 512 == 0", lambda s: s.dim % 512 == 0, MOE_CTE_SOURCE),
    # I_TP is the full expert hidden dim here (TP=1); the kernel shards it over LNC itself.
    MoEConstraint("moe_cte", "I % 16 == 0", lambda s: s.hidden_dim % 16 == 0, MOE_CTE_SOURCE),
    MoEConstraint(
        "blockwise_mm_bwd",
        "block size in {128, 256, 512, 1024}",
        lambda s: s.block_size in (128, 256, 512, 1024),
        MOE_BWD_SOURCE,
    ),
    MoEConstraint(
        "blockwise_mm_bwd", "(H/LNC) % 32 == 0", lambda s: s.dim % (32 * s.lnc) == 0, MOE_BWD_SOURCE
    ),
    MoEConstraint(
        "blockwise_mm_bwd",
        "(I/LNC) % 32 == 0",
        lambda s: s.hidden_dim % (32 * s.lnc) == 0,
        MOE_BWD_SOURCE,
    ),
)


def failed_constraints(
    dim: int, hidden_dim: int, lnc: int, block_size: int = BLOCK_SIZE
) -> list[MoEConstraint]:
    """The rules of :data:`MOE_CONSTRAINTS` these shapes break (none: the kernels take them)."""
    shape = MoEShape(dim=dim, hidden_dim=hidden_dim, block_size=block_size, lnc=lnc)
    return [c for c in MOE_CONSTRAINTS if not c.holds(shape)]


def assert_moe_shapes(dim: int, hidden_dim: int, lnc: int, block_size: int = BLOCK_SIZE) -> None:
    """What moe_cte / blockwise_mm_bwd assert on the device, asserted before the kernels compile."""
    failed = failed_constraints(dim, hidden_dim, lnc, block_size)
    if failed:
        raise MoEShapeError(
            f"H={dim}, I={hidden_dim}, block size {block_size}, LNC={lnc}: "
            + "; ".join(f"{c.kernel} needs {c.rule} ({c.source})" for c in failed)
        )


# ---------------------------------------------------------------------------
# cpu: per-expert fp32 loop
# ---------------------------------------------------------------------------


def expert_loop(
    x_RD: torch.Tensor,
    num_tokens_per_expert_E: torch.Tensor,
    w1_EFD: torch.Tensor,
    w2_EDF: torch.Tensor,
    w3_EFD: torch.Tensor,
) -> torch.Tensor:
    """SwiGLU of each expert's contiguous rows of ``x_RD``, in fp32; rows past the counts are 0."""
    rows = x_RD.float()
    # unbind once: indexing w[e] per expert would make autograd build a full-size
    # zero gradient per expert; unbind's backward stacks the expert grads once.
    w1s, w2s, w3s = (w.float().unbind(0) for w in (w1_EFD, w2_EDF, w3_EFD))
    outputs, start = [], 0
    for e, n in enumerate(num_tokens_per_expert_E.tolist()):
        if n == 0:
            continue
        x = rows[start : start + n]
        h = F.silu(x @ w1s[e].T) * (x @ w3s[e].T)
        outputs.append(h @ w2s[e].T)
        start += n
    if start < rows.shape[0]:  # capacity padding rows carry no token
        outputs.append(rows.new_zeros(rows.shape[0] - start, w2_EDF.shape[1]))
    if not outputs:
        return x_RD.new_zeros(0, w2_EDF.shape[1])
    return torch.cat(outputs).type_as(x_RD)


# ---------------------------------------------------------------------------
# trn2: nkilib moe_cte forward + blockwise_mm_bwd backward as one custom op
# ---------------------------------------------------------------------------


@dataclass
class BlockwiseInputs:
    """torchtitan's expert-sorted rows in the layout of nkilib's blockwise MoE kernels."""

    hidden: torch.Tensor  # [R+1, H]: row R is the zero row padding ids point at
    affinities: torch.Tensor  # [(R+1)*E, 1]: 1, scores are applied by the dispatcher
    gate_up: torch.Tensor  # [E, H, 2, I]: w1 (gate) and w3 (up), transposed
    down: torch.Tensor  # [E, I, H]: w2, transposed
    token_position_to_id: torch.Tensor  # [N*B] int32, padding id R
    block_to_expert: torch.Tensor  # [N, 1] int32


def block_layout(
    counts: list[int], num_rows: int, block_size: int = BLOCK_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks of ``block_size`` rows, each of one expert, padded with id ``num_rows``.

    N = ceil(R / B) + E blocks (each expert adds at most one partial block) keeps
    the kernel's shapes static; unused blocks hold only padding ids.
    """
    n_blocks = -(-num_rows // block_size) + len(counts)
    token_ids = torch.full((n_blocks * block_size,), num_rows, dtype=torch.int32)
    block_to_expert = torch.zeros((n_blocks, 1), dtype=torch.int32)
    row, block = 0, 0
    for expert, n in enumerate(counts):
        first = block * block_size
        token_ids[first : first + n] = torch.arange(row, row + n, dtype=torch.int32)
        expert_blocks = -(-n // block_size)
        block_to_expert[block : block + expert_blocks] = expert
        row, block = row + n, block + expert_blocks
    return token_ids, block_to_expert


def blockwise_inputs(
    x_RD: torch.Tensor,
    num_tokens_per_expert_E: torch.Tensor,
    w1_EFD: torch.Tensor,
    w2_EDF: torch.Tensor,
    w3_EFD: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
    block_size: int = BLOCK_SIZE,
) -> BlockwiseInputs:
    """Kernel inputs; the weight layout changes are torch ops, so autograd maps grads back."""
    num_rows, num_experts = x_RD.shape[0], w1_EFD.shape[0]
    token_ids, block_to_expert = block_layout(
        num_tokens_per_expert_E.tolist(), num_rows, block_size
    )
    device = x_RD.device
    return BlockwiseInputs(
        hidden=torch.cat([x_RD.to(dtype), x_RD.new_zeros(1, x_RD.shape[1], dtype=dtype)]),
        affinities=torch.ones((num_rows + 1) * num_experts, 1, dtype=dtype, device=device),
        gate_up=torch.stack([w1_EFD.transpose(1, 2), w3_EFD.transpose(1, 2)], dim=2).to(dtype),
        down=w2_EDF.transpose(1, 2).to(dtype),
        token_position_to_id=token_ids.to(device),
        block_to_expert=block_to_expert.to(device),
    )


class NkiMissingError(RecipeError):
    """The neuron device is there but nkilib / torch_neuronx are not importable."""


@functools.cache
def _kernels():
    """(moe_cte, blockwise_mm_bwd) wrapped for torch; imported only on the neuron device.

    moe_cte is reached through :mod:`recipes.kernels.moe_cte_checkpointed`, which builds its
    unhashable ``MoECTESpec`` inside the kernel. Sources (aws-neuron/nki-library,
    src/nkilib_src/nkilib/...): ``core/moe/moe_cte/__init__.py`` exports ``moe_cte``;
    ``experimental/moe/bwd/__init__.py`` exports nothing, ``blockwise_mm_bwd`` lives in
    ``experimental/moe/bwd/blockwise_mm_backward.py`` (nki-library's own test imports it from
    there: test/integration/nkilib/experimental/moe/test_bwmm_bwd.py).
    """
    try:
        from nkilib.experimental.moe.bwd.blockwise_mm_backward import blockwise_mm_bwd  # noqa: PLC0415 -- optional: Neuron's nkilib, only on trn2
        from torch_neuronx.nki_hop import wrap_nki  # noqa: PLC0415 -- optional: only on trn2

        from recipes.kernels.moe_cte_checkpointed import moe_cte_shard_on_i_checkpointed  # noqa: PLC0415 -- optional: imports nki, only on trn2
    except ImportError as e:
        raise NkiMissingError(
            f"grouped_experts on the neuron device needs nkilib and torch_neuronx ({e}); "
            "install requirements-neuron.txt, or drop the grouped_experts override"
        ) from e
    return wrap_nki(moe_cte_shard_on_i_checkpointed), wrap_nki(blockwise_mm_bwd)


def _contiguous(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """NKI addresses HBM with row-major access patterns: hand kernels contiguous tensors."""
    return [t.contiguous() for t in tensors]


def _affinity_post_scale():
    """``ExpertAffinityScaleMode.POST_SCALE``: nkilib/core/utils/common_types.py (moe_cte's default)."""
    from nkilib.core.utils.common_types import ExpertAffinityScaleMode  # noqa: PLC0415 -- optional: Neuron's nkilib, only on trn2

    return ExpertAffinityScaleMode.POST_SCALE


def launch_moe_cte(
    kernel,
    lnc: int,
    hidden,
    affinities,
    gate_up,
    down,
    token_ids,
    block_to_expert,
    block_size,
    *,
    scaling_mode,
):
    """Call moe_cte (``moe_cte_shard_on_i_checkpointed``) on an LNC-wide grid with contiguous inputs, in its order.

    ``moe_cte(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
    token_position_to_id, block_to_expert, block_size, spec, ...,
    expert_affinities_scaling_mode=...)`` (aws-neuron/nki-library
    src/nkilib_src/nkilib/core/moe/moe_cte/moe_cte.py); the spec is built inside the kernel and
    every constant passed here must be hashable (``require_hashable``). The grid is a tuple: a
    public copy of torch_neuronx/nki_hop.py (parmoham-aws/test-repo-parmoham) does
    ``tuple(map(int, grid))`` in ``NKIHOPCaller.__getitem__``, which an int grid would break.
    """
    tensors = _contiguous(hidden, affinities, gate_up, down, token_ids, block_to_expert)
    constants = {"block_size": block_size, "expert_affinities_scaling_mode": scaling_mode}
    require_hashable("moe_cte", constants)
    return kernel[(lnc,)](*tensors, **constants)


def launch_blockwise_mm_bwd(
    kernel,
    lnc: int,
    hidden,
    affinities,
    gate_up,
    down,
    gate_up_act_T,
    down_act,
    token_ids,
    block_to_expert,
    grad_out,
    block_size,
):
    """Call ``blockwise_mm_bwd`` on an LNC-wide grid with contiguous inputs, in its argument order.

    ``blockwise_mm_bwd(hidden_states, expert_affinities_masked, gate_up_proj_weight,
    down_proj_weight, gate_up_proj_act_checkpoint_T, down_proj_act_checkpoint,
    token_position_to_id, block_to_expert, output_hidden_states_grad, block_size, ...)`` returns
    ``(hidden_states_grad, expert_affinities_masked_grad, gate_up_proj_weight_grad,
    down_proj_weight_grad)`` without bias (aws-neuron/nki-library
    src/nkilib_src/nkilib/experimental/moe/bwd/blockwise_mm_backward.py).
    """
    tensors = _contiguous(
        hidden,
        affinities,
        gate_up,
        down,
        gate_up_act_T,
        down_act,
        token_ids,
        block_to_expert,
        grad_out,
    )
    require_hashable("blockwise_mm_bwd", {"block_size": block_size})
    return kernel[(lnc,)](*tensors, block_size=block_size)


def _moe_blockwise(
    hidden: torch.Tensor,
    affinities: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    token_position_to_id: torch.Tensor,
    block_to_expert: torch.Tensor,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_cte → (output [R+1, H], gate/up activations [N, 2, I, B], down activations [N, B, H])."""
    if not on_neuron(hidden):
        raise RuntimeError(
            f"{MOE_OP_NAME} runs nkilib kernels and needs tensors on the neuron device, got "
            f"{hidden.device}; off the device TrnGroupedExperts uses expert_loop."
        )
    moe_blockwise_op.require_nki_op()
    moe_cte, _ = _kernels()
    out, gate_up_act_T, down_act = launch_moe_cte(
        moe_cte,
        logical_neuron_cores(),
        hidden,
        affinities,
        gate_up,
        down,
        token_position_to_id,
        block_to_expert,
        block_size,
        scaling_mode=_affinity_post_scale(),
    )
    return out, gate_up_act_T, down_act


def _moe_blockwise_fake(
    hidden, affinities, gate_up, down, token_position_to_id, block_to_expert, block_size
):
    n_blocks, hidden_dim = block_to_expert.shape[0], gate_up.shape[-1]
    return (
        torch.empty_like(hidden),
        gate_up.new_empty(n_blocks, 2, hidden_dim, block_size),
        down.new_empty(n_blocks, block_size, hidden.shape[1]),
    )


def _moe_setup_context(ctx, inputs, output) -> None:
    ctx.block_size = inputs[-1]
    ctx.save_for_backward(*inputs[:-1], output[1], output[2])


def _moe_backward(ctx, grad_out, _grad_gate_up_act, _grad_down_act):
    """blockwise_mm_bwd from the checkpointed activations: grads of hidden, gate_up, down."""
    hidden, affinities, gate_up, down, token_ids, block_to_expert, gate_up_act_T, down_act = (
        ctx.saved_tensors
    )
    _, blockwise_mm_bwd = _kernels()
    grad_hidden, _grad_affinities, grad_gate_up, grad_down = launch_blockwise_mm_bwd(
        blockwise_mm_bwd,
        logical_neuron_cores(),
        hidden,
        affinities,
        gate_up,
        down,
        gate_up_act_T,
        down_act,
        token_ids,
        block_to_expert,
        grad_out,
        ctx.block_size,
    )
    return grad_hidden, None, grad_gate_up, grad_down, None, None, None


#: ``qwen3_trn_repro::moe_blockwise``; an ``nki_op`` on trn2 (recipes/kernels/kernel_op.py).
moe_blockwise_op = KernelOp(
    MOE_OP_NAME,
    _moe_blockwise,
    fake=_moe_blockwise_fake,
    backward=_moe_backward,
    setup_context=_moe_setup_context,
)


def nki_grouped_experts(x_RD, num_tokens_per_expert_E, w1_EFD, w2_EDF, w3_EFD) -> torch.Tensor:
    """The kernels' path: shape guard, block layout, one custom-op call; never a fallback."""
    assert_moe_shapes(w1_EFD.shape[2], w1_EFD.shape[1], logical_neuron_cores())
    inputs = blockwise_inputs(x_RD, num_tokens_per_expert_E, w1_EFD, w2_EDF, w3_EFD)
    out, _, _ = moe_blockwise_op(
        inputs.hidden,
        inputs.affinities,
        inputs.gate_up,
        inputs.down,
        inputs.token_position_to_id,
        inputs.block_to_expert,
        BLOCK_SIZE,
    )
    return out[:-1].type_as(x_RD)


# ---------------------------------------------------------------------------
# The torchtitan module and its override
# ---------------------------------------------------------------------------


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class TrnGroupedExperts(GroupedExperts):
    """``GroupedExperts`` computed by nkilib on the neuron device, by :func:`expert_loop` elsewhere."""

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        pass

    def forward(
        self,
        x_RD: torch.Tensor,
        num_tokens_per_expert_E: torch.Tensor,
    ) -> torch.Tensor:
        weights = _local(self.w1_EFD), _local(self.w2_EDF), _local(self.w3_EFD)
        if on_neuron(x_RD):  # the kernels or an error: no silent cpu loop here
            return nki_grouped_experts(x_RD, num_tokens_per_expert_E, *weights)
        if x_RD.device.type != "cpu":
            raise RuntimeError(
                f"TrnGroupedExperts runs nkilib on 'neuron' and a reference loop on 'cpu'; "
                f"got {x_RD.device}. Drop the grouped_experts override on this device."
            )
        return expert_loop(x_RD, num_tokens_per_expert_E, *weights)


GROUPED_EXPERTS_OVERRIDE = dict(
    target=GroupedExperts.Config,
    exact=True,
    description="nkilib blockwise MoE (trn2) / fp32 per-expert loop (cpu) for routed experts",
)
"""Exactly ``GroupedExperts``: subclasses (gpt-oss, fused w13) have other parameters."""


@override(**GROUPED_EXPERTS_OVERRIDE)
def grouped_experts(cfg: GroupedExperts.Config) -> TrnGroupedExperts.Config:
    """torchtitan override factory: ``--override.imports recipes.kernels.grouped_experts.grouped_experts``."""
    return derive(cfg, TrnGroupedExperts.Config)

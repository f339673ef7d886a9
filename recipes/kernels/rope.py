"""RoPE as one custom op: nkilib's ``rope_hf`` on trn2, the same math in torch on cpu.

The tutorial replaces torchtitan's ``CosSinRoPE`` with nkilib's ``rope_hf`` kernel
(``wrap_nki`` + ``nki_op`` + ``register_autograd``). This module keeps that shape
on every tier: ``torch.ops.qwen3_trn_repro.rope_hf`` is one custom op, defined on
first use by :class:`recipes.kernels.kernel_op.KernelOp`: torch_neuronx's ``nki_op``
on trn2 (which is not the same as ``torch.library.custom_op`` in eager mode, see
that module), ``torch.library.custom_op`` with the same body elsewhere. Its implementation

* on a ``neuron`` device calls ``rope_hf`` through ``wrap_nki(kernel)[LNC]`` in the
  kernel's layout ``[B, heads, S, D]`` with cos/sin ``[(B,) S, D]``;
* elsewhere computes the same rotate-half rotation in torch.

Both build cos/sin from ``positions × inv_freq`` instead of gathering rows of a
precomputed table ("RoPE without gather"), with exactly the operations and order
of ``CosSinRoPE`` so the cpu path equals torchtitan bit for bit (forward and
backward, fp32 and bf16). The backward is the op itself with ``backward=True``:
the transposed rotation, which is what ``rope_hf(..., backward=True)`` computes.

nkilib asserts ``S % (128 * LNC) == 0`` inside the kernel, at compile time;
:func:`assert_seq_len` makes the same assertion before the op, on every tier (the
harness refuses such a run before launch, naming the fix).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from recipes.errors import RecipeError
from recipes.kernels.kernel_op import KernelOp
from recipes.platform import on_neuron
from recipes.platform.neuron import VALID_LNC, LNCError, logical_neuron_cores
from recipes.titan import CosSinRoPE, _maybe_check_max_pos, _yarn_inv_freq, derive, override

__all__ = [
    "NKIRoPE",
    "OP_NAME",
    "ROPE_HF_OVERRIDE",
    "ROPE_HF_TARGETS",
    "SEQ_TILE",
    "SeqLenError",
    "SlicedCosSinRoPE",
    "assert_seq_len",
    "rope_hf",
    "rope_hf_op",
    "sliced_rope",
]

#: Rows per SBUF partition tile; rope_hf gives each of the LNC cores whole tiles.
SEQ_TILE = 128

OP_NAME = "qwen3_trn_repro::rope_hf"


class SeqLenError(RecipeError):
    """The sequence length cannot be split the way nkilib's rope_hf needs."""


def assert_seq_len(seq_len: int, lnc: int) -> None:
    """Raise :class:`SeqLenError` unless ``seq_len`` is a multiple of 128 × LNC: rope_hf's own assertion.

    rope_hf splits the sequence evenly across the LNC physical cores of a logical
    NeuronCore, each in 128-row tiles (``_validate_apply_rope_inputs`` in aws-neuron/nki-library
    src/nkilib_src/nkilib/core/embeddings/rope_hf.py).
    """
    if lnc not in VALID_LNC:
        raise LNCError(
            f"LNC={lnc!r} is not a logical NeuronCore size trn2 supports (NEURON_LOGICAL_NC_CONFIG 1 or 2)"
        )
    multiple = SEQ_TILE * lnc
    if seq_len <= 0 or seq_len % multiple:
        raise SeqLenError(
            f"seq_len={seq_len} is not a multiple of 128×LNC={multiple} (LNC={lnc}): nkilib's rope_hf asserts "
            "S % (128 * LNC) == 0"
        )


# ---------------------------------------------------------------------------
# The custom op
# ---------------------------------------------------------------------------


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """fp32 for fp32/bf16/fp16 (as CosSinRoPE's ``.float()``), fp64 stays fp64 for gradcheck."""
    return torch.promote_types(x.dtype, torch.float32)


def _cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[P, L, H]`` for positions ``[P, L]``: CosSinRoPE's table rows, computed.

    Same operations as ``CosSinRoPE._precompute_cache``: ``t * inv_freq`` (what
    ``torch.outer`` computes), duplicated halves, then cos and sin.
    """
    freqs = positions.to(dtype).unsqueeze(-1) * inv_freq.to(dtype)
    theta = torch.cat([freqs, freqs], dim=-1)
    return theta.cos(), theta.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool) -> torch.Tensor:
    """``x*cos + rotate_half(x)*sin``; ``backward`` uses the transposed rotation."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat((x2, -x1), dim=-1) if backward else torch.cat((-x2, x1), dim=-1)
    return (x * cos) + (rotated * sin)


def _rope_torch(q, k, positions, inv_freq, backward):
    dtype = _compute_dtype(q)
    cos, sin = _cos_sin(positions, inv_freq, dtype)
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # [P, L, 1, H]: broadcast over heads
    q_out = _rotate(q.to(dtype), cos, sin, backward)
    k_out = _rotate(k.to(dtype), cos, sin, backward)
    return q_out.type_as(q), k_out.type_as(k)


@functools.cache
def _rope_hf_kernel():
    """nkilib's rope_hf wrapped for torch; imported only where the neuron device exists.

    ``rope_hf(q, k, q_out, k_out, cos=None, sin=None, rope_cache=None, backward=False)``, q/k
    ``[B, heads, S, D]``, cos/sin ``[(B,) S, D]`` loaded in q's dtype, ``S % (128 * LNC) == 0``
    (aws-neuron/nki-library src/nkilib_src/nkilib/core/embeddings/rope_hf.py,
    ``_validate_apply_rope_inputs``).
    """
    from nkilib.core.embeddings.rope_hf import rope_hf as kernel  # noqa: PLC0415 -- optional: Neuron's nkilib, only on trn2
    from torch_neuronx.nki_hop import wrap_nki  # noqa: PLC0415 -- optional: only on trn2

    return wrap_nki(kernel)


def _rope_nki(q, k, positions, inv_freq, backward):
    """rope_hf on the device: q/k ``[B, L, N, H]`` → kernel layout ``[B, N, L, H]`` and back."""
    lnc = logical_neuron_cores()
    assert_seq_len(q.shape[1], lnc)
    dtype = _compute_dtype(q)
    cos, sin = _cos_sin(positions, inv_freq, dtype)
    if cos.shape[0] == 1:  # shared positions: the kernel's batch-less [S, D] form
        cos, sin = cos[0], sin[0]
    q_bnsd = q.to(dtype).transpose(1, 2).contiguous()
    k_bnsd = k.to(dtype).transpose(1, 2).contiguous()
    # Grid as a tuple: NKIHOPCaller.__getitem__ does tuple(map(int, grid)) in a public copy of
    # torch_neuronx/nki_hop.py (parmoham-aws/test-repo-parmoham); an int grid breaks there.
    q_out, k_out = _rope_hf_kernel()[(lnc,)](
        q_bnsd,
        k_bnsd,
        torch.empty_like(q_bnsd),
        torch.empty_like(k_bnsd),
        cos=cos.contiguous(),
        sin=sin.contiguous(),
        backward=backward,
    )
    # Back to [B, L, N, H] with the strides the fake implementation promises.
    return (
        torch.empty_like(q).copy_(q_out.transpose(1, 2)),
        torch.empty_like(k).copy_(k_out.transpose(1, 2)),
    )


def _rope_hf(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    backward: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q [B, L, N, H]`` and ``k [B, L, Nk, H]`` by ``positions [1|B, L] × inv_freq [H/2]``.

    ``backward=True`` applies the transposed rotation: the gradient of the forward.
    """
    if on_neuron(q):
        rope_hf_op.require_nki_op()
        return _rope_nki(q, k, positions, inv_freq, backward)
    return _rope_torch(q, k, positions, inv_freq, backward)


def _rope_hf_fake(q, k, positions, inv_freq, backward=False):
    return torch.empty_like(q), torch.empty_like(k)


def _setup_context(ctx, inputs, output) -> None:
    _, _, positions, inv_freq, backward = inputs
    ctx.save_for_backward(positions, inv_freq)
    ctx.backward = backward


def _backward(ctx, grad_q, grad_k):
    """A rotation's gradient is the transposed rotation: the same op, flag flipped."""
    positions, inv_freq = ctx.saved_tensors
    grad_q, grad_k = rope_hf_op(grad_q, grad_k, positions, inv_freq, not ctx.backward)
    return grad_q, grad_k, None, None, None


#: ``qwen3_trn_repro::rope_hf``: ``rope_hf_op(q, k, positions, inv_freq, backward=False)``.
rope_hf_op = KernelOp(
    OP_NAME, _rope_hf, fake=_rope_hf_fake, backward=_backward, setup_context=_setup_context
)


# ---------------------------------------------------------------------------
# The torchtitan module and its override
# ---------------------------------------------------------------------------


class NKIRoPE(CosSinRoPE):
    """``CosSinRoPE`` that rotates through :data:`OP_NAME` (nkilib's rope_hf on trn2).

    A drop-in for the stock module: same Config fields (plus one flag), same
    numerics, same buffer name. Its ``cache`` holds the inverse frequencies
    ``[H/2]`` instead of a ``[max_seq_len, 2H]`` cos/sin table, since cos/sin are
    computed from the positions; keeping the name keeps torchtitan's
    ``state_shardings={"cache": ...}`` and buffer re-init valid.
    Only plain (FSDP/DDP) q/k are supported; tensor or context parallel DTensors
    are refused rather than silently mis-rotated.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(CosSinRoPE.Config):
        enforce_kernel_constraints: bool = True
        """Check seq_len % (128 × LNC) on every tier, not only where the kernel runs,
        so a config trn2 would reject fails the same way on the cpu tier."""

        drop_positions: bool = False
        """Rotate by 0..L-1 whatever positions arrive, as :class:`SlicedCosSinRoPE` does, so
        swapping rope_hf into config 3 keeps config 3's numerics."""

    def _precompute_cache(self) -> torch.Tensor:
        """The inverse frequencies, by the expression ``CosSinRoPE`` builds its table from."""
        cfg = self.config
        if cfg.scaling == "llama":
            raise NotImplementedError("Cos/sin RoPE does not support Llama scaling.")
        if cfg.scaling == "yarn" and cfg.rope_factor > 1.0:
            return _yarn_inv_freq(
                cfg.dim,
                cfg.theta,
                cfg.rope_factor,
                cfg.beta_fast,
                cfg.beta_slow,
                cfg.original_seq_len,
                cfg.truncate,
            )
        dim = cfg.dim
        return 1.0 / (cfg.theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))

    @property
    def inv_freq(self) -> torch.Tensor:
        """``[H/2]`` inverse frequencies (stored as ``cache``, see the class docstring)."""
        return self.cache

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(query, DTensor) or isinstance(key, DTensor):
            raise NotImplementedError(
                "NKIRoPE (override rope_hf) supports plain q/k (FSDP/DDP); tensor or "
                "context parallel layers pass DTensors. Scope the override away from "
                "those layers or keep the stock CosSinRoPE."
            )
        seq_len = query.shape[1]
        if self.config.enforce_kernel_constraints or on_neuron(query):
            assert_seq_len(seq_len, logical_neuron_cores())
        if positions is None or self.config.drop_positions:
            positions = torch.arange(seq_len, device=query.device).unsqueeze(0)
        else:
            _maybe_check_max_pos(positions, max_valid_pos=self.config.max_seq_len - 1)
        return rope_hf_op(query, key, positions, self.inv_freq)


class SlicedCosSinRoPE(CosSinRoPE):
    """torchtitan's ``CosSinRoPE`` on its gather-free path: positions never reach the cache.

    In torchtitan 0.3.0 (``models/common/rope.py``, ``_reshape_for_broadcast``) the cos/sin
    cache is *sliced* (``cache[0:seq_len]``) when ``positions`` is None, indexed
    (``cache[positions]``) for one row of positions and ``torch.gather``-ed per sample
    otherwise; and its text dataloader always yields per-document positions
    (``hf_datasets/text_datasets.py``). This module drops them, so every sample is rotated
    by 0..L-1 from the sliced table: the tutorial's "RoPE without gather" for config 3,
    which attends causally across the packed documents (SDPA) anyway.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(CosSinRoPE.Config):
        pass

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return super().forward(query, key, None)


def sliced_rope(cfg: CosSinRoPE.Config) -> SlicedCosSinRoPE.Config:
    """The same RoPE (theta, sizes, scaling) on the slice path."""
    return derive(cfg, SlicedCosSinRoPE.Config)


ROPE_HF_OVERRIDE = dict(
    target=CosSinRoPE.Config,
    exact=True,
    description="nkilib rope_hf (trn2) / its torch twin (cpu) through one custom op",
)
"""How ``rope_hf`` is registered: exactly ``CosSinRoPE`` (not MRoPE-like subclasses)."""

#: Every config type ``rope_hf`` may replace, each exactly: stock CosSinRoPE and config 3's
#: sliced one (recipes.overrides registers the factory once per type).
ROPE_HF_TARGETS = (CosSinRoPE.Config, SlicedCosSinRoPE.Config)


@override(**ROPE_HF_OVERRIDE)
def rope_hf(cfg: CosSinRoPE.Config) -> NKIRoPE.Config:
    """torchtitan override factory: ``--override.imports recipes.kernels.rope.rope_hf``.

    From :class:`SlicedCosSinRoPE` it keeps that module's rule (positions dropped).
    """
    new = derive(cfg, NKIRoPE.Config)
    new.drop_positions = isinstance(cfg, SlicedCosSinRoPE.Config)
    return new

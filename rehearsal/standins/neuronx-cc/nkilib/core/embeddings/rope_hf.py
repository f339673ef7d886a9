"""Stand-in of ``rope_hf`` (aws-neuron/nki-library src/nkilib_src/nkilib/core/embeddings/rope_hf.py).

Same signature and contract: q/k ``[B, heads, S, D]``, cos/sin ``[(B,) S, D]`` (or a packed
``rope_cache [(B,) S, 2D]``), written into ``q_out``/``k_out`` and returned; ``S`` must be a
multiple of ``128 * LNC`` (the launch grid). Per the kernel's ``_apply_rope_single``: forward
``y1 = x1*c1 - x2*s1``, ``y2 = x2*c2 + x1*s2``; backward ``y1 = x1*c1 + x2*s2``,
``y2 = x2*c2 - x1*s1``, each product in q's dtype.

Every input check the real kernel makes is made here, in its words (:func:`_check`, each cited by line),
and its layout too: it reads packed row-major memory, so a tensor that is not contiguous is refused
(nkilib/core/utils/kernel_assert.py ``assert_packed``).
"""

from __future__ import annotations

from typing import Optional

import nki
import nki.language as nl
import torch

from nkilib import faulty
from nkilib.core.utils.kernel_assert import assert_packed, kernel_assert

calls = 0


#: Every check below is the real kernel's, cited by line of aws-neuron/nki-library (tag 2.29 = main d2ad3a5)
#: src/nkilib_src/nkilib/core/embeddings/rope_hf.py; "docstring" marks the Args contract (lines 54-63) the kernel
#: relies on without asserting it (it takes batch and seq from q, line 94, and reads k, q_out, k_out with them).


def _check(q, k, q_out, k_out, cos, sin, rope_cache, num_shards):
    """The kernel's ``_validate_apply_rope_inputs`` (rope_hf.py:154-214), its messages, and the layout it reads."""
    # rope_hf.py:180
    kernel_assert(
        len(q.shape) == 4, f"apply_rope only supports 4D tensors, got input shape {q.shape}"
    )
    # rope_hf.py:181
    kernel_assert(
        q.shape[-1] == k.shape[-1], f"Head dim mismatch: q={q.shape[-1]}, k={k.shape[-1]}"
    )
    head_dim = q.shape[-1]
    if rope_cache is not None:
        # rope_hf.py:187-190
        kernel_assert(
            rope_cache.shape[-1] == head_dim * 2,
            f"Packed rope_cache expects head_dim*2={head_dim * 2}, got {rope_cache.shape[-1]}",
        )
        # rope_hf.py:191
        kernel_assert(
            cos is None and sin is None,
            "Expected either rope_cache or separate cos/sin tensors, got both",
        )
        table = rope_cache
    else:
        # rope_hf.py:195
        kernel_assert(
            cos is not None and sin is not None,
            "Expected either rope_cache or separate cos/sin tensors, got none",
        )
        # rope_hf.py:196-198
        kernel_assert(
            cos.shape == sin.shape,
            f"Shape of cos Tensor: {cos.shape} doesn't match shape of sin Tensor: {sin.shape}",
        )
        # rope_hf.py:199
        kernel_assert(
            cos.shape[-1] == head_dim, f"Head dim mismatch: q={head_dim}, cos={cos.shape[-1]}"
        )
        table = cos
    # rope_hf.py:203-206
    kernel_assert(
        len(table.shape) == 2 or (len(table.shape) == 3 and table.shape[0] == q.shape[0]),
        f"rope_cache or cos tensor batch size {table.shape} doesn't match q batch size {q.shape}",
    )
    # rope_hf.py:207-210
    kernel_assert(
        table.shape[-2] >= q.shape[2],
        f"rope_cache or cos tensor seq len {table.shape[-2]} smaller than q seq len {q.shape[2]}",
    )
    # rope_hf.py:211-214
    kernel_assert(
        q.shape[2] % (nl.tile_size.pmax * num_shards) == 0,
        f"seq len must be multiple of 128 * LNC={num_shards}, got {q.shape[2]}",
    )
    # docstring (rope_hf.py:54-57): k [batch_size, k_heads, seq_len, head_dim] with q's batch and seq (line 94
    # takes them from q and reads k with them, lines 103-107 and 251-256); q_out, k_out the shapes of q, k
    kernel_assert(
        len(k.shape) == 4 and k.shape[0] == q.shape[0] and k.shape[2] == q.shape[2],
        f"k {tuple(k.shape)} must be [batch_size, k_heads, seq_len, head_dim] with q's batch and seq "
        f"{tuple(q.shape)} (stand-in check of the docstring's shapes)",
    )
    kernel_assert(
        q_out.shape == q.shape,
        f"q_out {tuple(q_out.shape)} must have q's shape {tuple(q.shape)} (stand-in check of the docstring's shapes)",
    )
    kernel_assert(
        k_out.shape == k.shape,
        f"k_out {tuple(k_out.shape)} must have k's shape {tuple(k.shape)} (stand-in check of the docstring's shapes)",
    )
    # layout: q, k, q_out, k_out read and written through .ap() patterns from their shapes (rope_hf.py:251-265);
    # cos/sin/rope_cache likewise (rope_hf.py:124-143)
    assert_packed(
        "rope_hf", q=q, k=k, q_out=q_out, k_out=k_out, cos=cos, sin=sin, rope_cache=rope_cache
    )


def _rotate_into(x, out, cos, sin, backward):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c1, c2, s1, s2 = cos[..., :h], cos[..., h:], sin[..., :h], sin[..., h:]
    if backward:
        y1, y2 = x1 * c1 + x2 * s2, x2 * c2 - x1 * s1
    else:
        y1, y2 = x1 * c1 - x2 * s1, x2 * c2 + x1 * s2
    y = torch.cat([y1, y2], dim=-1)
    if faulty("rope_hf"):
        y = torch.nextafter(y, torch.full_like(y, float("inf")))
    out.copy_(y)


@nki.jit
def rope_hf(
    q: nl.ndarray,
    k: nl.ndarray,
    q_out: nl.ndarray,
    k_out: nl.ndarray,
    cos: Optional[nl.ndarray] = None,
    sin: Optional[nl.ndarray] = None,
    rope_cache: Optional[nl.ndarray] = None,
    backward: bool = False,
):
    """Apply RoPE to q and k in the HuggingFace layout; returns ``(q_out, k_out)``."""
    global calls
    calls += 1
    _check(q, k, q_out, k_out, cos, sin, rope_cache, nl.num_programs(axes=0))
    seq = q.shape[2]
    if rope_cache is not None:
        d = q.shape[-1]
        cos, sin = rope_cache[..., :d], rope_cache[..., d:]
    cos, sin = cos[..., :seq, :].to(q.dtype), sin[..., :seq, :].to(q.dtype)
    if cos.dim() == 3:  # [B, S, D]: one table per sample
        cos, sin = cos[:, None], sin[:, None]
    _rotate_into(q, q_out, cos, sin, backward)
    _rotate_into(k, k_out, cos, sin, backward)
    return q_out, k_out

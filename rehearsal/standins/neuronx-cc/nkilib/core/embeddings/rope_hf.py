"""Stand-in of ``rope_hf`` (aws-neuron/nki-library src/nkilib_src/nkilib/core/embeddings/rope_hf.py).

Same signature and contract: q/k ``[B, heads, S, D]``, cos/sin ``[(B,) S, D]`` (or a packed
``rope_cache [(B,) S, 2D]``), written into ``q_out``/``k_out`` and returned; ``S`` must be a
multiple of ``128 * LNC`` (the launch grid). Per the kernel's ``_apply_rope_single``: forward
``y1 = x1*c1 - x2*s1``, ``y2 = x2*c2 + x1*s2``; backward ``y1 = x1*c1 + x2*s2``,
``y2 = x2*c2 - x1*s1``, each product in q's dtype.
"""

from __future__ import annotations

from typing import Optional

import nki
import nki.language as nl
import torch

from nkilib import faulty

calls = 0


def _check(q, k, cos, sin, rope_cache, num_shards):
    """The kernel's ``_validate_apply_rope_inputs``, as assertions with its messages."""
    assert len(q.shape) == 4, f"apply_rope only supports 4D tensors, got input shape {q.shape}"
    assert q.shape[-1] == k.shape[-1], f"Head dim mismatch: q={q.shape[-1]}, k={k.shape[-1]}"
    if rope_cache is not None:
        assert cos is None and sin is None, (
            "Expected either rope_cache or separate cos/sin tensors, got both"
        )
        assert rope_cache.shape[-1] == 2 * q.shape[-1]
        table = rope_cache
    else:
        assert cos is not None and sin is not None, (
            "Expected either rope_cache or separate cos/sin tensors, got none"
        )
        assert cos.shape == sin.shape and cos.shape[-1] == q.shape[-1]
        table = cos
    assert len(table.shape) == 2 or (len(table.shape) == 3 and table.shape[0] == q.shape[0])
    assert table.shape[-2] >= q.shape[2]
    assert q.shape[2] % (nl.tile_size.pmax * num_shards) == 0, (
        f"seq len must be multiple of 128 * LNC={num_shards}, got {q.shape[2]}"
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
    _check(q, k, cos, sin, rope_cache, nl.num_programs(axes=0))
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

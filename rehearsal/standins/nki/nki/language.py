"""``nki.language`` (stand-in): the few names nki-library's kernel signatures and configs use.

``nl.ndarray`` appears in kernel annotations, ``nl.NKIObject`` is the base of moe_cte's config
dataclasses, ``nl.bfloat16`` a default ``compute_dtype``, ``nl.num_programs``/``nl.program_id`` the
launch grid (aws-neuron/nki-library src/nkilib_src/nkilib/core/moe/moe_cte/moe_cte.py,
experimental/moe/bwd/blockwise_mm_backward.py). Here ``ndarray`` is ``torch.Tensor``.
"""

from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace

import torch

ndarray = torch.Tensor
bfloat16 = torch.bfloat16
float32 = torch.float32
tile_size = SimpleNamespace(pmax=128, psum_fmax=512)

_state = threading.local()


class NKIObject:
    """Base of nki-library's configuration dataclasses."""


@contextlib.contextmanager
def _grid(grid: tuple[int, ...]):
    prev = getattr(_state, "grid", (1,))
    _state.grid = grid
    try:
        yield
    finally:
        _state.grid = prev


def num_programs(axes: int = 0) -> int:
    return getattr(_state, "grid", (1,))[axes]


def program_id(axis: int = 0) -> int:
    return 0

"""REHEARSAL STAND-IN for ``nki``: ``nki.jit`` returns a :class:`Kernel` that runs its body eagerly.

Signature copied from the Neuron 2.33 API reference (aws-neuron/aws-neuron-sdk, generated page
nki/api/generated/nki.jit, v2.33.1): ``nki.jit(fn=None, *, compile_config=None,
specialization_config=None, **kwargs)`` returns a ``Kernel``; the LNC degree is given at the call
site with ``kernel[lnc](args)`` (v2.31 page) — a one-element grid ``kernel[(lnc,)]`` as well.
nki-library writes ``@nki.jit`` and ``@nki.jit(mode="trace")``
(aws-neuron/nki-library src/nkilib_src/nkilib/core/moe/moe_cte/moe_cte.py). torch_neuronx's
``wrap_nki`` reads a kernel's ``.func`` and ``.sign`` (parmoham-aws/test-repo-parmoham
torch_neuronx/nki_hop.py), so the Kernel has both.

Nothing is compiled: a stand-in kernel body computes with torch on the tensors it is given.
"""

from __future__ import annotations

import functools
import inspect

from . import language  # noqa: F401

__version__ = "0.7.0"
STANDIN = True


class Kernel:
    """A ``@nki.jit`` function: call it (nested, or LNC 1) or launch it on a grid, ``kernel[grid](...)``."""

    def __init__(self, fn, **options) -> None:
        self.func = fn
        self.sign = inspect.signature(fn)
        self.options = options
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid):
        grid = (grid,) if isinstance(grid, int) else tuple(int(g) for g in grid)

        def launch(*args, **kwargs):
            with language._grid(grid):
                return self.func(*args, **kwargs)

        return launch

    def __call__(self, *args, **kwargs):
        return self.func(*args, **kwargs)


def jit(fn=None, *, compile_config=None, specialization_config=None, **kwargs):
    """Just-in-time compile a top-level NKI function (stand-in: wrap it, run it eagerly)."""
    options = {
        "compile_config": compile_config,
        "specialization_config": specialization_config,
        **kwargs,
    }
    if fn is None:
        return lambda f: Kernel(f, **options)
    return Kernel(fn, **options)

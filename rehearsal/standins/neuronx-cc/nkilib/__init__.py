"""REHEARSAL STAND-IN for the NKI Library bundled in neuronx-cc (``nkilib``), at the real module paths.

Each kernel keeps the signature of aws-neuron/nki-library src/nkilib_src/nkilib/<same path>.py and
computes its documented result with torch, written for the stand-in (not the suite's own torch
twins, so a kernel test compares two independent computations). Each kernel module counts its
calls in a module-level ``calls``. ``QWEN3_STANDIN_FAULT=<kernel>`` makes that kernel wrong on
purpose (rope_hf: one ulp; moe_cte: gate and up swapped; blockwise_mm_bwd: hidden grad x 2).

The real bundled ``nkilib/__init__.py`` replaces itself by a standalone nki-library when one is
installed (``_try_setup_src_nkilib``); the stand-in does not: the rehearsal installs none.
"""

import os

__version__ = "2.33.0"
STANDIN = True
FAULT_ENV = "QWEN3_STANDIN_FAULT"


def faulty(kernel: str) -> bool:
    """Whether the rehearsal asked for ``kernel`` to be wrong (rehearsal/settings.py ``fault``)."""
    return os.environ.get(FAULT_ENV, "") == kernel

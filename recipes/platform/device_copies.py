"""torchtitan's copies of its device: one list for every tier, and the repointing of those already imported."""

from __future__ import annotations

import sys

#: torchtitan modules that copy ``device_type``/``device_module`` from torchtitan.tools.utils by value at import,
#: so a tier installed after them repoints each copy (cpu: always; trn2: when torchtitan came first).
DEVICE_COPIES = (
    "torchtitan.tools.utils",
    "torchtitan.components.metrics",
    "torchtitan.models.common.token_dispatcher",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.distributed.utils",
    "torchtitan.tools.profiler",
)


def repoint_imported_device_copies(device_type: str, device_module) -> list[str]:
    """Set ``device_type``/``device_module`` in every module of ``DEVICE_COPIES`` already imported; their names.

    A module imported later copies torchtitan.tools.utils' values, repointed first here.
    """
    repointed = []
    for name in DEVICE_COPIES:
        module = sys.modules.get(name)
        if module is None:
            continue
        for attribute, value in (("device_type", device_type), ("device_module", device_module)):
            if hasattr(module, attribute):
                setattr(module, attribute, value)
        repointed.append(name)
    return repointed

"""The cpu tier: run real torchtitan 0.3.0 on CPU processes with gloo.

torchtitan is written for accelerators. Each patch below is the smallest change
that lets the unmodified trainer run on CPU, and each has a canary test in
``tests/cpu/test_platform_canaries.py`` that fails once upstream no longer
needs it, so the patch can be deleted.

``install()`` must run before anything imports torchtitan: several torchtitan
modules copy ``device_type`` / ``device_module`` by value at import time.
"""

from __future__ import annotations

import os

import torch

#: torchtitan modules that copy ``device_type``/``device_module`` at import.
_DEVICE_COPIES = (
    "torchtitan.tools.utils",
    "torchtitan.components.metrics",
    "torchtitan.models.common.token_dispatcher",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.distributed.utils",
    "torchtitan.tools.profiler",
)

_installed = False


class CpuDeviceModule:
    """The ``torch.cuda``-shaped surface torchtitan calls, answered for the CPU.

    Upstream: ``torchtitan.tools.utils.get_device_info`` falls back to "cuda"
    when no accelerator is present, and the trainer and metrics then call
    ``set_device``, ``memory_stats``, ``get_device_properties`` … on it.
    """

    @staticmethod
    def set_device(device) -> None:
        return None

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def synchronize(device=None) -> None:
        return None

    @staticmethod
    def get_device_name(device=None) -> str:
        return "cpu"

    @staticmethod
    def get_device_properties(device=None) -> "_CpuProperties":
        return _CpuProperties()

    @staticmethod
    def memory_stats(device=None) -> dict[str, int]:
        return {
            "active_bytes.all.peak": 0,
            "reserved_bytes.all.peak": 0,
            "num_alloc_retries": 0,
            "num_ooms": 0,
        }

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None


class _CpuProperties:
    """What ``DeviceMemoryMonitor`` reads from ``get_device_properties``."""

    def __init__(self) -> None:
        self.total_memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        self.name = "cpu"


def _patch_device_type() -> None:
    """Point every torchtitan copy of device_type/device_module at the CPU."""
    import importlib

    from recipes.titan import device_utils as utils

    utils.device_type = "cpu"
    utils.device_module = CpuDeviceModule
    utils.get_device_info = lambda: ("cpu", CpuDeviceModule)
    utils.get_local_device = lambda: torch.device("cpu")
    for name in _DEVICE_COPIES:
        module = importlib.import_module(name)
        if hasattr(module, "device_type"):
            module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = CpuDeviceModule
        if hasattr(module, "get_local_device"):
            module.get_local_device = utils.get_local_device


def _patch_fsdp_sum_reduction() -> None:
    """Keep FSDP2's gradient reduce-scatter on an op gloo implements.

    Upstream: torchtitan calls ``set_gradient_divide_factor(1.0)`` on every FSDP
    module; FSDP2 then reduce-scatters with ``ReduceOp.PREMUL_SUM``, which gloo
    rejects. Forcing SUM reduction with a divide factor of 1.0 is the same math.
    """
    from torch.distributed.fsdp import FSDPModule

    original = FSDPModule.set_gradient_divide_factor
    if getattr(original, "_qwen3_trn_repro", False):
        return

    def set_gradient_divide_factor(self, factor: float) -> None:
        original(self, factor)
        self.set_force_sum_reduction_for_comms(True)

    set_gradient_divide_factor._qwen3_trn_repro = True
    FSDPModule.set_gradient_divide_factor = set_gradient_divide_factor


def install() -> None:
    """Make this process a cpu-tier torchtitan process. Idempotent."""
    global _installed
    if _installed:
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    _patch_device_type()
    _patch_fsdp_sum_reduction()
    _installed = True

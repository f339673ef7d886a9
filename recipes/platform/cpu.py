"""The cpu tier: run real torchtitan 0.3.0 on CPU processes with gloo.

torchtitan is written for accelerators. Each patch below is the smallest change
that lets the unmodified trainer run on CPU, and each has a canary test in
``tests/cpu/test_platform.py`` (``test_canary_*``) that fails once upstream no longer
needs it, so the patch can be deleted.

``install()`` must run before anything imports torchtitan: several torchtitan
modules copy ``device_type`` / ``device_module`` by value at import time.

Each patch first checks the upstream shape it relies on (``recipes.upstream_shape``):
after a bump that moved it, it fails with one line naming the package, its version
and the patch, instead of patching nothing or failing from inside.
"""

from __future__ import annotations

import importlib
import os

import torch
from torch.distributed.fsdp import FSDPModule

from recipes.platform.device_copies import DEVICE_COPIES
from recipes.upstream_shape import require, require_attributes

_installed = False

DEVICE_WORKAROUND = "recipes.platform.cpu._patch_device_type"
FSDP_WORKAROUND = "recipes.platform.cpu._patch_fsdp_sum_reduction"
#: What the device patch overwrites in torchtitan.tools.utils (the source every copy is taken from).
DEVICE_ATTRIBUTES = ("device_type", "device_module", "get_device_info")
#: The FSDP2 methods the sum-reduction patch wraps and calls.
FSDP_METHODS = ("set_gradient_divide_factor", "set_force_sum_reduction_for_comms")


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


def check_device_utils(utils) -> None:
    """torchtitan.tools.utils still has the names the patch overwrites (else a "cuda" copy stays behind)."""
    require_attributes(
        utils, DEVICE_ATTRIBUTES, "torchtitan", DEVICE_WORKAROUND, "torchtitan.tools.utils"
    )


def import_device_copy(name: str):
    """Import one module that copies device_type, after utils is patched (so its copy is "cpu").

    A module torchtitan moved or removed is one line naming the patch, not a bare ``ModuleNotFoundError``.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is None or not name.startswith(e.name):
            raise  # something the module itself imports is missing: not this patch's shape
        require(
            False,
            "torchtitan",
            DEVICE_WORKAROUND,
            f"the module {name} (it copies device_type at import)",
        )


def _patch_device_type() -> None:
    """Point every torchtitan copy of device_type/device_module at the CPU."""
    from recipes.titan import device_utils as utils  # noqa: PLC0415 -- lazy: recipes.titan resolves torchtitan names on first use, after recipes.platform.install

    check_device_utils(utils)
    utils.device_type = "cpu"
    utils.device_module = CpuDeviceModule
    utils.get_device_info = lambda: ("cpu", CpuDeviceModule)
    utils.get_local_device = lambda: torch.device("cpu")
    for name in DEVICE_COPIES:
        module = import_device_copy(name)
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

    require_attributes(FSDPModule, FSDP_METHODS, "torch", FSDP_WORKAROUND, "FSDPModule")
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

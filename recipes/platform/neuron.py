"""Neuron detection: what a trn2 run needs, and a precise reason when it is missing.

Nothing here imports a Neuron package at module import time, so the cpu tier
and test collection work on machines without them.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from recipes.errors import RecipeError
from recipes.platform import neuron_versions
from recipes.platform.device_copies import repoint_imported_device_copies
from recipes.tiers import REHEARSAL_SETTINGS_ENV, rehearsal_settings  # noqa: F401 -- the seam's name, re-exported

#: The device type torch-neuronx registers (PrivateUse1 renamed "neuron"; recipes.platform.on_neuron).
NEURON_DEVICE_TYPE = "neuron"

#: ``NEURON_LOGICAL_NC_CONFIG``: physical cores per logical NeuronCore. trn2 defaults to 2.
DEFAULT_LNC = 2
VALID_LNC = (1, 2)

#: Python packages the trn2 tier imports, and which pinned distribution provides each: from
#: recipes/platform/neuron_versions.py (requirements-neuron.txt), e.g. nkilib is bundled in neuronx-cc.
NEURON_PACKAGES = {
    module: neuron_versions.module_hint(module) for module in neuron_versions.MODULES
}


class LNCError(RecipeError):
    """NEURON_LOGICAL_NC_CONFIG holds a value trn2 does not support."""


def logical_neuron_cores() -> int:
    """LNC from ``NEURON_LOGICAL_NC_CONFIG`` (1 or 2); trn2's default is 2."""
    raw = os.environ.get("NEURON_LOGICAL_NC_CONFIG", str(DEFAULT_LNC)).strip()
    try:
        lnc = int(raw)
    except ValueError:
        lnc = None
    if lnc not in VALID_LNC:
        raise LNCError(
            f"NEURON_LOGICAL_NC_CONFIG={raw!r} is not a supported logical NeuronCore "
            f"size; set it to 1 or 2 (trn2 default: {DEFAULT_LNC}) or unset it."
        )
    return lnc


#: ``QWEN3_HIDE_NEURON_DEVICES=1``: this process and its children see no Neuron device. The cpu
#: tier's tests set it (tests/cpu/conftest.py), so they run the same on a trn2 instance as anywhere.
HIDE_DEVICES_ENV = "QWEN3_HIDE_NEURON_DEVICES"


def device_nodes() -> list[str]:
    """``/dev/neuron*`` character devices: one per Neuron device (16 on trn2.48xlarge); none when hidden."""
    if os.environ.get(HIDE_DEVICES_ENV) == "1":
        return []
    rehearsal = (
        rehearsal_settings()
    )  # the cpu rehearsal's fake nodes; refused where a real /dev/neuron* exists
    if rehearsal is not None:
        return rehearsal.device_nodes()
    return sorted(glob.glob("/dev/neuron[0-9]*"))


class NeuronDetectionError(RecipeError):
    """``neuron-ls`` is missing, or its report does not add up."""


def neuron_ls() -> list[dict] | None:
    """``neuron-ls -j`` parsed, or None when the tool is absent or fails."""
    exe = shutil.which("neuron-ls")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-j"], capture_output=True, text=True, timeout=30, check=True)
        return json.loads(out.stdout)
    except (subprocess.SubprocessError, json.JSONDecodeError, OSError):
        return None


def _device_logical_cores(device: dict) -> int:
    """Logical NeuronCores of one ``neuron-ls -j`` device, as neuron-ls configured them.

    aws-neuron/aws-neuron-sdk tools/neuron-sys-tools/neuron-ls.rst: since the
    JSON output exists (``-j``), each device reports ``nc_count`` (4 on trn2 at
    ``logical_neuroncore_config`` 2: already *logical* cores) and, in current
    versions, ``neuroncore_ids`` (the ids ``NEURON_RT_VISIBLE_CORES`` takes, 0-63
    over 16 devices). Older pages showed the physical count (8) in the table with
    a separate LOGICAL NC column. ``neuroncore_ids`` is unambiguous, so it wins;
    an ``nc_count`` that disagrees with it is an error rather than a guess.
    """
    name = f"neuron-ls device {device.get('neuron_device', '?')}"
    ids = device.get("neuroncore_ids")
    count = device.get("nc_count")
    if ids is not None:
        if count is not None and int(count) != len(ids):
            raise NeuronDetectionError(
                f"{name}: nc_count={count} but neuroncore_ids lists {len(ids)} cores; "
                "this neuron-ls reports cores in a way the suite does not know: update aws-neuronx-tools"
            )
        return len(ids)
    if count is None:
        raise NeuronDetectionError(
            f"{name} reports neither nc_count nor neuroncore_ids: update aws-neuronx-tools"
        )
    return int(count)


def logical_core_count(devices: list[dict] | None = None, lnc: int | None = None) -> int:
    """Logical NeuronCores this process can address at its LNC (64 on trn2.48xlarge at LNC=2).

    neuron-ls counts at its own ``logical_neuroncore_config`` (1 when absent: trn1/inf2);
    when this process runs at another LNC (``NEURON_LOGICAL_NC_CONFIG``), the same
    physical cores group differently: count × reported LNC / our LNC.
    """
    devices = neuron_ls() if devices is None else devices
    if not devices:
        raise NeuronDetectionError(
            "neuron-ls -j found no Neuron device (or is not installed): install aws-neuronx-tools "
            "on the trn2 instance so the suite can count NeuronCores"
        )
    lnc = logical_neuron_cores() if lnc is None else lnc
    total = 0
    for device in devices:
        reported_lnc = int(device.get("logical_neuroncore_config") or 1)
        physical = _device_logical_cores(device) * reported_lnc
        if physical % lnc:
            raise NeuronDetectionError(
                f"neuron-ls device {device.get('neuron_device', '?')} has {physical} physical cores, "
                f"which LNC={lnc} cannot group; set NEURON_LOGICAL_NC_CONFIG to {reported_lnc}"
            )
        total += physical // lnc
    return total


def parse_visible_cores(value: str) -> list[int]:
    """``NEURON_RT_VISIBLE_CORES`` ("3", "0-15", "0,2,4-7") as a list of core ids."""
    cores: list[int] = []
    for part in (p.strip() for p in value.split(",")):
        first, _, last = part.partition("-")
        try:
            lo, hi = int(first), int(last or first)
        except ValueError:
            raise ValueError(
                f"NEURON_RT_VISIBLE_CORES={value!r}: {part!r} is not a core index or range"
            ) from None
        if lo < 0 or hi < lo:
            raise ValueError(
                f"NEURON_RT_VISIBLE_CORES={value!r}: {part!r} is not an ascending range"
            )
        cores.extend(range(lo, hi + 1))
    return cores


def worker_cores(worker: int, workers: int, total: int) -> str:
    """Disjoint ``NEURON_RT_VISIBLE_CORES`` for xdist worker ``worker`` of ``workers``."""
    if workers > total:
        raise ValueError(
            f"{workers} test workers cannot each get a NeuronCore of {total}; use -n {total} or fewer"
        )
    per = total // workers
    first = worker * per
    return f"{first}-{first + per - 1}" if per > 1 else str(first)


def has_package(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@dataclass
class NeuronStatus:
    """What this machine has of the trn2 tier; ``missing`` names every gap."""

    devices: list[str] = field(default_factory=list)
    packages: dict[str, bool] = field(default_factory=dict)
    weights_gap: str | None = None

    @property
    def missing(self) -> list[str]:
        gaps = []
        if not self.devices:
            gaps.append("no Neuron device (/dev/neuron* is absent: not a trn2 instance)")
        for pkg, present in self.packages.items():
            if not present:
                gaps.append(f"package '{pkg}' is not installed ({NEURON_PACKAGES[pkg]})")
        if self.weights_gap:
            gaps.append(self.weights_gap)
        return gaps

    @property
    def ready(self) -> bool:
        return not self.missing

    def reason(self) -> str:
        if self.ready:
            return "Neuron device and packages present"
        return "; ".join(self.missing) + ". Set up a trn2 instance with `make neuron-venv`."


#: Where the trn2 tier finds Qwen3-4B-Instruct-2507 (a local copy; nothing is downloaded).
WEIGHTS_ENV = "QWEN3_4B_DIR"


def weights_gap(env: str = WEIGHTS_ENV) -> str | None:
    """Why ``$env`` cannot serve as the published weights, or None when it can."""
    value = os.environ.get(env)
    if not value:
        return f"{env} is not set (point it at a local copy of Qwen/Qwen3-4B-Instruct-2507)"
    if not glob.glob(os.path.join(value, "*.safetensors")):
        return f"{env}={value} holds no *.safetensors"
    return None


def neuron_status(
    packages: tuple[str, ...] = ("torch_neuronx",), needs_weights: bool = False
) -> NeuronStatus:
    return NeuronStatus(
        devices=device_nodes(),
        packages={p: has_package(p) for p in packages},
        weights_gap=weights_gap() if needs_weights else None,
    )


#: Logical NeuronCores each torchrun rank gets: the trn2 tier runs one rank per logical core (64 at LNC=2).
CORES_PER_RANK = 1


def rank_cores(local_rank: int, per_rank: int = CORES_PER_RANK) -> str:
    """``NEURON_RT_VISIBLE_CORES`` for local rank ``local_rank``: its own ``per_rank`` cores, "3" or "6-7"."""
    first = local_rank * per_rank
    return f"{first}-{first + per_rank - 1}" if per_rank > 1 else str(first)


def set_rank_cores(environ=os.environ) -> str | None:
    """Give this torchrun rank its own cores before the Neuron runtime starts; the value set, else None.

    The runtime reserves, at its start, every core of the host for the process unless
    ``NEURON_RT_VISIBLE_CORES`` names a slice, and a reserved core "cannot be used by another process at
    all" until that process ends (aws-neuron/aws-neuron-sdk neuron-runtime/guides/configuration-guide.rst,
    "NeuronCore allocation"; the variable: one index or an inclusive range, neuron-runtime/
    nrt-configurable-parameters.rst). Its indices are logical cores: at LNC=2 a trn2.48xlarge numbers
    them 0-63 across its 16 devices (tools/neuron-sys-tools/neuron-ls.rst, ``neuroncore_ids``). Whether
    torch_neuronx maps LOCAL_RANK itself is not documented (harness.checks.preflight.check_visible_cores),
    so the suite sets LOCAL_RANK x ``CORES_PER_RANK`` itself, on both rank entries (harness.rank.train and
    torchtitan's own, through the recipe's config function): the same value the public copy would set.
    A value the user set is kept (the launcher's preflight checks it); outside a torchrun rank
    (no LOCAL_RANK: the launcher, a test's child) nothing is set.
    """
    local_rank = environ.get("LOCAL_RANK")
    if local_rank is None or environ.get("NEURON_RT_VISIBLE_CORES"):
        return None
    environ["NEURON_RT_VISIBLE_CORES"] = rank_cores(int(local_rank))
    return environ["NEURON_RT_VISIBLE_CORES"]


def install() -> None:
    """Make this process a trn2-tier process: register the 'neuron' device and backend.

    ``import torch_neuronx`` registers PrivateUse1 as ``neuron`` with the ``torch.neuron`` device
    module (aws-neuron/aws-neuron-sdk torch/reference/api/torch-neuron-module.rst, "How the module
    is registered"; torch also autoloads it on ``import torch`` unless TORCH_DEVICE_BACKEND_AUTOLOAD=0)
    and the "neuron" process-group backend, which torchtitan then picks up as its device type.
    A public development copy also sets NEURON_RT_VISIBLE_CORES to LOCAL_RANK when unset, at the process
    group's creation (parmoham-aws/test-repo-parmoham torch_neuronx/distributed/backend.py,
    ``_set_rt_visible_cores``); the released 2.14.3 is not public (harness.checks.preflight.check_visible_cores).
    """
    logical_neuron_cores()  # refuse a bad LNC before the runtime reads it
    set_rank_cores()  # before the runtime starts (at the first device tensor)
    import torch_neuronx  # noqa: PLC0415, F401 -- optional: only on trn2

    point_torchtitan_at_neuron()


def point_torchtitan_at_neuron() -> None:
    """When torchtitan was imported before torch_neuronx, compute its device again and repoint its copies.

    torchtitan.tools.utils computes ``device_type`` once, at its import, from torch's registered
    backends (``torch._utils._get_available_device_type``), falling back to "cuda". ``torchrun -m
    torchtitan.train --module recipes.native_qwen3`` imports torchtitan before this module's
    ``install`` runs (from the config function), so with torch's device-backend autoload off
    (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) it had fixed "cuda"; after ``import torch_neuronx`` the
    same function answers "neuron". Nothing imported yet: nothing to do.
    """

    utils = sys.modules.get("torchtitan.tools.utils")
    if utils is None or utils.device_type == NEURON_DEVICE_TYPE:
        return
    device_type, device_module = utils.get_device_info()
    if device_type == NEURON_DEVICE_TYPE:
        repoint_imported_device_copies(device_type, device_module)

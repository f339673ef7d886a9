"""The rehearsal's one seam: fake device nodes, rank count, tiny sizes and the stand-ins' switches.

A rehearsal sets ``QWEN3_REHEARSAL_SETTINGS=<json file>``; the file holds the fields of
:class:`RehearsalSettings` (any subset, the rest default)::

    {"device_dir": "/tmp/rh/dev", "neuron_devices": 1, "cores_per_device": 2, "lnc": 2,
     "ranks": 2, "sizes": {"seq_len": 256}, "switches": {"QWEN3_STANDIN_AUTOLOAD": "1"}}

recipes/platform/neuron.py reads it in one place (``device_nodes``, by file path: the product
never imports this package); the stand-in packages read only their ``QWEN3_STANDIN_*``
variables, which :meth:`RehearsalSettings.env` exports. :func:`load` refuses to act on a host
that has a real ``/dev/neuron*``: the real night cannot reach a stand-in through this file.

This module imports nothing outside the standard library (the stand-in neuron-ls loads it by path).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

#: The variable a rehearsal sets; unset, nothing in the suite looks at this module.
SETTINGS_ENV = "QWEN3_REHEARSAL_SETTINGS"
#: Where a real trn2 host has its Neuron devices (recipes/platform/neuron.py globs the same).
REAL_DEVICE_GLOB = "/dev/neuron[0-9]*"

#: Each switch of a stand-in: a behaviour of the real package that no cited public source confirms
#: for the pinned release, so a rehearsal runs both settings. Values are "0" or "1".
SWITCHES = {
    # torch_neuronx registered under torch's ``torch.backends`` entry-point group, so ``import torch``
    # imports it (pytorch/tutorials advanced_source/python_extension_autoload.rst). A public copy of
    # torch_neuronx (parmoham-aws/test-repo-parmoham torch_neuronx/__init__.py) defines ``_autoload``;
    # its setup.py was not read to the entry point, and the 2.14.3 wheel is not public.
    "QWEN3_STANDIN_AUTOLOAD": "1",
    # NEURON_RT_VISIBLE_CORES set to LOCAL_RANK when unset, at the "neuron" process group's creation
    # (parmoham-aws/test-repo-parmoham torch_neuronx/distributed/backend.py, ``_set_rt_visible_cores``);
    # that is a public development copy (version 0.1.0), not the released 2.14.3.
    "QWEN3_STANDIN_LOCAL_RANK_CORES": "1",
    # Random ops on ``neuron`` draw from the device generator's [seed, offset] (as DTensor's RNG tracker assumes
    # of a CUDA-like device), not from the CPU generator. The public copy falls back to the CPU (its
    # tests/device/test_rng_state.py xfail: "will pass once native Neuron random ops are implemented"); with
    # that, torch 2.14's trunc_normal_ never returns on a sharded parameter (torch_neuronx/_cpu_device.py).
    "QWEN3_STANDIN_DEVICE_RANDOM": "1",
    # torch_neuronx's wrap_nki hands an NKI kernel packed copies of non-contiguous tensors. The kernels read packed
    # row-major memory (aws-neuron/nki-library core/embeddings/rope_hf.py:124-143, 251-265: access patterns from the
    # shape alone). The public development copy makes inputs contiguous only with its prologue off
    # (parmoham-aws/test-repo-parmoham torch_neuronx/python_ops/processors/argument_processor.py:96-98); its default
    # prologue path is not public. "0" (default, strict): handed as they are, refused by the stand-in kernels.
    "QWEN3_STANDIN_WRAP_NKI_CONTIGUOUS": "0",
    # wrap_nki hands back an output argument the kernel wrote and returned as the very tensor the caller passed.
    # The public copy returns tensors it allocates from the kernel's return types and writes an argument only when
    # the kernel reports aliasing (torch_neuronx/python_ops/torch_mlir/nki_op_impl.py); "0": new tensors come
    # back and the passed output arguments stay unwritten (the suite must read what the kernel returns).
    "QWEN3_STANDIN_WRAP_NKI_RETURNS_ARGUMENT": "1",
}
#: Faults a rehearsal may inject into one stand-in kernel (``QWEN3_STANDIN_FAULT``), to see a test fail.
FAULTS = ("", "rope_hf", "moe_cte", "blockwise_mm_bwd")


class RehearsalSettingsError(ValueError):
    """The settings file is missing, malformed, or this host has a real Neuron device."""


@dataclass
class RehearsalSettings:
    """What the rehearsal pretends the trn2 host is, and how the stand-ins behave."""

    device_dir: str = ""
    """Directory of fake device nodes (files ``neuron0`` ...); empty: none are made."""
    neuron_devices: int = 1
    """Neuron devices the stand-in neuron-ls reports (16 on a trn2.48xlarge)."""
    cores_per_device: int = 2
    """Logical NeuronCores per device at ``lnc`` (4 at LNC=2 on trn2), so the host has devices x this."""
    lnc: int = 2
    """The ``logical_neuroncore_config`` neuron-ls reports."""
    ranks: int = 2
    """Ranks of each of the night's launches (64 on the real host)."""
    sizes: dict = field(default_factory=dict)
    """Tiny sizes the runner substitutes for the night's (free-form: seq_len, steps, ...)."""
    switches: dict = field(default_factory=lambda: dict(SWITCHES))
    """``QWEN3_STANDIN_*`` values; a missing one takes :data:`SWITCHES`' default."""
    fault: str = ""
    """One of :data:`FAULTS`: a stand-in kernel made wrong on purpose."""

    def __post_init__(self) -> None:
        for name in ("neuron_devices", "cores_per_device", "lnc", "ranks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RehearsalSettingsError(
                    f"rehearsal settings: {name}={value!r} must be a positive integer"
                )
        if self.lnc not in (1, 2):
            raise RehearsalSettingsError(
                f"rehearsal settings: lnc={self.lnc!r} must be 1 or 2, as on trn2"
            )
        unknown = sorted(set(self.switches) - set(SWITCHES))
        if unknown:
            raise RehearsalSettingsError(
                f"rehearsal settings: unknown switches {unknown}; known: {sorted(SWITCHES)}"
            )
        bad = {k: v for k, v in self.switches.items() if v not in ("0", "1")}
        if bad:
            raise RehearsalSettingsError(
                f"rehearsal settings: switches {bad} must be the strings '0' or '1'"
            )
        if self.fault not in FAULTS:
            raise RehearsalSettingsError(
                f"rehearsal settings: fault={self.fault!r} is not one of {FAULTS}"
            )

    @property
    def total_cores(self) -> int:
        return self.neuron_devices * self.cores_per_device

    def device_nodes(self) -> list[str]:
        """The fake ``neuron<i>`` nodes, created on first use (files, not devices), sorted as a glob returns them."""
        if not self.device_dir:
            return []
        root = Path(self.device_dir)
        root.mkdir(parents=True, exist_ok=True)
        for i in range(self.neuron_devices):
            (root / f"neuron{i}").touch()
        return sorted(str(p) for p in root.glob("neuron[0-9]*"))

    def neuron_ls(self) -> list[dict]:
        """``neuron-ls -j`` as aws-neuron/aws-neuron-sdk tools/neuron-sys-tools/neuron-ls.rst documents its
        fields (one object per device: ``neuron_device``, ``nc_count`` logical cores at
        ``logical_neuroncore_config``, ``neuroncore_ids``), sized by these settings."""
        per = self.cores_per_device
        return [
            {
                "neuron_device": d,
                "bdf": f"{0xCC - d:02x}:00.0",
                "connected_to": [],
                "nc_count": per,
                "logical_neuroncore_config": self.lnc,
                "neuroncore_ids": list(range(d * per, (d + 1) * per)),
                "memory_size": 96 * 2**30,
                "neuron_processes": [],
            }
            for d in range(self.neuron_devices)
        ]

    def env(self) -> dict[str, str]:
        """What a rehearsal process exports: the settings file stays named, the stand-ins' switches set."""
        out = {**SWITCHES, **self.switches}
        out["QWEN3_STANDIN_FAULT"] = self.fault
        out["QWEN3_STANDIN_CORES"] = str(self.total_cores)
        if (
            self.device_dir
        ):  # the night's processes reserve cores in one place (torch_neuronx/_runtime.py)
            out["QWEN3_STANDIN_CORE_LOCKS"] = str(Path(self.device_dir).parent / "core-locks")
            out["QWEN3_STANDIN_DEVICE_DIR"] = (
                self.device_dir
            )  # its runtime opens them (_runtime.py)
        return out

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)


def refuse_on_real_host(real_glob: str = REAL_DEVICE_GLOB) -> None:
    """Raise when this host has a real Neuron device: a rehearsal never runs where the real night does."""
    real = sorted(glob.glob(real_glob))
    if real:
        raise RehearsalSettingsError(
            f"{SETTINGS_ENV} is set on a host with real Neuron devices ({', '.join(real[:3])}...): the rehearsal's "
            f"stand-ins never run on trn2. Unset {SETTINGS_ENV} for the real night."
        )


def load(
    path: str | os.PathLike | None = None, *, real_glob: str = REAL_DEVICE_GLOB
) -> RehearsalSettings:
    """The settings named by ``$QWEN3_REHEARSAL_SETTINGS`` (or ``path``); refuses on a real trn2 host."""
    refuse_on_real_host(real_glob)
    path = path or os.environ.get(SETTINGS_ENV)
    if not path:
        raise RehearsalSettingsError(
            f"{SETTINGS_ENV} is not set: point it at a rehearsal settings JSON file"
        )
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise RehearsalSettingsError(
            f"{SETTINGS_ENV}={path}: cannot read it ({e.strerror})"
        ) from None
    except json.JSONDecodeError as e:
        raise RehearsalSettingsError(
            f"{SETTINGS_ENV}={path}: not JSON ({e}); write an object of settings"
        ) from None
    if not isinstance(data, dict):
        raise RehearsalSettingsError(
            f"{path}: holds {type(data).__name__}, expected an object of settings"
        )
    names = {f.name for f in dataclasses.fields(RehearsalSettings)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise RehearsalSettingsError(f"{path}: unknown keys {unknown}; known: {sorted(names)}")
    return RehearsalSettings(**data)

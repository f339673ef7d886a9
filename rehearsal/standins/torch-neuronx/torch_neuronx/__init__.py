"""REHEARSAL STAND-IN for torch_neuronx (TorchNeuron): the ``neuron`` device, computed on the CPU.

Copies the names the suite uses from the public development copy of torch_neuronx
(parmoham-aws/test-repo-parmoham torch_neuronx/__init__.py; aws-neuron/torch-neuronx is not
public): ``_autoload`` (the ``torch.backends`` entry point), PrivateUse1 renamed ``neuron`` with
``torch.neuron`` registered as its device module, ``nki_op``/``wrap_nki`` re-exported from
``nki_hop``, ``device_count``/``current_device``/``set_device``/``synchronize``, and the ``neuron``
process-group backend (``torch_neuronx.distributed``). Tensors on ``neuron`` are CPU tensors in
a wrapper (:mod:`torch_neuronx._cpu_device`); nothing here is a Neuron measurement.

Switches (rehearsal/settings.py ``SWITCHES``): ``QWEN3_STANDIN_AUTOLOAD=0`` makes ``_autoload`` a
no-op (as if the wheel registered no entry point); ``QWEN3_STANDIN_LOCAL_RANK_CORES=0`` stops the
process group from setting ``NEURON_RT_VISIBLE_CORES`` from ``LOCAL_RANK``.
"""

from __future__ import annotations

__version__ = "2.14.3.0"
STANDIN = True  # the stand-in says what it is; the real package has no such name

#: Set by the autoload shim (``torch_neuronx_autoload``) when torch's entry point imported this package.
autoloaded = False


def _autoload() -> None:
    """The public copy's entry-point function (parmoham-aws/test-repo-parmoham torch_neuronx/__init__.py);
    importing the package did the work. The stand-in's entry point is the shim module instead, so that
    ``QWEN3_STANDIN_AUTOLOAD=0`` can keep the package unimported (loading ``torch_neuronx:_autoload``
    itself would import it whatever the function does)."""


import torch  # noqa: E402, F401 -- as the real package, which imports torch before its device modules

from . import _cpu_device, neuron  # noqa: E402

_cpu_device.install(neuron)

from . import distributed  # noqa: E402,F401  registers the "neuron" process-group backend
from .nki_hop import nki_op, wrap_nki  # noqa: E402,F401


def device_count() -> int:
    """Visible logical NeuronCores (public copy: ``_C._neuron_getDeviceCount``)."""
    return neuron.device_count()


def current_device() -> int:
    return neuron.current_device()


def set_device(device: int) -> None:
    neuron.set_device(device)


def is_available() -> bool:
    return neuron.is_available()


def synchronize(device=None) -> None:
    """Nothing is asynchronous on the CPU."""


def get_device_properties(device=0):
    return neuron.get_device_properties(device)


def empty_cache() -> None:
    """No caching allocator on the CPU."""


def memory_stats(device=None) -> dict:
    return neuron.memory_stats(device)


def reset_peak_memory_stats(device=None) -> None:
    neuron.reset_peak_memory_stats(device)


def is_neuron_runtime_initialized() -> bool:
    return True

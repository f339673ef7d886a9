"""REHEARSAL STAND-IN shim: the ``torch.backends`` entry point of the torch-neuronx stand-in.

torch imports every ``torch.backends`` entry point at the end of ``import torch`` unless
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (pytorch/tutorials advanced_source/python_extension_autoload.rst;
torch's own example: pytorch/pytorch test/cpp_extensions/open_registration_extension/torch_openreg,
whose ``_autoload`` renames PrivateUse1 and registers the device module).
Whether the released torch-neuronx 2.14.3 registers one is not public, so this is a switch:
``QWEN3_STANDIN_AUTOLOAD=1`` (default) imports torch_neuronx here, ``0`` leaves it unimported.
"""

import os

SWITCH = "QWEN3_STANDIN_AUTOLOAD"


def _autoload() -> None:
    if os.environ.get(SWITCH, "1") != "1":
        return
    import torch_neuronx  # noqa: PLC0415 -- the autoload hook: importing torch_neuronx is what it does, and only when switched on

    torch_neuronx.autoloaded = True

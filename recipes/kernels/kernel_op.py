"""A kernel's custom op: torch_neuronx's ``nki_op`` where torch_neuronx runs, ``torch.library.custom_op`` elsewhere.

The tutorial registers its kernels with ``wrap_nki`` + ``nki_op`` + ``register_autograd``.
``nki_op`` is not ``torch.library.custom_op`` under another name, in eager mode either:
the public copy of torch_neuronx/nki_hop.py (parmoham-aws/test-repo-parmoham;
aws-neuron/torch-neuronx itself is not readable here) builds
``custom_op(name, backend_fn, schema=infer_schema(fn))`` whose ``backend_fn`` runs the
body under ``set_wrap_nki_enabled(False)`` ("bypass the HOP outside of torch.compile"),
registers the body itself as the fake implementation, and adds a
``FunctionalTensorMode`` rule (aws-neuron/aws-neuron-sdk torch/guides/how-to-work-with-nki.rst
documents ``@nki_op`` + ``register_autograd`` as the way). So on trn2 the op is an ``nki_op``.
Open question: in that public copy ``NKIHOPCaller.__call__`` never reads the flag, so there the
eager difference is the fake and the functional rule only; what the released torch-neuronx 2.14.3
does with it is not public.

It cannot be one at import: recipes must import where torch_neuronx is absent (the cpu
tier) and must not import torch_neuronx merely by being imported (the pytest process on
trn2 collects every test module, and never touches the device). A :class:`KernelOp` is
therefore defined on first use: with ``nki_op`` when torch_neuronx is already loaded in
the process (every trn2 process installs the platform before it builds a model:
``recipes.platform.neuron.install``), with ``torch.library.custom_op`` otherwise, from the
same body, with an explicit fake and the same autograd. A device path calls
:meth:`KernelOp.require_nki_op`, so the kernels never run through the other flavour.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Mapping

import torch

#: How a :class:`KernelOp` was defined.
NKI_OP = "torch_neuronx.nki_hop.nki_op"
CUSTOM_OP = "torch.library.custom_op"


class KernelOp:
    """One custom op ``name`` (``namespace::op``), defined on first use; calling it calls the op."""

    def __init__(
        self,
        name: str,
        body: Callable,
        *,
        fake: Callable,
        backward: Callable,
        setup_context: Callable,
    ):
        self.name, self.body, self.fake = name, body, fake
        self.backward, self.setup_context = backward, setup_context
        self.flavour: str | None = None

    @functools.cached_property
    def op(self):
        """The ``CustomOpDef``: ``nki_op`` if torch_neuronx is loaded here, else ``torch.library.custom_op``."""
        if "torch_neuronx" in sys.modules:
            nki_op = importlib.import_module("torch_neuronx.nki_hop").nki_op
            op = nki_op(self.name, self.body, mutates_args=())  # registers the body as its fake
            self.flavour = NKI_OP
        else:
            op = torch.library.custom_op(self.name, self.body, mutates_args=())
            op.register_fake(self.fake)
            self.flavour = CUSTOM_OP
        op.register_autograd(self.backward, setup_context=self.setup_context)
        return op

    def __call__(self, *args):
        return self.op(*args)

    def require_nki_op(self) -> None:
        """On the device: refuse to run the kernel through an op that was defined before torch_neuronx was loaded."""
        if self.flavour != NKI_OP:
            raise RuntimeError(
                f"{self.name} was defined as {self.flavour} because torch_neuronx was not loaded when it was first "
                f"used; on trn2 it must be {NKI_OP}. Install the trn2 platform (recipes.platform.install('trn2')) "
                "before the first call."
            )


def require_hashable(kernel: str, constants: Mapping[str, object]) -> None:
    """Refuse a non-tensor kernel argument torch_neuronx cannot hash, naming it, before any launch.

    torch_neuronx keys every NKI kernel call on its non-tensor arguments: each is hashed
    into the kernel's cache key (public copy of torch_neuronx/nki_kernel.py,
    ``TorchNeuronNKIKernelV2._return_shape_dtype_or_hashable`` raises
    ``err_nki_param_not_hashable``; nki_hop.py ``get_dconfig_and_tensor_args``). A
    ``@dataclass`` that is not frozen has ``__hash__ = None``.
    """
    for name, value in constants.items():
        try:
            hash(value)
        except TypeError:
            raise TypeError(
                f"{kernel}: the constant argument {name}={type(value).__name__}(...) is not hashable, and "
                "torch_neuronx hashes every non-tensor argument of a wrap_nki kernel call; pass hashable values "
                "(ints, bools, enums) and build config objects inside the kernel"
            ) from None

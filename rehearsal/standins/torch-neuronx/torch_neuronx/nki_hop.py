"""``torch_neuronx.nki_hop`` (stand-in): ``wrap_nki``, ``NKIHOPCaller``, ``nki_op``.

Signatures and behaviour the suite relies on are copied from the public development copy
(parmoham-aws/test-repo-parmoham torch_neuronx/nki_hop.py):

* ``wrap_nki(nki_kernel, **kwargs)`` reads ``nki_kernel.sign`` (an ``inspect.Signature``) and
  ``nki_kernel.func`` and returns ``NKIHOPCaller(kernel_idx, [], arg_names, kernel_default_args)``;
* ``NKIHOPCaller.__getitem__(grid)`` does ``tuple(map(int, grid))`` (an int grid raises TypeError,
  as there); ``__call__(*args, **kwargs)`` merges positional names, keywords and defaults;
* ``nki_op(name, fn=None, mutates_args={})`` is ``custom_op(name, backend_fn, mutates_args=...,
  schema=infer_schema(fn, mutates_args=...))`` with ``fn`` registered as the fake, so the result
  has ``register_autograd`` like any ``CustomOpDef``.

The stand-in runs the kernel eagerly: it calls ``nki_kernel`` (the stand-in ``nki.jit`` object, whose
body computes with torch) with the launch grid set, instead of tracing it to a NEFF. As a kernel reads
and writes device memory directly, the body gets the neuron tensors' CPU payloads (no per-op dispatch
through the stand-in device); what it returns is handed back on ``neuron``, an output argument it wrote
and returned as the very tensor the caller passed (switch ``QWEN3_STANDIN_WRAP_NKI_RETURNS_ARGUMENT``; whether
``wrap_nki`` makes the kernel's inputs contiguous is the switch ``QWEN3_STANDIN_WRAP_NKI_CONTIGUOUS``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from torch._library.custom_ops import custom_op
from torch._library.infer_schema import infer_schema

NKIGridType = tuple[int, ...] | list[int]

wrap_nki_enabled = threading.local()
_kernels: dict[int, Any] = {}


def is_wrap_nki_enabled() -> bool:
    return getattr(wrap_nki_enabled, "value", True)


@contextlib.contextmanager
def set_wrap_nki_enabled(enabled: bool):
    prev = is_wrap_nki_enabled()
    wrap_nki_enabled.value = enabled
    try:
        yield
    finally:
        wrap_nki_enabled.value = prev


class NKIHOPCaller:
    """A ``wrap_nki`` kernel: ``caller[grid](*args, **kwargs)``."""

    def __init__(
        self,
        kernel_idx: int | None,
        grid: NKIGridType | None,
        kernel_arg_names: list[str],
        kernel_default_args: dict[str, Any],
    ) -> None:
        self.kernel_idx = kernel_idx
        self.grid = [] if grid is None else grid
        self.kernel_arg_names = kernel_arg_names
        self.kernel_default_args = kernel_default_args

    def __getitem__(self, grid: NKIGridType) -> NKIHOPCaller:
        grid = tuple(map(int, grid))
        return NKIHOPCaller(self.kernel_idx, grid, self.kernel_arg_names, self.kernel_default_args)

    def __call__(self, *args: Sequence[Any], **kwargs: dict[str, Any]) -> Any:
        combined = {**dict(zip(self.kernel_arg_names, args)), **kwargs}
        unknown = sorted(set(combined) - set(self.kernel_arg_names))
        if unknown:
            raise TypeError(
                f"wrap_nki kernel got unexpected arguments {unknown}; it takes {self.kernel_arg_names}"
            )
        for name in self.kernel_arg_names:
            if name not in combined:
                if name not in self.kernel_default_args:
                    raise TypeError(f"wrap_nki kernel is missing the argument {name!r}")
                combined[name] = self.kernel_default_args[name]
        for name, value in combined.items():
            if not hasattr(value, "shape"):
                hash(value)  # the real caller hashes every constant into the kernel's cache key
        kernel = _kernels[self.kernel_idx]
        return _on_device_memory(kernel[self.grid], combined)


#: Switch (rehearsal/settings.py SWITCHES): "1" hands the kernel packed copies of its non-contiguous tensors, as
#: the public development copy's argument processor does when its prologue is off
#: (parmoham-aws/test-repo-parmoham torch_neuronx/python_ops/processors/argument_processor.py:96-98); with the
#: prologue on (its default) what reaches an NKI kernel is not read anywhere public. "0" (default, strict): the
#: kernel gets the tensors as they are, and the stand-in kernels refuse one that is not packed row-major.
CONTIGUOUS_SWITCH = "QWEN3_STANDIN_WRAP_NKI_CONTIGUOUS"
#: Switch: "1" (default) an output argument the kernel writes and returns comes back as the very tensor the caller
#: passed; "0": what the kernel returns comes back as new tensors and the passed output arguments stay unwritten (the
#: public copy's NKITorchMlirOpImpl returns tensors it allocates from the kernel's return types,
#: torch_neuronx/python_ops/torch_mlir/nki_op_impl.py, and writes an argument only when the kernel reports aliasing).
RETURNS_ARGUMENT_SWITCH = "QWEN3_STANDIN_WRAP_NKI_RETURNS_ARGUMENT"


def _kernel_view(t):
    """The tensor a kernel body is handed for ``t`` (a CPU tensor), per the two switches."""
    if os.environ.get(RETURNS_ARGUMENT_SWITCH, "1") != "1":
        t = t.clone()  # keeps t's strides: the layout check still sees what the caller passed
    if os.environ.get(CONTIGUOUS_SWITCH, "0") == "1" and not t.is_contiguous():
        t = t.contiguous()
    return t


def _on_device_memory(launch: Callable, arguments: dict[str, Any]) -> Any:
    """``launch(**arguments)`` on the payloads of its neuron tensors; its tensors back on ``neuron``."""
    import torch  # noqa: PLC0415 -- read when a kernel runs (the stand-in loads during torch's own import)

    from torch_neuronx._cpu_device import NeuronTensor, _wrap  # noqa: PLC0415 -- circular: torch_neuronx._cpu_device imports this module

    def handed(v):
        if isinstance(v, NeuronTensor):
            return _kernel_view(v.payload)
        return _kernel_view(v) if isinstance(v, torch.Tensor) else v

    passed = {id(v.payload): v for v in arguments.values() if isinstance(v, NeuronTensor)}
    out = launch(**{k: handed(v) for k, v in arguments.items()})
    return _wrap(out, passed) if passed else out


def wrap_nki(nki_kernel, **kwargs) -> Any:
    """Allows capture of a nki kernel into a graph via torch.compile (here: an eager call)."""
    sig = nki_kernel.sign
    arg_names = list(sig.parameters.keys())
    defaults = {n: p.default for n, p in sig.parameters.items() if p.default is not p.empty}
    idx = len(_kernels)
    _kernels[idx] = nki_kernel
    return NKIHOPCaller(idx, [], arg_names, defaults)


def nki_op(
    name: str, fn: Callable | None = None, mutates_args: str | Iterable[str] = {}
) -> Callable:  # noqa: B006
    """Create a custom operator whose implementation is backed by NKI kernels (public copy's signature)."""

    def dec(fn: Callable):
        def backend_fn(*args, **kwargs):
            with set_wrap_nki_enabled(False):
                return fn(*args, **kwargs)

        result = custom_op(
            name,
            backend_fn,
            mutates_args=mutates_args,
            schema=infer_schema(fn, mutates_args=mutates_args),
        )
        result.register_fake(fn)
        return result

    return dec if fn is None else dec(fn)

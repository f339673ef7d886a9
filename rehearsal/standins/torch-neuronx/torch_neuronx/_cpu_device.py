"""The stand-in's ``neuron`` device: PrivateUse1 renamed ``neuron``, every tensor a CPU tensor in a wrapper.

How (torch 2.14): ``torch.utils.backend_registration._setup_privateuseone_for_python_backend``
(its docstring; pytorch/pytorch test/test_privateuseone_python_backend.py shows the pattern)
gives PrivateUse1 a Python device guard and hooks. A :class:`NeuronTensor` is a wrapper
subclass on ``neuron`` holding its CPU ``payload``; its ``__torch_dispatch__`` (below autograd)
runs each aten op on the payloads and wraps the results, so views alias their base's payload,
in-place ops mutate it, and autograd sees an ordinary device. Factory functions called with
``device="neuron"`` reach the PrivateUse1 key with no tensor to dispatch on: each has a
PrivateUse1 kernel that builds the CPU result and wraps it, and a boxed fallback catches the rest.

``untyped_storage``/``data_ptr`` are the payload's (FSDP2 frees and re-allocates parameter memory
through them). ``torch.autocast("neuron")`` is a pass-through (ops keep their inputs' dtypes). What it cannot do
(each a loud error, never a silent answer): pinned memory, device generators, streams with real ordering,
torch.compile graphs that lower to a Neuron backend, and any number that means "trn2".
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch.utils._pytree import tree_leaves

from . import _runtime

DEVICE_NAME = "neuron"
_CPU = torch.device("cpu")


def _is_neuron(device) -> bool:
    return device is not None and torch.device(device).type == DEVICE_NAME


class NeuronTensor(torch.Tensor):
    """A tensor on ``neuron:<i>`` whose data is the CPU tensor ``payload``."""

    payload: torch.Tensor

    @staticmethod
    def __new__(cls, payload: torch.Tensor, index: int = 0):
        t = torch.Tensor._make_wrapper_subclass(
            cls,
            payload.size(),
            strides=payload.stride(),
            storage_offset=payload.storage_offset(),
            dtype=payload.dtype,
            layout=payload.layout,
            device=torch.device(DEVICE_NAME, index),
            requires_grad=False,
        )
        t.payload = payload
        return t

    def __repr__(self, *, tensor_contents=None) -> str:
        return f"tensor({self.payload.tolist() if self.numel() <= 8 else '...'}, device='{self.device}', standin)"

    def tolist(self):
        """A device tensor's ``tolist`` copies to the host (torch refuses it for subclasses)."""
        return self.detach().cpu().tolist()

    def untyped_storage(self):
        """The device memory is the payload's: FSDP2 frees and re-allocates it with ``resize_``."""
        return self.payload.untyped_storage()

    def data_ptr(self) -> int:
        return self.payload.data_ptr()

    def __tensor_flatten__(self):
        """A traceable wrapper: ``nn.Module._apply`` swaps such parameters instead of ``.data =``."""
        return ["payload"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return NeuronTensor(inner["payload"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return run_on_cpu(func, args, kwargs or {})


def _unwrap(x):
    """A neuron tensor's payload, ``neuron`` as the cpu device; lists and tuples (aten's ``Tensor[]``) item by item."""
    if isinstance(x, NeuronTensor):
        return x.payload
    kind = type(x)
    if kind is list or kind is tuple:
        return kind(_unwrap(item) for item in x)
    if kind is torch.device and x.type == DEVICE_NAME:
        return _CPU
    return x


def _wrap(x, passed: dict[int, NeuronTensor] | None = None):
    """A cpu tensor an op made, on ``neuron``; lists and tuples item by item. ``passed``: payload id -> the neuron
    tensor it is the payload of, handed back as that very tensor (a kernel's output argument)."""
    kind = type(x)
    if kind is list or kind is tuple:
        return kind(_wrap(item, passed) for item in x)
    if passed and id(x) in passed:
        return passed[id(x)]
    if isinstance(x, torch.Tensor) and not isinstance(x, NeuronTensor) and x.device.type == "cpu":
        if not _runtime._started:
            _runtime.start()  # the process's first device tensor: the runtime reserves its cores
        return NeuronTensor(x)
    return x


class _Argument(NamedTuple):
    """One argument of an op's schema, found by position or by name as the dispatcher passes it."""

    position: int
    name: str
    keyword_only: bool = False

    def of(self, args, kwargs):
        return (
            args[self.position]
            if self.position < len(args) and not self.keyword_only
            else kwargs.get(self.name)
        )


@dataclass(frozen=True)
class _Schema:
    """What :func:`run_on_cpu` reads of an op's schema, read once per op (aten's schemas are many and static)."""

    device: _Argument | None
    aliased: tuple[tuple[int, _Argument], ...]  # (return index, the mutated input it returns)
    returns: int
    generator: _Argument | None  # a seeded random op's ``generator``


@functools.cache
def _schema(func) -> _Schema:
    arguments = [_Argument(i, a.name, a.kwarg_only) for i, a in enumerate(func._schema.arguments)]
    by_name = {argument.name: argument for argument in arguments}
    written = {
        frozenset(a.alias_info.before_set): argument
        for a, argument in zip(func._schema.arguments, arguments)
        if a.alias_info is not None and a.alias_info.is_write
    }
    aliased = tuple(
        (r, written[frozenset(ret.alias_info.before_set)])
        for r, ret in enumerate(func._schema.returns)
        if ret.alias_info is not None
        and ret.alias_info.is_write
        and frozenset(ret.alias_info.before_set) in written
    )
    seeded = torch.Tag.nondeterministic_seeded in func.tags
    generator = by_name.get("generator") if seeded else None
    return _Schema(by_name.get("device"), aliased, len(func._schema.returns), generator)


def _custom_op_body(func):
    """The Python implementation of a ``torch.library.custom_op`` (its "neuron" one, else its default)."""
    if func.namespace in ("aten", "prims"):
        return None
    from torch._library.custom_ops import _maybe_get_opdef  # noqa: PLC0415 -- private torch API, read when an op first runs (the stand-in loads during torch's own import)

    opdef = _maybe_get_opdef(func)
    if opdef is None:
        return None
    return opdef._backend_fns.get(DEVICE_NAME) or opdef._backend_fns.get(None)


#: The switch (rehearsal/settings.py SWITCHES): "1" random ops on ``neuron`` draw from the device's own
#: [seed, offset] generator, "0" from the CPU generator (the public copy today).
DEVICE_RANDOM_SWITCH = "QWEN3_STANDIN_DEVICE_RANDOM"


def _mix(seed: int, offset: int) -> int:
    """One CPU-generator seed per (seed, offset): a counter-based generator's stream, approximated."""
    return (seed ^ ((offset + 1) * 0x9E3779B97F4A7C15)) % 2**64


def _with_device_generator(func, schema: _Schema, args, kwargs):
    """``(args, kwargs, generator)`` with a CPU generator drawn from the device's [seed, offset] for a random op
    called without a generator, or ``None`` as the generator when the op is not one (or the switch is off).

    DTensor's RNG tracker (torch/distributed/tensor/_random.py ``_distribute_region``) sets each shard's offset
    in the device state, runs the op under ``torch.random.fork_rng`` (which restores the CPU generator after),
    and expects the op to read the device state, as a CUDA op reads its Philox seed and offset. The public
    torch_neuronx copy's random ops fall back to the CPU (its tests/device/test_rng_state.py xfail, "will pass
    once native Neuron random ops are implemented"); with that, every DTensor random op redraws the same CPU
    numbers and torch 2.14's ``trunc_normal_`` rejection loop never ends (seen in the rehearsal: rank 0 and 1
    spinning in ``_no_grad_trunc_normal_``). Which one the released 2.14.3 does is not public: a switch.
    """
    argument = schema.generator
    if (
        argument is None
        or os.environ.get(DEVICE_RANDOM_SWITCH, "1") != "1"
        or argument.of(args, kwargs) is not None
    ):
        return args, kwargs, None
    i = argument.position
    from torch_neuronx import neuron  # noqa: PLC0415 -- circular: torch_neuronx.neuron imports this module

    state = neuron._generator()
    generator = torch.Generator().manual_seed(_mix(state.seed, state.offset))
    if i < len(args):
        args = (*args[:i], generator, *args[i + 1 :])
    else:
        kwargs = {**kwargs, "generator": generator}
    return args, kwargs, state


def run_on_cpu(func, args, kwargs):
    """Run one aten op on the CPU payloads; wrap what it made, hand back what it mutated."""
    if func is torch.ops.aten.is_pinned.default:
        return False
    body = _custom_op_body(func)
    if body is not None:
        # A torch.library.custom_op (the suite's kernels, ``qwen3_trn_repro::*``): its body must see
        # neuron tensors, as on the device, so it takes its device branch (autograd already ran above).
        return body(*args, **kwargs)
    schema = _schema(func)
    args, kwargs, device_state = _with_device_generator(func, schema, args, kwargs)
    out = func(*_unwrap(args), **{name: _unwrap(value) for name, value in kwargs.items()})
    if (
        device_state is not None
    ):  # advance the offset by the draws, rounded up to 4 as a Philox generator does
        drawn = next((t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)), 0)
        device_state.offset += (drawn + 3) // 4 * 4
    if schema.device is not None:
        target = schema.device.of(args, kwargs)
        if target is not None and not _is_neuron(target):
            return out  # .cpu() / .to("cpu") (_to_copy, or to.* below autograd): a plain tensor leaves the device
    if schema.aliased:
        aliased = {r: argument.of(args, kwargs) for r, argument in schema.aliased}
        if schema.returns == 1:
            return aliased[0]
        return tuple(aliased.get(i, _wrap(o)) for i, o in enumerate(out))
    return _wrap(out)


#: Factory functions: called with device="neuron" they reach PrivateUse1 with no tensor argument.
FACTORIES = (
    "arange",
    "empty",
    "empty_strided",
    "empty_permuted",
    "eye",
    "full",
    "linspace",
    "logspace",
    "normal",
    "ones",
    "rand",
    "randint",
    "randn",
    "randperm",
    "scalar_tensor",
    "tril_indices",
    "triu_indices",
    "zeros",
)


def _factory(op):
    def impl(*args, **kwargs):
        kwargs = {**kwargs, "device": _CPU}
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        return _wrap(op(*args, **kwargs))

    return impl


def _fallback(op, *args, **kwargs):
    """Any other op that reaches PrivateUse1 without a neuron tensor (a factory not listed above)."""
    return run_on_cpu(op, args, kwargs)


_libraries: list = []  # torch.library registrations live as long as their Library objects


def install(device_module) -> None:
    """Rename PrivateUse1 to ``neuron``, register ``torch.neuron`` and the kernels above (once per process)."""
    if torch._C._get_privateuse1_backend_name() == DEVICE_NAME:
        return
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend  # noqa: PLC0415 -- at install(), once torch has finished importing (autoload runs inside it)

    _setup_privateuseone_for_python_backend(DEVICE_NAME, backend_module=device_module)
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_fallback, "PrivateUse1")
    # torch.autocast(device_type="neuron") (torchtitan's MoE router keeps fp32 with it): no autocast
    # kernels here, so autocast is a pass-through: ops run in their inputs' dtypes.
    fallback.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    aten = torch.library.Library("aten", "IMPL")
    for name in FACTORIES:
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            arguments = op._schema.arguments
            takes_tensor = any(a.type.kind() == "TensorType" for a in arguments)
            if "out" in overload or takes_tensor or not any(a.name == "device" for a in arguments):
                continue
            aten.impl(op, _factory(op), "PrivateUse1")
    # torch.tensor(data, device="neuron") sends the CPU tensor's _to_copy to PrivateUse1; through the boxed
    # fallback torch 2.14 trips an internal assert (python_dispatch.cpp "func != nullptr"), so it gets a kernel.
    to_copy = torch.ops.aten._to_copy.default
    aten.impl(to_copy, lambda *args, **kwargs: run_on_cpu(to_copy, args, kwargs), "PrivateUse1")
    _libraries.extend([fallback, aten])

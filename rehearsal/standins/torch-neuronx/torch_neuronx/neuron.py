"""``torch.neuron``: the device module torch_neuronx registers (``torch._register_device_module``).

Names follow the public development copy (parmoham-aws/test-repo-parmoham torch_neuronx/__init__.py
registers ``torch_neuronx.neuron`` as ``torch.neuron``) and what torchtitan asks of a device module
(torchtitan/tools/utils.py: set_device, current_device, device_count, get_device_name,
get_device_properties, memory_stats, reset_peak_memory_stats, empty_cache). Counts come from
``NEURON_RT_VISIBLE_CORES`` or, unset, ``QWEN3_STANDIN_CORES`` (rehearsal/settings.py).
"""

from __future__ import annotations

import os
import struct
from types import SimpleNamespace

_current = 0
#: Set when the first ``neuron`` process group is created (public copy: torch_neuronx/distributed/backend.py
#: calls ``_set_local_world_size`` and ``_set_local_device_start_index(local_rank)``): from then on
#: ``device_count()`` is the local world size and the current device is the local rank
#: (csrc/core/NeuronDevice.cpp: "PyTorch Device ID will always be equal to the local rank of the process").
_local_world_size: int | None = None


def _visible() -> list[int]:
    value = os.environ.get("NEURON_RT_VISIBLE_CORES", "").strip()
    if not value:
        return list(range(int(os.environ.get("QWEN3_STANDIN_CORES", "2"))))
    cores: list[int] = []
    for part in value.split(","):
        first, _, last = part.strip().partition("-")
        cores.extend(range(int(first), int(last or first) + 1))
    return cores


def is_initialized() -> bool:
    return True


def is_available() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """NeuronDevice.cpp ``device_count``: the local world size once distributed, else the visible cores."""
    return _local_world_size if _local_world_size is not None else len(_visible())


def _set_distributed(local_rank: int, local_world_size: int) -> None:
    """What the public copy's process-group creation sets: local world size, start index = current = local rank."""
    global _local_world_size, _current
    if not 0 <= local_rank < local_world_size:
        raise ValueError(
            f"local device start index {local_rank} is out of range. Valid range is 0 to "
            f"{local_world_size - 1}"
        )
    _local_world_size, _current = local_world_size, local_rank


def current_device() -> int:
    return _current


def set_device(device) -> None:
    global _current
    index = getattr(device, "index", device)
    index = 0 if index is None else int(index)
    if not 0 <= index < device_count():
        raise ValueError(f"Invalid device id: {index}. Valid range is 0 to {device_count() - 1}")
    _current = index


class _PhiloxGenerator:
    """One device's default generator as the public copy keeps it: a seed and a Philox offset, 16 bytes of state.

    parmoham-aws/test-repo-parmoham torch_neuronx/csrc/core/NeuronHooksInterface.cpp ``NeuronGeneratorImpl``
    ("Philox-based generator for Neuron devices (16-byte state)": ``get_state`` packs seed uint64 then
    offset int64; ``set_state`` takes 16 bytes, or 8 (the seed, offset 0), else "RNG state is wrong size";
    a new generator seeds itself non-deterministically); its tests/device/test_rng_state.py asserts the
    16-byte uint8 state. DTensor's ``OffsetBasedRNGTracker`` reads and writes exactly this layout
    (torch/distributed/tensor/_random.py ``_PhiloxState``). Random ops on ``neuron`` do not read it: as in
    that copy ("torch.randn(device='neuron') falls back to CPU, consuming CPU RNG state", an xfail in the
    same test file), they draw from the CPU generator.
    """

    def __init__(self) -> None:
        self.seed = int.from_bytes(os.urandom(8), "little")
        self.offset = 0

    def manual_seed(self, seed: int) -> None:
        self.seed = int(seed) % 2**64
        self.offset = 0

    def get_state(self):
        import torch  # noqa: PLC0415 -- the device module is registered while torch is still importing (autoload): torch is read when called

        return torch.frombuffer(
            bytearray(struct.pack("<Qq", self.seed, self.offset)), dtype=torch.uint8
        ).clone()

    def set_state(self, state) -> None:
        import torch  # noqa: PLC0415 -- the device module is registered while torch is still importing (autoload): torch is read when called

        raw = bytes(state.detach().to("cpu").contiguous().view(torch.uint8).tolist())
        if len(raw) not in (8, 16):
            raise RuntimeError("RNG state is wrong size")
        self.seed = struct.unpack("<Q", raw[:8])[0]
        self.offset = struct.unpack("<q", raw[8:])[0] if len(raw) == 16 else 0


_generators: dict[int, _PhiloxGenerator] = {}


def _generator(device=None) -> _PhiloxGenerator:
    """The default generator of ``device`` (an index, "neuron:<i>", a torch.device, or None: the current one)."""
    if isinstance(device, str):
        import torch  # noqa: PLC0415 -- the device module is registered while torch is still importing (autoload): torch is read when called

        device = torch.device(device)
    index = getattr(device, "index", device)
    index = current_device() if index is None else int(index)
    if not 0 <= index < device_count():
        raise RuntimeError(f"neuron device index {index} out of range: {device_count()} visible")
    return _generators.setdefault(index, _PhiloxGenerator())


def manual_seed_all(seed: int) -> None:
    """Every visible device's generator (``torch.manual_seed`` calls this through ``_seed_custom_device``)."""
    for index in range(device_count()):
        _generator(index).manual_seed(seed)


def manual_seed(seed: int) -> None:
    _generator().manual_seed(seed)


def seed() -> None:
    _generator().manual_seed(int.from_bytes(os.urandom(8), "little"))


def seed_all() -> None:
    manual_seed_all(int.from_bytes(os.urandom(8), "little"))


def initial_seed() -> int:
    return _generator().seed


def get_rng_state(device=None):
    return _generator(device).get_state()


def set_rng_state(state, device=None) -> None:
    _generator(device).set_state(state)


def get_device_name(device=None) -> str:
    return "neuron (rehearsal stand-in on cpu)"


def get_device_properties(device=None):
    return SimpleNamespace(name=get_device_name(device), total_memory=24 * 2**30)


def get_amp_supported_dtype():
    """What ``torch.autocast(device_type="neuron")`` asks of a device module (torch/amp/autocast_mode.py)."""
    import torch  # noqa: PLC0415 -- the device module is registered while torch is still importing (autoload): torch is read when called

    return [torch.bfloat16, torch.float16, torch.float32]


def get_device_capability(device=None):
    return (0, 0)


def memory_stats(device=None) -> dict:
    return {}


def reset_peak_memory_stats(device=None) -> None:
    pass


def empty_cache() -> None:
    pass


def synchronize(device=None) -> None:
    pass


def max_memory_allocated(device=None) -> int:
    return 0


def max_memory_reserved(device=None) -> int:
    return 0


def memory_allocated(device=None) -> int:
    return 0


def memory_reserved(device=None) -> int:
    return 0


class Event:
    """``torch.neuron.Event`` (public copy: torch_neuronx/streams.py): on the CPU every op is done when it returns."""

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> None:
        self.enable_timing = enable_timing

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class Stream:
    """``torch.neuron.Stream``: what FSDP2 asks of a device stream (wait, record, context), all immediate."""

    def __init__(self, device=None, priority: int = 0, **kwargs) -> None:
        self.device, self.priority = device, priority

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        return event if event is not None else Event()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


_default_stream = Stream()


def current_stream(device=None) -> Stream:
    return _default_stream


def default_stream(device=None) -> Stream:
    return _default_stream


def set_stream(stream) -> None:
    pass


def stream(stream):
    return stream if stream is not None else _default_stream

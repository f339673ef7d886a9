"""The Neuron runtime's core reservation, stand-in (no such module in the real package: the runtime is libnrt).

aws-neuron/aws-neuron-sdk neuron-runtime/guides/configuration-guide.rst, "NeuronCore allocation": "By default,
Neuron Runtime initializes all the cores present in the system and reserves them for the current process", and
"Once a NeuronCore is reserved for a process, it cannot be used by another process at all, until the process
reserving that NeuronCore is terminated"; ``NEURON_RT_VISIBLE_CORES`` (one index or an inclusive range) names
the cores a process reserves instead. A second claim fails at runtime initialization with
``ERROR NRT:nrt_allocate_neuron_cores NeuronCore(s) not available - Requested:nc1-nc1 Available:0``
(neuron-runtime/nrt-troubleshoot.rst, "Neuron Core is in use").

Here the runtime starts with the process's first tensor on ``neuron`` (:func:`start`, from
``_cpu_device._wrap``) and reserves each core as an exclusive ``flock`` on ``core<N>.lock`` in
``$QWEN3_STANDIN_CORE_LOCKS`` (a directory the night's processes share: rehearsal/settings.py); the kernel drops
the locks when the process ends, however it ends. Without that variable nothing is shared: nothing is reserved.
The host's cores are ``$QWEN3_STANDIN_CORES`` (0 .. N-1).

Like a driver-backed runtime, it also opens the device file of each device its cores are on (the rehearsal's
fake nodes ``neuron<i>`` in ``$QWEN3_STANDIN_DEVICE_DIR``, the cores split evenly across them) and keeps them
open for the process's life. That is the reading the guard after each trn2 test relies on (an open
``/dev/neuron*`` means held cores: harness/base/device_files.py, which cites the driver's side) and the one
the night's preflight checks on the real runtime before the first launch
(``python -m harness.night.device_random --held-guard``).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCKS_ENV = "QWEN3_STANDIN_CORE_LOCKS"
DEVICE_DIR_ENV = "QWEN3_STANDIN_DEVICE_DIR"
_held: list[
    int
] = []  # the open lock files and device nodes: the reservation lasts as long as the process
_started = False


class NeuronRuntimeError(RuntimeError):
    """The runtime's initialization failed (the real one reports NRT_RESOURCE through torch_neuronx)."""


def claimed() -> list[int]:
    """The cores this process asks for: ``NEURON_RT_VISIBLE_CORES``, else every core of the host."""
    value = os.environ.get("NEURON_RT_VISIBLE_CORES", "").strip()
    if not value:
        return list(range(int(os.environ.get("QWEN3_STANDIN_CORES", "2"))))
    first, _, last = value.partition("-")
    return list(range(int(first), int(last or first) + 1))


def start() -> None:
    """Initialize the runtime once per process: reserve the claimed cores, or fail as nrt_init does."""
    global _started
    if _started:
        return
    _started = True
    folder = os.environ.get(LOCKS_ENV)
    if folder:
        _reserve(folder)
    _open_devices()


def _open_devices() -> None:
    """Open (read-only, kept) the fake node of each device that holds one of this process's cores."""
    folder = os.environ.get(DEVICE_DIR_ENV)
    nodes = (
        sorted(Path(folder).glob("neuron[0-9]*"), key=lambda p: int(p.name[6:])) if folder else []
    )
    if not nodes:
        return
    per_device = max(1, int(os.environ.get("QWEN3_STANDIN_CORES", "2")) // len(nodes))
    for device in sorted({core // per_device for core in claimed()}):
        if device < len(nodes):
            _held.append(os.open(nodes[device], os.O_RDONLY))


def _reserve(folder: str) -> None:
    """Each claimed core's lock in ``folder``, or none and the runtime's error."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    cores, held, taken = claimed(), [], []
    for core in cores:
        fd = os.open(os.path.join(folder, f"core{core}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            taken.append(core)
            continue
        held.append(fd)
    if taken:
        for fd in held:
            os.close(fd)  # nothing is reserved when the runtime fails to start
        raise NeuronRuntimeError(
            "ERROR   NRT:nrt_allocate_neuron_cores               NeuronCore(s) not available - "
            f"Requested:nc{cores[0]}-nc{cores[-1]} Available:{len(cores) - len(taken)} "
            f"(reserved by another process: {', '.join(f'nc{c}' for c in taken)})"
        )
    _held.extend(held)

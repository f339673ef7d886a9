"""The one way a trn2 test touches a NeuronCore: in a child process that names its cores.

    @neuron_core_body
    def measure_rope():                      # runs in the child only
        device = neuron_device()             # imports torch_neuronx there, never in pytest
        ...
        return {"q_diff": ...}               # JSON: what the test asserts on

    def test_rope(golden):
        measured = on_neuron_cores(measure_rope)   # NEURON_RT_VISIBLE_CORES=0 in the child
        golden(..., measured["q_diff"])

Why: a process that opens the device without ``NEURON_RT_VISIBLE_CORES`` gets every
NeuronCore and keeps them until it exits (aws-neuron/aws-neuron-sdk, Neuron runtime
configuration guide: ``NEURON_RT_VISIBLE_CORES``; unset, the runtime reserves all cores
for the process). A one-core kernel test run inside the pytest process would therefore
starve every 64-rank launch after it in the same serial session. So the pytest process
never opens the device: a body runs in a fresh interpreter with its cores named, and
its JSON result comes back. The 64-rank runs start from ``harness.launch.lifecycle`` (torchrun's
ranks are child processes too) and get all 64 cores, which is only possible because
the pytest process holds none.

Under xdist (the root conftest gives each worker a slice in ``NEURON_RT_VISIBLE_CORES``)
a body takes the first cores of its worker's slice; serially it takes cores 0.. .

``tests/cpu/test_neuron_device_contract.py`` reads every module of tests/neuron and fails
when anything touches the device outside a ``@neuron_core_body`` function (importing
torch_neuronx, ``torch.device("neuron")``, ``neuron_device()``) or calls a body directly;
on trn2, ``tests/neuron/conftest.py`` fails the test after which the pytest process holds
an open ``/dev/neuron*`` (:func:`open_neuron_devices`; the night's ``device_random --held-guard`` step
checks first that a process holding a core shows one).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

#: Set in the child's environment; a body or ``neuron_device()`` refuses to run without it.
CHILD_ENV = "QWEN3_NEURON_CORE_CHILD"
VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"
#: Where the repository and this folder are, for the child's imports.
_HERE = Path(__file__).resolve().parent
_REPO = _HERE.parent.parent
#: Default wall-clock limit of one body: a cold NEFF compile of a kernel takes minutes.
DEFAULT_TIMEOUT_S = 3600.0


class NeuronCoreContractError(RuntimeError):
    """Device work was attempted outside a child started by :func:`on_neuron_cores`."""


def in_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def neuron_core_body(fn):
    """Mark ``fn`` as a body that runs only in a child started by :func:`on_neuron_cores`.

    Called anywhere else (the pytest process) it raises instead of touching the device.
    """

    @functools.wraps(fn)
    def body(*args, **kwargs):
        if not in_child():
            raise NeuronCoreContractError(
                f"{fn.__qualname__} touches a NeuronCore: run it with on_neuron_cores({fn.__name__}), "
                "never in the pytest process (tests/neuron/neuron_cores.py)"
            )
        return fn(*args, **kwargs)

    body.neuron_core_body = True
    return body


def neuron_device():
    """``torch.device("neuron")`` for a body: installs the trn2 platform (imports torch_neuronx) here, in the child."""
    if not in_child():
        raise NeuronCoreContractError(
            "neuron_device() outside a child of on_neuron_cores: the pytest process must never open the device"
        )
    import torch

    from recipes.platform import neuron

    neuron.install()  # refuses a bad NEURON_LOGICAL_NC_CONFIG, then imports torch_neuronx
    return torch.device("neuron")


def child_cores(count: int, parent_visible: str | None) -> str:
    """``NEURON_RT_VISIBLE_CORES`` for a child that needs ``count`` cores: the first of the parent's allotment.

    The parent's own value (an xdist worker's slice) bounds what the child may take; unset,
    the allotment is the whole instance and the child takes cores ``0..count-1``.
    """
    from recipes.platform.neuron import parse_visible_cores

    if count < 1:
        raise ValueError(f"a body needs at least one NeuronCore, not {count}")
    allotted = parse_visible_cores(parent_visible) if parent_visible else list(range(count))
    if len(allotted) < count:
        raise ValueError(
            f"{VISIBLE_CORES_ENV}={parent_visible} allots {len(allotted)} core(s); the body needs {count}: "
            "run with fewer xdist workers or serially (-p no:xdist)"
        )
    first = allotted[0]
    if allotted[:count] != list(range(first, first + count)):
        raise ValueError(
            f"{VISIBLE_CORES_ENV}={parent_visible}: the first {count} cores are not one range"
        )
    return str(first) if count == 1 else f"{first}-{first + count - 1}"


def _kill_group(proc: subprocess.Popen) -> None:
    """The child and anything it started (a compiler, a helper) go with it: no orphans."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def on_neuron_cores(body, *args, cores: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S):
    """Run ``body(*args)`` (a ``@neuron_core_body`` of a test module) in a child owning ``cores`` NeuronCores.

    Returns the body's JSON result. The child is a fresh interpreter: it imports the
    body's module by path, so module-level state (a counting wrapper around a kernel, a
    patched factory) lives and dies there. A failure fails the test with the child's
    output; a timeout kills the child's whole process group.
    """
    if not getattr(body, "neuron_core_body", False):
        raise TypeError(
            f"{body!r} is not a @neuron_core_body function (tests/neuron/neuron_cores.py)"
        )
    module_file = Path(inspect.getfile(inspect.unwrap(body))).resolve()
    visible = child_cores(cores, os.environ.get(VISIBLE_CORES_ENV))
    env = {**os.environ, CHILD_ENV: "1", VISIBLE_CORES_ENV: visible}
    from harness.launch.child import _prctl, die_with_parent

    parent = os.getpid()
    _prctl()  # load libc here, not between fork and exec
    with tempfile.TemporaryDirectory(prefix="neuron-core-body-") as tmp:
        result_file = Path(tmp) / "result.json"
        request = {
            "module": str(module_file),
            "body": body.__name__,
            "args": list(args),
            "result": str(result_file),
        }
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), json.dumps(request)],
            cwd=_REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, killed whole on timeout
            # and SIGTERMed by the kernel when pytest dies (a cancelled night, a step's timeout): it never
            # outlives pytest holding its cores; _child_main then ends its whole group.
            preexec_fn=lambda: die_with_parent(signal.SIGTERM, parent=parent),
        )
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            pytest.fail(
                f"{body.__name__} on NeuronCores {visible} did not finish in {timeout_s:.0f} s",
                pytrace=False,
            )
        finally:
            if proc.poll() is None:
                _kill_group(proc)
        if proc.returncode != 0 or not result_file.exists():
            tail = "\n".join(output.splitlines()[-60:])
            pytest.fail(
                f"{body.__name__} on NeuronCores {visible} failed (exit {proc.returncode}):\n{tail}",
                pytrace=False,
            )
        return json.loads(result_file.read_text())


def open_neuron_devices(fd_dir: Path = Path("/proc/self/fd")) -> list[str]:
    """The Neuron device files this process holds open: a process holding them holds NeuronCores.

    The fd table is read by ``harness.base.device_files.open_device_files`` (why the reading holds: its
    docstring, from the driver's public source); on a cpu rehearsal the fake nodes of
    ``recipes.platform.neuron.device_nodes`` count too, as the stand-in runtime opens them when it starts.
    That the runtime keeps a descriptor while it holds cores is checked on the night, before the first
    64-rank launch, by ``python -m harness.night.device_random --held-guard`` (its step fails when a child
    holding core 0 shows none: this guard would then be blind).
    """
    from harness.base.device_files import open_device_files
    from recipes.platform.neuron import device_nodes

    return open_device_files(fd_dir, device_nodes())


class CountingKernel:
    """Wraps a ``wrap_nki`` kernel in a body: records each launch's grid, so a silent torch fallback cannot pass."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def call(*args, **kwargs):
            self.grids.append(list(grid))
            return launch(*args, **kwargs)

        return call


def fail_if_device_held(nodeid: str, held: list[str] | None = None) -> None:
    """Fail ``nodeid`` when the pytest process holds a Neuron device after it (every later launch would starve)."""
    held = open_neuron_devices() if held is None else held
    if held:
        pytest.fail(
            f"after {nodeid} the pytest process holds {', '.join(held)}: it keeps those NeuronCores until it exits "
            "and every 64-rank launch after it cannot get them. Touch the device only inside a "
            "@neuron_core_body run by on_neuron_cores (tests/neuron/neuron_cores.py)",
            pytrace=False,
        )


def _end_group(signum, frame) -> None:
    """SIGTERM in the child (pytest died): the child and everything it started go, as on a timeout."""
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _child_main(request: dict) -> None:
    """In the child: import the body's module by path, run the body, write its JSON result."""
    signal.signal(signal.SIGTERM, _end_group)
    for path in (str(_HERE), str(_REPO)):
        if path not in sys.path:
            sys.path.insert(0, path)
    module_file = Path(request["module"])
    spec = importlib.util.spec_from_file_location(
        f"neuron_core_child_{module_file.stem}", module_file
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    result = getattr(module, request["body"])(*request["args"])
    Path(request["result"]).write_text(json.dumps(result))


if __name__ == "__main__":
    _child_main(json.loads(sys.argv[1]))

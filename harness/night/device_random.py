"""The night's first stage: the random-init ops of a launch, on one core, in a child with a hard limit.

    python -m harness.night.device_random [--limit 60]

Every launch initializes its model as torchtitan's trainer does: the parameters are DTensors on the
device mesh (FSDP2 shards them along dim 0), seeded by ``torch.distributed.tensor._random.manual_seed``
(torchtitan/distributed/utils.py ``set_determinism``), materialized with ``to_empty`` and filled under
``torch.no_grad()`` by ``init_weights`` with ``trunc_normal_`` (torchtitan/models/common/param_init.py,
config/function.py), ``normal_`` (torchtitan/models/qwen3) and ``uniform_``. Each draw goes through
DTensor's RNG tracker, which sets the device generator's [seed, offset] and expects the op to read it.
If random ops on ``neuron`` draw from the CPU generator instead (the public torch_neuronx copy today,
rehearsal/README.md), every redraw repeats itself and torch 2.14's ``trunc_normal_`` rejection loop
never returns: each 64-rank launch would then hang in ``init_weights`` until its watchdog or timeout.

So before any launch, a child process on one core (``NEURON_RT_VISIBLE_CORES=0``) with a 1-rank
``neuron`` process group, a DeviceMesh of size 1 and Shard(0) DTensors runs those three ops. The parent
watches the child's progress lines; if the child does not return within ``--limit`` seconds (it is
then killed with its process group, so it holds no core) or fails, this prints ONE line naming the op
and why, and exits :data:`EXIT_STOP`; the workflow runs no launch after it. Otherwise one line with
the seconds each op took, exit 0.

The same child, once its runtime holds core 0, also reads its own fd table (harness/base/device_files.py)
and ``--held-out FILE`` keeps what it held; the next step, ``--held-guard FILE``, judges it without a child:
with no ``/dev/neuron*`` open, the guard after each trn2 test (tests/neuron/neuron_cores.py
``fail_if_device_held``) cannot see held cores on this release, and it prints ONE line saying so and exits
:data:`EXIT_GUARD_BLIND` (the launches still run: they follow the random-ops step).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from harness.base.device_files import open_device_files
from recipes.platform.neuron import device_nodes, install

#: The suite's checkout: the child runs ``-m harness.night.device_random`` from it.
REPO = Path(__file__).resolve().parents[2]
#: The hard limit, seconds: import, process group and three ops take seconds on a warm NEFF cache.
LIMIT_S = 60.0
#: The exit code when the night must stop here (1: the workflow step fails; nothing else reads it).
EXIT_STOP = 1
#: ``--held-guard``: a process holding core 0 shows no open device file, so the held-device guard is blind.
#: Only that step fails (nightly-trn2.yml conditions the launches on the random-ops step, not on this one).
EXIT_GUARD_BLIND = 2
#: The core the child runs on (a launch has not started: every core is free).
CORE = "0"
#: The ops, in the order a launch's init_weights meets them (trunc_normal_ first: the one that can hang).
OPS = ("trunc_normal_", "normal_", "uniform_")
#: What the child is doing before its first op.
SETUP = "setup (import torch_neuronx, 1-rank neuron process group, DeviceMesh of size 1)"
#: Why an op that does not return stops the night.
HANG_WHY = (
    "random ops on the device may draw from the CPU generator (rehearsal/README.md, "
    "QWEN3_STANDIN_DEVICE_RANDOM), and trunc_normal_ then redraws forever"
)
#: Elements of each DTensor: ~0.27% of trunc_normal_'s draws fall outside 3 std, so a redraw always happens.
NUMEL = (256, 64)


def what(op: str) -> str:
    return SETUP if op == "setup" else f"DTensor {op} on neuron"


def held_files() -> list[str]:
    """The Neuron device files this process holds open (a rehearsal's fake nodes count)."""
    return open_device_files(nodes=device_nodes())


def child() -> int:
    """Run in the child: print ``start <op>`` / ``done <op> <s>`` lines, flushed, as each op runs, and after the
    first device tensor ``held <file> ...`` (``held`` alone: none)."""

    def mark(text: str) -> None:
        print(text, flush=True)

    mark("start setup")
    started = time.monotonic()
    install()
    # The child's own imports, after install(): the parent watches it and never imports torch.
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
    from torch.distributed.tensor import Shard, distribute_tensor  # noqa: PLC0415
    from torch.distributed.tensor import _random as dtensor_random  # noqa: PLC0415

    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh("neuron", (1,))
    torch.manual_seed(0)
    dtensor_random.manual_seed(0, mesh)  # as torchtitan's set_determinism on a multi-rank mesh
    torch.empty(1, device="neuron")  # the first device tensor: the runtime holds core 0 from here
    mark(" ".join(["held", *held_files()]))
    mark(f"done setup {time.monotonic() - started:.1f}")
    std = 0.02
    calls = {
        "trunc_normal_": lambda t: torch.nn.init.trunc_normal_(t, std=std, a=-3 * std, b=3 * std),
        "normal_": lambda t: torch.nn.init.normal_(t, std=std),
        "uniform_": lambda t: torch.nn.init.uniform_(t, -std, std),
    }
    for op in OPS:
        mark(f"start {op}")
        started = time.monotonic()
        weight = distribute_tensor(torch.empty(NUMEL, device="neuron"), mesh, [Shard(0)])
        with torch.no_grad():
            calls[op](weight)
        local = weight.to_local().cpu()
        if not bool(local.abs().max() > 0):
            raise RuntimeError(f"{op} left the tensor all zeros")
        mark(f"done {op} {time.monotonic() - started:.1f}")
    dist.destroy_process_group()
    return 0


def check(
    limit_s: float = LIMIT_S, env: dict[str, str] | None = None, held_out: Path | None = None
) -> tuple[int, str]:
    """Run the child and watch it: (exit code, the one line to print). ``held_out``: where to write the
    device files the child held with core 0 (``--held-guard`` reads them), or null when it never got there."""
    env = {**(os.environ if env is None else env), "NEURON_RT_VISIBLE_CORES": CORE}
    env.pop("LOCAL_RANK", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.night.device_random", "--child"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    current, done, errors, held = "setup", {}, [], None

    def read_stdout():
        nonlocal current, held
        for line in proc.stdout:
            word = line.split()
            if word[:1] == ["held"]:
                held = word[1:]
            elif len(word) >= 2 and word[0] == "start":
                current = word[1]
            elif len(word) == 3 and word[0] == "done":
                done[word[1]] = float(word[2])

    def read_stderr():
        errors.extend(proc.stderr)

    readers = [threading.Thread(target=f, daemon=True) for f in (read_stdout, read_stderr)]
    for r in readers:
        r.start()
    started = time.monotonic()
    try:
        code = proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        if proc.poll() is None:  # its whole process group: nothing keeps a core after this
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for r in readers:
            r.join(timeout=5)
    seconds = time.monotonic() - started
    if held_out is not None:
        held_out.write_text(json.dumps({"held": held}) + "\n")
    if code is None:
        why = HANG_WHY if current in OPS else "the device or its runtime did not answer"
        return EXIT_STOP, (
            f"device random: {what(current)} did not return in {limit_s:.0f} s: {why}; no launch started"
        )
    if code != 0 or set(done) != {"setup", *OPS}:
        last = next((e.strip() for e in reversed(errors) if e.strip()), f"exit code {code}")
        return EXIT_STOP, f"device random: {what(current)} failed: {last}; no launch started"
    times = ", ".join(f"{op} {done[op]:.1f} s" for op in OPS)
    return 0, (
        f"device random: DTensor {times} on neuron (NEURON_RT_VISIBLE_CORES={CORE}, child {seconds:.0f} s "
        f"of {limit_s:.0f})"
    )


def guard_verdict(held: list[str] | None) -> tuple[int, str]:
    """The one line of ``--held-guard`` from the device files the child held with core 0."""
    if held is None:
        return EXIT_GUARD_BLIND, (
            "held-device guard: no record of a process holding NeuronCore "
            f"{CORE} (run python -m harness.night.device_random --held-out FILE first); the launches still run"
        )
    if held:
        return 0, (
            f"held-device guard: a process holding NeuronCore {CORE} holds {', '.join(held)} open, "
            "as tests/neuron/neuron_cores.py fail_if_device_held reads it"
        )
    return EXIT_GUARD_BLIND, (
        f"held-device guard: a process holding NeuronCore {CORE} has no /dev/neuron* open, so "
        "tests/neuron/neuron_cores.py fail_if_device_held cannot see held cores on this release; "
        "the launches still run"
    )


def held_of(path: Path) -> list[str] | None:
    """What ``--held-out`` wrote: the device files, or None (no file, or the child never held core 0)."""
    try:
        return json.loads(path.read_text())["held"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.night.device_random", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--limit", type=float, default=LIMIT_S, help="seconds the child may take (hard limit)"
    )
    parser.add_argument(
        "--held-out",
        type=Path,
        help="write the device files the child held with core 0 here (JSON), for --held-guard",
    )
    parser.add_argument(
        "--held-guard",
        type=Path,
        metavar="HELD_OUT",
        help="instead: judge what --held-out wrote (exit 2 if a process holding core 0 showed no /dev/neuron*)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child()
    if args.held_guard is not None:
        code, line = guard_verdict(held_of(args.held_guard))
    else:
        code, line = check(args.limit, held_out=args.held_out)
    print(line, file=sys.stderr if code else sys.stdout, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""torchrun whose ranks start already imported: torch elastic with a preloading forkserver.

    python -m harness.launch.elastic --preload torchtitan.train,harness.rank.train,recipes.<recipe>
    then on stdin one JSON line: {"argv": torchrun's arguments, "console": FILE, "env": {NAME: VALUE}}
    argv: [--standalone, --nproc_per_node=2, ..., -m, harness.rank.train, --run-dir, DIR, (torchtitan options)]

Exactly what ``torchrun`` does (its own parser and launch config,
``torch.distributed.run.parse_args`` / ``config_from_args``, then torch elastic's
``elastic_launch``), with one difference: each rank is ``harness.rank.train.main``
called in a process forked from a multiprocessing forkserver that imported
``--preload`` once, instead of a fresh interpreter that imports torch and
torchtitan itself (~9 s of CPU per rank on the cpu tier, paid nproc times).

Why stdin: the launcher starts this process before it checks the run, so the
forkserver imports while the launcher imports and checks (one torch+torchtitan
import each, side by side). No rank exists and nothing is written until the launcher
sends the argv; end of input without one (a refused run) exits 0 having done
nothing. torch elastic documents function entrypoints with start methods
spawn/fork/forkserver (torch/distributed/launcher/api.py ``elastic_launch``,
torch/distributed/elastic/multiprocessing/api.py ``MultiprocessContext``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import signal
import sys
import uuid
from multiprocessing import forkserver

from harness.launch.child import name_this_rank
from harness.launch.forkserver_init import PARENT_ENV

#: torchrun's own value for ``--start-method`` (torch/distributed/run.py: spawn, fork, forkserver).
START_METHOD = "forkserver"


def start_forkserver(modules: list[str]) -> None:
    """Start the forkserver now, importing ``modules`` (a module that fails to import is left to the rank).

    ``harness.launch.forkserver_init`` comes first: the forkserver dies with this process even
    while it is still importing.
    """

    multiprocessing.set_forkserver_preload(["harness.launch.forkserver_init", *modules])
    os.environ[PARENT_ENV] = str(os.getpid())  # for the forkserver alone
    try:
        forkserver.ensure_running()
    finally:
        del os.environ[PARENT_ENV]


def run_forked_rank(module: str, argv: list[str]) -> None:
    """One rank: ``<module>.main(argv)`` (``harness.rank.train``, named by torchrun's ``-m``), ending as a torchrun-started rank would.

    A function entrypoint's return value is not its exit code in torch elastic (it is
    queued to the agent), so a non-zero return (2: a refusal) is raised as
    ``SystemExit``. An exception was already recorded, with this rank's number, in
    the rank's error file by harness.rank.train; torch elastic's own ``record`` around
    this function would record it again over that file, so it leaves as exit 1 with
    its traceback printed by ``sys.excepthook``, as the interpreter would print it.
    """

    name_this_rank()  # first: from here on harness.base.processes tells this rank from other forkserver children
    try:
        code = importlib.import_module(module).main(argv)
    except Exception:
        sys.excepthook(*sys.exc_info())  # torch.distributed's hook adds "[rankN]:" to each line
        code = 1
    if code:
        sys.stdout.flush()
        sys.stderr.flush()
        raise SystemExit(code)


def launch_args(argv: list[str]):
    """torchrun's parsed options for ``argv``, with ``--standalone`` resolved as torchrun's ``run`` does."""

    from torch.distributed.run import parse_args  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light

    args = parse_args(argv)
    if args.standalone:  # torch/distributed/run.py run(): a c10d rendezvous on a free local port
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = (
            "c10d",
            "localhost:0",
            str(uuid.uuid4()),
        )
    if args.master_port is None:
        args.master_port = 29500
    if not args.module or args.training_script != "harness.rank.train":
        raise SystemExit(
            f"harness.launch.elastic: runs `-m harness.rank.train` only, got {args.training_script!r}"
        )
    args.start_method = START_METHOD
    return args


def run(argv: list[str]) -> None:
    """Launch ``harness.rank.train`` with torchrun's options in ``argv`` (blocks until every rank ends)."""
    from torch.distributed.launcher.api import elastic_launch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light
    from torch.distributed.run import config_from_args  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light

    args = launch_args(argv)
    config, _, _ = config_from_args(args)
    elastic_launch(config=config, entrypoint=run_forked_rank)(
        args.training_script, list(args.training_script_args)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="harness.launch.elastic", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--preload",
        default="harness.rank.train",
        help="comma-separated modules the forkserver imports",
    )
    args = parser.parse_args(argv)
    start_forkserver(
        [m for m in args.preload.split(",") if m]
    )  # first: nothing here has imported torch yet
    from torch.distributed.elastic.multiprocessing.errors import (  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light
        record,  # torchrun's import, while the launcher checks
    )

    return record(serve)()


def serve() -> int:
    """Wait for the run on stdin; launch it; 0 when every rank succeeded (torch elastic raises otherwise)."""
    line = sys.stdin.readline()
    if not line.strip():
        return 0  # the launcher refused the run (or was stopped) before sending it
    message = json.loads(line)
    to_console(message["console"])
    os.environ.update(message["env"])
    try:
        run(message["argv"])
    finally:
        stop_forkserver()
    return 0


def stop_forkserver() -> None:
    """SIGKILL the forkserver once every rank has ended, and reap it.

    Left alone it exits after this process (its "alive" pipe closes) by finalizing
    an interpreter full of torch and torchtitan, seconds of CPU beside the launcher's
    report, and init reaps it, so its CPU time and its ranks' never reach this
    process's rusage. It holds nothing to save. Its pid is a private attribute of
    the stdlib's ForkServer (cpython Lib/multiprocessing/forkserver.py); without it
    the forkserver is left to exit by itself.
    """

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def to_console(path: str) -> None:
    """From now on this process writes to the run's console.log (the launcher copied what came before)."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


if __name__ == "__main__":
    from harness.launch.child import (
        exit_now,  # no finalizing of an interpreter full of torch; every rank is reaped
    )

    exit_now(main())

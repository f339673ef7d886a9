"""How every process the launcher starts ends with its parent, and how a finished process leaves.

torchrun, the preloading forkserver and every rank set a parent-death signal
(prctl(2) ``PR_SET_PDEATHSIG``): the kernel, not a poll, ends an orphan, so a killed
launcher leaves nothing running. Used by the launch (torchrun's child), the
forkserver, and the rank entry (``harness.rank.train``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from harness.base.processes import RANK_NAME

#: ``PR_SET_PDEATHSIG`` from <linux/prctl.h>; see prctl(2).
PR_SET_PDEATHSIG = 1
#: What a rank gets when torchrun vanishes without closing it (torchrun itself
#: SIGTERMs its ranks on an orderly stop): nothing on a rank is worth saving then,
#: and a killed process releases its devices (NeuronCores) at once.
RANK_DEATH_SIGNAL = signal.SIGKILL

#: ``PR_SET_NAME`` from <linux/prctl.h>: the thread's name, /proc/PID/comm and ``ps``'s COMM (at most 15 bytes).
PR_SET_NAME = 15

_PRCTL = None


def _prctl():
    """libc's ``prctl``, loaded once (before any fork, so a preexec_fn only calls it)."""
    global _PRCTL
    if _PRCTL is None:
        _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
    return _PRCTL


def die_with_parent(sig: int, parent: int | None = None) -> None:
    """Have Linux send ``sig`` to this process the moment its parent exits.

    prctl(2) PR_SET_PDEATHSIG: the setting survives exec. A parent that died before
    the call would never trigger it, so the parent pid is checked after it
    (``parent``: the pid it must be, when known). No-op off Linux.
    """
    if not sys.platform.startswith("linux"):
        return
    expected = os.getppid() if parent is None else parent
    if _prctl()(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != expected or os.getppid() == 1:
        os.kill(os.getpid(), sig)


def name_this_rank() -> None:
    """Name this process ``RANK_NAME`` (prctl(2) ``PR_SET_NAME``); harness.base.processes.role reads it. No-op off Linux."""
    if sys.platform.startswith("linux") and _prctl()(PR_SET_NAME, RANK_NAME.encode(), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NAME) failed")


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown of torch, torchtitan and matplotlib.

    Measured 2-7 s on 2 cores after the report is written (SIGTERM to exit went from
    12.2 s to 5.9 s). By then every child is reaped, the report and its lock file are
    closed, and nothing else needs finalizing.
    """
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    sys.stderr.flush()
    os._exit(code)

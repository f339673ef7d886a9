"""A run's processes, found through /proc: the run marker in their environment, and the process tree.

A rank forked from harness.launch.elastic's forkserver carries the forkserver's command line,
not its run's: only its environment (``RUN_DIR_ENV``, which the launcher sets for every
process it starts, and which forked ranks inherit) and its ancestry say which run it
belongs to. The launcher ends a run's processes with this (``harness.launch.lifecycle.end_run``)
and the tests prove with it that none is left; one finder, so both see the same thing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness.base.run_dir import RUN_DIR_ENV

#: What a rank forked from the preloading forkserver calls itself (``name_this_rank``). It keeps the
#: forkserver's command line, and so does any child the forkserver forks before that child execs (an
#: import that runs ``ldconfig -p``), so only this name says which forkserver child is a rank.
RANK_NAME = "qwen3-rank"
_MARKER = RUN_DIR_ENV.encode() + b"="
#: The multiprocessing forkserver's command line (``-c 'from multiprocessing.forkserver import main; ...'``).
FORKSERVER = "multiprocessing.forkserver"


@dataclass(frozen=True)
class Process:
    """One process as /proc shows it."""

    pid: int
    ppid: int
    state: str
    #: Clock ticks after boot (/proc/PID/stat field 22): with ``pid``, one process across pid reuse.
    started: int
    argv: tuple[str, ...]
    #: ``RUN_DIR_ENV`` in its environment, if set.
    run_dir: str | None
    #: Its name (/proc/PID/comm): ``RANK_NAME`` for a rank forked from the forkserver.
    name: str = ""

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.started)

    @property
    def alive(self) -> bool:
        """Running: a zombie left for its parent or init to reap counts as gone."""
        return self.state != "Z"


def read(pid: int) -> Process | None:
    """``pid`` from /proc, or None when it is gone (or not ours to read)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    name, rest = stat.split("(", 1)[1].rsplit(
        ")", 1
    )  # the command name in (...) may hold spaces and ")"
    fields = rest.split()
    marker = next((v for v in environ.split(b"\0") if v.startswith(_MARKER)), None)
    run_dir = marker[len(_MARKER) :].decode(errors="replace") if marker is not None else None
    return Process(
        pid=pid,
        ppid=int(fields[1]),
        state=fields[0],
        started=int(fields[19]),
        argv=tuple(a.decode(errors="replace") for a in argv.split(b"\0") if a),
        run_dir=run_dir,
        name=name,
    )


def table() -> dict[int, Process]:
    """Every process /proc shows now."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (proc := read(int(entry))) is not None:
            found[proc.pid] = proc
    return found


def descendants_of(pid: int, procs: dict[int, Process] | None = None) -> list[int]:
    """Every process below ``pid``: torchrun's ranks (in sessions of their own), or the forkserver and its ranks."""
    procs = table() if procs is None else procs
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def marked(run_dir: Path) -> list[Process]:
    """The live processes whose run marker is exactly ``run_dir``, this process excepted: what a run started,
    including what outlives its parent (multiprocessing's resource tracker ignores SIGTERM and exits
    only when its pipe closes, re-parented to init by then)."""
    own, wanted = os.getpid(), str(run_dir)
    return [p for p in table().values() if p.run_dir == wanted and p.alive and p.pid != own]


def still_running(proc: Process) -> bool:
    """Whether ``proc`` itself (not a later process that reuses its pid) is alive."""
    now = read(proc.pid)
    return now is not None and now.started == proc.started and now.alive


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def names_run(proc: Process, run_root: Path) -> bool:
    """Whether ``proc``'s run marker, or an argument on its command line (``--report-dir X``, ``--x=X``), lies
    under ``run_root``."""
    root = str(run_root)
    if proc.run_dir is not None and _under(proc.run_dir, root):
        return True
    return any(_under(arg.split("=", 1)[-1], root) for arg in proc.argv)


def of_run(run_root: Path, parents: tuple[int, ...] = ()) -> list[Process]:
    """The live processes of the run(s) under ``run_root``, sorted by pid.

    Those that name it (``names_run``), every descendant of those, and every
    descendant of ``parents`` (an in-process launcher: the test itself). A rank that
    cleared its environment is still found below torchrun; an orphan re-parented
    to init is still found by its marker.
    """
    procs = table()
    found = {pid for pid, proc in procs.items() if names_run(proc, run_root)}
    for pid in [*found, *parents]:
        found.update(descendants_of(pid, procs))
    return [procs[pid] for pid in sorted(found) if procs[pid].alive]


def role(proc: Process, procs: dict[int, Process]) -> str:
    """What ``proc`` is in a run: launcher, torchrun (or harness.launch.elastic), forkserver, rank, or other."""
    argv, module = proc.argv, _module(proc.argv)
    if module == "harness" and "run" in argv:
        return "launcher"
    if module in ("torch.distributed.run", "harness.launch.elastic") or any(
        Path(a).name == "torchrun" for a in argv[:2]
    ):
        return "torchrun"
    if module == "harness.rank.train":
        return "rank"  # an exec'd rank: torchrun starts ``python -u -m harness.rank.train``
    if any(FORKSERVER in arg for arg in argv):
        if proc.name == RANK_NAME:
            return "rank"  # a forked rank keeps its forkserver's command line; it names itself (run_forked_rank)
        parent = procs.get(proc.ppid)
        # Any other forkserver child is not a rank: e.g. an import's ``ldconfig -p`` between fork and exec.
        return (
            "other"
            if parent is not None and any(FORKSERVER in arg for arg in parent.argv)
            else "forkserver"
        )
    return "other"


def _module(argv: tuple[str, ...]) -> str | None:
    """The module of a ``python [-u] -m MODULE ...`` command line."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m":
            return argv[i + 1]
    return None

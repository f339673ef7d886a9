"""Run one command; count the wall time and the CPU time of every process it starts, however they end.

    python benchmarks/reaper.py --out RESULT.json [--log LOG] [--cwd DIR] [--timeout S] [--linger S] -- CMD ...

Why every process is counted: ``getrusage(RUSAGE_CHILDREN)`` sums the user and system
time of the children this process has waited for, and each child's figure already
includes the descendants *it* waited for (getrusage(2)). What it misses is a process
whose parent exits without waiting for it: Linux re-parents that orphan, normally to
init, whose wait this process never sees. ``prctl(PR_SET_CHILD_SUBREAPER)`` makes this
process the one orphans below it are re-parented to (prctl(2)), and it waits until
``waitpid`` reports no child left, so at the end RUSAGE_CHILDREN holds the CPU of every
process the command started: make, pytest and its xdist workers, torchrun, every rank,
forkservers and anything a parent forgot. ``os.wait4`` on the command alone (what
``benchmarks.common.run_timed`` does) counts only the waited-for part of the tree.

Wall time is the command's own (until it exits); processes it left running are waited
for up to ``--linger`` seconds, then killed, and reported. Standard library only: it is
run by path, from the current checkout, for any checkout's command.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

#: <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.05


def become_subreaper() -> None:
    """Orphans below this process are re-parented to it (and so waited for, and counted) from now on."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


#: A signal this process was told to stop by (its tree is killed, then reaped): SIGINT, SIGTERM, SIGHUP.
STOPPED: list[int] = []


def stop_on_signals() -> None:
    """Turn SIGINT/SIGTERM/SIGHUP into "kill the command's tree, reap it, report": no process outlives us."""

    def handler(signum, frame):
        STOPPED.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def run(
    cmd: list[str], cwd: str | None, log: Path | None, timeout_s: float, linger_s: float
) -> dict:
    """Start ``cmd``, reap every process below this one, and return what they cost."""
    become_subreaper()
    stop_on_signals()
    started = time.perf_counter()
    with log.open("wb") if log else open(os.devnull, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    status = wall_s = ended = None
    reaped = orphans = 0
    killed: set[int] = set()
    timed_out = False
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # no child left: every descendant has been waited for
            break
        now = time.perf_counter()
        if pid == 0:
            if STOPPED:
                kill_all(descendants(os.getpid()))
            elif status is None and now - started > timeout_s and not timed_out:
                timed_out = True
                kill_all([proc.pid, *descendants(os.getpid())])
            elif status is not None and now - ended > linger_s:
                left = descendants(os.getpid())
                killed.update(left)
                kill_all(left)
            time.sleep(POLL_S)
            continue
        reaped += 1
        if pid == proc.pid:
            status, wall_s, ended = code, now - started, now
        else:
            orphans += 1
    proc.returncode = os.waitstatus_to_exitcode(
        status
    )  # reaped above: keep Popen from waiting again
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "command": cmd,
        "cwd": cwd,
        "returncode": proc.returncode,
        "wall_s": wall_s,
        "wall_until_last_exit_s": time.perf_counter() - started,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "user_s": usage.ru_utime,
        "sys_s": usage.ru_stime,
        "max_rss_gib": usage.ru_maxrss / 2**20,
        "processes_reaped": reaped,
        "orphans_reaped": orphans,
        "killed_after_linger": len(killed),
        "timed_out": timed_out,
        "stopped_by": signal.Signals(STOPPED[0]).name if STOPPED else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks/reaper.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="where the JSON result goes")
    parser.add_argument(
        "--log", type=Path, help="the command's stdout and stderr (default: discarded)"
    )
    parser.add_argument("--cwd", help="directory to run the command in")
    parser.add_argument(
        "--timeout", type=float, default=7200.0, help="kill everything after this many seconds"
    )
    parser.add_argument(
        "--linger", type=float, default=60.0, help="wait this long for processes the command left"
    )
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command given after --")
    result = run(cmd, args.cwd, args.log, args.timeout, args.linger)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 128 + STOPPED[0] if STOPPED else 0


if __name__ == "__main__":
    sys.exit(main())

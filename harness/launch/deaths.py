"""How a rank ended when it raised nothing: the signal that killed it and, where the kernel says so, the OOM killer.

torchrun prints a ``ChildFailedError`` with its "Root Cause (first observed failure)": the rank,
``exitcode : -9 (pid: N)``. A negative exit code is a signal; for a SIGKILL the kernel log
(``dmesg``: "Killed process N", "oom-kill: ... pid=N") or the cgroup's OOM-kill count
(cgroup v2 ``memory.events``, v1 ``memory.oom_control``: ``oom_kill K``, compared with its value
when the launcher started) says whether the OOM killer sent it. Only what they say is reported.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

from harness.base.run_dir import CONSOLE_FILE

ROOT_CAUSE = "Root Cause"
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)", re.M)
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)", re.M)


def _cgroup_files() -> list[Path]:
    """The files that count this process's cgroup's OOM kills (v2 memory.events, v1 memory.oom_control)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # v2 (unified)
            for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                found.append(root / rel / "memory.events")
        elif "memory" in controllers.split(","):
            found.append(Path("/sys/fs/cgroup/memory") / rel / "memory.oom_control")
    return [f for f in found if f.is_file()]


def oom_kills() -> dict[Path, int]:
    """Each cgroup file's ``oom_kill`` count now."""
    counts = {}
    for path in _cgroup_files():
        try:
            match = re.search(r"^oom_kill (\d+)$", path.read_text(), re.M)
        except OSError:
            continue
        if match:
            counts[path] = int(match.group(1))
    return counts


#: The counts when the launcher started (this module is imported by the launch).
AT_START = oom_kills()


def kernel_says(pid: int) -> str | None:
    """The kernel log's line about the OOM killer and ``pid``, if ``dmesg`` can be read and has one."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    pattern = re.compile(rf"(Killed process {pid}\b|oom-kill:.*\bpid={pid}\b)")
    lines = [line for line in out.stdout.splitlines() if pattern.search(line)]
    return lines[-1].split("] ", 1)[-1].strip() if lines else None


def why_killed(pid: int | None) -> str:
    """What the kernel or the cgroup says about a SIGKILL: the OOM killer, or nothing known."""
    line = kernel_says(pid) if pid is not None else None
    if line is not None:
        return f"; the kernel's OOM killer sent it (kernel log: {line!r})"
    grew = {p: n - AT_START.get(p, 0) for p, n in oom_kills().items() if n > AT_START.get(p, 0)}
    if grew:
        path, n = next(iter(grew.items()))
        return (
            f"; {path} counts {n} OOM kill(s) since the launcher started: the OOM killer, "
            "most likely (a smaller --local-batch-size or --seq-len needs less host memory)"
        )
    return ""


def _signal_deaths(block: str) -> list[tuple[int, int, int]]:
    """``(rank, signal, pid)`` of each failure in a part of torchrun's ChildFailedError a signal ended."""
    found = []
    for entry in re.split(r"^\[\d+\]:", block, flags=re.M)[1:]:
        rank, code = _RANK.search(entry), _EXIT.search(entry)
        if rank and code and int(code.group(1)) < 0:
            found.append((int(rank.group(1)), -int(code.group(1)), int(code.group(2))))
    return found


def killed_rank(run_dir: Path) -> str | None:
    """'rank R was killed by SIGKILL (signal 9, pid P)...' from torchrun's ChildFailedError in console.log.

    A SIGKILLed rank first, the root cause or not: a SIGKILL comes from outside (the OOM killer, a user),
    and torch elastic times a signal death when it sees it, to the second (``ProcessFailure`` in
    torch/distributed/elastic/multiprocessing/errors/__init__.py), so the exception a peer raised on
    losing it ("Connection closed by peer") can come first. Else the root cause, if a signal ended it.
    torchrun (exec ranks) lists every rank that had failed when it looked; the preloaded start's
    function entrypoint (``MultiprocessContext``) lists only the first one its join saw.
    None when no signal ended a rank, or torchrun printed no ChildFailedError.
    """
    try:
        text = (Path(run_dir) / CONSOLE_FILE).read_text(errors="replace")
    except OSError:
        return None
    if ROOT_CAUSE not in text:
        return None
    before, _, cause = text.rpartition(ROOT_CAUSE)
    others = before.rpartition("Failures:")[2]
    in_cause = _signal_deaths(cause)
    sigkilled = [d for d in in_cause + _signal_deaths(others) if d[1] == signal.SIGKILL]
    chosen = sigkilled or in_cause
    if not chosen:
        return None
    rank, number, pid = chosen[0]
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    extra = why_killed(pid) if number == signal.SIGKILL else ""
    return f"rank {rank} was killed by {name} (signal {number}, pid {pid}){extra}"


def torchrun_killed(returncode: int) -> str | None:
    """'torchrun was killed by SIGKILL ...' for torchrun's own negative exit code, else None."""
    if returncode >= 0:
        return None
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return (
        f"torchrun was killed by {name}{why_killed(None) if -returncode == signal.SIGKILL else ''}"
    )

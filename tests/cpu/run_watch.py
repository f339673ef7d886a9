"""Watch a run's processes while it runs, so "no process left" is asserted only after they were seen.

A finder that finds nothing (a rank forked from harness.launch.elastic's forkserver names its
run in its environment only, not on its command line) makes "none left" hold whatever
is still running. ``RunWatch`` samples ``harness.base.processes.of_run`` in a thread from
before the launch; ``saw`` fails unless the launcher and every rank were seen alive,
and ``left`` counts what is alive now among everything ever seen, plus what the
finder finds now.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

from harness.base import processes


class RunWatch:
    """``with RunWatch(run_root) as watch: ...`` samples the run's processes every ``interval_s``."""

    def __init__(
        self, run_root: Path, parents: tuple[int, ...] = (), interval_s: float = 0.05, finder=None
    ) -> None:
        self.run_root = Path(run_root)
        self.parents = parents
        self.interval_s = interval_s
        self.finder = finder or processes.of_run
        #: Every process seen, by (pid, start time), as last seen, and its role then (a process
        #: torchrun forks shows torchrun's command line until it execs the rank's).
        self.seen: dict[tuple[int, int], processes.Process] = {}
        self.roles: dict[tuple[int, int], str] = {}
        #: The most processes of each role seen alive in one sample.
        self.most: Counter = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="run-watch", daemon=True)

    def __enter__(self) -> "RunWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> Counter:
        """One look: remember every process of the run and its role; the count of each role now."""
        found = self.finder(self.run_root, self.parents)
        procs = {p.pid: p for p in found}
        now = Counter()
        for proc in found:
            self.seen[proc.key] = proc
            self.roles[proc.key] = processes.role(proc, procs)
            now[self.roles[proc.key]] += 1
        for role, count in now.items():
            self.most[role] = max(self.most[role], count)
        return now

    def saw(self, **at_least: int) -> None:
        """Fail unless, in one sample, at least this many of each role were alive (``saw(launcher=1, rank=2)``)."""
        short = {role: (self.most[role], n) for role, n in at_least.items() if self.most[role] < n}
        assert not short, (
            f"the watch of {self.run_root} saw too few of the run's processes alive (role: seen, needed) {short}; "
            f"all seen: {self.summary()}"
        )

    def wait_for(self, timeout_s: float, **at_least: int) -> None:
        """Block until ``saw(**at_least)`` holds (or fail after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while (
            any(self.most[role] < n for role, n in at_least.items()) and time.monotonic() < deadline
        ):
            time.sleep(self.interval_s)
        self.saw(**at_least)

    def left(self) -> list[processes.Process]:
        """The run's processes alive now: every one seen that still runs, and any the finder finds now."""
        now = {p.key: p for p in self.finder(self.run_root, self.parents)}
        now.update({k: p for k, p in self.seen.items() if processes.still_running(p)})
        return sorted(now.values(), key=lambda p: p.pid)

    def seconds_until_gone(self, limit_s: float) -> float:
        """Seconds until ``left()`` is empty (``limit_s`` at most)."""
        started = time.monotonic()
        while self.left() and time.monotonic() - started < limit_s:
            time.sleep(0.1)
        return time.monotonic() - started

    def kill_left(self) -> list[processes.Process]:
        """SIGKILL whatever is left (never leave it to the rest of the suite); what was left."""
        left = self.left()
        for proc in left:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left

    def rank_starts(self) -> set[str]:
        """How the ranks it saw were started: "exec" (``python -m harness.rank.train``, torchrun's exec) or
        "preloaded" (forked from harness.launch.elastic's forkserver, named by run_forked_rank)."""
        return {
            "exec" if "harness.rank.train" in proc.argv else "preloaded"
            for key, proc in self.seen.items()
            if self.roles.get(key) == "rank"
        }

    def summary(self) -> str:
        counts = Counter(self.roles.values())
        return ", ".join(f"{role} {n}" for role, n in sorted(counts.items())) or "nothing"


def describe(procs: list[processes.Process]) -> str:
    """``pid: argv`` per process, for a failure message."""
    return "; ".join(f"{p.pid}: {' '.join(p.argv)[:120]}" for p in procs) or "none"


def run_roles(rank_start: str, nproc: int = 2, launcher: bool = True) -> dict[str, int]:
    """The processes a training run has: the launcher, torchrun (harness.launch.elastic and its forkserver
    when ranks start "preloaded") and ``nproc`` ranks."""
    roles = {
        "torchrun": 1,
        "rank": nproc,
        **({"forkserver": 1} if rank_start == "preloaded" else {}),
    }
    return {"launcher": 1, **roles} if launcher else roles

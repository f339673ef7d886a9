"""Every launch watched for progress, on both tiers: a rank silent past its phase's budget is a stall.

Each rank touches ``<run dir>/heartbeat/rank<R>.json`` (:func:`beat`, from ``harness.rank.train``) at its
entry, once its trainer is built, after every training step and once training is over: its pid, phase, step
and the last step's time. The launcher (``harness.launch.lifecycle.launch``) asks :meth:`Watchdog.check` every
poll; a rank silent longer than :meth:`Budgets.allowed` is a stall. Then, before anything is ended, every
rank's Python stack is dumped with ``py-spy dump --pid PID`` into ``<run dir>/stacks/rank<R>.txt`` (py-spy
reads a process through ptrace: root, or ``kernel.yama.ptrace_scope`` 0; when it fails the file says why),
the launch is ended with no process left (``end_run``), and the console and the report say in one line
``stalled: rank R in FUNCTION (FILE:LINE) after N s`` (the top frame of that rank's main thread).
``python -m harness run`` then exits :data:`STALL_EXIT`; a night (``tests/neuron/lane_runs.py``) records
the failed launch and goes on with its next one. The tier's ``launch_timeout_s`` stays as the last resort.

The rank named is the one furthest behind (phase, then step); among those, a stopped process (state T: a
SIGSTOP, a debugger) first, then the one silent longest.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.base import processes
from harness.base.run_dir import HEARTBEAT_DIR, STACKS_DIR
from recipes.tiers import rehearsal_settings

#: ``python -m harness run``'s exit code when a launch stalled (0 ok, 1 a failed run or check, 2 refused
#: before launch, 128 + N stopped by signal N).
STALL_EXIT = 3
#: Test switch: the cpu tier's after-step-1 floor in seconds (tests/cpu/test_watchdog.py sets it small).
FLOOR_ENV = "QWEN3_WATCHDOG_FLOOR_S"
#: A rank's phases, in order; "step" is the only one judged by its step time.
PHASES = ("start", "built", "step", "finish")
#: How long one ``py-spy dump`` may take before the next way is tried.
PY_SPY_TIMEOUT_S = 30
#: The margin on the plan's estimate before step 1 (an estimate, not a measurement: harness.night.plan).
PLAN_MARGIN = 1.5


@dataclass(frozen=True)
class Budgets:
    """How long a rank may stay silent, by phase."""

    #: Before step 1 (and after the last step: final state, export): start-up, weights, the first compile.
    #: cpu: a fixed 90 s, as a phase's gap is 20-40 s of start-up on 2 loaded cores (README: startup 20-40 s per
    #: launch), so a stall is declared within two minutes; trn2: ``harness.night.plan``'s estimate of that launch's
    #: start-up + weights + cold compile times :data:`PLAN_MARGIN` (:func:`harness.night.plan.watchdog_budgets`).
    before_first_step_s: float
    #: After step 1: this many times the longest step the rank has taken since step 1 (step 1 compiles) ...
    step_multiple: float = 10.0
    #: ... but never less than this. cpu: 60 s (a step takes under a second; a checkpoint save a few);
    #: trn2: 600 s (a 4B checkpoint save, or a new shape's compile mid-run, takes minutes: plan's EXPORT_MIN 3).
    step_floor_s: float = 60.0

    def allowed(self, phase: str, step: int, longest_step_s: float) -> float:
        if phase != "step" or step < 1:
            return self.before_first_step_s
        return max(self.step_floor_s, self.step_multiple * longest_step_s)


CPU = Budgets(before_first_step_s=90.0, step_multiple=10.0, step_floor_s=60.0)
#: trn2 when no plan launch is named (``python -m harness run --tier trn2``): the plan's costliest launch
#: (first of its family, weights loaded: 3 + 4 + 45 min) x 1.5; test_watchdog checks it against the plan.
TRN2 = Budgets(before_first_step_s=(3.0 + 4.0 + 45.0) * 60 * PLAN_MARGIN, step_floor_s=600.0)


def for_tier(tier) -> Budgets:
    """The tier's budgets; a rehearsal of trn2 runs tiny models on cpu and gets the cpu tier's."""

    budgets = CPU if tier.name == "cpu" or rehearsal_settings() is not None else TRN2
    if os.environ.get(FLOOR_ENV):
        floor = float(os.environ[FLOOR_ENV])
        budgets = Budgets(budgets.before_first_step_s, budgets.step_multiple, floor)
    return budgets


def beat(run_dir: Path, phase: str, step: int = 0, step_s: float | None = None) -> None:
    """This rank is alive in ``phase`` (after ``step``, which took ``step_s``): replace its heartbeat file."""
    rank = os.environ.get("RANK", "0")
    folder = Path(run_dir) / HEARTBEAT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    record = {"rank": int(rank), "pid": os.getpid(), "phase": phase, "step": step}
    record.update(step_s=step_s, unix_s=time.time())
    tmp = folder / f".rank{rank}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, folder / f"rank{rank}.json")


@dataclass
class Stall:
    rank: int
    pid: int | None
    silent_s: float
    phase: str
    step: int


@dataclass
class Watchdog:
    """One launch's heartbeats against its budgets; ``started`` (time.time()) stands in for a rank's first beat."""

    run_dir: Path
    nproc: int
    budgets: Budgets
    started: float = field(default_factory=time.time)
    #: Each rank's longest step since step 1, as its beats said.
    longest: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        shutil.rmtree(self.run_dir / HEARTBEAT_DIR, ignore_errors=True)  # an earlier launch's beats

    def beats(self) -> dict[int, dict]:
        out = {}
        for path in (self.run_dir / HEARTBEAT_DIR).glob("rank*.json"):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):  # replaced while read: the next poll reads it
                continue
            out[record["rank"]] = record
        return out

    def check(self, now: float | None = None) -> Stall | None:
        """The stalled rank, if one is silent past its budget, else None."""
        now = time.time() if now is None else now
        beats = self.beats()
        missing = {"phase": "start", "step": 0, "pid": None, "unix_s": self.started}
        ranks = sorted(set(beats) | set(range(self.nproc)))
        stalls = []
        for rank in ranks:
            b = beats.get(rank, missing)
            if b.get("step_s") and b["step"] > 1:
                self.longest[rank] = max(self.longest.get(rank, 0.0), b["step_s"])
            silent = now - b["unix_s"]
            if silent > self.budgets.allowed(b["phase"], b["step"], self.longest.get(rank, 0.0)):
                stalls.append(Stall(rank, b["pid"], silent, b["phase"], b["step"]))
        if not stalls:
            return None
        everyone = [
            (r, beats.get(r, missing)) for r in ranks
        ]  # the rank named: furthest behind among all
        behind = min((PHASES.index(b["phase"]), b["step"]) for _, b in everyone)
        late = [s for s in stalls if (PHASES.index(s.phase), s.step) == behind] or stalls
        return min(late, key=lambda s: (not _stopped(s.pid), -s.silent_s))

    def pids(self) -> dict[str, int]:
        """``rank<R>`` → pid for every rank that beat; a rank process found without a beat as ``pid<P>``."""
        out = {f"rank{r}": b["pid"] for r, b in sorted(self.beats().items())}
        procs = processes.table()
        for proc in processes.of_run(self.run_dir):
            if proc.pid not in out.values() and processes.role(proc, procs) == "rank":
                out[f"pid{proc.pid}"] = proc.pid
        return out


def _stopped(pid: int | None) -> bool:
    proc = processes.read(pid) if pid else None
    return proc is not None and proc.state in ("T", "t")


def py_spy() -> str | None:
    """py-spy beside this interpreter (the venv's, from the lock), else the program of the py-spy distribution
    this interpreter imports from (a venv layered on the DLAMI's sees the base venv's, whose bin/ is not beside
    this interpreter nor on PATH: the rehearsal's layered neuron venv found none), else on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    if here.is_file():
        return str(here)
    try:
        files = importlib.metadata.distribution("py-spy").files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    installed = [Path(f.locate()).resolve() for f in files if f.name == "py-spy"]
    return next((str(p) for p in installed if p.is_file()), None) or shutil.which("py-spy")


def dump_stack(pid: int) -> str:
    """``py-spy dump --pid PID``; a stopped process (py-spy cannot suspend it) again with ``--nonblocking``.

    What each attempt printed is kept, so a failed dump says why."""
    exe = py_spy()
    if exe is None:
        return "py-spy not found beside this interpreter nor on PATH: no stack\n"
    attempts = []
    for extra in ([], ["--nonblocking"]):
        cmd = [exe, "dump", "--pid", str(pid), *extra]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            attempts.append(f"$ {' '.join(cmd)}\ntimed out after {PY_SPY_TIMEOUT_S} s\n")
            continue
        if done.returncode == 0 and top_frame(done.stdout, pid):
            return done.stdout
        attempts.append(f"$ {' '.join(cmd)}\nexit {done.returncode}\n{done.stdout}{done.stderr}")
    return "py-spy could not read the stack:\n" + "\n".join(attempts)


FRAME = re.compile(r"^\s+(\S.*?) \((.+):(\d+)\)\s*$")
THREAD = re.compile(r"^Thread (?:0x)?(\w+)")


def top_frame(text: str, pid: int) -> tuple[str, str, int] | None:
    """``(function, file, line)`` of the main thread's innermost frame in a py-spy dump (its thread id is the
    pid; else the first thread), or None when the dump holds no frame."""
    threads: list[tuple[str, tuple[str, str, int] | None]] = []
    for line in text.splitlines():
        if m := THREAD.match(line):
            threads.append((m.group(1), None))
        elif threads and threads[-1][1] is None and (m := FRAME.match(line)):
            threads[-1] = (threads[-1][0], (m.group(1), m.group(2), int(m.group(3))))
    frames = [frame for tid, frame in threads if frame and tid in (str(pid), f"{pid:x}")]
    frames = frames or [frame for _, frame in threads if frame]
    return frames[0] if frames else None


def dump_stacks(run_dir: Path, pids: dict[str, int]) -> dict[str, str]:
    """Each rank's stack into ``<run dir>/stacks/<name>.txt``; name → the dump's text."""
    folder = Path(run_dir) / STACKS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, pid in pids.items():
        out[name] = dump_stack(pid)
        (folder / f"{name}.txt").write_text(out[name])
    return out


def stall_line(stall: Stall, dumps: dict[str, str]) -> str:
    """``stalled: rank R in FUNCTION (FILE:LINE) after N s``."""
    frame = top_frame(dumps.get(f"rank{stall.rank}", ""), stall.pid or 0)
    where = f"{frame[0]} ({frame[1]}:{frame[2]})" if frame else "an unknown function (no stack)"
    return f"stalled: rank {stall.rank} in {where} after {stall.silent_s:.0f} s"

"""What every benchmark shares: timed subprocesses with peak RSS, torchtitan log lines, goals, tables."""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.base.environment import KERNEL_ISA_FLAGS, cpu_model
from harness.launch.child import _prctl, die_with_parent
from harness.launch.lifecycle import end_run
from recipes.tiers import REPO_ROOT

DEFAULT_OUT_DIR = REPO_ROOT / "report" / "bench"

#: How the overhead benchmark hands resolved RunOptions (JSON) to ``benchmarks.titan_entry``.
OPTIONS_ENV = "QWEN3_BENCH_RUN_OPTIONS"

#: Seconds one training launch may take before the benchmark gives up on it.
LAUNCH_TIMEOUT_S = {"cpu": 900, "trn2": 3600}


@dataclass
class Goal:
    """A target from the issue and whether this run met it (None: not measured)."""

    name: str
    target: str
    measured: float | None
    met: bool | None
    note: str = ""
    #: Over the repetitions: {"median", "min", "max", "n"} of the measured value (None: one value or none).
    spread: dict | None = None

    def line(self) -> str:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[self.met]
        measured = "–" if self.measured is None else f"{self.measured:.4g}"
        if self.spread:
            s = self.spread
            measured += f" (median of {s['n']}; min-max {s['min']:.4g}-{s['max']:.4g})"
        note = f" ({self.note})" if self.note else ""
        return f"goal {self.name}: {self.target}, measured {measured}: {verdict}{note}"


@dataclass
class Section:
    """One benchmark's outcome: figures for the JSON, a table for people, its goals and notes."""

    name: str
    figures: dict = field(default_factory=dict)
    header: list[str] = field(default_factory=list)
    rows: list[list] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None
    error: str | None = None
    #: How long the benchmark took and how loaded the (shared) machine was around it.
    context: dict = field(default_factory=dict)
    #: The few figures benchmarks/history.jsonl keeps commit over commit (name: number), goals aside.
    kept: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("header")
        data.pop("rows")
        return data


@dataclass
class ProcessRun:
    """One finished subprocess: exit code, wall time, CPU time, and the largest resident set it reached."""

    returncode: int
    wall_s: float
    peak_rss_gib: float
    #: user + system CPU seconds of the process and every descendant it reaped.
    cpu_s: float
    #: CPU seconds the rest of the machine used meanwhile: contention from other users.
    others_cpu_s: float
    timed_out: bool = False


def machine_busy_s() -> float:
    """Non-idle CPU seconds of the whole machine since boot (/proc/stat), 0 where unavailable."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run_timed(
    cmd: list[str], *, env: dict[str, str], log_path: Path, timeout_s: float
) -> ProcessRun:
    """Run ``cmd`` from the repo root, output to ``log_path``; time it and read its peak RSS.

    ``os.wait4`` returns the child's rusage including every descendant it reaped
    (torchrun reaps its ranks, ``harness run`` reaps torchrun), so ``ru_maxrss``
    is the peak RSS of the largest *single* process of the launch, not a sum.
    The process gets its own session so a timeout can stop its whole group.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    timed_out = threading.Event()
    with log_path.open("w") as log:
        busy_before = machine_busy_s()
        started = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def stop() -> None:
            timed_out.set()
            os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout_s, stop)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:  # Ctrl-C does not reach a child in its own session: stop it here
            end_run(proc)
            raise
        finally:
            timer.cancel()
        wall_s = time.perf_counter() - started
        busy_s = machine_busy_s() - busy_before
    proc.returncode = os.waitstatus_to_exitcode(
        status
    )  # already reaped: keep Popen from waiting again
    cpu_s = usage.ru_utime + usage.ru_stime
    return ProcessRun(
        returncode=proc.returncode,
        wall_s=wall_s,
        peak_rss_gib=usage.ru_maxrss / 2**20,
        cpu_s=cpu_s,
        others_cpu_s=max(0.0, busy_s - cpu_s),
        timed_out=timed_out.is_set(),
    )


def log_tail(path: Path, lines: int = 30) -> str:
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join(text[-lines:])


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: ``key: value`` pairs of torchtitan's step line: "step:  2  loss:  1.53794  grad_norm: ... tps: 2,128 ...".
_FIELD = re.compile(r"\b([a-z_]+):\s+(\S+)")


@dataclass
class TitanStep:
    """One of torchtitan's own per-step log lines (``MetricsProcessor.log``), as printed."""

    step: int
    loss: float
    tokens_per_s: float | None
    tflops: float | None
    mfu_pct: float | None
    memory_gib: float | None


def _number(text: str | None) -> float | None:
    """ "2,128" → 2128.0, "12.5%" → 12.5, "0.00GiB(0.00%)" → 0.0; None for "N/A" or absent."""
    match = re.match(r"[-\d,.]+(?:e[-+]?\d+)?|nan|inf", text or "")
    try:
        return float(match.group().replace(",", "")) if match else None
    except ValueError:
        return None


def parse_titan_steps(text: str) -> list[TitanStep]:
    """torchtitan's step lines (printed when its logger is initialised), colour codes stripped.

    Read field by field so a fork that adds or reorders fields (torchtitan-neuron) still parses.
    """
    steps = []
    for line in _ANSI.sub("", text).splitlines():
        fields = dict(_FIELD.findall(line))
        if "step" not in fields or "loss" not in fields or not fields["step"].isdigit():
            continue
        steps.append(
            TitanStep(
                step=int(fields["step"]),
                loss=_number(fields["loss"]),
                tokens_per_s=_number(fields.get("tps")),
                tflops=_number(fields.get("tflops")),
                mfu_pct=_number(fields.get("mfu")),
                memory_gib=_number(fields.get("memory")),
            )
        )
    return steps


def titan_train_command(
    module: str, config: str, nproc: int, log_dir: Path, *overrides: str
) -> list[str]:
    """torchtitan's own entry on a config function, under the torchrun options ``harness.launch.lifecycle`` uses.

    ``torchrun --standalone --nproc_per_node=N -m torchtitan.train --module M --config F [overrides]``:
    the README's way to run a recipe without the harness; rank logs go to ``log_dir``.
    """
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "--log-dir",
        str(log_dir),
        "--redirects",
        "3",
        "-m",
        "torchtitan.train",
        "--module",
        module,
        "--config",
        config,
        *overrides,
    ]


def run_titan_train(
    module: str, config: str, nproc: int, work_dir: Path, *overrides: str, timeout_s: float
):
    """One ``titan_train_command`` launch from the repository root; rank 0's printed steps.

    Raises RuntimeError with the launcher's and rank 0's log tails when the launch fails.
    """
    log_dir = work_dir / "logs"
    cmd = titan_train_command(
        module, config, nproc, log_dir, "--dump_folder", str(work_dir / "out"), *overrides
    )
    returncode, stderr = run_bound(cmd, timeout_s)
    text = "".join(
        p.read_text(errors="replace") for p in sorted(log_dir.glob("*/attempt_0/0/std*.log"))
    )
    if returncode != 0:
        raise RuntimeError(
            f"torchtitan.train exited {returncode}:\n{stderr[-3000:]}\nrank 0:\n{text[-3000:]}"
        )
    return parse_titan_steps(text)


#: How long torchrun gets to close its ranks after SIGTERM (it SIGKILLs them after 30 s itself).
TORCHRUN_CLOSE_S = 60


def run_bound(cmd: list[str], timeout_s: float, cwd: Path = REPO_ROOT) -> tuple[int, str]:
    """``cmd`` (a torchrun) from ``cwd`` (the repository root) in a session of its own, bound to this process:
    the kernel SIGTERMs it when this process dies (harness.launch.child.die_with_parent), and a timeout
    SIGTERMs it too, so torchrun closes its ranks; none outlives the caller holding NeuronCores.
    ``(returncode, stderr)``; a timeout raises subprocess.TimeoutExpired after the ranks are closed."""

    parent = os.getpid()
    _prctl()  # load libc here, not between fork and exec
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: die_with_parent(signal.SIGTERM, parent=parent),
    )
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
        return proc.returncode, stderr
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.communicate(timeout=TORCHRUN_CLOSE_S)
        except subprocess.TimeoutExpired:
            pass
        raise
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def rank_log(run_dir: Path, rank: int = 0, stream: str = "stdout") -> Path | None:
    """The last attempt's log of ``rank`` under torchrun's ``--log-dir run_dir/logs``."""
    logs = sorted(
        (run_dir / "logs").glob(f"*/attempt_*/{rank}/{stream}.log"), key=lambda p: p.stat().st_mtime
    )
    return logs[-1] if logs else None


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def cpu_flags() -> list[str]:
    """The CPU's instruction-set flags that decide which kernels torch runs (``KERNEL_ISA_FLAGS``), as present."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    flags = set(line.partition(":")[2].split())
    return [f for f in KERNEL_ISA_FLAGS if f in flags]


def machine() -> dict:
    """The machine behind the figures; load average shows how shared it was."""
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "mem_total_gib": round(pages / 2**30, 1),
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
    }


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{digits}f}" if abs(value) < 1e3 else f"{value:,.0f}"
    return str(value)


def table(header: list[str], rows: list[list]) -> str:
    """A plain aligned text table (first column left, the rest right)."""
    cells = [header] + [[fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))
        )

    return "\n".join(
        [line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]]
    )


#: One JSON line per benchmark run, committed with the code, so the suite's cost is seen over time.
HISTORY = Path(__file__).resolve().parent / "history.jsonl"


def commit_of(repo: Path) -> str:
    """``repo``'s HEAD, with " + uncommitted changes" when tracked files other than the history (which each run
    appends to) differ from it ("unknown" outside git)."""
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    if head.returncode != 0:
        return "unknown"
    dirty = subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            f":!{HISTORY.relative_to(REPO_ROOT)}",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return head.stdout.strip() + (" + uncommitted changes" if dirty else "")


def append_history(path: Path, doc: dict) -> None:
    """Append the run's commit, goals (measured vs target), kept figures, versions and machine as one line."""
    line = {
        k: doc[k]
        for k in ("date", "command", "tier", "versions", "machine", "goals", "all_goals_met")
    }
    line.update(commit=doc.get("commit", "unknown"), figures=doc.get("figures", {}))
    with path.open("a") as f:
        f.write(json.dumps(line, default=str, sort_keys=True) + "\n")

"""Start a recipe under torchrun, show its progress, and collect what it measured."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from harness.base import processes
from harness.base.processes import RUN_DIR_ENV
from harness.base.run_dir import (
    CONSOLE_FILE,
    ERROR_FILE,
    LOGS_DIR,
    RUN_FILE,
    read_provenance,
    read_steps,
)
from harness.launch.child import _prctl, die_with_parent
from harness.launch.failures import failure_summary, rank_log_tails
from harness.launch.rendezvous import RendezvousWait
from harness.launch.speed import record_run
from harness.launch.stop import STOP_SIGNALS, Interrupted, deferred, stop_signals_raise  # noqa: F401 -- the launch's names
from harness.launch.watchdog import STALL_EXIT, Budgets, Watchdog, dump_stacks, for_tier, stall_line
from harness.options.run_options import RunOptions
from recipes.platform import offline_env
from recipes.registry import RECIPES
from recipes.tiers import REPO_ROOT, TIERS

#: What torchrun gets when the launcher dies, however it dies: torchrun turns SIGTERM
#: into SignalException and closes its ranks (SIGTERM, then SIGKILL after 30 s):
#: torch/distributed/elastic/multiprocessing/api.py _terminate_process_handler, _close.
TORCHRUN_DEATH_SIGNAL = signal.SIGTERM


class LaunchError(RuntimeError):
    """A run whose ranks did not all exit 0; the message carries their last log lines.

    ``result`` holds what the run measured before it failed, ``summary`` the one-line why.
    """

    def __init__(self, message: str, result: "RunResult | None" = None, summary: str = "") -> None:
        super().__init__(message)
        self.result = result
        self.summary = summary


class Stalled(LaunchError):
    """A launch the watchdog ended (``harness.launch.watchdog``): ``summary`` is its ``stalled: ...`` line."""

    exit_code = STALL_EXIT


@dataclass
class RunResult:
    recipe: str
    tier: str
    init: str
    nproc: int
    seed: int
    seq_len: int
    local_batch_size: int
    run_dir: str
    export_dir: str | None
    returncode: int
    wall_s: float
    steps: list[dict] = field(default_factory=list)
    provenance: dict = field(default_factory=dict)
    #: The signal that stopped the launcher mid-run ("SIGTERM"), else None.
    interrupted: str | None = None
    #: Wall clock (time.time()) when the launch started: the origin of the time to the first step.
    started_unix_s: float | None = None
    #: ``harness.launch.speed.Speed`` as a dict: step time, tokens/s, MFU, time to the first step, NEFF cache.
    speed: dict = field(default_factory=dict)
    #: The watchdog's ``stalled: rank R in FUNCTION (FILE:LINE) after N s`` when it ended the launch.
    stalled: str | None = None

    @property
    def losses(self) -> list[float]:
        return [s["loss"] for s in self.steps]

    def to_dict(self) -> dict:
        return {**asdict(self), "losses": self.losses}


def rendezvous_args(opts: RunOptions) -> list[str]:
    """One node: ``--standalone`` (a free local port). Several: torchrun's c10d rendezvous."""
    if opts.nnodes == 1:
        return ["--standalone"]
    return [
        f"--nnodes={opts.nnodes}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={opts.rdzv_endpoint}",
        f"--rdzv-id={opts.recipe}-{opts.tier}-{opts.seed}",
        f"--rdzv-conf=is_host={str(opts.node_rank == 0).lower()},join_timeout={opts.rdzv_timeout}",
    ]


def torchrun_command(opts: RunOptions, cli_overrides: list[str] = ()) -> list[str]:
    """``torchrun --nproc_per_node=N -m harness.rank.train --run-dir DIR [torchtitan overrides]`` for resolved ``opts``.

    The ranks read ``opts`` from ``DIR/run.json`` (``write_run_file``), not from flags.
    """
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *rendezvous_args(opts),
        f"--nproc_per_node={opts.nproc}",
        "--log-dir",
        str(opts.run_dir / LOGS_DIR),
        "--redirects",
        "3",
        "-m",
        "harness.rank.train",
        "--run-dir",
        str(opts.run_dir),
    ]
    return cmd + list(cli_overrides)


def write_run_file(opts: RunOptions) -> Path:
    """``run.json`` in the run directory: the resolved options every rank reads (``harness.rank.train``)."""
    opts.run_dir.mkdir(parents=True, exist_ok=True)
    path = opts.run_dir / RUN_FILE
    path.write_text(opts.to_json() + "\n")
    return path


def child_env(opts: RunOptions) -> dict[str, str]:
    env = dict(os.environ)
    env.update(offline_env())
    env.update(opts.tier_preset.extra_env)
    if opts.threads is not None:
        env["OMP_NUM_THREADS"] = str(opts.threads)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def _progress(step: dict, total: int) -> str:
    return (
        f"  step {step['step']:>3}/{total}  loss {step['loss']:.4f}  "
        f"{step['tokens_per_s']:,.0f} tokens/s  {step['step_time_s']:.2f} s/step"
    )


GRACE_S = 10
#: A stalled launch's grace: its stacks are dumped, and a rank stuck in C code never handles SIGTERM.
STALL_GRACE_S = 3
#: How long a SIGKILLed straggler may take to leave the process table (it cannot refuse; it can be slow).
KILL_WAIT_S = 5
#: How often the launcher shows new steps while torchrun runs.
POLL_S = 0.5


def _start(cmd: list[str], env: dict, stdout, stdin=None) -> subprocess.Popen:
    """torchrun (or harness.launch.elastic) in a session of its own, SIGTERMed by the kernel if this process dies.

    PR_SET_PDEATHSIG (harness.launch.child.die_with_parent) is set in the child before exec,
    so even a SIGKILLed launcher (the OOM killer) leaves no torchrun behind; its ranks
    follow torchrun (SIGTERM from torchrun's close, or their own death signal).
    """
    launcher = os.getpid()
    _prctl()  # load libc here, not between fork and exec

    def preexec() -> None:
        die_with_parent(TORCHRUN_DEATH_SIGNAL, parent=launcher)

    return subprocess.Popen(
        cmd,
        env=env,
        stdin=stdin,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
        start_new_session=True,
        preexec_fn=preexec,
    )


#: What every rank imports before its first step, whatever the recipe: torchtitan's own entry module
#: (torch, torchtitan's trainer, datasets, ...), the rank entry and what it imports lazily.
RANK_IMPORTS = (
    "torchtitan.train",
    "harness.rank.train",
    "harness.config.titan_cli",
    "harness.config.provenance",
    "harness.checks.preflight",
    "harness.reference.diagnosis",
    "harness.rank.faults",
    "harness.rank.export",
    "recipes.registry",
    "recipes.overrides",
    "recipes.titan",
)


def preload_modules(recipe: str) -> list[str]:
    """What a "preloaded" rank imports before it knows its run: ``RANK_IMPORTS`` and the recipe's module."""

    return list(RANK_IMPORTS) + ([RECIPES[recipe].module] if recipe in RECIPES else [])


@dataclass
class Prestarted:
    """``harness.launch.elastic`` started ahead of its run: its forkserver imports while the launcher checks.

    Until ``launch`` sends it torchrun's argv it has started no rank and written
    nothing; its output goes to ``output`` (an unnamed file) until the run has a
    directory. ``cancel`` ends it for a run that was refused.
    """

    proc: subprocess.Popen
    output: IO[bytes]
    #: The run it was started for (its processes carry this marker).
    run_dir: Path | None = None
    #: How much of ``output`` is already in the run's console.log (the child shares the file offset).
    copied: int = 0

    def cancel(self) -> None:
        try:
            self.proc.stdin.close()  # end of input without a run: it exits 0
        except OSError:
            pass
        end_run(self.proc, self.run_dir)
        self.output.close()


def prestart(opts: RunOptions) -> Prestarted | None:
    """Start ``harness.launch.elastic`` for a tier whose ranks start "preloaded"; None for "exec" tiers."""

    tier = TIERS.get(opts.tier)
    if tier is None or tier.rank_start != "preloaded":
        return None
    output = tempfile.TemporaryFile()
    cmd = [
        sys.executable,
        "-m",
        "harness.launch.elastic",
        "--preload",
        ",".join(preload_modules(opts.recipe)),
    ]
    proc = _start(
        cmd, {**child_env(opts), RUN_DIR_ENV: str(opts.run_dir)}, output, stdin=subprocess.PIPE
    )
    return Prestarted(proc, output, opts.run_dir)


#: ``python -m torch.distributed.run``: what ``torchrun_command`` starts with and harness.launch.elastic does not need.
TORCHRUN_PREFIX = 3


def _go(prestarted: Prestarted, torchrun_argv: list[str], env: dict, console) -> subprocess.Popen:
    """Hand a prestarted ``harness.launch.elastic`` its run: what it printed so far into ``console``, then torchrun's argv."""
    _copy_output(prestarted, console)
    message = {"argv": torchrun_argv, "console": console.name, "env": {k: env[k] for k in GO_ENV}}
    try:
        prestarted.proc.stdin.write((json.dumps(message) + "\n").encode())
        prestarted.proc.stdin.close()
    except BrokenPipeError:  # it died before its run came: its exit code and output tell why
        pass
    return prestarted.proc


#: Run-specific variables a prestarted harness.launch.elastic sets when its run arrives (its forkserver's
#: environment, and so the ranks', was fixed when it started: ``child_env``, the same for any run of the tier).
GO_ENV = ("TORCHELASTIC_ERROR_FILE", RUN_DIR_ENV)


def _copy_output(prestarted: Prestarted, console) -> None:
    """Append what the prestarted process wrote to its unnamed file since the last copy."""
    if prestarted.output.closed:
        return
    fd = prestarted.output.fileno()
    while chunk := os.pread(fd, 1 << 16, prestarted.copied):
        console.write(chunk)
        prestarted.copied += len(chunk)
    console.flush()


def end_run(proc: subprocess.Popen, run_dir: Path | None = None, grace_s: float = GRACE_S) -> None:
    """Stop torchrun and every rank it started, within ``grace_s`` plus a moment; then reap.

    SIGTERM lets torchrun close its ranks itself; after ``GRACE_S`` torchrun's group
    is SIGKILLed, and the ranks (not in torchrun's process group: torch elastic starts
    each with ``start_new_session``, subprocess_handler.py) die by their own death signal.
    Last, whatever still carries ``run_dir``'s marker (``processes.marked``: a resource
    tracker finishing after its parent) gets the same grace, then SIGKILL: none outlives the run.
    """
    procs = processes.table()
    ranks = [procs[pid] for pid in processes.descendants_of(proc.pid, procs)]
    deadline = time.monotonic() + grace_s
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:  # reaped: its pid may already be another process's
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    proc.wait()
    while (
        any(processes.still_running(rank) for rank in ranks)
        and time.monotonic() < deadline + grace_s
    ):
        time.sleep(0.1)
    if run_dir is None:
        return
    while (left := processes.marked(run_dir)) and time.monotonic() < deadline + grace_s:
        time.sleep(0.05)
    for straggler in left:
        try:
            os.kill(straggler.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # SIGKILL is delivered, not done: under load a killed process still shows as running for a moment.
    killed_by = time.monotonic() + KILL_WAIT_S
    while any(processes.still_running(p) for p in left) and time.monotonic() < killed_by:
        time.sleep(0.02)


def launch(
    opts: RunOptions,
    cli_overrides: list[str] = (),
    echo=print,
    timeout_s: float | None = None,
    prestarted: Prestarted | None = None,
    stall_timeout_s: float | None = None,
    budgets: Budgets | None = None,
) -> RunResult:
    """Run resolved ``opts`` under torchrun; raise ``LaunchError`` with rank logs on failure.

    However the launch ends (success, failure, timeout, an exception, Ctrl-C, or a
    signal turned into ``Interrupted`` by ``stop_signals_raise``), torchrun and every
    rank are ended before it returns; an interrupt re-raises with what was measured.
    ``timeout_s`` defaults to the tier's ``launch_timeout_s`` (long on trn2: cold NEFF compiles).
    ``prestarted``: this run's ``harness.launch.elastic``, started while the run was checked
    (a "preloaded" tier starts one here otherwise). ``stall_timeout_s``: also end the run
    when no new step arrives for that long after its first one (a hung collective ends
    seconds after it hangs, not at ``timeout_s``; the fault tests use it); None: no such limit.
    ``budgets``: the watchdog's (``harness.launch.watchdog``; default: the tier's); a stall raises ``Stalled``.
    """
    if timeout_s is None:
        timeout_s = opts.tier_preset.launch_timeout_s
    run_dir = opts.run_dir
    write_run_file(opts)  # creates run_dir
    (run_dir / ERROR_FILE).unlink(missing_ok=True)
    (run_dir / CONSOLE_FILE).unlink(
        missing_ok=True
    )  # appended to: a prestarted harness.launch.elastic writes there too
    argv = torchrun_command(opts, cli_overrides)
    env = {
        **child_env(opts),
        "TORCHELASTIC_ERROR_FILE": str(run_dir / ERROR_FILE),
        RUN_DIR_ENV: str(run_dir),
    }
    echo(
        f"[{opts.recipe}/{opts.tier}/init={opts.init}] {opts.nproc} process(es), run dir {run_dir}"
    )
    started, started_unix_s = time.perf_counter(), time.time()
    shown = 0
    timed_out = stalled = False
    progressed = started
    stopped: BaseException | None = None
    if prestarted is None:
        prestarted = prestart(opts)
    waiting = RendezvousWait(opts, echo, started)
    dog, stall = Watchdog(run_dir, opts.nproc, budgets or for_tier(opts.tier_preset)), None
    with (run_dir / CONSOLE_FILE).open("ab") as console:
        proc = None
        try:
            with (
                deferred()
            ):  # started and watched as one: a stop signal now is raised in here, never before it
                if prestarted is None:
                    proc = _start(argv, env, console)
                else:
                    proc = _go(prestarted, argv[TORCHRUN_PREFIX:], env, console)
            while proc.poll() is None:
                try:
                    proc.wait(timeout=POLL_S)  # returns as soon as torchrun exits
                except subprocess.TimeoutExpired:
                    pass
                waiting.poll()
                steps = read_steps(run_dir)
                for step in steps[shown:]:
                    echo(_progress(step, opts.steps))
                if len(steps) > shown:
                    shown, progressed = len(steps), time.perf_counter()
                if timeout_s is not None and time.perf_counter() - started > timeout_s:
                    timed_out = True
                    break
                if (
                    stall_timeout_s is not None
                    and shown
                    and time.perf_counter() - progressed > stall_timeout_s
                ):
                    stalled = True
                    break
                if stall := dog.check():
                    stall = stall_line(stall, dump_stacks(run_dir, dog.pids()))  # before any end
                    echo(stall)
                    break
        except (Interrupted, KeyboardInterrupt) as stop:
            stopped = stop
        finally:
            if proc is not None:
                end_run(proc, run_dir, STALL_GRACE_S if stall else GRACE_S)
            if prestarted is not None:
                _copy_output(prestarted, console)
                prestarted.output.close()
    steps = read_steps(run_dir)
    for step in steps[shown:]:
        echo(_progress(step, opts.steps))
    signum = getattr(stopped, "signum", signal.SIGINT) if stopped is not None else None
    from harness.config.provenance import add_input_key  # noqa: PLC0415 -- heavy: harness.config.provenance imports torch (torch 2.9 s); this module stays light

    result = RunResult(
        recipe=opts.recipe,
        tier=opts.tier,
        init=opts.init,
        nproc=opts.nproc,
        seed=opts.seed,
        seq_len=opts.seq_len,
        local_batch_size=opts.local_batch_size,
        run_dir=str(run_dir),
        export_dir=str(opts.export_dir) if opts.export_dir else None,
        returncode=proc.returncode,
        wall_s=time.perf_counter() - started,
        steps=steps,
        provenance={**read_provenance(run_dir), "inputs": add_input_key(run_dir, opts)},
        interrupted=signal.Signals(signum).name if signum is not None else None,
        started_unix_s=started_unix_s,
        stalled=stall,
    )
    record_run(result)  # speed figures; one line to $QWEN3_RUNS_LOG
    if stopped is not None:
        raise Interrupted(signum, result) from stopped
    if stall:
        raise Stalled(
            f"{opts.recipe} on {opts.tier}: {stall}; every rank was ended, stacks in {run_dir}/stacks.\n"
            + rank_log_tails(run_dir),
            result=result,
            summary=stall,
        )
    if timed_out or stalled or proc.returncode != 0:
        if stalled:
            why = (
                f"no new step for {stall_timeout_s:g} s after step {steps[-1]['step']} "
                "(a hung collective or a stuck rank); every rank was ended"
            )
        else:
            why = waiting.failure() or failure_summary(
                run_dir, steps, proc.returncode, timeout_s if timed_out else None
            )
        raise LaunchError(
            f"{opts.recipe} on {opts.tier} failed after {result.wall_s:.0f} s: {why}.\n{rank_log_tails(run_dir)}",
            result=result,
            summary=why,
        )
    return result

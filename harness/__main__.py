"""``python -m harness list | run RECIPE|all``: the suite's main job.

``run`` launches each recipe under torchrun (``harness.rank.train``), prints progress,
and writes the report (results.json + results.md) to ``--report-dir``. Exit codes: 0 every run passed,
1 a run or check failed, 2 refused before any launch, 3 a launch stalled (``harness.launch.watchdog``),
128 + N stopped by signal N.
"""

from __future__ import annotations

import errno
import importlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.base import run_dir as run_dir_mod
from harness.declare import catalogue
from harness.judge.verdicts import FULL_WIDTH_RANDOM_INIT, golden_key, judge, reference_of  # noqa: F401
from harness.launch.child import exit_now
from harness.options.run_options import (
    RunCommand,
    RunOptions,
    absolute_titan_paths,
    parse_run_command,
)
from recipes.errors import RecipeError
from recipes.registry import RECIPES
from recipes.tiers import TIERS

#: The job's own wall time (``make repro`` reports it) counts from this module's start.
STARTED = time.perf_counter()

USAGE = """usage: python -m harness {list,run,history,page} ...

  list     list recipes, tiers and kernel overrides
  run      run recipes under torchrun and write the report (python -m harness run --help)
  history  plot every published number and speed figure across nights (python -m harness history --help)
  page     write REPORT_DIR/index.html, the report as one page (python -m harness page --help)"""


def cmd_list(args) -> int:

    print("recipes:")
    for recipe in RECIPES.values():
        print(f"  {recipe.name:<14} {recipe.description}")
    print("tiers:")
    for tier in TIERS.values():
        print(
            f"  {tier.name:<14} {tier.nproc} process(es), seq_len {tier.seq_len}, {tier.steps} steps"
        )
    try:
        from recipes.overrides import available_overrides  # noqa: PLC0415 -- heavy: recipes.overrides imports torchtitan (torchtitan+torch 2.9 s); this module stays light
    except ImportError:
        return 0
    print("overrides (--override NAME or NAME=GLOB[,GLOB]):")
    for name, description in available_overrides().items():
        print(f"  {name:<14} {description}")
    return 0


def run_dir_for(args: RunCommand, name: str, claim: bool) -> Path:
    """``REPORT_DIR/runs/NAME-YYYYMMDD-HHMMSS``; ``claim``: made now, exclusively (``harness.base.run_dir.claim``),
    so two launches in the same second never share one. The dry run names it and makes nothing."""
    runs, name = args.report_dir / "runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return run_dir_mod.claim(runs, name) if claim else runs / name


def _runs_for(args: RunCommand, recipe: str, claim: bool = False) -> list[RunOptions]:

    inits = (
        [args.init] if args.init else list(RECIPES[recipe].inits) if recipe in RECIPES else ["hf"]
    )
    return [
        args.options(
            recipe=recipe,
            init=init,
            run_dir=run_dir_for(args, f"{recipe}-{args.tier}-{init}", claim),
            export_dir=args.export_dir if init == "hf" else None,
        )
        for init in inits
    ]


def _full_width_random_init(args, recipe: str, claim: bool = False) -> RunOptions:
    """The full-width random-init preset of ``recipe`` (its catalogue entry's proxy, harness.declare.catalogue)."""
    from harness.judge.proxy import proxy_options  # noqa: PLC0415 -- --help stays fast: harness.judge.proxy 50 ms

    return proxy_options(
        recipe,
        seed=args.seed,
        run_dir=run_dir_for(args, f"{recipe}-cpu-random-4B-width", claim),
        threads=one_rank_threads(),
    )


def one_rank_threads() -> int:
    """Threads for the main job's one-rank full-width runs: every core this process may use.

    The main job runs its launches one after another, so a one-rank launch has the machine
    to itself (torchrun's and the cpu tier's OMP_NUM_THREADS=1 would leave the other cores
    idle through a 4B-width matmul). Under pytest-xdist its workers already share the cores: one.
    """
    if "PYTEST_XDIST_WORKER" in os.environ:
        return 1
    return len(os.sched_getaffinity(0))


def import_for_the_report(runs: list[RunOptions]) -> threading.Thread:
    """Import, while the ranks run, what this process needs once they end (a daemon thread).

    matplotlib for the loss plots, and transformers' model classes for the reference loss of a
    weights-loaded run: ~3 s of CPU this process would otherwise spend after the last step.
    """
    from harness.report.results import import_plotting  # noqa: PLC0415 -- --help stays fast: harness.report.results 16 ms

    def imports() -> None:
        import_plotting()
        if any(opts.init == "hf" for opts in runs):
            importlib.import_module(
                "transformers.models.auto.modeling_auto"
            )  # AutoModelForCausalLM

    thread = threading.Thread(target=imports, name="report-imports", daemon=True)
    thread.start()
    return thread


def cmd_run(args, cli_overrides: list[str]) -> int:
    """Check, launch, judge and report every planned run; run directories no run wrote to are removed again."""
    plan: list[RunOptions] = []
    try:
        return _cmd_run(args, cli_overrides, plan)
    finally:
        for opts in reversed(
            plan
        ):  # the last claimed first: the first claim made the parents they share
            run_dir_mod.release(
                opts.run_dir
            )  # an empty directory only: a refused or never-started run's


@dataclass
class Progress:
    """Where the command is, for the report an interrupt leaves: the stage, and what is measured but not yet reported."""

    #: checks, rank start, training, reference or report.
    stage: str = "checks"
    #: The planned runs' names ("<recipe>/cpu/init=hf"), and how many were launched.
    planned: list[str] = field(default_factory=list)
    launched: int = 0
    #: A run whose launch ended but which is not in the report yet (judged; its reference under way).
    unreported: dict | None = None
    checks: list = field(default_factory=list)
    finished: list[dict] = field(default_factory=list)


def _name(opts: RunOptions) -> str:
    return f"{opts.recipe}/{opts.tier}/init={opts.init}"


def _cmd_run(args, cli_overrides: list[str], plan: list[RunOptions]) -> int:
    """The command under ``stop_signals_raise``: whatever stage a stop signal finds, what was measured is reported."""
    from harness.launch.lifecycle import Interrupted, stop_signals_raise  # noqa: PLC0415 -- --help stays fast: harness.launch.lifecycle 19 ms

    progress = Progress()
    with stop_signals_raise():
        try:
            return _run_plan(args, cli_overrides, plan, progress)
        except (
            Interrupted,
            KeyboardInterrupt,
        ) as stop:  # KeyboardInterrupt: a Ctrl-C before the handler was set
            stop = stop if isinstance(stop, Interrupted) else Interrupted(signal.SIGINT)
            return report_interrupt(args.report_dir, progress, stop)


def report_interrupt(report_dir: Path, progress: Progress, stop) -> int:
    """Write what was measured, the run and the report marked interrupted (every later signal is ignored
    by then: ``harness.launch.stop``); 128 + the signal's number."""
    from harness.report import markdown as report_markdown  # noqa: PLC0415 -- --help stays fast: harness.report 16 ms
    from harness.report import results as report_mod  # noqa: PLC0415 -- --help stays fast: harness.report.results 16 ms

    name = signal.Signals(stop.signum).name
    run = None
    if stop.result is not None:  # the launch already ended torchrun and every rank
        run = stop.result.to_dict()
        progress.stage = "training" if run["steps"] else "rank start"
    elif progress.unreported is not None:
        run = {**progress.unreported, "interrupted": name}
        if progress.stage == "reference":
            why = f"not computed: interrupted by {name}"
            run["reference"] = {"passed": None, "error": why, "summary": why}
    if run is not None:
        run["interrupted_stage"] = progress.stage
        progress.finished.append(run)
    # A launch stopped before it had started torchrun returns no result: its run never started either.
    started = progress.launched - (run is None and progress.stage == "rank start")
    marker = {"signal": name, "stage": progress.stage, "not_started": progress.planned[started:]}
    timing = report_markdown.run_timing(time.perf_counter() - STARTED, progress.finished)
    report_mod.update(
        report_dir,
        runs=[run] if run else [],
        checks=progress.checks,
        timing=timing,
        interrupted=marker,
    )
    steps = len(run["steps"]) if run else 0
    print(
        f"INTERRUPTED by {name} during the {progress.stage}"
        + (f" after {steps} step(s) of {run['recipe']}" if run else "")
        + f"; what was measured is in {report_dir / report_mod.RESULTS_JSON} and {report_mod.RESULTS_MD}",
        file=sys.stderr,
    )
    return stop.exit_code


def _run_plan(args, cli_overrides: list[str], plan: list[RunOptions], progress: Progress) -> int:
    from harness.launch.lifecycle import LaunchError, deferred, launch, prestart  # noqa: PLC0415 -- --help stays fast: harness.launch.lifecycle 19 ms
    from harness.night import page  # noqa: PLC0415 -- heavy: harness.night.page imports jinja2 (0.12 s); --help stays fast
    from harness.report import markdown as report_markdown  # noqa: PLC0415 -- --help stays fast: harness.report 16 ms
    from harness.report import results as report_mod  # noqa: PLC0415 -- --help stays fast: harness.report.results 16 ms

    names = _recipe_names(args.recipe)
    plan += [opts for name in names for opts in _runs_for(args, name, claim=True)]
    # A "preloaded" tier's first launcher starts now, before this process imports torch (preflight
    # does): its forkserver's imports overlap this process's checks. Preflight first would start
    # nothing for a refusal from the options, but cost a good run 2.5-3.4 s to step 1 (issue 27, n=3).
    prestarted = prestart(plan[0]) if plan else None
    from harness.config.build import as_configured, checked_config  # noqa: PLC0415 -- heavy: harness.config.build imports torch (torch 2.9 s); this module stays light

    wants_full_width = args.tier == "cpu" and args.layers is None and args.init in (None, "random")
    if wants_full_width:
        plan += [
            _full_width_random_init(args, name, claim=True)
            for name in names
            if name in catalogue.with_proxy()
        ]
    progress.planned = [_name(opts) for opts in plan]
    resolved = []
    try:
        for opts in plan:
            opts, config = checked_config(opts, cli_overrides)  # once, before any rank
            resolved.append(as_configured(opts, config))
    except RecipeError as e:
        print(f"python -m harness run: error: {e}", file=sys.stderr)
        return 2
    finally:
        if prestarted is not None and len(resolved) < len(plan):
            prestarted.cancel()  # refused or interrupted: no rank was started, nothing was written

    failed = False
    import_for_the_report(resolved)
    for opts in resolved:
        progress.stage, progress.checks = "rank start", []
        progress.launched += 1
        try:
            result = launch(
                opts, cli_overrides, prestarted=prestarted if opts is resolved[0] else None
            )
        except LaunchError as e:
            print(f"FAILED: {e}", file=sys.stderr)
            failed = max(int(failed), getattr(e, "exit_code", 1))  # a stall: watchdog.STALL_EXIT
            if e.result is not None:
                failed_run = {**e.result.to_dict(), "error": e.summary}
                with deferred():
                    report_mod.update(args.report_dir, runs=[failed_run])
                    progress.finished.append(failed_run)
            continue
        progress.unreported = result.to_dict()  # first: from here on an interrupt reports it
        progress.stage = "reference"
        verdict = judge(opts, result)
        if verdict is not None:
            progress.checks.append((f"{opts.recipe}.{opts.tier}.{golden_key(opts)}", verdict))
            if verdict.passed is False:
                print(f"FAILED check: {verdict.message()}", file=sys.stderr)
                failed = failed or True
            elif verdict.passed is None:  # unmeasured / inputs differ: said, not failed
                print(f"not judged: {verdict.message()}", file=sys.stderr)
        run = progress.unreported
        reference = reference_of(opts, result)
        if reference is not None:
            run["reference"] = reference
            if reference["passed"] is False:
                print(f"FAILED check: reference: {reference['summary']}", file=sys.stderr)
                failed = failed or True
        progress.stage = "report"
        with deferred():  # a report is never half written: a stop signal now is raised once it is
            report_mod.update(args.report_dir, runs=[run], checks=progress.checks)
            progress.finished.append(run)
            progress.unreported, progress.checks = None, []
    progress.stage = "report"
    timing = report_markdown.run_timing(time.perf_counter() - STARTED, progress.finished)
    with deferred():
        report_mod.update(
            args.report_dir, timing=timing, interrupted=None
        )  # this command ran to its end
    print()
    print((args.report_dir / report_mod.RESULTS_MD).read_text())
    print(
        f"report: {args.report_dir / report_mod.RESULTS_JSON} and {args.report_dir / report_mod.RESULTS_MD}"
    )
    print(report_markdown.timing_line(timing))
    print(f"page: {page.write(args.report_dir)}")
    return int(failed)


def _recipe_names(recipe: str) -> list[str]:

    return list(RECIPES) if recipe == "all" else [recipe]


def cmd_dry_run(args, cli_overrides: list[str]) -> int:
    """``run --dry-run``: every planned run checked and described, none started (harness.night.dry_run)."""
    from harness.night import dry_run  # noqa: PLC0415 -- heavy: harness.night.dry_run imports torch (torch 2.9 s); --help stays fast

    names = list(RECIPES) if args.recipe == "all" else [args.recipe]
    plan = [opts for name in names for opts in _runs_for(args, name)]
    return dry_run.cmd_dry_run(plan, cli_overrides, args.report_dir)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command, rest = (argv[0], argv[1:]) if argv else (None, [])
    if command == "list":
        return cmd_list(None)
    if command == "history":
        from harness.report.history import main as history_main  # noqa: PLC0415 -- --help stays fast: harness.report.history

        return history_main(rest)
    if command == "page":
        from harness.night.page import main as page_main  # noqa: PLC0415 -- heavy: harness.night.page imports jinja2 (0.12 s); --help stays fast

        return page_main(rest)
    if command in (None, "-h", "--help"):
        print(USAGE, file=sys.stdout if command else sys.stderr)
        return 0 if command else 2
    if command != "run":
        dry_run = (
            " (a dry run is `python -m harness run RECIPE --dry-run`)" if "dry" in command else ""
        )
        print(
            f"python -m harness: error: unknown command {command!r}; choose one of list, run, history, page{dry_run}; "
            "see python -m harness --help",
            file=sys.stderr,
        )
        return 2
    try:
        args, cli_overrides = parse_run_command(rest)
    except RecipeError as e:
        print(f"python -m harness run: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before cmd_run's handler: no run was planned, nothing to report
        print("INTERRUPTED by SIGINT while reading the options; nothing ran", file=sys.stderr)
        return 128 + signal.SIGINT
    args.report_dir = args.report_dir.resolve()
    cli_overrides = absolute_titan_paths(
        cli_overrides
    )  # the user's relative paths are from here, not the ranks' cwd
    if args.dry_run:
        return cmd_dry_run(args, cli_overrides)
    return cmd_run(args, cli_overrides)


class UntilReaderLeaves:
    """``sys.stdout`` or ``sys.stderr`` that outlives its reader: once a write finds the pipe closed (``| head``,
    or a ``2>&1 | tee`` that a Ctrl-C ended with the launcher), its fd points at /dev/null and the rest of the
    output is dropped (a closed terminal's EIO alike); the run goes on, keeps its report and exits with its
    own code (or 128 + the signal's).

    Python's advice for SIGPIPE (the signal module's docs, "Note on SIGPIPE"): point the stream at
    /dev/null so that no later write, nor the interpreter's last flush, fails again.
    """

    def __init__(self, stream) -> None:
        self._stream = stream
        #: True once the reader had gone.
        self.reader_gone = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            self._gone(e)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            self._gone(e)

    def _gone(self, error: OSError) -> None:
        """EPIPE: a pipe's reader left; EIO: the terminal was closed (SIGHUP's case). Anything else is raised."""
        if error.errno not in (errno.EPIPE, errno.EIO):
            raise error
        if not self.reader_gone:
            self.reader_gone = True
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main_for_a_pipe() -> int:
    """``main()`` with a stdout and stderr whose reader may leave early (``python -m harness run ... | head -2``)."""
    sys.stdout.reconfigure(
        line_buffering=True
    )  # progress shows up live in a pipe too (``| tee``, ``| head``)
    sys.stdout, sys.stderr = UntilReaderLeaves(sys.stdout), UntilReaderLeaves(sys.stderr)
    return main()


if __name__ == "__main__":
    exit_now(main_for_a_pipe())

"""``python -m harness list | run RECIPE|all``: the suite's main job.

``run`` launches each recipe under torchrun (``harness.train``), prints progress,
and writes the report (results.json + results.md) to ``--report-dir``.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

from harness import run_dir as run_dir_mod
from harness.launch.child import exit_now
from harness.options import RunCommand, RunOptions, absolute_titan_paths, parse_run_command
from harness.verdicts import FULL_WIDTH_RANDOM_INIT, golden_key, judge, reference_of  # noqa: F401
from recipes.errors import RecipeError
from recipes.tiers import TIERS
#: The job's own wall time (``make repro`` reports it) counts from this module's start.
STARTED = time.perf_counter()

USAGE = """usage: python -m harness {list,run,history} ...

  list     list recipes, tiers and kernel overrides
  run      run recipes under torchrun and write the report (python -m harness run --help)
  history  plot every published number and speed figure across nights (python -m harness history --help)"""


def cmd_list(args) -> int:
    from recipes.registry import RECIPES

    print("recipes:")
    for recipe in RECIPES.values():
        print(f"  {recipe.name:<14} {recipe.description}")
    print("tiers:")
    for tier in TIERS.values():
        print(f"  {tier.name:<14} {tier.nproc} process(es), seq_len {tier.seq_len}, {tier.steps} steps")
    try:
        from recipes.overrides import available_overrides
    except ImportError:
        return 0
    print("overrides (--override NAME or NAME=GLOB[,GLOB]):")
    for name, description in available_overrides().items():
        print(f"  {name:<14} {description}")
    return 0


def run_dir_for(args: RunCommand, name: str, claim: bool) -> Path:
    """``REPORT_DIR/runs/NAME-YYYYMMDD-HHMMSS``; ``claim``: made now, exclusively (``harness.run_dir.claim``),
    so two launches in the same second never share one. The dry run names it and makes nothing."""
    runs, name = args.report_dir / "runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return run_dir_mod.claim(runs, name) if claim else runs / name


def _runs_for(args: RunCommand, recipe: str, claim: bool = False) -> list[RunOptions]:
    from recipes.registry import RECIPES

    inits = [args.init] if args.init else list(RECIPES[recipe].inits) if recipe in RECIPES else ["hf"]
    return [
        args.options(
            recipe=recipe,
            init=init,
            run_dir=run_dir_for(args, f"{recipe}-{args.tier}-{init}", claim),
            export_dir=args.export_dir if init == "hf" else None,
        )
        for init in inits
    ]


#: Recipes whose random-init step-1 loss the cpu tier measures at the real 4B width.
FULL_WIDTH_RECIPES = ("native_qwen3", "hf_backend")


def _full_width_random_init(args, recipe: str = "native_qwen3", claim: bool = False) -> RunOptions:
    """The full-width random-init preset of ``recipe``.

    The HF backend builds whatever config.json it is pointed at: the real
    Qwen3-4B-Instruct-2507 config.json in fixtures/ (no weights, no tokenizer), so its
    tokenizer is the tier's (random init loads nothing to disagree with).
    """
    from recipes.specs import QWEN3_4B_INSTRUCT_2507
    from recipes.tiers import CPU

    paths = dict(model_dir=QWEN3_4B_INSTRUCT_2507, tokenizer_dir=CPU.tokenizer_dir) if recipe == "hf_backend" else {}
    return RunOptions(
        recipe=recipe,
        tier="cpu",
        init="random",
        seed=args.seed,
        run_dir=run_dir_for(args, f"{recipe}-cpu-random-4B-width", claim),
        threads=one_rank_threads(),
        **paths,
        **FULL_WIDTH_RANDOM_INIT,
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
    from harness.report import import_plotting

    def imports() -> None:
        import_plotting()
        if any(opts.init == "hf" for opts in runs):
            importlib.import_module("transformers.models.auto.modeling_auto")  # AutoModelForCausalLM

    thread = threading.Thread(target=imports, name="report-imports", daemon=True)
    thread.start()
    return thread


def cmd_run(args, cli_overrides: list[str]) -> int:
    """Check, launch, judge and report every planned run; run directories no run wrote to are removed again."""
    plan: list[RunOptions] = []
    try:
        return _cmd_run(args, cli_overrides, plan)
    finally:
        for opts in reversed(plan):  # the last claimed first: the first claim made the parents they share
            run_dir_mod.release(opts.run_dir)  # an empty directory only: a refused or never-started run's


def _cmd_run(args, cli_overrides: list[str], plan: list[RunOptions]) -> int:
    from harness import report as report_mod
    from recipes.errors import RecipeError
    from harness.launch import Interrupted, LaunchError, launch, prestart, stop_signals_raise

    names = _recipe_names(args.recipe)
    plan += [opts for name in names for opts in _runs_for(args, name, claim=True)]
    # A "preloaded" tier's first launcher starts now, before this process imports torch (preflight
    # does): its forkserver's imports overlap this process's checks. Preflight first would start
    # nothing for a refusal from the options, but cost a good run 2.5-3.4 s to step 1 (issue 27, n=3).
    prestarted = prestart(plan[0]) if plan else None
    from harness.config import as_configured, checked_config

    wants_full_width = args.tier == "cpu" and args.layers is None and args.init in (None, "random")
    if wants_full_width:
        plan += [_full_width_random_init(args, name, claim=True) for name in names if name in FULL_WIDTH_RECIPES]
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
    finished_runs = []
    import_for_the_report(resolved)
    with stop_signals_raise():
        for opts in resolved:
            try:
                result = launch(opts, cli_overrides, prestarted=prestarted if opts is resolved[0] else None)
            except Interrupted as e:
                # The launch already ended torchrun and every rank; keep what they measured.
                if e.result is not None:
                    report_mod.update(args.report_dir, runs=[e.result.to_dict()])
                steps = len(e.result.steps) if e.result is not None else 0
                print(f"INTERRUPTED by {signal.Signals(e.signum).name} after {steps} step(s) of "
                      f"{opts.recipe}; what ran is in {args.report_dir / report_mod.RESULTS_JSON}", file=sys.stderr)
                return e.exit_code
            except KeyboardInterrupt:
                print(f"INTERRUPTED (Ctrl-C) during {opts.recipe}", file=sys.stderr)
                return 128 + signal.SIGINT
            except LaunchError as e:
                print(f"FAILED: {e}", file=sys.stderr)
                failed = True
                if e.result is not None:
                    failed_run = {**e.result.to_dict(), "error": e.summary}
                    report_mod.update(args.report_dir, runs=[failed_run])
                    finished_runs.append(failed_run)
                continue
            checks = []
            verdict = judge(opts, result)
            if verdict is not None:
                checks.append((f"{opts.recipe}.{opts.tier}.{golden_key(opts)}", verdict))
                if verdict.passed is False:
                    print(f"FAILED check: {verdict.message()}", file=sys.stderr)
                    failed = True
                elif verdict.passed is None:  # unmeasured / inputs differ: said, not failed
                    print(f"not judged: {verdict.message()}", file=sys.stderr)
            run = result.to_dict()
            reference = reference_of(opts, result)
            if reference is not None:
                run["reference"] = reference
                if reference["passed"] is False:
                    print(f"FAILED check: reference: {reference['summary']}", file=sys.stderr)
                    failed = True
            report_mod.update(args.report_dir, runs=[run], checks=checks)
            finished_runs.append(run)
    timing = report_mod.run_timing(time.perf_counter() - STARTED, finished_runs)
    report_mod.update(args.report_dir, timing=timing)
    print()
    print((args.report_dir / report_mod.RESULTS_MD).read_text())
    print(f"report: {args.report_dir / report_mod.RESULTS_JSON} and {args.report_dir / report_mod.RESULTS_MD}")
    print(report_mod.timing_line(timing))
    return 1 if failed else 0


def _recipe_names(recipe: str) -> list[str]:
    from recipes.registry import RECIPES

    return list(RECIPES) if recipe == "all" else [recipe]


def cmd_dry_run(args, cli_overrides: list[str]) -> int:
    """``run --dry-run``: every planned run checked and described, none started (harness.dry_run)."""
    from harness import dry_run
    from recipes.registry import RECIPES

    names = list(RECIPES) if args.recipe == "all" else [args.recipe]
    plan = [opts for name in names for opts in _runs_for(args, name)]
    return dry_run.cmd_dry_run(plan, cli_overrides, args.report_dir)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command, rest = (argv[0], argv[1:]) if argv else (None, [])
    if command == "list":
        return cmd_list(None)
    if command == "history":
        from harness.history import main as history_main

        return history_main(rest)
    if command in (None, "-h", "--help"):
        print(USAGE, file=sys.stdout if command else sys.stderr)
        return 0 if command else 2
    if command != "run":
        dry_run = " (a dry run is `python -m harness run RECIPE --dry-run`)" if "dry" in command else ""
        print(f"python -m harness: error: unknown command {command!r}; choose one of list, run, history{dry_run}; "
              "see python -m harness --help", file=sys.stderr)  # fmt: skip
        return 2
    try:
        args, cli_overrides = parse_run_command(rest)
    except RecipeError as e:
        print(f"python -m harness run: error: {e}", file=sys.stderr)
        return 2
    args.report_dir = args.report_dir.resolve()
    cli_overrides = absolute_titan_paths(cli_overrides)  # the user's relative paths are from here, not the ranks' cwd
    if args.dry_run:
        return cmd_dry_run(args, cli_overrides)
    return cmd_run(args, cli_overrides)


def main_for_a_pipe() -> int:
    """``main()``, quiet when stdout's reader leaves early (``python -m harness list | head``).

    Python's advice for SIGPIPE: point stdout at /dev/null so the interpreter's last
    flush cannot fail again, and exit 1.
    """
    try:
        return main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    exit_now(main_for_a_pipe())

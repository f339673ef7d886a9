"""Per-recipe figures: step time, tokens/s, peak memory; on trn2 also MFU and compile time cold vs warm.

Each recipe is launched the way ``python -m harness run`` launches it
(``harness.launch.lifecycle.torchrun_command`` and ``child_env``), with the rank module
``benchmarks.train_logged`` (``harness.rank.train`` plus torchtitan's step log, which
carries torchtitan's MFU). Step time and tokens/s come from the run's
steps.jsonl (torchtitan's own metrics), step 1 excluded from the means.

Memory: torchtitan's ``max_reserved_gib`` is a device figure, 0 on CPU. The
host figure is the peak RSS of the largest single process of the launch (a
rank, in practice), from ``os.wait4``'s ``ru_maxrss``; ``rss_import_floor_gib``
is what a process importing torch and torchtitan's trainer alone reaches, so the
model's share is the difference.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from benchmarks.common import (
    LAUNCH_TIMEOUT_S,
    Section,
    fmt,
    log_tail,
    mean,
    parse_titan_steps,
    rank_log,
    run_timed,
)
from harness.checks.preflight import preflight
from harness.launch.lifecycle import child_env, read_steps, torchrun_command, write_run_file
from harness.options.run_options import RunOptions
from recipes.errors import RecipeError
from recipes.platform.neuron import neuron_status
from recipes.registry import RECIPES, get_recipe

TRAIN_LOGGED = "benchmarks.train_logged"
NEFF_CACHE_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"
CPU_MFU_NOTE = (
    "n/a on cpu: torchtitan's peak-FLOPS table has no CPU entry (it falls back to A100's)"
)


@dataclass
class LaunchFigures:
    """What one launch measured."""

    wall_s: float
    cpu_s: float
    others_cpu_s: float
    peak_rss_gib: float
    steps: int
    step1_s: float | None
    mean_step_s: float | None
    tokens_per_s_per_rank: float | None
    tokens_per_s_total: float | None
    device_max_reserved_gib: float | None
    mfu_pct: float | None
    tflops_per_rank: float | None


@dataclass
class RecipeFigures:
    recipe: str
    tier: str
    status: str  # ok | skipped | failed
    note: str = ""
    init: str | None = None
    nproc: int | None = None
    seq_len: int | None = None
    local_batch_size: int | None = None
    launch: LaunchFigures | None = None
    #: trn2 only: the same launch with an empty NEFF cache, then again with the cache it filled.
    compile: dict | None = None


def import_gap(name: str) -> str | None:
    """Why recipe ``name`` cannot be imported (another engineer may still be adding it)."""

    try:
        get_recipe(name).config_fn()
    except Exception as e:  # noqa: BLE001 - any import failure means "skip with a note"
        return f"recipe module does not import: {type(e).__name__}: {e}"
    return None


def trn2_gap(init: str) -> str | None:
    """The reason the trn2 figures cannot be taken here, from the platform's own detection."""

    status = neuron_status(needs_weights=init == "hf")
    return None if status.ready else status.reason()


def recipe_options(name: str, args, run_dir: Path) -> RunOptions:

    return preflight(
        RunOptions(
            recipe=name,
            tier=args.tier,
            init=get_recipe(name).inits[0],
            nproc=args.nproc,
            steps=args.steps,
            seq_len=args.seq_len,
            run_dir=run_dir,
            export=False,
        )
    )


def train_logged_command(opts: RunOptions) -> list[str]:
    """``harness.launch.lifecycle``'s torchrun command with ``benchmarks.train_logged`` as the rank module."""
    cmd = torchrun_command(opts)
    i = cmd.index("harness.rank.train")
    if cmd[i - 1] != "-m":
        raise RuntimeError(f"unexpected torchrun command shape: {cmd}")
    return cmd[:i] + [TRAIN_LOGGED] + cmd[i + 1 :]


def launch_once(opts: RunOptions, extra_env: dict[str, str] | None = None) -> LaunchFigures:
    """One launch of resolved ``opts``; raises RuntimeError with the rank log tail on failure."""
    write_run_file(opts)
    env = {**child_env(opts), **(extra_env or {})}
    proc = run_timed(
        train_logged_command(opts),
        env=env,
        log_path=opts.run_dir / "console.log",
        timeout_s=LAUNCH_TIMEOUT_S[opts.tier],
    )
    steps = read_steps(opts.run_dir)
    if proc.returncode != 0 or len(steps) != opts.steps:
        stderr = rank_log(opts.run_dir, stream="stderr")
        why = "timed out" if proc.timed_out else f"exit {proc.returncode}"
        raise RuntimeError(
            f"{why}, {len(steps)}/{opts.steps} steps:\n{log_tail(stderr or opts.run_dir / 'console.log')}"
        )
    log = rank_log(opts.run_dir)
    titan = parse_titan_steps(log.read_text(errors="replace")) if log else []
    return figures_from(proc, steps, titan, opts)


def figures_from(proc, steps: list[dict], titan: list, opts: RunOptions) -> LaunchFigures:
    steady = steps[1:] or steps
    steady_titan = [s for s in titan if s.step > 1]
    tps = mean([s["tokens_per_s"] for s in steady])
    # steps.jsonl carries MFU if harness.rank.train ever records it; otherwise torchtitan's printed line.
    mfu = [s["mfu_pct"] for s in steady if s.get("mfu_pct") is not None] or [
        s.mfu_pct for s in steady_titan if s.mfu_pct is not None
    ]
    return LaunchFigures(
        wall_s=proc.wall_s,
        cpu_s=proc.cpu_s,
        others_cpu_s=proc.others_cpu_s,
        peak_rss_gib=proc.peak_rss_gib,
        steps=len(steps),
        step1_s=steps[0]["step_time_s"] if steps else None,
        mean_step_s=mean([s["step_time_s"] for s in steady]),
        tokens_per_s_per_rank=tps,
        # Every recipe is data-parallel only (TP=CP=PP=1), so the job's rate is per-rank × ranks.
        tokens_per_s_total=tps * opts.nproc if tps is not None else None,
        device_max_reserved_gib=max((s["max_reserved_gib"] for s in steps), default=None),
        mfu_pct=mean(mfu) if opts.tier == "trn2" else None,
        tflops_per_rank=mean([s.tflops for s in steady_titan if s.tflops is not None]),
    )


def cpu_figures(opts: RunOptions) -> RecipeFigures:
    figures = RecipeFigures(opts.recipe, opts.tier, "ok", CPU_MFU_NOTE, **shape(opts))
    figures.launch = launch_once(opts)
    return figures


def neff_files(cache: Path) -> int:
    return sum(1 for p in cache.rglob("*") if p.is_file())


def trn2_figures(opts: RunOptions) -> RecipeFigures:
    """Cold launch on an empty NEFF cache, then a warm one on the cache it filled.

    The steady-state figures are the warm launch's; compile cost is read as the
    cold − warm difference in wall time and in step-1 time.
    """
    cache = Path(tempfile.mkdtemp(prefix="bench-neff-cache-"))
    try:
        env = {NEFF_CACHE_ENV: str(cache)}
        cold = launch_once(replace(opts, run_dir=opts.run_dir / "cold"), env)
        filled = neff_files(cache)
        warm = launch_once(replace(opts, run_dir=opts.run_dir / "warm"), env)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    figures = RecipeFigures(opts.recipe, opts.tier, "ok", **shape(opts))
    figures.launch = warm
    figures.compile = {
        "cold_wall_s": cold.wall_s,
        "warm_wall_s": warm.wall_s,
        "cold_minus_warm_wall_s": cold.wall_s - warm.wall_s,
        "cold_step1_s": cold.step1_s,
        "warm_step1_s": warm.step1_s,
        "neff_cache_files_after_cold": filled,
    }
    if filled == 0:
        figures.note = f"the NEFF cache stayed empty: {NEFF_CACHE_ENV} was not used, cold/warm are not comparable"
    return figures


def shape(opts: RunOptions) -> dict:
    return dict(
        init=opts.init,
        nproc=opts.nproc,
        seq_len=opts.seq_len,
        local_batch_size=opts.local_batch_size,
    )


def one_recipe(name: str, args, work: Path, echo) -> RecipeFigures:
    """Figures for one recipe, or a skip/failure record that says why."""

    gap = import_gap(name)
    if gap:
        return RecipeFigures(name, args.tier, "skipped", gap)
    if args.tier == "trn2":
        gap = trn2_gap(get_recipe(name).inits[0])
        if gap:
            return RecipeFigures(name, args.tier, "skipped", gap)
    try:
        opts = recipe_options(name, args, work / name)
    except RecipeError as e:
        return RecipeFigures(name, args.tier, "skipped", f"preflight refused: {e}")
    echo(
        f"  recipes: {name} ({opts.tier}, init {opts.init}, {opts.nproc} process(es), {opts.steps} steps) …"
    )
    try:
        return trn2_figures(opts) if opts.tier == "trn2" else cpu_figures(opts)
    except RuntimeError as e:
        return RecipeFigures(name, opts.tier, "failed", str(e), **shape(opts))


def import_floor_rss_gib(work: Path) -> float | None:
    """Peak RSS of a process that only imports torch and torchtitan's trainer: every rank's floor."""
    proc = run_timed(
        [sys.executable, "-c", "import torch, torchtitan.trainer"],
        env=child_env(RunOptions()),
        log_path=work / "import-floor.log",
        timeout_s=300,
    )
    return proc.peak_rss_gib if proc.returncode == 0 else None


CPU_COLUMNS = [
    "recipe",
    "init",
    "procs",
    "launch s",
    "others' CPU s",
    "s/step",
    "step-1 s",
    "tok/s/rank",
    "tok/s total",
    "peak RSS GiB",
]
TRN2_COLUMNS = CPU_COLUMNS + ["device GiB", "MFU %", "compile cold s", "compile warm s"]


def row(r: RecipeFigures, tier: str) -> list:
    f = r.launch
    cells = [
        r.recipe,
        r.init,
        r.nproc,
        f.wall_s,
        f.others_cpu_s,
        f.mean_step_s,
        f.step1_s,
        f.tokens_per_s_per_rank,
        f.tokens_per_s_total,
        f.peak_rss_gib,
    ]
    if tier == "trn2":
        c = r.compile or {}
        cells += [f.device_max_reserved_gib, f.mfu_pct, c.get("cold_wall_s"), c.get("warm_wall_s")]
    return cells


def summarize(results: list[RecipeFigures], floor: float | None, tier: str) -> Section:
    section = Section("recipes")
    section.figures = {"rss_import_floor_gib": floor, "recipes": [asdict(r) for r in results]}
    section.header = TRN2_COLUMNS if tier == "trn2" else CPU_COLUMNS
    section.rows = [row(r, tier) for r in results if r.launch is not None]
    section.notes += [f"{r.recipe}: {r.status}: {r.note}" for r in results if r.launch is None]
    section.notes += [
        f"{r.recipe}: {r.note}"
        for r in results
        if r.launch is not None and r.note and tier == "trn2"
    ]
    section.notes += [
        "s/step and tokens/s: torchtitan's metrics from steps.jsonl, step 1 (warm-up) excluded; "
        "tok/s total = per-rank × ranks (all recipes are data-parallel only). launch s: torchrun start to exit; "
        "others' CPU s: CPU the rest of the machine used meanwhile (contention).",
        f"peak RSS: largest single process of the launch (wait4 ru_maxrss); import floor "
        f"(torch + torchtitan.trainer only) {fmt(floor, 2)} GiB.",
    ]
    if tier == "cpu":
        section.notes.append(
            f"MFU, device memory and compile time are trn2 figures ({CPU_MFU_NOTE})."
        )
    else:
        section.notes.append(
            "compile cold/warm: wall time of the launch with an empty NEFF cache, then with the cache it filled; "
            "the other figures are the warm launch's. MFU: torchtitan's, from its peak-FLOPS table."
        )
    return section


def bench_recipes(args, echo=print) -> Section:

    work = Path(tempfile.mkdtemp(prefix="bench-recipes-"))
    try:
        results = [one_recipe(name, args, work, echo) for name in RECIPES]
        floor = import_floor_rss_gib(work) if any(r.launch for r in results) else None
        return summarize(results, floor, args.tier)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

"""Loss-curve bands: per-step tolerance from repeated runs, for tiers that are not bitwise repeatable.

On the cpu tier a curve is bitwise repeatable and lives in the goldens' exact lane. On
trn2 (bf16, nondeterministic collectives and kernels) the same seeded run gives slightly
different curves, so its golden is a band: per step, the mean of N repeated runs ± k
sample standard deviations, never narrower than a stated floor. One command makes it::

    python -m harness.judge.band record RECIPE --tier trn2            # N runs, then the band
    python -m harness.judge.band compute RECIPE --tier trn2 RUN_DIR…  # the band of runs made already

Both write ``fixtures/goldens/<recipe>/<tier>-band.json`` (lane ``band``, key
``loss_curve_<steps>``) with how the band was made: N, k, the floor, the per-step std, every
run's curve, the run options, the command and the environment (lock, versions, machine).
``tests/neuron/test_curves_neuron.py`` checks a fresh trn2 run against it.

Defaults, and why:

* **20 steps** (:data:`BAND_STEPS`): each repetition is a 64-rank launch of the full model
  (minutes of checkpoint load before step 1, even with a warm NEFF cache), and N of them make
  one band. Twenty steps cover the first optimizer updates, where a broken gradient,
  optimizer or data path shows; with the tier's 600 warmup steps the learning rate is still
  at most 20/600 of its peak, so the runs stay close and the band measures run-to-run
  nondeterminism rather than divergence.
* **N = 5 repetitions of the same seed, k = 4** (:data:`BAND_RUNS`, :data:`BAND_K`): if
  repeated runs spread normally, a new run falls outside mean ± k·s at one step with
  probability P(|T_{N-1}| > k / sqrt(1 + 1/N)) = 2.2 % for N = 5, k = 4 (written into the
  band as ``false_alarm_per_step``); k = 3 would be 5.2 %.
* **floor 0.005 nats** (:data:`MIN_HALFWIDTH`): half of the published numbers' last digit
  (6.54, 12.43), so a band never claims more precision than the tutorial's numbers, and
  a device whose N runs happen to agree bitwise does not get a zero-width band.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from harness.base.run_dir import STEPS_FILE, read_run_json, read_steps
from harness.declare import catalogue
from harness.declare import catalogue as nightly
from harness.judge import goldens, verdicts
from harness.options.run_options import RunOptions

BAND_STEPS = 20
BAND_RUNS = 5
BAND_K = 4.0
MIN_HALFWIDTH = 0.005


class BandError(goldens.GoldenError):
    """Runs a band cannot be made from (too few, unequal lengths, NaN/inf)."""


def band_tier(tier: str) -> str:
    """The goldens "tier" a tier's bands live under: ``<tier>-band.json`` beside ``<tier>.json``."""
    return f"{tier}-band"


def band_key(steps: int) -> str:
    return f"loss_curve_{steps}"


def band_options(
    recipe: str, tier: str = "trn2", steps: int = BAND_STEPS, seed: int = 0, **extra
) -> RunOptions:
    """The run a band is made of, and the run the neuron test checks against it.

    On trn2 it is the recipe's band lane run of the nightly (its catalogue entry's band launch,
    ``harness.declare.catalogue.BAND_LAUNCH``), so the night's lane run is judged against a band of the same
    runs. Elsewhere, as the tutorial runs each recipe: its entry's ``band_init`` (``--model-dir``'s
    weights, or random init), accepting what its as-published lane accepts. No export.
    """
    if tier == "trn2":
        launch = nightly.LAUNCHES[nightly.BAND_LAUNCH[recipe]]
        return replace(launch.options(seed=seed), steps=steps, export=False, **extra)

    entry = catalogue.entry(recipe)
    tier_preset = RunOptions(tier=tier).tier_preset
    init = entry.band_init
    allow = list(entry.published_lane.allow_mismatch) if init == "hf" else []
    return RunOptions(
        recipe=recipe,
        tier=tier,
        nproc=tier_preset.nproc,
        steps=steps,
        init=init,
        seed=seed,
        allow_mismatch=allow,
        export=False,
        **extra,
    )


def judge_curve(
    recipe: str, tier: str, losses: list[float], env: dict | None = None
) -> verdicts.Verdict:
    """A curve against its recorded band; "unmeasured" (with the values) while none is recorded.

    A band nobody has recorded yet says nothing about the curve, so it never fails a night;
    once ``python -m harness.judge.band record`` has written one, a curve that leaves it fails.
    """
    tier_name, key = band_tier(tier), band_key(len(losses))
    why = unrecorded(recipe, tier, len(losses))
    if why is None:
        _, values = goldens.load(recipe, tier_name)
        return verdicts.compare(key, losses, values, {}, env)
    path = goldens.goldens_path(recipe, tier_name)
    missing = goldens.Golden(
        key=key,
        value=[],
        tolerance=0.0,
        lane="band",
        reason=f"no band recorded in {path}",
        unmeasured=why,
    )
    return verdicts.Verdict(
        key=key, measured=losses, golden=missing, passed=None, kind=goldens.NOT_JUDGED
    )


def unrecorded(recipe: str, tier: str, steps: int) -> str | None:
    """Why ``recipe``'s ``steps``-step curve on ``tier`` has no band to be judged against, or None when it has one."""
    tier_name, key = band_tier(tier), band_key(steps)
    path = goldens.goldens_path(recipe, tier_name)
    if path.exists() and key in goldens.load(recipe, tier_name)[1]:
        return None
    return (
        f"{path} has no {key!r}: record it on a trn2.48xlarge with `python -m harness.judge.band record "
        f"{recipe}` ({BAND_RUNS} runs of {steps} steps) and commit it"
    )


def loss_fall(losses: list[float]) -> dict:
    """How much a curve falls over its run, beside its measured noise.

    A least-squares line through the losses: ``fall`` is its drop from the first step to
    the last, ``noise`` the standard deviation of the losses around it (what one step's
    batch and rounding add), and ``se`` the standard error of that drop. A curve "trains"
    when ``fall > FALL_SIGMAS * se``: the drop is that many of its own standard errors, so a
    flat curve of the same noise passes with probability P(T_{n-2} > 3) = 0.38 % at 20 steps
    (Student t, :func:`t_tail`); the curvature of a falling loss only inflates ``noise``.
    """
    n = len(losses)
    if n < 3 or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses):
        return {"steps": n, "fall": None, "noise": None, "se": None, "trains": False}
    xs = range(n)
    x_mean, y_mean = (n - 1) / 2, math.fsum(losses) / n
    sxx = math.fsum((x - x_mean) ** 2 for x in xs)
    slope = math.fsum((x - x_mean) * (y - y_mean) for x, y in zip(xs, losses)) / sxx
    residuals = [y - (y_mean + slope * (x - x_mean)) for x, y in zip(xs, losses)]
    noise = math.sqrt(math.fsum(r * r for r in residuals) / (n - 2))
    se = noise / math.sqrt(sxx) * (n - 1)
    fall = -slope * (n - 1)
    return {
        "steps": n,
        "fall": fall,
        "noise": noise,
        "se": se,
        "sigmas": FALL_SIGMAS,
        "trains": fall > FALL_SIGMAS * se,
    }


#: How many standard errors the fitted drop must exceed (see loss_fall).
FALL_SIGMAS = 3.0


# --- the statistics -------------------------------------------------------------------------------


def t_tail(x: float, dof: int) -> float:
    """P(|T| > x) for Student's t with ``dof`` degrees of freedom (Simpson's rule on the density)."""
    if x <= 0:
        return 1.0
    log_c = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)

    def density(t: float) -> float:
        return math.exp(log_c - (dof + 1) / 2 * math.log1p(t * t / dof))

    n = 4000  # even
    h = x / n
    inner = sum((4 if i % 2 else 2) * density(i * h) for i in range(1, n))
    central = 2 * h / 3 * (density(0) + inner + density(x))
    return max(0.0, 1.0 - central)


def false_alarm_per_step(n: int, k: float) -> float:
    """Chance that one more run of the same distribution lands outside mean ± k·s at a given step."""
    return t_tail(k / math.sqrt(1 + 1 / n), n - 1)


def compute_band(
    runs: list[list[float]], k: float = BAND_K, min_halfwidth: float = MIN_HALFWIDTH
) -> dict:
    """Per step: mean, sample std (n - 1) and half-width max(k·std, min_halfwidth) of ``runs``."""
    if len(runs) < 2:
        raise BandError(f"a band needs at least 2 runs, got {len(runs)}: a std needs two")
    lengths = sorted({len(r) for r in runs})
    if len(lengths) != 1 or lengths[0] == 0:
        raise BandError(f"every run must have the same number of steps, got lengths {lengths}")
    for i, run in enumerate(runs):
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in run):
            raise BandError(f"run {i} has a non-finite loss; a band never holds NaN/inf")
    if not (math.isfinite(k) and k > 0) or not (
        math.isfinite(min_halfwidth) and min_halfwidth >= 0
    ):
        raise BandError(
            f"k must be > 0 and the floor ≥ 0, got k={k}, min_halfwidth={min_halfwidth}"
        )
    n = len(runs)
    mean, std = [], []
    for step in zip(*runs):
        m = math.fsum(step) / n
        mean.append(m)
        std.append(math.sqrt(math.fsum((x - m) ** 2 for x in step) / (n - 1)))
    return {"mean": mean, "std": std, "halfwidth": [max(k * s, min_halfwidth) for s in std]}


def band_entry(
    runs: list[list[float]],
    *,
    k: float,
    min_halfwidth: float,
    command: str,
    options: dict,
    seeds: list[int],
    environment: dict | None = None,
) -> dict:
    """The goldens entry of a band: what it is, and how it was made."""
    stats = compute_band(runs, k, min_halfwidth)
    n = len(runs)
    floored = sum(1 for s in stats["std"] if k * s < min_halfwidth)
    return {
        "value": stats["mean"],
        "tolerance": stats["halfwidth"],
        "lane": "band",
        "reason": (
            f"mean ± max({k:g}·std, {min_halfwidth:g}) per step over {n} repeated runs "
            f"(seeds {sorted(set(seeds))}); the floor set {floored} of {len(stats['std'])} steps. "
            f"One more run of the same distribution leaves the band at a given step with probability "
            f"{false_alarm_per_step(n, k):.3g} (Student t, {n - 1} dof)"
        ),
        "band": {
            "n": n,
            "k": k,
            "min_halfwidth": min_halfwidth,
            "std": stats["std"],
            "runs": runs,
            "seeds": seeds,
            "false_alarm_per_step": false_alarm_per_step(n, k),
            "options": options,
            "command": command,
            "environment": environment
            if environment is not None
            else goldens.environment_metadata(),
            "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
    }


def write_band(recipe: str, tier: str, key: str, entry: dict) -> Path:
    """Put ``entry`` under ``key`` in ``<recipe>/<tier>-band.json``; other keys stay. Refuses a bad entry."""
    path = goldens.goldens_path(recipe, band_tier(tier))
    data = json.loads(path.read_text()) if path.exists() else {"values": {}}
    data.setdefault("values", {})[key] = entry
    goldens._parse_entry(path, key, entry)  # the loader's own checks, before anything is written
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


# --- runs -------------------------------------------------------------------------------------------


def read_run(run_dir: Path) -> tuple[list[float], dict]:
    """(losses, options) of a finished run directory (steps.jsonl, run.json)."""

    steps_file = Path(run_dir) / STEPS_FILE
    if not steps_file.is_file():
        raise BandError(f"{steps_file} does not exist: {run_dir} is not a finished run directory")
    return [s["loss"] for s in read_steps(run_dir) if "loss" in s], read_run_json(run_dir)


def record(
    recipe: str, tier: str, runs: int, steps: int, seeds: list[int], work_dir: Path, launch=None
) -> list[Path]:
    """Launch ``runs`` runs of :func:`band_options` one after another; return their run directories."""
    from harness.checks.preflight import preflight  # noqa: PLC0415 -- heavy: harness.checks.preflight imports torch (torch 2.9 s); this module stays light

    if launch is None:
        from harness.launch.lifecycle import launch  # noqa: PLC0415 -- shadowed: `launch` is also a local name here
    dirs = []
    for i in range(runs):
        seed = seeds[i % len(seeds)]
        run_dir = Path(work_dir) / f"{recipe}-{tier}-run{i}-seed{seed}"
        opts = preflight(band_options(recipe, tier, steps, seed, run_dir=run_dir))
        print(
            f"[band] run {i + 1}/{runs}: {recipe} on {tier}, seed {seed}, {steps} steps -> {run_dir}",
            flush=True,
        )
        result = launch(opts)  # the band lanes keep no defect: no lane environment to set
        if len(result.losses) != steps:
            raise BandError(
                f"run {i + 1} recorded {len(result.losses)} of {steps} steps ({run_dir})"
            )
        dirs.append(run_dir)
    return dirs


def make_band(
    recipe: str, tier: str, run_dirs: list[Path], k: float, min_halfwidth: float, command: str
) -> Path:
    curves, options, seeds = [], [], []
    for run_dir in run_dirs:
        losses, opts = read_run(run_dir)
        curves.append(losses)
        options.append(opts)
        seeds.append(opts.get("seed", 0))
    recipes_seen = {o.get("recipe", recipe) for o in options}
    if recipes_seen != {recipe}:
        raise BandError(f"the runs are of {sorted(recipes_seen)}, not only {recipe!r}")
    same = {
        k_: v
        for k_, v in options[0].items()
        if all(o.get(k_) == v for o in options) and k_ != "run_dir"
    }
    entry = band_entry(
        curves, k=k, min_halfwidth=min_halfwidth, command=command, options=same, seeds=seeds
    )
    path = write_band(recipe, tier, band_key(len(curves[0])), entry)
    width = entry["tolerance"]
    print(
        f"[band] {path}: {band_key(len(curves[0]))} from {len(curves)} runs, half-width "
        f"{min(width):.4g} .. {max(width):.4g}, false alarm per step {entry['band']['false_alarm_per_step']:.3g}"
    )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.judge.band", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("record", "compute"):
        p = sub.add_parser(name)
        p.add_argument("recipe")
        p.add_argument("--tier", default="trn2")
        p.add_argument(
            "--k", type=float, default=BAND_K, help=f"half-width = k·std (default {BAND_K:g})"
        )
        p.add_argument(
            "--min-halfwidth",
            type=float,
            default=MIN_HALFWIDTH,
            help=f"per-step floor (default {MIN_HALFWIDTH:g})",
        )
        if name == "record":
            p.add_argument(
                "--runs", type=int, default=BAND_RUNS, help=f"repetitions (default {BAND_RUNS})"
            )
            p.add_argument(
                "--steps",
                type=int,
                default=BAND_STEPS,
                help=f"steps per run (default {BAND_STEPS})",
            )
            p.add_argument(
                "--seeds",
                type=int,
                nargs="+",
                default=[0],
                help="seeds, cycled over the runs (default 0)",
            )
            p.add_argument(
                "--work-dir", type=Path, default=Path("report") / "band", help="where the runs go"
            )
        else:
            p.add_argument(
                "run_dirs",
                type=Path,
                nargs="+",
                help="finished run directories (steps.jsonl, run.json)",
            )
    args = parser.parse_args(argv)
    command = "python -m harness.judge.band " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    try:
        if args.command == "record":
            if args.runs < 2:
                raise BandError(f"--runs {args.runs}: a band needs at least 2 runs")
            run_dirs = record(
                args.recipe, args.tier, args.runs, args.steps, args.seeds, args.work_dir
            )
        else:
            run_dirs = args.run_dirs
        make_band(args.recipe, args.tier, run_dirs, args.k, args.min_halfwidth, command)
    except goldens.GoldenError as e:
        print(f"harness.judge.band: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

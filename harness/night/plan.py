"""The trn2 nightly as a plan: its steps in order, every 64-rank launch and what it serves, and its budget.

One run per recipe and lane serves step 1, the export round trip, the band, the
"trains" check and the host reference at once (``tests/neuron/lane_runs.py`` launches each
once per session, whichever test asks first), so the night makes :data:`LAUNCHES` and no
more (it made 16, then 11). Each recipe declares its launches, its claims' judges and its band launch in its
entry of ``harness.declare.catalogue``; this module plans and budgets them. A stable night (no version, input or suite code changed: ``harness.night.standing``)
makes only the every-night launches, 8: the two diagnosis lanes and the torchtitan.train check re-run
only when what they explain or check may have moved, and carry their standing result otherwise; the
host reference scores each distinct first batch once, beside the next launches (one host worker), so
only its tail is the night's; the suspects are scored only when the explanation is due.

:data:`CLAIM_JUDGES` says, for every published claim in ``fixtures/goldens/*/trn2.json``,
which launch and lane judge it and in which test (the as-published lane: a published
number is judged on the tutorial's config as published; config 1's export, which its
as-published run never reaches, names the lane that judges it and each way that lane differs). Every
claim is judged every night. The dry run prints both (``python -m harness run all --tier trn2 --dry-run``),
with the stable and the changed night's totals, so a maintainer can size the runner's timeout; the
workflow's ``timeout-minutes`` is :func:`workflow_timeout_minutes`.

Every time below is an **estimate, not a measurement**: no trn2 night has timed one yet.
Each constant says what it is based on; replace it with a night's figure (the report
records every launch's wall time and step times) and the timeout follows.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.checks import titan as titan_check
from harness.declare import catalogue
from harness.declare.catalogue import (  # noqa: F401  (the plan's names, declared per recipe in the catalogue)
    BAND_LAUNCH,
    CLAIM_JUDGES,
    EVERY_NIGHT,
    LANE_STEPS,
    LAUNCHES,
    ON_CHANGE,
    ClaimJudge,
    Launch,
)
from harness.declare.claims import published_claims
from harness.launch import watchdog
from harness.launch.watchdog import Budgets
from harness.night.config3_fork import config3_comparison
from harness.report.markdown import md_table
from recipes.tiers import TIERS, rehearsal_settings

# --- estimates (minutes unless named otherwise), each with its basis ---------------------------------
#: torchrun start-up of 64 ranks, process groups, dataloader: torch/torchtitan imports take ~9 s of CPU
#: per rank on the cpu tier (README, harness.launch.elastic), 64 in parallel on 192 vCPUs, plus NRT init.
STARTUP_MIN = 3.0
#: Loading Qwen3-4B-Instruct-2507's ~8 GB of bf16 safetensors into 64 FSDP shards (DCP HF load).
LOAD_WEIGHTS_MIN = 4.0
#: Eager TorchNeuron compiles each new op/kernel shape on first call (Neuron docs: a cold run spends
#: many minutes before step 1). Cold: the first launch of a model family with an empty NEFF cache;
#: warm: a later launch of the same family, or any night after the first (the persistent cache).
COMPILE_COLD_MIN = 45.0
COMPILE_WARM_MIN = 5.0
#: A kernel's first compile (forward and backward) with the ops fused around it, when the rest of its family is
#: cached: the one-core kernel step's cold estimate. Eager TorchNeuron dispatches ops one at a time and fuses
#: queued runs of them into single ops by heuristics (aws-neuron/aws-neuron-sdk, the TorchNeuron landing page's
#: eager-mode FAQ, "Adaptive Eager Execution"), each compiled on first call: swapping RoPE for rope_hf leaves the
#: experts, attention, loss and optimizer ops of the family's cache as they were.
KERNEL_COMPILE_COLD_MIN = COMPILE_COLD_MIN / 3
#: Seconds per step after compilation: 64 x 2048 tokens, eager, 4B dense / 4-layer MoE.
STEP_S = {"dense": 4.0, "moe": 3.0}
#: Writing the bf16 HF export (~8 GB) and config.json/tokenizer from rank 0.
EXPORT_MIN = 3.0
#: One fp32 forward of the 64 x 2048-token batch through the 4B model on the host CPU: ~5 CPU-hours
#: (README, `python -m harness.reference.diagnosis cost` on this suite's machine), ~25 effective cores of the
#: trn2.48xlarge host -> ~12 min, rounded up. A diagnosed lane scores one more per suspect that applies.
REFERENCE_FORWARD_MIN = 15.0
#: The 64-rank kernel-free steps' margin: the workflow's timeout is the cold total times this, rounded up.
TIMEOUT_MARGIN = 1.25
TIMEOUT_ROUND_MIN = 30


#: The two nights the plan is sized for: nothing changed (every ON_CHANGE launch and diagnosis carried), or a
#: version or input changed (everything runs). The cold NEFF cache is sized on the changed night.
STABLE, CHANGED = "stable", "changed"


# --- the budget -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """Minutes one step of the night takes, cold NEFF cache and warm, with what they are made of."""

    cold: float
    warm: float
    parts: dict[str, float] = field(default_factory=dict)


def launch_estimate(launch: Launch, first_of_family: bool, new_kernels: int = 0) -> Estimate:
    """The chip's minutes for one launch: start-up, weights, compile, steps, export (the host reference is not
    the chip's: it runs beside the next launches, :func:`host_reference_minutes`). ``new_kernels``: overrides
    whose kernel no earlier launch of the night compiled (each compiles cold beside a cached family)."""
    kind = catalogue.entry(launch.recipe).kind
    parts = {
        "start-up": STARTUP_MIN,
        "weights": LOAD_WEIGHTS_MIN if launch.init == "hf" else 0.0,
        "steps": launch.steps * STEP_S[kind] / 60,
        "export": EXPORT_MIN if launch.export else 0.0,
    }
    fixed = sum(parts.values())
    cold = (
        COMPILE_COLD_MIN
        if first_of_family
        else COMPILE_WARM_MIN + new_kernels * KERNEL_COMPILE_COLD_MIN
    )
    return Estimate(
        cold=fixed + cold, warm=fixed + COMPILE_WARM_MIN, parts={**parts, "compile (cold)": cold}
    )


def host_reference_minutes(launch: Launch, night: str, scored: set[str]) -> float:
    """The host's reference forwards after ``launch``: its batch once a night (``scored``: batches already
    scored tonight), and its diagnosis suspects only on a night the explanation is due (the changed night)."""
    if not launch.reference:
        return 0.0
    forwards = (launch.batch not in scored) + (launch.suspects if night == CHANGED else 0)
    scored.add(launch.batch)
    return forwards * REFERENCE_FORWARD_MIN


@dataclass(frozen=True)
class Step:
    """One step of the nightly workflow, in order."""

    name: str
    command: str
    processes: int
    cores: int
    launches: int
    estimate: Estimate
    #: The launch of ``LAUNCHES`` this step is (None: not a launch).
    launch: str | None = None
    #: Host reference minutes the launch queues for the host worker, which scores beside the next launches.
    host_min: float = 0.0


def night_launches(night: str = CHANGED) -> list[Launch]:
    """The launches a night makes, in the plan's order: every one on a changed night, the every-night ones on a
    stable night (tests/neuron decide at run time with ``harness.night.standing.due``)."""
    return [x for x in LAUNCHES.values() if night == CHANGED or x.when == EVERY_NIGHT]


def steps(night: str = CHANGED) -> list[Step]:
    """The night in order: install, names check, the device-randomness preflight (at most its 60 s limit), the
    neuron tests (each launch on its own line), guards."""
    out = [
        Step("install the trn2 tier", "make neuron-venv", 1, 0, 0, Estimate(15.0, 2.0)),
        Step(
            "torchtitan names and hooks against the installed fork",
            "python -m harness.checks.titan --tier trn2",
            1,
            0,
            0,
            Estimate(0.5, 0.5),
        ),
        Step(
            "device randomness: a launch's random-init ops on one core (a hang stops the night), and "
            "the device files a process holding a core keeps open (the held-device guard's reading)",
            "python -m harness.night.device_random --limit 60 --held-out held-guard.json",
            1,
            1,
            0,
            Estimate(1.0, 1.0),
        ),
        Step(
            "one-core kernel tests (rope_hf, grouped experts) and config 3 fork vs twin",
            "pytest -m neuron",
            1,
            1,
            0,
            Estimate(KERNEL_COMPILE_COLD_MIN, COMPILE_WARM_MIN),
        ),
    ]
    seen: set[str] = set()
    kernels: set[str] = set()
    scored: set[str] = set()
    for launch in night_launches(night):
        new_kernels = set(launch.overrides) - kernels
        estimate = launch_estimate(launch, launch.family not in seen, len(new_kernels))
        seen.add(launch.family)
        kernels |= new_kernels
        out.append(
            Step(
                f"launch {launch.name}: {launch.describe()}",
                "pytest -m neuron",
                64,
                64,
                1,
                estimate,
                launch.name,
                host_reference_minutes(launch, night, scored),
            )
        )
    out.append(
        Step(
            "guards: require-ran, require-claims, record-inputs, trend",
            "python -m harness.night.ci ...",
            1,
            0,
            0,
            Estimate(0.5, 0.5),
        )
    )
    return out


def launch_estimates() -> dict[str, Estimate]:
    """Each launch's estimate, as the plan orders them (the first of a compile family compiles cold)."""
    return {s.launch: s.estimate for s in steps() if s.launch}


def watchdog_budgets(name: str) -> Budgets:
    """The launch watchdog's budgets for launch ``name`` (``harness.launch.watchdog``): before step 1, its
    estimate's start-up, weights and cold compile times ``watchdog.PLAN_MARGIN`` (a warm night only finishes
    sooner); after it, the trn2 tier's multiple and floor. A rehearsal runs tiny models on cpu: the tier's."""

    tier = watchdog.for_tier(TIERS["trn2"])
    if rehearsal_settings() is not None:
        return tier
    parts = launch_estimates()[name].parts
    before = sum(parts[k] for k in ("start-up", "weights", "compile (cold)")) * 60
    return replace(tier, before_first_step_s=before * watchdog.PLAN_MARGIN)


def measured_lines(measured: dict[str, dict]) -> list[str]:
    """The plan's estimate of each launch beside what a night measured (``{name: {"launch_min", "reference_min",
    "steps", "stopped"}}``, from tests/neuron/lane_runs.py), so the first real night can replace the estimates."""

    rows = []
    for name, estimate in launch_estimates().items():
        got = measured.get(name)
        cells = (
            ["not launched", "–", "–"]
            if got is None
            else [
                f"{got['launch_min']:.1f}",
                f"{got['reference_min']:.1f}" if got.get("reference_min") is not None else "–",
                f"{got['steps']}" + (f" (stopped: {got['stopped']})" if got.get("stopped") else ""),
            ]
        )
        rows.append([name, f"{estimate.cold:.0f}", f"{estimate.warm:.0f}", *cells])
    return [
        "Each launch: the plan's estimate (harness/night/plan.py) beside tonight's measurement, in minutes",
        "",
        *md_table(
            [
                "launch",
                "estimate cold",
                "estimate warm",
                "measured launch",
                "measured reference",
                "steps",
            ],
            rows,
        ),
    ]


def _clock(plan: list[Step], cache: str) -> tuple[float, float, dict[str, float]]:
    """(chip minutes, host worker's end, each launch's end) with one host worker that scores each launch's batch
    as the launch ends, beside the later launches (the reference tests run after the last launch)."""
    chip = host = 0.0
    ends = {}
    for step in plan[
        :-1
    ]:  # the guards read the reference tests' report: they run after the host is done
        chip += getattr(step.estimate, cache)
        if step.launch:
            ends[step.launch] = chip
        if step.host_min:
            host = max(host, chip) + step.host_min
    return chip, host, ends


def totals(plan: list[Step] | None = None) -> Estimate:
    """The night's wall minutes: the chip's steps, then whatever the host reference still has to score, then the
    guards."""
    plan = plan or steps()
    out = {}
    for cache in ("cold", "warm"):
        chip, host, _ = _clock(plan, cache)
        out[cache] = max(chip, host) + getattr(plan[-1].estimate, cache)
    return Estimate(**out, parts={"host reference": sum(s.host_min for s in plan)})


def first_published_verdict(plan: list[Step] | None = None) -> tuple[str, Estimate]:
    """The first launch whose tests judge a published claim, and the minutes into the night when it ends, by the
    plan (tests/neuron/conftest.py runs the night in this order: the cheap checks, then the launches as listed)."""
    plan = plan or steps()
    judging = {j.launch for j in CLAIM_JUDGES.values() if j.launch}
    first = next((s.launch for s in plan if s.launch in judging), None)
    if first is None:
        raise ValueError(
            "no launch of the plan judges a published claim (harness.night.plan.CLAIM_JUDGES)"
        )
    return first, Estimate(cold=_clock(plan, "cold")[2][first], warm=_clock(plan, "warm")[2][first])


def workflow_timeout_minutes() -> int:
    """``timeout-minutes`` of .github/workflows/nightly-trn2.yml: the changed night's cold total with a margin,
    rounded up."""
    cold = totals(steps(CHANGED)).cold * TIMEOUT_MARGIN
    return int(math.ceil(cold / TIMEOUT_ROUND_MIN) * TIMEOUT_ROUND_MIN)


# --- what the dry run prints ---------------------------------------------------------------------------


def night_line(night: str) -> str:
    plan = steps(night)
    total = totals(plan)
    what = {
        STABLE: "a stable night (no version or input changed; on-change launches and diagnoses carried)",
        CHANGED: "a changed night (a version or input changed: everything runs)",
    }[night]
    return (
        f"{what}: {sum(s.launches for s in plan)} launches of 64 ranks; {total.cold:.0f} min with a cold NEFF "
        f"cache, {total.warm:.0f} min warm; host reference {total.parts['host reference']:.0f} min, scored "
        "beside the launches"
    )


def plan_lines() -> list[str]:

    plan = steps(CHANGED)
    rows = [
        [
            i,
            s.name,
            s.processes,
            s.cores,
            s.launches,
            f"{s.estimate.cold:.0f}",
            f"{s.estimate.warm:.0f}",
            f"{s.host_min:.0f}",
        ]
        for i, s in enumerate(plan, 1)
    ]
    return [
        "The trn2 nightly, in order (estimates, not measurements: no trn2 night has timed them; harness/night/plan.py "
        "says what each is based on)",
        "",
        *md_table(
            [
                "#",
                "step",
                "processes",
                "NeuronCores",
                "64-rank launches",
                "min (cold cache)",
                "min (warm)",
                "host reference min (beside)",
            ],
            rows,
        ),
        "",
        night_line(STABLE),
        night_line(CHANGED),
        f"workflow timeout-minutes {workflow_timeout_minutes()} (the changed night cold x {TIMEOUT_MARGIN:g}, rounded "
        f"up to {TIMEOUT_ROUND_MIN} min)",
        "first published verdict: after {0}, about {1.warm:.0f} min into a warm night ({1.cold:.0f} cold)".format(
            *first_published_verdict(plan)
        ),
    ]


def claim_lines() -> list[str]:

    rows = []
    for claim in published_claims("trn2"):
        judge = CLAIM_JUDGES.get(claim.name)
        if judge is None:
            rows.append([claim.name, repr(claim.value), "**no launch judges it**", "–"])
            continue
        launch = LAUNCHES[judge.launch] if judge.launch else None
        where = f"{launch.name} ({launch.describe()})" if launch else judge.how
        if judge.not_as_published:
            where += f"; not as published: {judge.not_as_published}"
        rows.append([claim.name, repr(claim.value), where, judge.test])
    return [
        "Published claims and the run that judges each (the as-published lane: the tutorial's config as published,"
        " unless the row says why not)",
        "",
        *md_table(["published claim", "value", "judged by (launch: recipe/lane)", "test"], rows),
    ]


def dry_run_report(out_dir: Path, inputs, echo=print) -> bool:
    """The trn2 nightly without a chip: the names check, config 3's source, the plan and budget, the claims.

    ``inputs``: the ``RecipeInputs`` config 3 is compared at (the dry run's stand-ins on a machine
    without the trn2 inputs). Writes ``<out_dir>/nightly.json``; False when a required torchtitan
    name is missing.
    """

    rows = titan_check.check("trn2")
    echo(titan_check.summary(rows, "trn2"))
    forked = catalogue.forked()
    config3 = config3_comparison(inputs) if forked else None
    if forked and config3["fork"] == "absent":
        echo(
            f"{forked.fork.label}: the fork's {forked.fork.name} is absent here, so a trn2 run builds "
            f"{config3['source']} (a finding, reported, not a skip): {config3['finding']}"
        )
    elif forked:
        echo(f"{forked.fork.label}: built from {config3['fork']}; {config3['finding']}:")
        echo(
            "\n".join(
                f"  {d['path']}: fork {d['fork']!r}, twin {d['twin']!r}"
                for d in config3["differences"]
            )
        )
    echo("")
    echo("\n".join(plan_lines()))
    echo("")
    echo("\n".join(claim_lines()))
    out = out_dir / "nightly.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    plan = [dataclasses.asdict(step) for step in steps()]
    launches = {
        name: {**dataclasses.asdict(x), "options": json.loads(x.options().to_json())}
        for name, x in LAUNCHES.items()
    }
    claims = {name: dataclasses.asdict(j) for name, j in CLAIM_JUDGES.items()}
    out.write_text(
        json.dumps(
            {
                "names": [r.to_dict() for r in rows],
                "config3": config3,
                "plan": plan,
                "launches": launches,
                "claims": claims,
                "total_minutes": dataclasses.asdict(totals()),
                "nights": {
                    night: dataclasses.asdict(totals(steps(night)))
                    | {"launches": len(night_launches(night))}
                    for night in (STABLE, CHANGED)
                },
                "workflow_timeout_minutes": workflow_timeout_minutes(),
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    echo(f"  report: {out}")
    return not any(r.status == "missing" for r in rows)

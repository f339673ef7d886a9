"""What one catalogue entry declares about a recipe: its lanes, night launches, claim judges, upstream spec,
proxy and fork (``harness.declare.catalogue`` holds one :class:`Entry` per recipe)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.options.lanes import Lane
from harness.options.run_options import RunOptions
from recipes.tiers import TRN2, launch_seq_len

#: Every lane, by ``recipe.lane``: refilled in place by harness.declare.catalogue from its entries.
LANES: dict[str, Lane] = {}

#: Steps of a lane run: the band's length (harness.judge.band.BAND_STEPS), so the run is the band's run.
LANE_STEPS = 20
#: When a launch runs: every night, or only on a night what it explains or checks may have moved.
EVERY_NIGHT, ON_CHANGE = "every night", "on change"


@dataclass(frozen=True)
class Upstream:
    """Upstream's own spec a recipe's model must match, shrunk as the tutorial shrinks it (the dry run)."""

    flavor: str
    n_layers: int | None = None
    num_experts: int | None = None
    top_k: int | None = None


@dataclass(frozen=True)
class Proxy:
    """The recipe's 4B-width random-init stand-in on the cpu tier (``harness.judge.verdicts.FULL_WIDTH_RANDOM_INIT``)."""

    #: Build the real Qwen3-4B-Instruct-2507 config.json in fixtures/ (no weights) and read the cpu tier's
    #: tokenizer: a recipe that builds whatever config.json it is pointed at.
    fixture_config: bool = False


@dataclass(frozen=True)
class Fork:
    """The fork's own config function the recipe's twin stands in for (``harness.night.config3_fork``).

    The recipe's module has ``config_source(tier)``, ``fork_config()`` and ``twin_config(tier, as_published)``.
    """

    #: The function's name in ``recipes.titan.BY_NAME``.
    name: str
    #: How the dry run names it ("config 3").
    label: str


@dataclass(frozen=True)
class Launch:
    """One 64-rank launch of the night: a recipe in a lane, and everything it serves."""

    name: str
    lane: str
    """A key of :data:`LANES` (``recipe.lane``)."""
    init: str
    steps: int
    serves: tuple[str, ...]
    tests: tuple[str, ...]
    export: bool = False
    overrides: tuple[str, ...] = ()
    seq_len: int | None = None
    #: Scores its first batch with the host reference (random init has nothing to score): once per distinct
    #: batch a night, shared by every launch that feeds the same tokens (:attr:`batch`).
    reference: bool = False
    #: Diagnosis forwards (one per suspect that applies): scored only on a night its explanation is due.
    suspects: int = 0
    #: :data:`EVERY_NIGHT`, or :data:`ON_CHANGE`: only when what it explains or checks may have moved
    #: (``harness.night.standing``); otherwise the standing result of the night that measured it is carried.
    when: str = "every night"
    #: A diagnosis lane: the launch whose as-published step 1 it explains (its due-ness follows that number).
    explains: str = ""
    #: "harness" (python -m harness run's launch) or "torchtitan.train" (torchtitan's own entry).
    entry: str = "harness"
    #: Which compiled ops it shares with earlier launches (the first of a family compiles cold). An override that
    #: swaps a module for a kernel keeps the family: eager TorchNeuron compiles per (fused) op, so only the new
    #: kernel and the ops fused around it compile (``harness.night.plan.KERNEL_COMPILE_COLD_MIN``).
    family: str = ""

    @property
    def recipe(self) -> str:
        return LANES[self.lane].recipe

    @property
    def batch(self) -> str:
        """Which first batch the launch trains on: the same tokenizer, text and sequence length give the same
        tokens (same seed), so the host reference scores it once (tests/neuron/lane_runs.py keys by its sha256)."""
        lane = LANES[self.lane]
        tokenizer = "test BPE" if lane.titan_tokenizer else "weights' tokenizer"
        text = "c4_test" if lane.titan_dataset else "$QWEN3_DATASET_DIR"
        return f"{tokenizer}, {text}, seq_len {self.seq_len or 'recipe'}"

    @property
    def lane_name(self) -> str:
        return LANES[self.lane].name

    def options(
        self, run_dir: Path | None = None, checkout: Path | None = None, seed: int = 0
    ) -> RunOptions:
        """The run's options as ``python -m harness run`` resolves them on trn2."""
        extra = {"seq_len": launch_seq_len(self.seq_len)} if self.seq_len else {}
        return LANES[self.lane].options(
            checkout,
            init=self.init,
            steps=self.steps,
            seed=seed,
            export=self.export,
            run_dir=run_dir,
            overrides=list(self.overrides),
            nproc=TRN2.nproc,
            **extra,
        )

    def describe(self) -> str:
        bits = [f"{self.recipe}/{self.lane_name}", f"init {self.init}", f"{self.steps} step(s)"]
        bits += ["export"] * self.export + [f"--override {o}" for o in self.overrides]
        bits += ["on change"] * (self.when == ON_CHANGE)
        return ", ".join(bits) + (" [torchtitan.train]" if self.entry != "harness" else "")


@dataclass(frozen=True)
class ClaimJudge:
    """Which launch, lane and test judge one published claim of ``fixtures/goldens/<recipe>/trn2.json``."""

    claim: str
    launch: str | None
    test: str
    how: str = ""
    #: Why a claim is judged on a lane other than the as-published one (empty: it is not). Only for a claim
    #: the as-published config cannot reach, on a lane that differs from it in one named way the claim does not read.
    not_as_published: str = ""


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One recipe, as the harness knows it. Every field without a default must be declared."""

    recipe: str
    #: The tutorial's name for it ("config 1").
    tutorial: str
    #: "dense" or "moe": which step time the night's estimate uses (``harness.night.plan.STEP_S``).
    kind: str
    upstream: Upstream
    lanes: tuple[Lane, ...]
    #: Its 64-rank launches of the trn2 night, in the night's order (harness.night.plan plans them).
    launches: tuple[Launch, ...]
    #: A judge for each published claim of its ``fixtures/goldens/<recipe>/trn2.json``.
    claims: tuple[ClaimJudge, ...]
    #: The launch its trn2 band is made of and judged on (``harness.judge.band.band_options``).
    band_launch: str
    #: None: no 4B-width proxy (the recipe has no random init at that width).
    proxy: Proxy | None
    #: The band's init on tiers other than trn2 (trn2's band is a night launch's).
    band_init: str = "hf"
    #: Its MoE experts compute in bf16 by design: the reference's wider tolerance (MOE_BF16_EXPERTS) applies.
    bf16_experts: bool = False
    #: Its modules are mapped to transformers' (``harness.reference.localize``).
    localized: bool = False
    fork: Fork | None = None

    def lane(self, name: str) -> Lane:
        return next(x for x in self.lanes if x.name == name)

    @property
    def published_lane(self) -> Lane:
        """The lane that judges published numbers: the tutorial's config as published."""
        return next(x for x in self.lanes if x.published)

    @property
    def keeps_defects(self) -> bool:
        """A lane of it keeps upstream defects ($QWEN3_HF_KEEP_DEFECTS): provenance records which."""
        return any(x.kept_defects for x in self.lanes)

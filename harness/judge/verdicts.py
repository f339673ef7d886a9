"""Stage 6, judgement: the verdict on a measured value against its golden, and on a finished run.

:func:`compare` gives the :class:`Verdict` on any measured value against a golden of
:mod:`harness.judge.goldens` (which reads and writes the golden files). For each run that ended,
``python -m harness run`` asks which golden its conditions make it comparable to
(:func:`golden_key`), the verdict on it (:func:`judge`), and for a weights-loaded run the
reference check (:func:`reference_of`, from :mod:`harness.reference.diagnosis`). Nothing here launches or writes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from harness.judge import goldens
from harness.judge.goldens import (
    INPUTS_DIFFER,
    NOT_JUDGED,
    PORTABLE_RTOL,
    REGENERATE,
    Golden,
    environment_differences,
    environment_metadata,
    is_curve,
    is_number,
    short_value,
    why_not_judged,
)
from harness.options.run_options import RunOptions
from recipes.tiers import TIERS


@dataclass(frozen=True)
class Verdict:
    key: str
    measured: object
    golden: Golden
    #: None: unmeasured (NOT_JUDGED, INPUTS_DIFFER).
    passed: bool | None
    kind: str  # "pass", "pass, other environment", "regression", "stale golden", or one of UNJUDGED_KINDS
    #: Environment fields that differ from the ones the golden was recorded in.
    differs: tuple[str, ...] = ()
    #: The relative tolerance the measurement was last held to (the portable one in another environment).
    rtol: float = 0.0

    def message(self) -> str:
        g = self.golden
        if self.kind == INPUTS_DIFFER:
            return (
                f"{self.kind} ({', '.join(self.differs)}): {self.key} measured {short_value(self.measured)}, not "
                f"judged against {short_value(g.value)}; re-record with `python -m harness.night.ci record-inputs --replace` "
                "only if the new inputs are meant"
            )
        if self.kind == NOT_JUDGED:
            return f"{self.kind}: {self.key} measured {short_value(self.measured)} ({g.lane} {short_value(g.value)}): {why_not_judged(g)}"
        if is_curve(g.value):
            text = f"{self.kind}: {self.key} {_curve_misses(self.measured, g, self.rtol)} ({g.lane}: {g.reason})"
        else:
            text = (
                f"{self.kind}: {self.key} measured {self.measured!r}, golden {g.value!r} "
                f"± {g.tolerance} ({g.lane}: {g.reason})"
            )
        if self.kind == "stale golden":
            text += f". Recorded in another environment (differs in {', '.join(self.differs)}); {REGENERATE}"
        return text


def _element_allowed(golden: Golden, i: int, rtol: float) -> float:
    tolerance = golden.tolerance[i] if isinstance(golden.tolerance, list) else golden.tolerance
    return max(tolerance, rtol * abs(golden.value[i]))


def _within(measured, golden: Golden, rtol: float = 0.0) -> bool:
    if is_number(golden.value) and is_number(measured):
        allowed = max(golden.tolerance, rtol * abs(golden.value))
        return math.isfinite(measured) and abs(measured - golden.value) <= allowed
    if is_curve(golden.value):
        # A curve: every step within its own tolerance (and the relative one), same length.
        if not (
            isinstance(measured, list)
            and len(measured) == len(golden.value)
            and all(map(is_number, measured))
        ):
            return False
        return all(
            math.isfinite(m) and abs(m - g) <= _element_allowed(golden, i, rtol)
            for i, (m, g) in enumerate(zip(measured, golden.value))
        )
    return measured == golden.value


def _curve_misses(measured, golden: Golden, rtol: float) -> str:
    """Where a measured curve leaves its golden: steps outside, the first one, the largest |Δ|."""
    values = golden.value
    if not (isinstance(measured, list) and len(measured) == len(values)):
        got = len(measured) if isinstance(measured, list) else type(measured).__name__
        return f"measured {got} steps, golden {len(values)} steps"
    deltas = [abs(m - g) if math.isfinite(m) else math.inf for m, g in zip(measured, values)]
    outside = [i for i, d in enumerate(deltas) if d > _element_allowed(golden, i, rtol)]
    worst = max(range(len(deltas)), key=deltas.__getitem__)
    text = f"{len(outside)} of {len(values)} steps outside"
    if outside:
        i = outside[0]
        text += (
            f"; first at step {i + 1}: measured {measured[i]!r}, golden {values[i]!r}, "
            f"allowed ±{_element_allowed(golden, i, rtol):.3g}"
        )
    return text + f"; max |Δ| {deltas[worst]:.3g} at step {worst + 1}"


def portable_rtol(golden: Golden) -> float:
    """The relative tolerance of an exact value measured in another environment."""
    return PORTABLE_RTOL if golden.portable_rtol is None else golden.portable_rtol


def input_differences(recorded: dict, here: dict | None) -> tuple[str, ...]:
    """Dotted names of the inputs (files, allowed mismatches, kept defects) where a night differs from the record."""
    return environment_differences(recorded, here or {})


def compare(
    key: str,
    measured,
    goldens: dict[str, Golden],
    metadata: dict,
    env: dict | None = None,
    inputs: dict | None = None,
) -> Verdict:
    """Measured vs golden. An exact value from another environment is held to its portable rtol.

    A band is judged against its half-widths only; a miss in another environment than the
    one its runs were recorded in reads "stale golden" too. A golden keyed by inputs is
    judged only on the recorded ``inputs`` (:data:`INPUTS_DIFFER` otherwise, :data:`NOT_JUDGED`
    before any are recorded); one with an ``unmeasured`` tolerance is :data:`NOT_JUDGED`.
    """
    golden = goldens[key]
    if golden.keyed_by_inputs and golden.inputs is not None:
        differs = input_differences(golden.inputs, inputs)
        if differs:
            return Verdict(
                key=key,
                measured=measured,
                golden=golden,
                passed=None,
                kind=INPUTS_DIFFER,
                differs=differs,
            )
    if golden.unmeasured or (golden.keyed_by_inputs and golden.inputs is None):
        return Verdict(key=key, measured=measured, golden=golden, passed=None, kind=NOT_JUDGED)
    here = env or (environment_metadata() if golden.lane in ("exact", "band") else {})
    if golden.lane == "exact":
        differs = environment_differences(metadata, here)
    elif golden.lane == "band":
        differs = environment_differences(golden.band["environment"], here)
    else:
        differs = ()
    rtol = 0.0
    if _within(measured, golden):
        kind, passed = "pass", True
    elif golden.lane == "exact" and differs and _within(measured, golden, portable_rtol(golden)):
        kind, passed, rtol = "pass, other environment", True, portable_rtol(golden)
    else:
        kind, passed = ("stale golden" if differs else "regression"), False
        rtol = portable_rtol(golden) if golden.lane == "exact" and differs else 0.0
    return Verdict(
        key=key,
        measured=measured,
        golden=golden,
        passed=passed,
        kind=kind,
        differs=differs,
        rtol=rtol,
    )


#: Step-1 random-init loss at the real Qwen3-4B width/vocab is a published number
#: the cpu tier can reproduce: one layer, 2048 tokens, one step, one process, scored
#: forward-only (a step-1 loss is a forward pass before any update; harness.rank.step1_forward
#: is bitwise the trainer's step 1, tests/cpu/test_step1_forward.py).
FULL_WIDTH_RANDOM_INIT = dict(
    layers=1, seq_len=2048, local_batch_size=1, steps=1, nproc=1, export=False, forward_only=True
)
#: What makes a run comparable to the full-width golden: its shape, not how step 1 was scored.
FULL_WIDTH_SHAPE = ("layers", "seq_len", "local_batch_size", "steps", "nproc")
FULL_WIDTH_GOLDEN = "step1_loss_random_4b_width"


def golden_key(opts: RunOptions) -> str | None:
    """The golden a run's step-1 loss is recorded as, if it ran under the golden's conditions.

    Goldens hold the tier's default launch (processes, batch, seq_len, seed 0, no kernel
    overrides, the tier's own inputs) and the full-width random-init preset; any other run is
    reported, not judged.
    """
    tier = TIERS[opts.tier]
    plain = opts.seed == 0 and not opts.overrides and opts.rope_theta is None and opts.nnodes == 1
    if not plain:
        return None
    if opts.layers is not None:
        shape = all(getattr(opts, k) == FULL_WIDTH_RANDOM_INIT[k] for k in FULL_WIDTH_SHAPE)
        return FULL_WIDTH_GOLDEN if shape and opts.init == "random" else None
    defaults = (tier.nproc, tier.seq_len, tier.local_batch_size)
    if (opts.nproc, opts.seq_len, opts.local_batch_size) != defaults or not reads_tier_inputs(opts):
        return None
    return f"step1_loss_{opts.init}"


def reads_tier_inputs(opts: RunOptions) -> bool:
    """The run reads the tier's own weights, tokenizer and corpus: the inputs its goldens were measured on.

    A run on the user's own files is reported, not judged: a golden's "stale golden" advice
    (``make goldens ACCEPT=1``) is for a code change on the same inputs, never for other inputs.
    """
    own = RunOptions(recipe=opts.recipe, tier=opts.tier, init=opts.init).resolved()
    mine = opts.resolved()
    return all(
        getattr(mine, k) == getattr(own, k) for k in ("model_dir", "tokenizer_dir", "dataset_dir")
    )


def judge(opts: RunOptions, result):
    """A run's step-1 loss against its golden (published, proxy or exact), or None when it has none."""

    key = golden_key(opts)
    if (
        key is None
        or not result.losses
        or not goldens.goldens_path(opts.recipe, opts.tier).exists()
    ):
        return None
    metadata, values = goldens.load(opts.recipe, opts.tier)
    if key not in values:
        return None
    # A golden keyed by inputs is judged only on the recorded ones (a corrected run reads "inputs differ").
    return compare(key, result.losses[0], values, metadata, inputs=result.provenance.get("inputs"))


def reference_of(opts: RunOptions, result) -> dict | None:
    """A weights-loaded run's step-1 loss against transformers on its own first batch (harness.reference.diagnosis).

    Computed here, on the host, after every rank has ended. None for a run that loaded no
    weights or recorded no batch; a reference that cannot be computed is a failed check
    whose summary says why (the run itself stays in the report).
    """
    from harness.reference import diagnosis as reference  # noqa: PLC0415 -- --help stays fast: harness.reference.diagnosis 50 ms (on python -m harness's import path)

    if opts.init != "hf":
        return None
    print(
        f"[{opts.recipe}/{opts.tier}] reference loss: transformers fp32 on the host, same batch ..."
    )
    try:
        check = reference.check_run_dir(Path(result.run_dir))
    except reference.IncompleteRecord as e:
        print(f"  not computed: {e}")
        return {"passed": None, "error": str(e), "summary": f"not computed: {e}"}
    except Exception as e:  # noqa: BLE001 -- reported as a failed check, never lost
        return {
            "passed": False,
            "error": f"{type(e).__name__}: {e}",
            "summary": f"not computed: {type(e).__name__}: {e}",
        }
    if check is None:
        return None
    summary = reference.summary(check)
    print("  " + summary.replace("\n", "\n  "))
    if not check.judged:  # an unmeasured tolerance (trn2 until a night measures it): unmeasured
        return {**check.to_dict(), "passed": None, "summary": f"unmeasured: {summary}"}
    return {**check.to_dict(), "summary": summary}

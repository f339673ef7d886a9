"""Stage 6, judgement: a finished run's step-1 loss against its golden, and against the host reference.

The launcher's caller (``python -m harness run``) asks, for each run that ended, which
golden its conditions make it comparable to (:func:`golden_key`), the verdict on it
(:func:`judge`, from :mod:`harness.goldens`), and for a weights-loaded run the reference
check (:func:`reference_of`, from :mod:`harness.reference`). Nothing here launches or writes.
"""

from __future__ import annotations

from pathlib import Path

from harness.options import RunOptions
from recipes.tiers import TIERS

#: Step-1 random-init loss at the real Qwen3-4B width/vocab is a published number
#: the cpu tier can reproduce: one layer, 2048 tokens, one step, one process, scored
#: forward-only (a step-1 loss is a forward pass before any update; harness.step1_forward
#: is bitwise the trainer's step 1, tests/cpu/test_step1_forward.py).
FULL_WIDTH_RANDOM_INIT = dict(layers=1, seq_len=2048, local_batch_size=1, steps=1, nproc=1, export=False, forward_only=True)
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
    return all(getattr(mine, k) == getattr(own, k) for k in ("model_dir", "tokenizer_dir", "dataset_dir"))


def judge(opts: RunOptions, result):
    """A run's step-1 loss against its golden (published, proxy or exact), or None when it has none."""
    from harness import goldens

    key = golden_key(opts)
    if key is None or not result.losses or not goldens.goldens_path(opts.recipe, opts.tier).exists():
        return None
    metadata, values = goldens.load(opts.recipe, opts.tier)
    if key not in values:
        return None
    # A golden keyed by inputs is judged only on the recorded ones (a corrected run reads "inputs differ").
    return goldens.compare(key, result.losses[0], values, metadata, inputs=result.provenance.get("inputs"))


def reference_of(opts: RunOptions, result) -> dict | None:
    """A weights-loaded run's step-1 loss against transformers on its own first batch (harness.reference).

    Computed here, on the host, after every rank has ended. None for a run that loaded no
    weights or recorded no batch; a reference that cannot be computed is a failed check
    whose summary says why (the run itself stays in the report).
    """
    from harness import reference

    if opts.init != "hf":
        return None
    print(f"[{opts.recipe}/{opts.tier}] reference loss: transformers fp32 on the host, same batch ...")
    try:
        check = reference.check_run_dir(Path(result.run_dir))
    except reference.IncompleteRecord as e:
        print(f"  not computed: {e}")
        return {"passed": None, "error": str(e), "summary": f"not computed: {e}"}
    except Exception as e:  # noqa: BLE001 -- reported as a failed check, never lost
        return {"passed": False, "error": f"{type(e).__name__}: {e}", "summary": f"not computed: {type(e).__name__}: {e}"}
    if check is None:
        return None
    summary = reference.summary(check)
    print("  " + summary.replace("\n", "\n  "))
    if not check.judged:  # an unmeasured tolerance (trn2 until a night measures it): unmeasured
        return {**check.to_dict(), "passed": None, "summary": f"unmeasured: {summary}"}
    return {**check.to_dict(), "summary": summary}

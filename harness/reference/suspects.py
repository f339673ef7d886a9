"""The diagnosis of a reference mismatch: each cheap suspect measured as its effect on the reference.

Tokenizer (the run's is not the weights' own), RoPE theta (not config.json's), and
the inverse frequencies the run's model held (torchtitan issue 4783). Each is one
forward over the recorded batch with the run's value in place of the weights' one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from harness.rank.first_batch import IncompleteRecord, Record, ReferenceError
from harness.reference.scoring import (
    PLAUSIBLE_FRACTION,
    ReferenceCheck,
    Suspect,
    batch_loss,
    batch_loss_sums,
    computed_inv_freq,
    set_inv_freq,
)


def _file_sha(directory: Path) -> str | None:
    from harness.config.provenance import sha256_of

    files = [
        p
        for p in (directory / "tokenizer.json", directory / "tokenizer_config.json")
        if p.is_file()
    ]
    return sha256_of(files) if (directory / "tokenizer.json").is_file() else None


def tokenizer_suspect(
    run: "RunInfo", record: Record, model, reference: float, measured: float, tol: float
):
    own = Path(run.model_dir)
    used = Path(run.tokenizer["path"])
    own_sha = _file_sha(own)
    if own_sha is None:
        return Suspect("tokenizer", False, f"{own} has no tokenizer.json to compare with")
    if own_sha == run.tokenizer["sha256"]:
        return Suspect("tokenizer", False, f"the run's tokenizer ({used}) is the weights' own")
    what = f"the run tokenized with {used} (V={run.tokenizer['vocab_size']}), the weights' own tokenizer is {own}"
    if run.options is None:
        return Suspect("tokenizer", True, what + " (no run.json: cannot re-pack the text)")
    batches = rebuilt_batches(run.options, own, len(record.batches) // max(record.ranks, 1))
    with_own = batch_loss(model, batches, record.attention)
    # The fault is in the data: the recorded batch IS the faulty one. Its effect is what the
    # run's tokenizer costs against the weights' own on the same text.
    effect = reference - with_own
    plausible = PLAUSIBLE_FRACTION * math.log(model.config.vocab_size)
    explains = effect > tol and with_own <= plausible
    return Suspect(
        "tokenizer",
        True,
        what + f"; the same text in the weights' own tokens scores {with_own:.6g}",
        reference_with_fault=reference,
        effect=effect,
        explains=explains,
    )


def rebuilt_batches(opts, tokenizer_dir: Path, per_rank: int) -> list[dict]:
    """The run's step-1 batches, re-packed from the same corpus with ``tokenizer_dir`` (torchtitan's loader)."""
    import dataclasses

    from harness.config.build import build_config

    opts = dataclasses.replace(
        opts, tokenizer_dir=Path(tokenizer_dir), allow_mismatch=[*opts.allow_mismatch, "tokenizer"]
    )
    config = build_config(opts)
    tokenizer = config.tokenizer.build(tokenizer_path=str(tokenizer_dir))
    world = opts.nproc * opts.nnodes
    out = []
    for rank in range(world):
        loader = config.dataloader.build(
            dp_world_size=world,
            dp_rank=rank,
            tokenizer=tokenizer,
            seq_len=config.training.seq_len,
            local_batch_size=config.training.local_batch_size,
        )
        batches = iter(loader)
        for _ in range(per_rank):
            inputs, labels = next(batches)
            out.append(
                {"input": inputs["input"], "positions": inputs.get("positions"), "labels": labels}
            )
    return out


def theta_suspect(
    run: "RunInfo", record: Record, model, reference: float, measured: float, tol: float
):
    from recipes.specs import read_hf_dims

    weights_theta = read_hf_dims(Path(run.model_dir)).get("rope_theta")
    run_theta = run.model.get("rope_theta")
    if run_theta is None or weights_theta is None or float(run_theta) == float(weights_theta):
        return Suspect(
            "rope_theta",
            False,
            f"the run's RoPE theta {run_theta:g} is config.json's"
            if run_theta
            else "no theta recorded",
        )
    weights_inv = computed_inv_freq(model)
    try:
        set_inv_freq(model, computed_inv_freq(model, run_theta))
        with_run_theta = batch_loss(model, record.batches, record.attention)
    finally:
        set_inv_freq(model, weights_inv)
    return Suspect(
        "rope_theta",
        True,
        f"the run's RoPE theta is {run_theta:g}, config.json's {weights_theta:g}",
        reference_with_fault=with_run_theta,
        effect=with_run_theta - reference,
        explains=abs(measured - with_run_theta) <= tol and abs(with_run_theta - reference) > tol,
    )


#: Relative difference at which two inverse-frequency vectors are different RoPEs
#: (fp32 recomputations of the same formula agree to ~1e-7).
INV_FREQ_RTOL = 1e-5


def inv_freq_suspect(
    run: "RunInfo", record: Record, model, reference: float, measured: float, tol: float
):
    """Each rank's held ``inv_freq`` vs what the run's theta gives; scored per rank with its own."""
    import torch

    held = [
        b.get("held_inv_freq") if b.get("held_inv_freq") is not None else record.inv_freq
        for b in record.batches
    ]
    if any(h is None for h in held):
        return Suspect(
            "inv_freq", False, "the run's model holds no RoPE frequencies the record could read"
        )
    run_theta = run.model.get("rope_theta")
    expected = computed_inv_freq(model, run_theta)
    if any(h.shape != expected.shape for h in held):
        what = f"the run's model held {tuple(held[0].shape)} RoPE frequencies, its theta gives {tuple(expected.shape)}"
        return Suspect("inv_freq", True, what)

    def gap(h) -> float:
        return (h - expected).abs().max().item() if bool(torch.isfinite(h).all()) else float("inf")

    gaps = [gap(h) for h in held]
    if max(gaps) <= INV_FREQ_RTOL * expected.abs().max().item():
        return Suspect(
            "inv_freq", False, "the run's model held the RoPE frequencies its theta gives"
        )
    what = (
        f"the run's model held RoPE inv_freq different from what its theta {run_theta:g} gives (max |Δ| "
        f"{max(gaps):.3g} over {len(held)} batch(es); rank 0 held [{held[0].min().item():.3g}, "
        f"{held[0].max().item():.3g}]): as left by to_empty(), torchtitan issue 4783"
    )
    weights_inv = computed_inv_freq(model)
    total, count = 0.0, 0
    try:
        for batch, h in zip(record.batches, held, strict=True):
            set_inv_freq(model, h)
            t, c = batch_loss_sums(model, [batch], record.attention)
            total, count = total + t, count + c
    finally:
        set_inv_freq(model, weights_inv)
    with_held = total / count
    both_blow_up = not math.isfinite(with_held) and not math.isfinite(measured)
    return Suspect(
        "inv_freq",
        True,
        what,
        reference_with_fault=with_held,
        effect=with_held - reference,
        explains=both_blow_up
        or (abs(measured - with_held) <= tol and abs(with_held - reference) > tol),
    )


SUSPECTS = (tokenizer_suspect, theta_suspect, inv_freq_suspect)


@dataclass
class RunInfo:
    """What the host needs from a run directory: provenance, options and the measured loss."""

    recipe: str
    tier: str
    model_dir: str
    tokenizer: dict
    model: dict
    measured: float
    options: object = None

    @classmethod
    def from_run_dir(cls, run_dir: Path, allow_no_step: bool = False) -> "RunInfo":
        """``allow_no_step``: a run that died in step 1 (torchtitan stops on a non-finite loss
        before logging it) is measured as NaN, so its record can still be diagnosed."""
        from harness.base.run_dir import RUN_FILE, provenance_state, read_provenance, read_steps
        from harness.options.run_options import RunOptions

        run_dir = Path(run_dir)
        provenance = read_provenance(run_dir)
        state = provenance_state(provenance)
        if state is not None:
            raise IncompleteRecord(f"{run_dir}: {state}")
        steps = read_steps(run_dir)
        if not steps and not allow_no_step:
            raise ReferenceError(f"{run_dir} recorded no step")
        opts = (
            RunOptions.from_json((run_dir / RUN_FILE).read_text())
            if (run_dir / RUN_FILE).is_file()
            else None
        )
        weights = provenance.get("weights")
        if not weights:
            raise ReferenceError(
                f"{run_dir} loaded no weights (random init): there is nothing to score"
            )
        return cls(
            recipe=opts.recipe if opts else "?",
            tier=opts.tier if opts else "cpu",
            model_dir=weights["path"],
            tokenizer=provenance["tokenizer"],
            model=provenance["model"],
            measured=float(steps[0]["loss"]) if steps else math.nan,
            options=opts,
        )


def diagnose(check: ReferenceCheck, run: RunInfo, record: Record, model) -> list[Suspect]:
    """Measure every suspect's effect on the reference (each a forward over the recorded batch)."""
    return [
        suspect(run, record, model, check.reference, check.measured, check.tolerance)
        for suspect in SUSPECTS
    ]

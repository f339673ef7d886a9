"""The diagnosis of a reference mismatch: each cheap suspect measured as its effect on the reference.

Tokenizer (the run's is not the weights' own by content: sha256 and vocabulary against the model dir's
tokenizer, config.json's vocab_size and the recorded inputs), RoPE theta (not config.json's), and
the inverse frequencies the run's model held (torchtitan issue 4783). Each is one
forward over the recorded batch with the run's value in place of the weights' one. Every mismatch the
run allowed (``--allow-mismatch``) is a suspect as well, measured or not.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from harness.base.run_dir import RUN_FILE, provenance_state, read_provenance, read_steps
from harness.options.run_options import RunOptions
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
    from harness.config.provenance import sha256_of  # noqa: PLC0415 -- heavy: harness.config.provenance imports torch (torch 2.9 s); this module stays light

    files = [
        p
        for p in (directory / "tokenizer.json", directory / "tokenizer_config.json")
        if p.is_file()
    ]
    return sha256_of(files) if (directory / "tokenizer.json").is_file() else None


#: The share of config.json's ``vocab_size`` (the embedding rows) a model's own tokenizer covers at least: the rows past
#: it are padding (Qwen3: 151669 ids of 151936 rows, 0.998). A 400-id tokenizer beside 1024 rows is another tokenizer.
VOCAB_COVERAGE = 0.99


def tokenizer_doubts(run: "RunInfo") -> tuple[list[str], list[str]]:
    """What the content of the run's tokenizer leaves in doubt, and what it was checked against.

    The run's tokenizer as rank 0 recorded it (sha256, vocabulary) against the model dir's own
    tokenizer.json as it is now, config.json's ``vocab_size``, and the tokenizer files the launcher
    hashed into provenance ``inputs``. Where the tokenizer lies rules nothing out.
    """
    from harness.config.provenance import file_sha256  # noqa: PLC0415 -- heavy: harness.config.provenance imports torch (torch 2.9 s); this module stays light
    from recipes.specs import read_hf_dims  # noqa: PLC0415 -- heavy: recipes.specs imports torch (torch 2.9 s); this module stays light

    own = Path(run.model_dir)
    doubts, checked = [], []
    own_sha = _file_sha(own)
    if own_sha is None:
        doubts.append(f"{own} has no tokenizer.json to compare with")
    elif own_sha != run.tokenizer.get("sha256"):
        doubts.append(
            f"its sha256 {str(run.tokenizer.get('sha256'))[:12]} is not {own}'s own {own_sha[:12]}"
        )
    else:
        checked.append(f"sha256 {own_sha[:12]} is {own}'s own")
    vocab = run.tokenizer.get("vocab_size")
    try:
        rows = read_hf_dims(own).get("vocab_size")
    except (OSError, ValueError) as e:
        rows = None
        doubts.append(f"config.json unreadable ({e})")
    if isinstance(rows, int) and isinstance(vocab, int):
        if not VOCAB_COVERAGE * rows <= vocab <= rows:
            doubts.append(
                f"its {vocab} ids against config.json's vocab_size {rows} (a model's own covers "
                f"{VOCAB_COVERAGE:.0%} to 100% of its rows)"
            )
        else:
            checked.append(f"{vocab} ids for config.json's vocab_size {rows}")
    for name, recorded in ((run.inputs or {}).get("tokenizer") or {}).items():
        path = Path(run.tokenizer.get("path", own)) / name
        now = file_sha256(path) if path.is_file() else None
        if now != recorded:
            doubts.append(
                f"{path} is not the file the run's inputs recorded (sha256 {recorded[:12]})"
            )
        else:
            checked.append(f"{name} as the run's inputs recorded")
    return doubts, checked


def tokenizer_suspect(
    run: "RunInfo", record: Record, model, reference: float, measured: float, tol: float
):
    own = Path(run.model_dir)
    used = Path(run.tokenizer["path"])
    doubts, checked = tokenizer_doubts(run)
    if not doubts:
        return Suspect(
            "tokenizer", False, f"the run's tokenizer ({used}) by content: {'; '.join(checked)}"
        )
    if _file_sha(own) in (None, run.tokenizer.get("sha256")):
        # Nothing else to score the text with: the model dir's own tokenizer is the one in doubt (or none).
        return Suspect(
            "tokenizer", True, f"the run's tokenizer ({used}): {'; '.join(doubts)}; not measured"
        )
    what = (
        f"the run tokenized with {used} (V={run.tokenizer['vocab_size']}), the weights' own tokenizer is {own} "
        f"({'; '.join(doubts)})"
    )
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

    from harness.config.build import build_config  # noqa: PLC0415 -- heavy: harness.config.build imports torch (torch 2.9 s); this module stays light

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
    from recipes.specs import read_hf_dims  # noqa: PLC0415 -- heavy: recipes.specs imports torch (torch 2.9 s); this module stays light

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
    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light

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


def allowed_suspects(allowed: list[tuple[str, str]], measured: list[Suspect]) -> list[Suspect]:
    """``measured`` with every mismatch the run allowed (``--allow-mismatch NAME``: (name, message)) a suspect.

    A measured suspect of that name stays as measured when it applies, and is a suspect again when its
    check found nothing: the run's own launch found the mismatch. Others are named, not measured.
    """
    out = list(measured)
    for name, message in allowed:
        said = f"allowed by --allow-mismatch {name}: {message}"
        same = [i for i, s in enumerate(out) if s.name == name]
        if not same:
            out.append(Suspect(name, True, said + "; not measured"))
        elif not out[same[0]].applies:
            out[same[0]] = Suspect(name, True, f"{said}; not measured ({out[same[0]].what})")
    return out


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
    #: provenance.json's ``inputs``: the sha256 of each file the launcher saw the run read, by role.
    inputs: dict | None = None
    #: (name, message) of every mismatch the run allowed (``--allow-mismatch``), as provenance recorded it.
    allowed: list = field(default_factory=list)

    @classmethod
    def from_run_dir(cls, run_dir: Path, allow_no_step: bool = False) -> "RunInfo":
        """``allow_no_step``: a run that died in step 1 (torchtitan stops on a non-finite loss
        before logging it) is measured as NaN, so its record can still be diagnosed."""

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
            inputs=provenance.get("inputs"),
            allowed=allowed_of(provenance, opts),
        )


def allowed_of(provenance: dict, opts) -> list[tuple[str, str]]:
    """(name, message) of each mismatch the run allowed: provenance's names, else run.json's ``--allow-mismatch``."""
    messages = provenance.get("allowed_mismatches") or []
    names = provenance.get("allowed_mismatch_names")
    if (
        names is None
    ):  # a provenance.json written before the names were: run.json's, with every message
        names = list(getattr(opts, "allow_mismatch", None) or [])
        return [(n, "; ".join(m for m in messages if n in m) or "; ".join(messages)) for n in names]
    return list(zip(names, messages))


def diagnose(check: ReferenceCheck, run: RunInfo, record: Record, model) -> list[Suspect]:
    """Measure every suspect's effect on the reference (each a forward over the recorded batch); every mismatch
    the run allowed is a suspect too (:func:`allowed_suspects`)."""
    measured = [
        suspect(run, record, model, check.reference, check.measured, check.tolerance)
        for suspect in SUSPECTS
    ]
    return allowed_suspects(run.allowed, measured)

"""Step-1 loss, explained: the run's own first batch scored by transformers on the host.

A step-1 loss from loaded weights only says something when we know what those
weights *should* score on that batch. Every run that loads weights (``--init hf``)
records, on every rank, the batches its step 1 consumed (token ids, labels, the
per-document positions torchtitan's loader hands RoPE), how the model attends
(causal over the whole packed window, or per document), and the RoPE inverse
frequencies the model really holds after init and checkpoint load. After the
launch, the harness scores exactly those tokens with transformers'
``AutoModelForCausalLM`` from the same weights directory, in fp32 on the host
CPU, outside torchtitan and outside the device, averaged as torchtitan averages
(every rank's token sum / the global valid-token count).

The verdict compares the measured step-1 loss with that reference under a
stated per-tier tolerance (:data:`TOLERANCES`). When the measured loss is above
(or below) the reference by more than the tolerance, or a weights-loaded loss is
implausible for a trained model (above :data:`PLAUSIBLE_FRACTION` × ln V), the
diagnosis measures the suspects that are cheap to test on the host, each as its
effect on the reference (:func:`diagnose`):

* ``tokenizer``: the run's tokenizer (``hf_assets_path``) is not the weights'
  own; the same text is re-packed with the model directory's tokenizer and scored.
* ``rope_theta``: the run's RoPE theta is not config.json's; the batch is scored
  with the run's theta.
* ``inv_freq``: the RoPE inverse frequencies the run's model held are not what
  its own theta gives (torchtitan issue 4783: the Transformers backend leaves
  ``inv_freq`` as ``to_empty()`` memory); the batch is scored with the held ones.

``python -m harness.reference RUN_DIR`` prints the check of one run;
``python -m harness.reference cost`` measures what the reference costs per
token and layer at the real 4B width on this CPU and extrapolates to a trn2
global batch.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: Where a run keeps its step-1 batches: ``rank00000.safetensors`` per rank.
RECORD_DIR = "first_batch"
#: torchtitan's and transformers' "no loss here" label (torchtitan.components.loss.IGNORE_INDEX).
IGNORE_INDEX = -100
#: How the model attended over a packed window.
#: "causal": every token sees every earlier token of the window, documents included (SDPA
#:   ``is_causal``: what torchtitan's SDPA and the HF backend's causal attention compute);
#: "document": only earlier tokens of its own document (Flex/Varlen block-causal masks).
ATTENTIONS = ("causal", "document")
#: Positions whose logits are formed at once: bounds host memory at the 4B vocab
#: (256 × 151,936 fp32 logits = 156 MB) instead of a whole 2048-token row (1.2 GB).
LOGIT_CHUNK = 256

#: A model that loaded trained weights and scores worse than half of ln V (a per-token
#: perplexity above √V) has recovered less than half of what a uniform guess lacks;
#: trained Qwen3 models score 0.2-0.3 × ln V on web text (Qwen3-0.6B 3.63 in torchtitan,
#: Qwen3-4B about 2.2-2.7 on wikitext, ln 151936 = 11.93; the cpu fixture 1.55 of 6.93).
PLAUSIBLE_FRACTION = 0.5


@dataclass(frozen=True)
class Tolerance:
    value: float
    reason: str
    #: False: a stated allowance no run has measured; a verdict under it is "recorded, not judged".
    measured: bool = True


#: |measured − reference| allowed per tier, and why.
TOLERANCES = {
    "cpu": Tolerance(
        1e-5,
        "fp32 on both sides, the same math in another summation order (transformers one row at a "
        "time with chunked logits vs torchtitan's whole batch): measured |Δ| = 6e-8 for the native "
        "and the backend fixture runs (tests/cpu/test_reference_loss.py). 1e-5 is about 80 fp32 ulps "
        "at 1.5; the smallest fault the cpu tests craft (theta 5x off) moves the loss by 8e-3",
    ),
    "trn2": Tolerance(
        0.05,
        "the run computes in bf16 (FSDP mixed precision on 64 ranks), the reference in fp32: bf16 "
        "keeps 8 significand bits, and its rounding is not averaged away through 36 layers. Measured "
        "on the 2-layer cpu fixture, bf16 vs fp32 transformers on the same batch differ by 6e-4 "
        "(tests/cpu/test_reference_loss.py); depth and width grow that, so 0.05 is an allowance "
        "until a trn2 run records the real difference, not a measurement. The faults it must tell "
        "apart move the loss by much more (an implausible 6.54 vs ~2.5 from sound weights)",
        measured=False,
    ),
}
#: The HF backend's Qwen3-MoE runs its routed experts through torchtitan's GroupedExperts,
#: which compute in bf16 by design (not a workaround), on every tier.
MOE_BF16_EXPERTS = Tolerance(
    1e-3,
    "the backend's MoE experts compute in bf16 (torchtitan GroupedExperts, upstream's design) on every "
    "tier, the reference in fp32: measured |Δ| = 7.4e-5 on the MoE fixture's 2-rank run "
    "(tests/cpu/test_reference_loss.py); 1e-3 is about 13x that",
)


# --- recording, on every rank (called from harness.train) -------------------------------------


def install(trainer, opts, run_dir: Path, rank: int) -> None:
    """Record the batches step 1 consumes on this rank, for runs that load weights.

    Wraps the declared hook ``Trainer.batch_generator`` (``Trainer.train`` calls it; wrap_hook
    refuses a trainer without it, never a run with no record): the first ``gradient_accumulation_steps
    × num_pipeline_parallel_microbatches`` batches are the ones ``train_step`` sums into the step-1
    loss. They are written when the first step fetches them, after the checkpoint load, so the
    RoPE frequencies recorded are the ones step 1 runs with.
    """
    from recipes import titan

    if opts.init != "hf":
        return
    dims = trainer.parallel_dims
    if (dims.tp, dims.cp, dims.pp) != (1, 1, 1):
        return  # each rank's batch is one data-parallel shard only when TP, CP and PP are 1
    count = trainer.gradient_accumulation_steps * trainer.num_pipeline_parallel_microbatches

    def recording(generate):
        def batch_generator(data_iterable):
            batches = generate(data_iterable)
            first = [next(batches) for _ in range(count)]
            # Fetched inside step 1 (Trainer.train increments step first). A run resumed from a
            # torchtitan checkpoint starts later and holds weights other than --model-dir's: no record.
            if trainer.step == 1:
                write_rank_record(Path(run_dir) / RECORD_DIR, rank, dims.world_size, first, trainer.model_parts[0])
            yield from first
            yield from batches

        return batch_generator

    titan.wrap_hook(trainer, "Trainer.batch_generator", recording)


def write_rank_record(directory: Path, rank: int, world: int, batches, model) -> Path:
    """``rank<R>.safetensors``: each batch's input/positions/labels, and the RoPE the model holds."""
    from safetensors.torch import save_file

    tensors = {}
    for i, (input_dict, labels) in enumerate(batches):
        tensors[f"input.{i}"] = input_dict["input"]
        if input_dict.get("positions") is not None:
            tensors[f"positions.{i}"] = input_dict["positions"]
        tensors[f"labels.{i}"] = labels
    inv_freq = held_inv_freq(model)
    if inv_freq is not None:
        tensors["inv_freq"] = inv_freq
    metadata = {
        "rank": str(rank), "world": str(world), "batches": str(len(batches)), "attention": attention_of(model),
        # recipes.hf_as_published: upstream defects this run kept on purpose (the "as published" lanes)
        "kept_defects": os.environ.get("QWEN3_HF_KEEP_DEFECTS", ""),
    }  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"rank{rank:05d}.safetensors"
    tmp = path.with_suffix(".tmp")
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    tmp.replace(path)
    return path


def _local(tensor):
    full = getattr(tensor, "full_tensor", None)
    return (full() if full is not None else tensor).detach().float().cpu()


def held_inv_freq(model):
    """The RoPE inverse frequencies ``model`` really holds (first rotary module), or None.

    transformers' rotary modules keep an ``inv_freq`` buffer; torchtitan's CosSinRoPE
    keeps a ``cache`` of cos/sin rows ``[cos(p·f), cos(p·f), sin(p·f), sin(p·f)]``, whose
    row 1 gives ``f = atan2(sin, cos)`` (every Qwen3 frequency is ≤ 1 < π).
    """
    import torch

    for module in model.modules():
        buffer = getattr(module, "inv_freq", None)
        if isinstance(buffer, torch.Tensor):
            return _local(buffer)
    for module in model.modules():
        cache = getattr(module, "cache", None)
        if "RoPE" in type(module).__name__ and isinstance(cache, torch.Tensor) and cache.dim() == 2:
            cache = _local(cache)
            half = cache.shape[-1] // 4  # cache row: 2·dim values, dim = head_dim, dim/2 frequencies
            return torch.atan2(cache[1, 2 * half : 3 * half], cache[1, :half])
    return None


def attention_of(model) -> str:
    """"causal" or "document" (see :data:`ATTENTIONS`), from the model the run built.

    torchtitan 0.3.0 ``Trainer.post_dataloading_process`` builds document masks only for
    ``FlexAttention`` / ``VarlenAttention`` inner attention (SDPA runs ``is_causal``); the
    Transformers backend's mask follows its config's ``attn_mask_type`` ("block_causal" is
    per document). Names are compared, not imported: no torchtitan import on this path.
    """
    hf_model = getattr(model, "model", None)
    if hf_model is not None and hasattr(hf_model, "config") and hasattr(hf_model, "lm_head"):
        return "document" if getattr(hf_model.config, "attn_mask_type", "causal") == "block_causal" else "causal"
    config = getattr(model, "config", None)
    attention = getattr(config, "first_attention", None) if config is not None else None
    inner = type(getattr(attention, "inner_attention", None)).__qualname__
    return "document" if inner in ("FlexAttention.Config", "VarlenAttention.Config") else "causal"


# --- reading a record, on the host -----------------------------------------------------------


@dataclass
class Record:
    """A run's step-1 global batch: one (input, positions, labels) per data-parallel row set."""

    batches: list[dict]
    attention: str
    #: The RoPE inverse frequencies the run's model held at step 1 (rank 0), or None; each
    #: batch also carries its own rank's as ``held_inv_freq`` (recorded runs).
    inv_freq: object
    ranks: int
    #: Upstream defects the run kept on purpose (``QWEN3_HF_KEEP_DEFECTS``), e.g. ["inv_freq"].
    kept_defects: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in self.batches)


def load_record(run_dir: Path) -> Record | None:
    """The run's recorded first batch (None when it recorded none); refuses a partial one."""
    from safetensors import safe_open

    directory = Path(run_dir) / RECORD_DIR
    paths = sorted(directory.glob("rank*.safetensors"))
    if not paths:
        return None
    batches, attentions, inv_freq, world, kept = [], set(), None, None, ""
    for path in paths:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
            world = int(meta["world"])
            attentions.add(meta["attention"])
            kept = meta.get("kept_defects", "")
            names = set(f.keys())
            held = f.get_tensor("inv_freq") if "inv_freq" in names else None
            for i in range(int(meta["batches"])):
                batches.append({
                    "input": f.get_tensor(f"input.{i}"),
                    "positions": f.get_tensor(f"positions.{i}") if f"positions.{i}" in names else None,
                    "labels": f.get_tensor(f"labels.{i}"),
                    # each rank's own: uninitialised memory differs from rank to rank
                    "held_inv_freq": held,
                })  # fmt: skip
            if inv_freq is None:
                inv_freq = held
    if len(paths) != world:
        raise IncompleteRecord(
            f"{directory} holds {len(paths)} rank record(s) of a {world}-rank run: the global batch is incomplete "
            "(a multi-node run without a shared --run-dir keeps each node's ranks on that node)"
        )
    if len(attentions) != 1:
        raise ReferenceError(f"{directory}: ranks disagree on attention {sorted(attentions)}")
    return Record(
        batches=batches, attention=attentions.pop(), inv_freq=inv_freq, ranks=world,
        kept_defects=[d for d in kept.split(",") if d],
    )  # fmt: skip


class ReferenceError(RuntimeError):
    """A record or weights directory the reference cannot be computed from."""


class IncompleteRecord(ReferenceError):
    """Not every rank's batch is in this run directory: nothing is wrong with the run itself."""


# --- the reference: transformers on the same tokens, fp32, host CPU -----------------------------


def load_reference_model(model_dir: Path):
    """``AutoModelForCausalLM.from_pretrained(model_dir)`` in fp32 on the CPU, RoPE as config.json gives it.

    The rotary ``inv_freq`` is recomputed from the config (transformers' own rope init), so
    a process-wide init patch (torchtitan's backend replaces ``PreTrainedModel._init_weights``
    for every later model, see recipes/hf_compat.py workaround 5) cannot leave it at 0 here.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    set_inv_freq(model, computed_inv_freq(model))
    return model


def _rotaries(model):
    return [m for m in model.modules() if hasattr(m, "inv_freq") and hasattr(m, "compute_default_rope_parameters")]


def computed_inv_freq(model, rope_theta: float | None = None):
    """The inverse frequencies transformers computes from ``model``'s config (or with ``rope_theta``)."""
    import copy

    from recipes.hf_rope import rope_parameters

    rotary = _rotaries(model)[0]
    config = rotary.config
    if rope_theta is not None:
        config = copy.deepcopy(config)
        config.rope_parameters = {**(config.rope_parameters or {}), "rope_theta": float(rope_theta)}
    # The one shape-checked call of transformers' rope init (config alone: fits 5.16 and 5.23).
    inv_freq, _ = rope_parameters(rotary, config)
    return inv_freq.float().to(rotary.inv_freq.device)


def set_inv_freq(model, inv_freq) -> None:
    for rotary in _rotaries(model):
        rotary.inv_freq.copy_(inv_freq.to(rotary.inv_freq.dtype))
        if hasattr(rotary, "original_inv_freq"):
            rotary.original_inv_freq.copy_(inv_freq.to(rotary.original_inv_freq.dtype))


def batch_loss(model, batches: list[dict], attention: str, chunk: int = LOGIT_CHUNK) -> float:
    """torchtitan's logged step loss on ``batches``: Σ token CE over every batch / Σ valid tokens."""
    total, count = batch_loss_sums(model, batches, attention, chunk)
    if count == 0:
        raise ReferenceError("the recorded batch has no valid labels")
    return total / count


def batch_loss_sums(model, batches: list[dict], attention: str, chunk: int = LOGIT_CHUNK) -> tuple[float, int]:
    """(Σ token CE, valid tokens) of ``model`` on ``batches``.

    One row at a time, logits ``chunk`` positions at a time (host memory); CE summed in fp64.
    """
    import torch
    import torch.nn.functional as F

    if attention not in ATTENTIONS:
        raise ReferenceError(f"attention {attention!r}: expected one of {ATTENTIONS}")
    total, count = 0.0, 0
    head = model.get_output_embeddings()
    with torch.no_grad():
        for batch in batches:
            for row in range(batch["input"].shape[0]):
                ids = batch["input"][row : row + 1]
                labels = batch["labels"][row : row + 1]
                kwargs = {"use_cache": False}
                if batch.get("positions") is not None:
                    kwargs["position_ids"] = batch["positions"][row : row + 1]
                if attention == "causal":
                    # An all-ones mask: causal over the whole window, whatever the positions say.
                    # Without one, transformers reads position resets as packed documents.
                    kwargs["attention_mask"] = torch.ones_like(ids)
                hidden = model.model(input_ids=ids, **kwargs).last_hidden_state
                for start in range(0, ids.shape[1], chunk):
                    target = labels[0, start : start + chunk]
                    valid = target != IGNORE_INDEX
                    if not valid.any():
                        continue
                    logits = head(hidden[0, start : start + chunk]).float()
                    ce = F.cross_entropy(logits[valid], target[valid], reduction="sum")
                    total += ce.double().item()
                    count += int(valid.sum())
    return total, count


# --- verdict and diagnosis ------------------------------------------------------------------------


@dataclass
class Suspect:
    name: str
    #: Whether the run differs from the weights in this respect at all.
    applies: bool
    #: The run's value vs the weights' (human-readable).
    what: str
    #: The reference with the run's value in place of the weights' one (None: not measured).
    reference_with_fault: float | None = None
    #: reference_with_fault − reference.
    effect: float | None = None
    #: True when the suspect accounts for the measured number (see ``diagnose``).
    explains: bool = False


@dataclass
class ReferenceCheck:
    measured: float
    reference: float
    tolerance: float
    tolerance_reason: str
    vocab_size: int
    tokens: int
    ranks: int
    attention: str
    model_dir: str
    kept_defects: list[str] = field(default_factory=list)
    suspects: list[Suspect] = field(default_factory=list)
    cost: dict = field(default_factory=dict)
    #: False when the tolerance is an unmeasured allowance: the verdict is "recorded, not judged".
    judged: bool = True

    @property
    def difference(self) -> float:
        return self.measured - self.reference

    @property
    def agrees(self) -> bool:
        return math.isfinite(self.measured) and abs(self.difference) <= self.tolerance

    @property
    def plausible_bound(self) -> float:
        return PLAUSIBLE_FRACTION * math.log(self.vocab_size)

    @property
    def implausible(self) -> bool:
        return not math.isfinite(self.measured) or self.measured > self.plausible_bound

    @property
    def needs_diagnosis(self) -> bool:
        # Below the reference needs explaining too: a fault can lower the loss on a given batch
        # (the fixture's measured loss drops by 0.008 with the recipe's theta 5x below config.json's).
        return self.implausible or not self.agrees

    @property
    def passed(self) -> bool:
        return self.agrees and not self.implausible

    @property
    def verdict(self) -> str:
        parts = []
        if not math.isfinite(self.measured):
            parts.append("measured loss is not finite")
        elif self.agrees:
            parts.append("agrees with the reference")
        elif self.difference > 0:
            parts.append(f"measured is {self.difference:.4g} above the reference")
        else:
            parts.append(f"measured is {-self.difference:.4g} below the reference")
        if self.implausible and math.isfinite(self.measured):
            parts.append(f"implausible for trained weights (> {PLAUSIBLE_FRACTION:g} × ln V = {self.plausible_bound:.3f})")
        return "; ".join(parts)

    @property
    def named(self) -> list[str]:
        return [s.name for s in self.suspects if s.explains]

    def diagnosis(self) -> str:
        if not self.suspects:
            return "not diagnosed" if self.needs_diagnosis else ""
        lines = []
        for s in self.suspects:
            if not s.applies:
                lines.append(f"{s.name}: ruled out ({s.what})")
                continue
            effect = "not measured" if s.effect is None else f"reference with it {s.reference_with_fault:.6g} (effect {s.effect:+.4g})"
            lines.append(f"{s.name}: {s.what}; {effect}{' -> EXPLAINS it' if s.explains else ''}")
        if not self.named and self.needs_diagnosis:
            lines.append("none of the known suspects accounts for the measured loss")
        return "; ".join(lines)

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(
            difference=self.difference, agrees=self.agrees, plausible_bound=self.plausible_bound,
            implausible=self.implausible, passed=self.passed, verdict=self.verdict,
            named_suspects=self.named, diagnosis=self.diagnosis(),
        )  # fmt: skip
        return data


def tolerance_for(tier: str, model_dir: Path, recipe: str) -> Tolerance:
    from recipes.specs import read_hf_config

    hf = read_hf_config(model_dir)
    moe = "num_experts" in hf or "num_local_experts" in hf
    base = TOLERANCES[tier]
    if moe and recipe == "hf_backend" and MOE_BF16_EXPERTS.value > base.value:
        return MOE_BF16_EXPERTS
    return base


def _file_sha(directory: Path) -> str | None:
    from harness.provenance import sha256_of

    files = [p for p in (directory / "tokenizer.json", directory / "tokenizer_config.json") if p.is_file()]
    return sha256_of(files) if (directory / "tokenizer.json").is_file() else None


def tokenizer_suspect(run: "RunInfo", record: Record, model, reference: float, measured: float, tol: float):
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
    return Suspect("tokenizer", True, what + f"; the same text in the weights' own tokens scores {with_own:.6g}",
                   reference_with_fault=reference, effect=effect, explains=explains)  # fmt: skip


def rebuilt_batches(opts, tokenizer_dir: Path, per_rank: int) -> list[dict]:
    """The run's step-1 batches, re-packed from the same corpus with ``tokenizer_dir`` (torchtitan's loader)."""
    import dataclasses

    from harness.train import build_config

    opts = dataclasses.replace(opts, tokenizer_dir=Path(tokenizer_dir), allow_mismatch=[*opts.allow_mismatch, "tokenizer"])
    config = build_config(opts)
    tokenizer = config.tokenizer.build(tokenizer_path=str(tokenizer_dir))
    world = opts.nproc * opts.nnodes
    out = []
    for rank in range(world):
        loader = config.dataloader.build(
            dp_world_size=world, dp_rank=rank, tokenizer=tokenizer,
            seq_len=config.training.seq_len, local_batch_size=config.training.local_batch_size,
        )  # fmt: skip
        batches = iter(loader)
        for _ in range(per_rank):
            inputs, labels = next(batches)
            out.append({"input": inputs["input"], "positions": inputs.get("positions"), "labels": labels})
    return out


def theta_suspect(run: "RunInfo", record: Record, model, reference: float, measured: float, tol: float):
    from recipes.specs import read_hf_dims

    weights_theta = read_hf_dims(Path(run.model_dir)).get("rope_theta")
    run_theta = run.model.get("rope_theta")
    if run_theta is None or weights_theta is None or float(run_theta) == float(weights_theta):
        return Suspect("rope_theta", False, f"the run's RoPE theta {run_theta:g} is config.json's" if run_theta else "no theta recorded")
    weights_inv = computed_inv_freq(model)
    try:
        set_inv_freq(model, computed_inv_freq(model, run_theta))
        with_run_theta = batch_loss(model, record.batches, record.attention)
    finally:
        set_inv_freq(model, weights_inv)
    return Suspect(
        "rope_theta", True, f"the run's RoPE theta is {run_theta:g}, config.json's {weights_theta:g}",
        reference_with_fault=with_run_theta, effect=with_run_theta - reference,
        explains=abs(measured - with_run_theta) <= tol and abs(with_run_theta - reference) > tol,
    )  # fmt: skip


#: Relative difference at which two inverse-frequency vectors are different RoPEs
#: (fp32 recomputations of the same formula agree to ~1e-7).
INV_FREQ_RTOL = 1e-5


def inv_freq_suspect(run: "RunInfo", record: Record, model, reference: float, measured: float, tol: float):
    """Each rank's held ``inv_freq`` vs what the run's theta gives; scored per rank with its own."""
    import torch

    held = [b.get("held_inv_freq") if b.get("held_inv_freq") is not None else record.inv_freq for b in record.batches]
    if any(h is None for h in held):
        return Suspect("inv_freq", False, "the run's model holds no RoPE frequencies the record could read")
    run_theta = run.model.get("rope_theta")
    expected = computed_inv_freq(model, run_theta)
    if any(h.shape != expected.shape for h in held):
        what = f"the run's model held {tuple(held[0].shape)} RoPE frequencies, its theta gives {tuple(expected.shape)}"
        return Suspect("inv_freq", True, what)

    def gap(h) -> float:
        return (h - expected).abs().max().item() if bool(torch.isfinite(h).all()) else float("inf")

    gaps = [gap(h) for h in held]
    if max(gaps) <= INV_FREQ_RTOL * expected.abs().max().item():
        return Suspect("inv_freq", False, "the run's model held the RoPE frequencies its theta gives")
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
        "inv_freq", True, what, reference_with_fault=with_held, effect=with_held - reference,
        explains=both_blow_up or (abs(measured - with_held) <= tol and abs(with_held - reference) > tol),
    )  # fmt: skip


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
        from harness.options import RunOptions
        from harness.train import PROVENANCE_FILE, RUN_FILE, STEPS_FILE

        run_dir = Path(run_dir)
        provenance = json.loads((run_dir / PROVENANCE_FILE).read_text())
        steps_file = run_dir / STEPS_FILE
        steps = [json.loads(line) for line in steps_file.read_text().splitlines() if line.strip()] if steps_file.exists() else []
        if not steps and not allow_no_step:
            raise ReferenceError(f"{run_dir} recorded no step")
        opts = RunOptions.from_json((run_dir / RUN_FILE).read_text()) if (run_dir / RUN_FILE).is_file() else None
        weights = provenance.get("weights")
        if not weights:
            raise ReferenceError(f"{run_dir} loaded no weights (random init): there is nothing to score")
        return cls(
            recipe=opts.recipe if opts else "?", tier=opts.tier if opts else "cpu", model_dir=weights["path"],
            tokenizer=provenance["tokenizer"], model=provenance["model"],
            measured=float(steps[0]["loss"]) if steps else math.nan,
            options=opts,
        )  # fmt: skip


def diagnose(check: ReferenceCheck, run: RunInfo, record: Record, model) -> list[Suspect]:
    """Measure every suspect's effect on the reference (each a forward over the recorded batch)."""
    return [
        suspect(run, record, model, check.reference, check.measured, check.tolerance) for suspect in SUSPECTS
    ]


def check(run: RunInfo, record: Record, model=None, tolerance: Tolerance | None = None, always_diagnose: bool = False) -> ReferenceCheck:
    """Reference loss of ``record`` from ``run``'s weights, the verdict, and the diagnosis when needed."""
    started, cpu_started = time.perf_counter(), time.process_time()
    model = model if model is not None else load_reference_model(Path(run.model_dir))
    loaded = time.perf_counter()
    reference = batch_loss(model, record.batches, record.attention)
    scored = time.perf_counter()
    tolerance = tolerance or tolerance_for(run.tier, Path(run.model_dir), run.recipe)
    result = ReferenceCheck(
        measured=run.measured, reference=reference, tolerance=tolerance.value, tolerance_reason=tolerance.reason,
        vocab_size=model.config.vocab_size, tokens=record.tokens, ranks=record.ranks, attention=record.attention,
        model_dir=str(run.model_dir), kept_defects=list(record.kept_defects), judged=tolerance.measured,
    )  # fmt: skip
    if result.needs_diagnosis or always_diagnose:
        result.suspects = diagnose(result, run, record, model)
    result.cost = {
        "load_s": loaded - started,
        "score_s": scored - loaded,
        "total_s": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu_started,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    return result


def check_run_dir(
    run_dir: Path, tolerance: Tolerance | None = None, always_diagnose: bool = False, allow_no_step: bool = False,
    model=None,
) -> ReferenceCheck | None:
    """The reference check of one run directory, or None when the run recorded no batch.

    ``model``: a ``load_reference_model`` of the run's weights directory, to reuse across runs.
    """
    record = load_record(run_dir)
    if record is None:
        return None
    run = RunInfo.from_run_dir(run_dir, allow_no_step=allow_no_step)
    return check(run, record, model=model, tolerance=tolerance, always_diagnose=always_diagnose)


def summary(result: ReferenceCheck) -> str:
    text = (
        f"step-1 loss {result.measured:.7g} vs reference {result.reference:.7g} (transformers fp32 on the host, "
        f"{result.tokens} tokens of {result.ranks} rank(s)): Δ {result.difference:+.3g}, tolerance {result.tolerance:g}: "
        f"{result.verdict}"
    )
    diagnosis = result.diagnosis()
    return text + (f"\n  diagnosis: {diagnosis}" if diagnosis else "")


# --- what the reference costs at the 4B size ---------------------------------------------------------


#: A trn2 global batch at the tutorial's launch: 64 ranks × local batch 1 × 2048 tokens.
TRN2_GLOBAL_ROWS = 64


def measure_cost(config_dir: Path, layers: tuple[int, ...] = (1, 2), seq_len: int = 2048, threads: int | None = None) -> dict:
    """Host CPU time and memory of the reference at the real width, measured, then extrapolated.

    Random weights at ``layers`` depths: two depths separate the per-layer cost from the
    fixed one (embedding, final norm, the 151,936-row head), so a 2048-token row of the
    full model costs ``fixed + n_layers × per_layer``. CPU seconds, not wall time, are
    the figure to scale (other processes on a shared machine stretch wall time).
    The full model's fp32 size is counted on the meta device.
    """
    import gc

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from harness.report import cpu_model

    if threads:
        torch.set_num_threads(threads)
    full = AutoConfig.from_pretrained(config_dir)
    with torch.device("meta"):
        full_params = sum(p.numel() for p in AutoModelForCausalLM.from_config(full).parameters())
    measured = {}
    for n in layers:
        config = AutoConfig.from_pretrained(config_dir)
        config.num_hidden_layers = n
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:n]
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa").eval()
        ids = torch.randint(0, config.vocab_size, (1, seq_len))
        batch = {"input": ids, "positions": torch.arange(seq_len)[None], "labels": torch.roll(ids, -1, 1)}
        batch_loss(model, [batch], "causal")  # warm-up
        started, cpu = time.perf_counter(), time.process_time()
        batch_loss(model, [batch], "causal")
        measured[n] = {"wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu}
        del model
        gc.collect()
    a, b = layers[0], layers[-1]
    per_layer = (measured[b]["cpu_s"] - measured[a]["cpu_s"]) / (b - a)
    fixed = measured[a]["cpu_s"] - a * per_layer
    per_row = fixed + full.num_hidden_layers * per_layer
    return {
        "config": str(config_dir),
        "seq_len": seq_len,
        "threads": torch.get_num_threads(),
        "cpu_model": cpu_model(),
        "by_layers": measured,
        "per_row_fixed_cpu_s": fixed,
        "per_row_per_layer_cpu_s": per_layer,
        "full_layers": full.num_hidden_layers,
        "per_row_full_model_cpu_s": per_row,
        "trn2_global_batch_rows": TRN2_GLOBAL_ROWS,
        "trn2_global_batch_cpu_hours": per_row * TRN2_GLOBAL_ROWS / 3600,
        "full_model_params": full_params,
        "full_model_fp32_gib": full_params * 4 / 2**30,
        "peak_rss_gib_here": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m harness.reference", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", help="a run directory, or 'cost'")
    parser.add_argument("--diagnose", action="store_true", help="measure every suspect even when the verdict passes")
    parser.add_argument("--config-dir", type=Path, help="cost: config.json to size the model from")
    parser.add_argument("--threads", type=int)
    args = parser.parse_args(argv)
    if args.what == "cost":
        from recipes.specs import QWEN3_4B_INSTRUCT_2507

        print(json.dumps(measure_cost(args.config_dir or QWEN3_4B_INSTRUCT_2507, threads=args.threads), indent=2))
        return 0
    result = check_run_dir(Path(args.what), always_diagnose=args.diagnose)
    if result is None:
        print(f"{args.what} recorded no first batch (random init, or TP/CP/PP > 1)", file=sys.stderr)
        return 2
    print(summary(result))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())

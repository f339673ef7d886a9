"""The reference itself: transformers' model on the recorded tokens, fp32 on the host CPU, and its tolerance.

Judge stage. Primitives that the check and its diagnosis (:mod:`harness.reference.suspects`)
share: loading the weights, RoPE inverse frequencies, the loss of a recorded batch, the
per-tier tolerance, and the verdict of one check (:class:`ReferenceCheck`).
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from harness.declare import catalogue
from harness.rank.first_batch import ATTENTIONS, IGNORE_INDEX
from recipes.hf_config import read_hf_config
from recipes.hf_rope import rope_parameters

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
    #: False: a stated allowance no run has measured; a verdict under it is "unmeasured".
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


def load_reference_model(model_dir: Path):
    """``AutoModelForCausalLM.from_pretrained(model_dir)`` in fp32 on the CPU, RoPE as config.json gives it.

    The rotary ``inv_freq`` is recomputed from the config (transformers' own rope init), so
    a process-wide init patch (torchtitan's backend replaces ``PreTrainedModel._init_weights``
    for every later model, see recipes/hf_compat.py workaround 5) cannot leave it at 0 here.
    """
    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 -- heavy: transformers 1.8 s; this module stays light

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    set_inv_freq(model, computed_inv_freq(model))
    return model


def _rotaries(model):
    return [
        m
        for m in model.modules()
        if hasattr(m, "inv_freq") and hasattr(m, "compute_default_rope_parameters")
    ]


def computed_inv_freq(model, rope_theta: float | None = None):
    """The inverse frequencies transformers computes from ``model``'s config (or with ``rope_theta``)."""

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


def batch_loss_sums(
    model, batches: list[dict], attention: str, chunk: int = LOGIT_CHUNK
) -> tuple[float, int]:
    """(Σ token CE, valid tokens) of ``model`` on ``batches``.

    One row at a time, logits ``chunk`` positions at a time (host memory); CE summed in fp64.
    """
    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light
    import torch.nn.functional as F  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light

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
    #: False when the tolerance is an unmeasured allowance: the verdict is "unmeasured".
    judged: bool = True
    #: Where torchtitan's model and transformers' first part ways (``harness.reference.localize``):
    #: its ``to_dict()``, or {"error": ...}; None when not run (the reference agreed, no --localize).
    localization: dict | None = None

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
            parts.append(
                f"implausible for trained weights (> {PLAUSIBLE_FRACTION:g} × ln V = {self.plausible_bound:.3f})"
            )
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
            effect = (
                "not measured"
                if s.effect is None
                else f"reference with it {s.reference_with_fault:.6g} (effect {s.effect:+.4g})"
            )
            lines.append(f"{s.name}: {s.what}; {effect}{' -> EXPLAINS it' if s.explains else ''}")
        open_ = [s.name for s in self.suspects if s.applies and not s.explains]
        if not self.named and self.needs_diagnosis:
            lines.append(
                f"no measured suspect accounts for the measured loss; still suspect: {', '.join(open_)}"
                if open_
                else "none of the known suspects accounts for the measured loss"
            )
        return "; ".join(lines)

    @classmethod
    def from_dict(cls, data: dict) -> "ReferenceCheck":
        """Back from :meth:`to_dict` (a standing result carried from the night that measured it)."""
        known = {f.name for f in fields(cls)}
        suspects = [Suspect(**s) for s in data.get("suspects", [])]
        return cls(
            **{k: v for k, v in data.items() if k in known and k != "suspects"}, suspects=suspects
        )

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(
            difference=self.difference,
            agrees=self.agrees,
            plausible_bound=self.plausible_bound,
            implausible=self.implausible,
            passed=self.passed,
            verdict=self.verdict,
            named_suspects=self.named,
            diagnosis=self.diagnosis(),
        )
        return data


def tolerance_for(tier: str, model_dir: Path, recipe: str) -> Tolerance:
    """The tier's tolerance; a MoE model of a recipe whose experts compute in bf16 (harness.declare.catalogue) gets the wider one."""

    hf = read_hf_config(model_dir)
    moe = "num_experts" in hf or "num_local_experts" in hf
    base = TOLERANCES[tier]
    if moe and catalogue.entry(recipe).bf16_experts and MOE_BF16_EXPERTS.value > base.value:
        return MOE_BF16_EXPERTS
    return base

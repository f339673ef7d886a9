"""First divergence, by layer (harness.reference.localize): each injected defect is named at its module and layer.

The tiny fixture (2 layers) through torchtitan's native Qwen3 and transformers' Qwen3 side by
side; each defect is injected into one side only, at layer 1 (k ≠ 0) where it has a layer.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.config.provenance import sha256_of
from harness.options.run_options import RunOptions
from harness.rank.first_batch import Record
from harness.reference.diagnosis import RunInfo, batch_loss, check, load_reference_model, summary
from harness.reference.localize import localize, titan_model
from recipes.tiers import CPU

MODEL_DIR = CPU.model_dir


@pytest.fixture(scope="module")
def hf():
    return load_reference_model(MODEL_DIR)


@pytest.fixture(scope="module")
def ids():
    """One 64-token row from the fixture's vocabulary (seeded)."""
    return torch.randint(0, 1024, (1, 64), generator=torch.Generator().manual_seed(0))


def options(**changes) -> RunOptions:
    return RunOptions(
        recipe="native_qwen3", tier="cpu", init="hf", model_dir=MODEL_DIR, **changes
    ).resolved()


@pytest.fixture
def titan(hf):
    return titan_model(options())[0]


def where(loc) -> tuple[str, int | None] | None:
    return None if loc.first is None else (loc.first.name, loc.first.layer)


def test_a_clean_pair_names_nothing(titan, hf, ids, record_property):
    """The control: same weights, same tokens, every module within its dtype's tolerance."""
    loc = localize(titan, hf, ids)
    worst = max(d.max_abs / d.tolerance for d in loc.compared)
    record_property("localize.control_worst_fraction_of_tolerance", worst)
    record_property("localize.cost", loc.cost)
    assert len(loc.compared) == 1 + 2 * 14 + 2  # embedding, 14 per block, final norm, head
    assert where(loc) is None, loc.summary()


def test_a_wrong_rope_theta_is_the_first_rope(hf, ids):
    """``--rope-theta 5e6`` against config.json's 1e6: the run's model through build_config."""
    loc = localize(titan_model(options(rope_theta=5e6))[0], hf, ids)
    assert where(loc) == ("RoPE'd q", 0), loc.summary()
    assert [(d.name, d.layer) for d in loc.diverging[1:4]] == [
        ("RoPE'd k", 0),
        ("attention", 0),
        ("mlp norm", 0),
    ]
    assert "layer 0 RoPE'd q" in loc.summary() and "next: layer 0 RoPE'd k" in loc.summary()


def test_an_untied_head_is_the_head(titan, hf, ids):
    """A head that is not the embedding (untied and left at its init): only the head differs."""
    init = (
        torch.randn(titan.lm_head.weight.shape, generator=torch.Generator().manual_seed(1)) * 0.02
    )
    titan.lm_head.weight = torch.nn.Parameter(init)
    loc = localize(titan, hf, ids)
    assert where(loc) == ("head", None), loc.summary()
    assert len(loc.diverging) == 1


def test_a_weight_the_checkpoint_lacks_is_named_and_localized(hf, ids):
    """The checkpoint without layer 1's MLP norm: torchtitan keeps its init (ones) there, and says so."""
    from safetensors.torch import load_file

    state = load_file(MODEL_DIR / "model.safetensors")
    del state["model.layers.1.post_attention_layernorm.weight"]
    model, not_loaded = titan_model(options(), state)
    assert not_loaded == ["layers.1.ffn_norm.weight"]
    loc = localize(model, hf, ids, not_loaded=not_loaded)
    assert where(loc) == ("mlp norm", 1), loc.summary()
    assert "left at torchtitan's init: layers.1.ffn_norm.weight" in loc.summary()


def test_a_perturbed_norm_weight_at_layer_1_is_that_norm(titan, hf, ids):
    with torch.no_grad():
        titan.layers["1"].ffn_norm.weight.mul_(1.01)
    loc = localize(titan, hf, ids)
    assert where(loc) == ("mlp norm", 1), loc.summary()
    assert loc.first.rel == pytest.approx(0.01, rel=0.05)


def test_a_changed_attention_scale_at_layer_1_is_that_attention(titan, hf, ids):
    """RoPE'd q and k still agree; the attention's output is the first to part."""
    attention = titan.layers["1"].attention
    attention.scaling = 0.5 * attention.head_dim**-0.5
    loc = localize(titan, hf, ids)
    assert where(loc) == ("attention", 1), loc.summary()


def test_a_defect_on_transformers_side_is_found_too(titan, hf, ids):
    """Not on the issue's list, and on the other side: transformers' v_proj at layer 1 scaled by 1.001."""
    v = hf.model.layers[1].self_attn.v_proj.weight
    original = v.detach().clone()
    try:
        with torch.no_grad():
            v.mul_(1.001)
        loc = localize(titan, hf, ids)
    finally:
        with torch.no_grad():
            v.copy_(original)
    assert where(loc) == ("v_proj", 1), loc.summary()
    assert loc.first.max_abs > 10 * loc.first.tolerance


def _run(measured: float) -> RunInfo:
    return RunInfo(
        recipe="native_qwen3",
        tier="cpu",
        model_dir=str(MODEL_DIR),
        measured=measured,
        options=options(),
        tokenizer={
            "path": str(MODEL_DIR),
            "vocab_size": 1024,
            "sha256": sha256_of(
                [MODEL_DIR / "tokenizer.json", MODEL_DIR / "tokenizer_config.json"]
            ),
        },
        model={"rope_theta": 1e6},
    )


def test_the_reference_check_localizes_only_a_disagreement(hf, ids):
    """harness.reference.diagnosis.check: no localization when step 1 agrees, one when it does not or on --localize."""
    batch = {"input": ids, "positions": None, "labels": torch.roll(ids, -1, 1)}
    record = Record(batches=[batch], attention="causal", inv_freq=None, ranks=1)
    reference = batch_loss(hf, [batch], "causal")
    agreeing = check(_run(reference), record, model=hf)
    assert agreeing.agrees and agreeing.localization is None
    disagreeing = check(_run(reference + 0.1), record, model=hf)
    assert not disagreeing.agrees
    assert disagreeing.localization["first"] is None, (
        disagreeing.localization
    )  # the models agree: the loss does not
    assert "layer by layer: no module differs" in summary(disagreeing)
    asked = check(_run(reference), record, model=hf, localize=True)
    assert asked.localization["compared"] and math.isfinite(asked.cost["localize_s"])


def test_the_report_and_the_upstream_report_name_the_first_divergence(hf, ids):
    """results.md gets a "First divergence, by layer" section; upstream/<claim>.md fills its section from it."""
    from harness.night import upstream
    from harness.report import markdown as report_markdown

    loc = localize(titan_model(options(rope_theta=5e6))[0], hf, ids).to_dict()
    run = {
        "recipe": "native_qwen3",
        "tier": "cpu",
        "reference": {"verdict": "measured is 0.01 above", "localization": loc},
    }
    section = "\n".join(
        report_markdown.first_divergence_section(
            [run, {"recipe": "hf_backend", "tier": "cpu", "reference": {}}]
        )
    )
    assert section.startswith("## First divergence, by layer")
    assert (
        "- native_qwen3 (cpu): first divergence: layer 0 RoPE'd q (torchtitan layers.0.attention.rope[0]"
        in section
    )
    assert "hf_backend" not in section
    assert (
        report_markdown.first_divergence_section(
            [{"recipe": "x", "tier": "cpu", "reference": {"verdict": "agrees"}}]
        )
        == []
    )
    named = upstream.first_diverging({"native_qwen3.cpu.reference": run["reference"]})
    assert named == [f"- `native_qwen3.cpu.reference`: {loc['summary']}"]
    assert upstream.first_diverging({"x.reference": {"verdict": "agrees"}})[0].startswith(
        "not run for this claim"
    )

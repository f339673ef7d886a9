"""Every weights-loaded step-1 loss against transformers on the same batch, and a diagnosis per crafted fault.

The shared runs (tests/cpu/conftest.py) record their first global batch on every rank
(``harness.reference.diagnosis.install``, called from harness/rank/train.py); the reference scores it
with ``AutoModelForCausalLM`` in fp32 here, on the host, outside torchtitan.

The suspect tests craft each fault on the fixture in this process: the recipe's own
config, torchtitan's own loader for the batch, and torchtitan's own model (native, or
the backend's) with the fixture weights loaded through the recipe's state-dict adapter
for the measured loss -- what step 1 computes, without a launch (the two shared-run
tests below show that number equals the trainer's to < 1e-6). One end-to-end test
carries a fault through a real launch and the main job's report.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from bad_inputs import harness_run

from harness.checks.preflight import preflight
from harness.options.run_options import RunOptions
from harness.reference import diagnosis as reference
from recipes.tiers import FIXTURES

MODEL_DIR = FIXTURES / "qwen3-tiny"
MOE_DIR = FIXTURES / "qwen3-moe-tiny"
CPU_TOL = reference.TOLERANCES["cpu"].value
#: The tutorial's theta mismatch in miniature: the recipe builds 5x less than config.json says
#: (torchtitan's "4B" flavor 1e6 vs Qwen3-4B-Instruct-2507's 5e6; the fixture was trained at 1e6).
FAULTY_THETA = 2e5
#: A diagnosis must not name a suspect for a gap no suspect made: the healthy batch's
#: measured loss, shifted by this much, stays unexplained.
UNEXPLAINED_SHIFT = 0.05


# --- helpers ---------------------------------------------------------------------------------------


def options(recipe: str = "native_qwen3", **overrides) -> RunOptions:
    """The shared 2-rank runs' options (tests/cpu/conftest.py), with ``overrides``."""
    return preflight(
        RunOptions(
            recipe=recipe, tier="cpu", nproc=2, init="hf", model_dir=MODEL_DIR, seed=0, **overrides
        )
    )


def titan_model(config, model_dir: Path, before_init=None):
    """The recipe's torchtitan model as the trainer builds it (meta, to_empty, init), weights loaded."""
    from safetensors.torch import load_file

    spec = config.model_spec
    if hasattr(config, "hf_model"):
        spec.model.update_from_config(config=config)
    with torch.device("meta"):
        model = spec.model.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        if before_init is not None:
            before_init(model)
        model.init_weights(buffer_device=None)
    state = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(path))
    model.load_state_dict(
        spec.state_dict_adapter(spec.model, str(model_dir)).from_hf(state), strict=True
    )
    return model.eval()


def titan_loss(model, batches) -> float:
    """torchtitan's step-1 global average loss of ``model`` on every rank's batch."""
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            logits = model(batch["input"], positions=batch["positions"])
            valid = batch["labels"] != reference.IGNORE_INDEX
            total += (
                F.cross_entropy(logits[valid].float(), batch["labels"][valid], reduction="sum")
                .double()
                .item()
            )
            count += int(valid.sum())
    return total / count


def step1_in_process(opts: RunOptions, before_init=None):
    """(RunInfo, Record, torchtitan model) of ``opts``'s step 1, computed here instead of launched."""
    from harness.config import provenance
    from harness.config.build import build_config

    config = build_config(opts)
    batches = reference.rebuilt_batches(opts, opts.tokenizer_dir, per_rank=1)
    model = titan_model(config, opts.model_dir, before_init)
    record = reference.Record(
        batches=batches,
        attention=reference.attention_of(model),
        inv_freq=reference.held_inv_freq(model),
        ranks=opts.nproc,
    )
    run = reference.RunInfo(
        recipe=opts.recipe,
        tier=opts.tier,
        model_dir=str(opts.model_dir),
        tokenizer=provenance.tokenizer_info(Path(config.hf_assets_path)),
        model=provenance.built_dims(config),
        measured=titan_loss(model, batches),
        options=opts,
    )
    return run, record, model


@pytest.fixture(scope="module")
def reference_model():
    return reference.load_reference_model(MODEL_DIR)


@pytest.fixture(scope="module")
def healthy(reference_model):
    """The native recipe's step 1 on the fixture, as the shared 2-rank run has it, checked."""
    run, record, _ = step1_in_process(options())
    return run, record, reference.check(run, record, model=reference_model)


def record_check(record_property, prefix: str, result: reference.ReferenceCheck) -> None:
    record_property(f"{prefix}_measured", result.measured)
    record_property(f"{prefix}_reference", result.reference)
    record_property(f"{prefix}_difference", result.difference)
    record_property(f"{prefix}_reference_outcome", result.verdict)
    for s in result.suspects:
        record_property(
            f"{prefix}_suspect_{s.name}",
            {"applies": s.applies, "effect": s.effect, "explains": s.explains},
        )


def craft_tokenizer(out_dir: Path, vocab_size: int = 512) -> Path:
    """Another byte-level BPE, trained on the corpus reversed: torchtitan's test tokenizer in miniature.

    The tutorial's default ``hf_assets_path`` is a 2,020-id test BPE paired with a
    151,936-row model; this is a 512-id BPE paired with the fixture's 1,024 rows.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from fixtures.build_fixtures import EOS_TOKEN, FIXTURES_DIR, read_corpus, write_tokenizer

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(read_corpus(FIXTURES_DIR / "corpus")[::-1], trainer=trainer)
    write_tokenizer(tokenizer, out_dir)
    return out_dir


# --- the record and the reference on the shared runs -------------------------------------------------


def test_run_records_its_first_global_batch(native_hf_run):
    """Every rank's rows, the loader's per-document positions, causal attention, the RoPE the model held."""
    record = reference.load_record(Path(native_hf_run["run_dir"]))
    assert record is not None and record.ranks == native_hf_run["nproc"] == 2
    rebuilt = reference.rebuilt_batches(options(), MODEL_DIR, per_rank=1)
    for got, expected in zip(record.batches, rebuilt, strict=True):
        for key in ("input", "positions", "labels"):
            assert torch.equal(got[key], expected[key]), (
                f"recorded {key} is not torchtitan's loader's first batch"
            )
    assert record.attention == "causal"  # the tutorial's SDPA: causal over the packed window
    expected = reference.computed_inv_freq(reference.load_reference_model(MODEL_DIR))
    torch.testing.assert_close(record.inv_freq, expected, rtol=reference.INV_FREQ_RTOL, atol=0)
    assert record.kept_defects == []


def test_random_init_runs_record_nothing(native_random_run):
    assert reference.load_record(Path(native_random_run["run_dir"])) is None


def test_attention_is_read_from_the_model_the_run_built():
    """SDPA (the tutorial's attn_backend) is causal over the window; Flex builds per-document masks."""
    from torchtitan.models.common.attention import FlexAttention

    from harness.config.build import build_config

    config = build_config(options())
    with torch.device("meta"):
        assert reference.attention_of(config.model_spec.model.build()) == "causal"
    for layer in config.model_spec.model.layers:
        layer.attention.inner_attention = FlexAttention.Config()
    with torch.device("meta"):
        assert reference.attention_of(config.model_spec.model.build()) == "document"


@pytest.mark.parametrize(
    "run_fixture", ["native_hf_run", "hf_backend_hf_run", "hf_backend_moe_run"]
)
@pytest.mark.slow
def test_reference_agrees_with_measured_step1(run_fixture, request, record_property):
    """transformers on the run's own batch, fp32 on the host == the run's step-1 loss, within the cpu tolerance."""
    run = request.getfixturevalue(run_fixture)
    result = reference.check_run_dir(Path(run["run_dir"]))
    record_check(record_property, run_fixture, result)
    record_property(f"{run_fixture}_reference_cost", result.cost)
    assert result.measured == run["losses"][0]
    assert result.tokens == 2 * 2 * 256 and result.ranks == 2
    assert result.passed, reference.summary(result)
    assert not result.needs_diagnosis and result.suspects == []
    if run_fixture == "hf_backend_moe_run":
        assert result.tolerance == reference.MOE_BF16_EXPERTS.value
    else:
        assert result.tolerance == CPU_TOL


@pytest.mark.slow
def test_cpu_tolerance_rejects_the_smallest_fault(healthy, reference_model, record_property):
    """The cpu tolerance is tight: a one-ulp-scale gap passes, the theta fault's effect is > 100× it."""
    run, record, result = healthy
    record_property("healthy_native_difference", result.difference)
    assert abs(result.difference) <= CPU_TOL / 10
    theta = reference.theta_suspect(
        dataclasses.replace(run, model={**run.model, "rope_theta": FAULTY_THETA}),
        record,
        reference_model,
        result.reference,
        result.measured,
        CPU_TOL,
    )
    record_property("theta_fault_effect", theta.effect)
    assert abs(theta.effect) > 100 * CPU_TOL


def test_bf16_rounding_on_the_fixture_is_inside_the_trn2_allowance(healthy, record_property):
    """The trn2 tolerance covers at least bf16's rounding at the fixture's scale (see its reason)."""
    from transformers import AutoModelForCausalLM

    _, record, result = healthy
    bf16 = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.bfloat16).eval()
    reference.set_inv_freq(bf16, reference.computed_inv_freq(bf16))
    gap = reference.batch_loss(bf16, record.batches, record.attention) - result.reference
    record_property("fixture_bf16_minus_fp32_reference", gap)
    assert CPU_TOL < abs(gap) < reference.TOLERANCES["trn2"].value / 10


# --- one test per suspect: a crafted fault, and the diagnosis naming it --------------------------------


def test_tokenizer_fault_is_named(tmp_path, reference_model, healthy, record_property):
    """hf_assets_path pointing at another tokenizer: same ids on both sides, implausible, re-packed text fixes it."""
    bad = craft_tokenizer(tmp_path / "tokenizer")
    run, record, _ = step1_in_process(options(tokenizer_dir=bad, allow_mismatch=["tokenizer"]))
    result = reference.check(run, record, model=reference_model)
    record_check(record_property, "tokenizer_fault", result)
    # The weights score these ids exactly as torchtitan did: the reference alone cannot see the fault ...
    assert result.agrees
    # ... the plausibility bound does, and the diagnosis measures the weights' own tokenizer on the same text.
    assert result.implausible and not result.passed
    assert result.named == ["tokenizer"], result.diagnosis()
    (tok,) = [s for s in result.suspects if s.name == "tokenizer"]
    assert tok.reference_with_fault - tok.effect == pytest.approx(healthy[2].reference, abs=CPU_TOL)
    assert "tokenizer" in result.diagnosis() and "EXPLAINS" in result.diagnosis()


def test_a_healthy_run_localized_on_request_names_no_module(healthy, reference_model):
    """The control of the localizer on the loader's real batch (per-document positions, both sides)."""
    run, record, _ = healthy
    result = reference.check(run, record, model=reference_model, localize=True)
    assert result.agrees and result.localization["first"] is None, result.localization["summary"]
    assert len(result.localization["compared"]) == 31


def test_rope_theta_fault_is_named(reference_model, record_property):
    """The recipe's RoPE theta 5× below config.json's: measured off the reference, the run's theta accounts for it.

    On this batch the fault *lowers* the loss (the loader's per-document positions under
    causal SDPA are already off, see tests/cpu/test_data_path.py): a disagreement either way
    is diagnosed.
    """
    run, record, _ = step1_in_process(
        options(rope_theta=FAULTY_THETA, allow_mismatch=["rope_theta"])
    )
    result = reference.check(run, record, model=reference_model)
    record_check(record_property, "rope_theta_fault", result)
    assert abs(result.difference) > CPU_TOL and not result.passed
    assert result.named == ["rope_theta"], result.diagnosis()
    (theta,) = [s for s in result.suspects if s.name == "rope_theta"]
    assert theta.reference_with_fault == pytest.approx(result.measured, abs=CPU_TOL)
    # The held inv_freq is what the run's theta gives: not a second, separate suspect.
    assert [s.applies for s in result.suspects if s.name == "inv_freq"] == [False]
    # The disagreement is localized on the recorded batch (its per-document positions on both sides).
    first = result.localization["first"]
    assert (first["name"], first["layer"]) == ("RoPE'd q", 0), result.localization["summary"]


@pytest.mark.parametrize("left_as", [0.0, float("nan")], ids=["zeros", "nan"])
@pytest.mark.slow
def test_inv_freq_fault_is_named(left_as, monkeypatch, reference_model, record_property):
    """The backend with upstream's RoPE init (torchtitan issue 4783), to_empty() memory made deterministic."""
    monkeypatch.setenv("QWEN3_HF_KEEP_DEFECTS", "inv_freq")

    def fill(
        model,
    ):  # what to_empty() may hand out; upstream's init_states never overwrites inv_freq
        for buffer in model.buffers():
            if buffer.is_floating_point():
                buffer.fill_(left_as)

    run, record, model = step1_in_process(options("hf_backend"), before_init=fill)
    assert type(model).__name__ == "UpstreamRopeInitModel"
    result = reference.check(run, record, model=reference_model)
    record_check(record_property, f"inv_freq_fault_{left_as}", result)
    assert not result.passed
    assert result.named == ["inv_freq"], result.diagnosis()
    assert "4783" in result.diagnosis()


def test_a_gap_no_suspect_made_stays_unexplained(healthy, reference_model):
    run, record, _ = healthy
    shifted = dataclasses.replace(run, measured=run.measured + UNEXPLAINED_SHIFT)
    result = reference.check(shifted, record, model=reference_model)
    assert result.needs_diagnosis and not result.passed
    assert result.named == [] and [s.applies for s in result.suspects] == [False, False, False]
    assert "none of the known suspects" in result.diagnosis()


def test_a_carried_diagnosis_scores_no_suspect_and_a_known_batch_is_not_scored_again(
    healthy, reference_model, monkeypatch
):
    """The night's plan (issue 37): a batch already scored tonight reuses its reference loss, and a stable night
    carries the standing diagnosis (harness.night.standing) instead of scoring the suspects again."""
    run, record, checked = healthy
    shifted = dataclasses.replace(run, measured=run.measured + UNEXPLAINED_SHIFT)
    diagnosed = reference.check(shifted, record, model=reference_model)
    assert diagnosed.needs_diagnosis and len(diagnosed.suspects) == 3

    def no_forward(*args, **kwargs):
        raise AssertionError("the batch was scored again")

    monkeypatch.setattr(reference, "batch_loss", no_forward)
    carried = reference.check(
        shifted, record, model=reference_model, diagnose=False, known_reference=checked.reference
    )
    assert (
        carried.suspects == []
        and carried.localization is None
        and carried.reference == checked.reference
    )
    assert reference.ReferenceCheck.from_dict(diagnosed.to_dict()).to_dict() == diagnosed.to_dict()


def test_a_partial_record_is_refused_not_scored(tmp_path, healthy, reference_model):
    """One node's run dir of a 2-node run holds half the global batch: named, never averaged as the whole."""
    from harness.report.markdown import reference_section

    _, record, _ = healthy
    batch = record.batches[0]
    reference.write_rank_record(
        tmp_path / reference.RECORD_DIR,
        0,
        2,
        [({"input": batch["input"], "positions": batch["positions"]}, batch["labels"])],
        reference_model,
    )
    with pytest.raises(reference.IncompleteRecord, match="1 rank record"):
        reference.load_record(tmp_path)
    row = {
        "recipe": "native_qwen3",
        "tier": "cpu",
        "nproc": 1,
        "losses": [1.5],
        "reference": {"passed": None, "error": "x", "summary": "not computed: x"},
    }
    table = "\n".join(reference_section([row]))
    assert "not computed: x" in table and "FAIL" not in table


def test_implausibility_bound_is_half_ln_v(healthy):
    _, _, result = healthy
    assert result.plausible_bound == pytest.approx(math.log(1024) / 2)
    assert result.measured < result.plausible_bound  # the trained fixture scores 1.55 of 6.93


# --- end to end: a fault through a real launch, the main job's verdict and report ------------------------


@pytest.mark.slow
def test_kept_inv_freq_defect_through_the_trainer_is_named(tmp_path, monkeypatch, record_property):
    """The trn2 as-published lane in miniature: QWEN3_HF_KEEP_DEFECTS=inv_freq reaches every rank.

    Each rank's inv_freq is that rank's own uninitialised memory, so the reference scores
    each rank's rows with the frequencies that rank held (recorded per rank). A step-1 loss
    that is not finite stops torchtitan before it logs (measured as NaN, still diagnosed).
    """
    from harness.launch.lifecycle import LaunchError, launch

    monkeypatch.setenv("QWEN3_HF_KEEP_DEFECTS", "inv_freq")
    opts = options("hf_backend", run_dir=tmp_path / "run", steps=1, export=False)
    try:
        launch(opts, echo=lambda line: None)
    except LaunchError as e:
        assert reference.load_record(opts.run_dir) is not None, str(e)
    result = reference.check_run_dir(opts.run_dir, allow_no_step=True)
    record_check(record_property, "kept_inv_freq_run", result)
    assert result.kept_defects == ["inv_freq"]
    assert not result.passed and result.named == ["inv_freq"], reference.summary(result)
    (inv,) = [s for s in result.suspects if s.name == "inv_freq"]
    if math.isfinite(result.measured):
        assert inv.reference_with_fault == pytest.approx(result.measured, abs=CPU_TOL)


@pytest.mark.slow
def test_main_job_reports_the_reference_and_names_the_fault(tmp_path):
    report_dir = tmp_path / "report"
    out = harness_run(
        report_dir,
        "--rope-theta",
        repr(FAULTY_THETA),
        "--allow-mismatch",
        "rope_theta",
        timeout=600,
    )
    assert out.returncode == 1, (out.stdout[-3000:], out.stderr[-3000:])
    assert "FAILED check: reference" in out.stderr
    (run,) = json.loads((report_dir / "results.json").read_text())["runs"]
    ref = run["reference"]
    assert ref["measured"] == run["losses"][0] and ref["named_suspects"] == ["rope_theta"], ref
    assert abs(ref["difference"]) > CPU_TOL
    markdown = (report_dir / "results.md").read_text()
    assert "Step-1 loss vs an independent reference" in markdown
    assert (
        "diagnosis of native_qwen3" in markdown
        and "rope_theta" in markdown
        and "EXPLAINS" in markdown
    )
    assert (
        ref["localization"]["first"]["name"] == "RoPE'd q"
        and ref["localization"]["first"]["layer"] == 0
    )
    assert (
        "## First divergence, by layer" in markdown
        and "first divergence: layer 0 RoPE'd q" in markdown
    )


def test_cost_estimate_extrapolates_from_two_depths():
    """``python -m harness.reference.diagnosis cost`` (run at the real 4B width by hand; here on the fixture's config)."""
    cost = reference.measure_cost(MODEL_DIR, layers=(1, 2), seq_len=64, threads=1)
    assert cost["full_layers"] == 2 and cost["trn2_global_batch_rows"] == 64
    assert cost["per_row_full_model_cpu_s"] == pytest.approx(
        cost["per_row_fixed_cpu_s"] + 2 * cost["per_row_per_layer_cpu_s"]
    )
    assert cost["full_model_params"] == sum(
        p.numel() for p in reference.load_reference_model(MODEL_DIR).parameters()
    )

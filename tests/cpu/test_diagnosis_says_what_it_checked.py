"""Issue 46 item 6: a diagnosis rules a suspect out only after a check of content, names every mismatch the run
allowed, and says when the report directory vanished. Unit tests: no run, no model, a small tokenizer built here."""

from __future__ import annotations

import shutil
from pathlib import Path

from test_reference_loss import craft_tokenizer

from harness.base.run_dir import provenance_state
from harness.config.provenance import tokenizer_info
from harness.launch.failures import failure_summary
from harness.reference.scoring import ReferenceCheck, Suspect
from harness.reference.suspects import RunInfo, allowed_suspects, tokenizer_suspect
from recipes.tiers import FIXTURES

FIXTURE_DIR = FIXTURES / "qwen3-tiny"


def run_info(model_dir: Path, inputs: dict | None = None, allowed=()) -> RunInfo:
    """What a run directory holds when its run read ``model_dir``'s weights and tokenizer, as they are now."""
    return RunInfo(
        recipe="native_qwen3",
        tier="cpu",
        model_dir=str(model_dir),
        tokenizer=tokenizer_info(model_dir),
        model={},
        measured=8.19,
        inputs=inputs,
        allowed=list(allowed),
    )


def suspect_of(run: RunInfo) -> Suspect:
    """The tokenizer suspect of ``run``: with options None it never re-packs the corpus (no model is needed)."""
    return tokenizer_suspect(run, None, None, reference=1.5, measured=run.measured, tol=1e-5)


def test_a_400_token_tokenizer_inside_a_copy_of_the_model_dir_is_not_ruled_out(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(FIXTURE_DIR, model)
    craft_tokenizer(model, vocab_size=400)  # the weights' config.json still says vocab_size 1024
    suspect = suspect_of(run_info(model))
    assert suspect.applies, suspect.what
    assert "400" in suspect.what and "vocab_size 1024" in suspect.what, suspect.what


def test_the_weights_own_tokenizer_is_ruled_out_by_its_content(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(FIXTURE_DIR, model)
    suspect = suspect_of(run_info(model))
    assert not suspect.applies, suspect.what
    assert "sha256" in suspect.what and "1024" in suspect.what, suspect.what


def test_a_tokenizer_that_differs_from_the_recorded_inputs_is_not_ruled_out(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(FIXTURE_DIR, model)
    recorded = {"tokenizer": {"tokenizer.json": "0" * 64}}
    suspect = suspect_of(run_info(model, inputs=recorded))
    assert suspect.applies and "recorded" in suspect.what, suspect.what


def test_a_model_dir_without_a_tokenizer_is_not_ruled_out(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(FIXTURE_DIR, model)
    run = run_info(model)
    (model / "tokenizer.json").unlink()
    suspect = suspect_of(run)
    assert suspect.applies and "no tokenizer.json" in suspect.what, suspect.what


def check(*suspects: Suspect) -> ReferenceCheck:
    return ReferenceCheck(
        measured=1.6,
        reference=1.5,
        tolerance=1e-5,
        tolerance_reason="",
        vocab_size=1024,
        tokens=512,
        ranks=2,
        attention="causal",
        model_dir="m",
        suspects=list(suspects),
    )


def test_every_mismatch_the_run_allowed_is_a_suspect_never_none_of_the_known():
    measured = [Suspect(name, False, "checked") for name in ("tokenizer", "rope_theta", "inv_freq")]
    allowed = [
        ("rms_norm_eps", "rms_norm_eps: m/config.json says 1e-05, recipe builds RMSNorm eps 1e-06")
    ]
    suspects = measured + allowed_suspects(allowed, measured)
    text = check(*suspects).diagnosis()
    assert "none of the known suspects" not in text, text
    assert "rms_norm_eps: allowed by --allow-mismatch rms_norm_eps" in text, text
    assert "rms_norm_eps" in check(*suspects).to_dict()["diagnosis"]


def test_an_allowed_mismatch_a_measured_suspect_ruled_out_stays_a_suspect():
    measured = [Suspect("rope_theta", False, "the run's RoPE theta 1e+06 is config.json's")]
    suspects = allowed_suspects(
        [("rope_theta", "rope_theta: config.json says 1e6, recipe builds 5e5")], measured
    )
    assert [(s.name, s.applies) for s in suspects] == [("rope_theta", True)]


def test_a_report_dir_that_vanished_during_the_run_is_said(tmp_path):
    report = tmp_path / "report"
    run_dir = report / "runs" / "native_qwen3-cpu-hf-1"
    run_dir.mkdir(parents=True)
    shutil.rmtree(report)
    said = f"the report directory {report} vanished during the run"
    assert provenance_state({}, run_dir) == said
    assert failure_summary(run_dir, [], 1, None).startswith(said)
    assert (
        provenance_state({}) == "ranks failed before provenance was written"
    )  # no run dir: as before

"""Tutorial config 2 at full size on a trn2.48xlarge: the published 6.54 / 12.43 and the export round trip.

Judged on config 2 *as published* (``harness.options.lanes``, lane ``as_published``): the tutorial's
``model_registry("4B")`` with its RoPE theta 1e6 (Qwen3-4B-Instruct-2507's config.json says
5e6: ``--allow-mismatch rope_theta``, recorded in provenance and in the golden's input key),
on the checkout's ``c4_test``. The corrected lane (theta 5e6) is held to the host reference
in tests/neuron/test_reference_neuron.py. The runs are the night's shared lane runs.
"""

from __future__ import annotations

import math

import pytest
from lane_runs import diagnosis_due, lane_run
from requires import (
    requires_dataset,
    requires_neuron_device,
    requires_qwen3_4b_weights,
    requires_titan_assets,
    requires_torch_neuronx,
)

from harness.judge import unmeasured
from harness.night import plan as nightly
from harness.night import standing
from harness.options import lanes
from recipes.tiers import TRN2

pytestmark = [
    requires_neuron_device,
    requires_torch_neuronx,
    requires_qwen3_4b_weights,
    requires_titan_assets,
]


@pytest.mark.launch("config2-as_published")
def test_published_step1_loss_from_pretrained_weights(shared_dir, golden, record_property):
    run = lane_run("config2-as_published", shared_dir)
    record_property("native_qwen3.trn2.as_published.provenance", run.result.get("provenance"))
    golden("native_qwen3", "trn2", "step1_loss_hf", run.step1(), inputs=run.inputs)


@pytest.mark.launch("config2-as_published-random")
def test_published_step1_loss_from_random_init(shared_dir, golden):
    run = lane_run("config2-as_published-random", shared_dir)
    golden("native_qwen3", "trn2", "step1_loss_random", run.step1(), inputs=run.inputs)


@pytest.mark.launch("config2-as_published")
def test_export_round_trip_keys(shared_dir, golden):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from harness.rank.export import EXPORT_DIR_NAME

    run = lane_run("config2-as_published", shared_dir)
    run.finished("the export round trip")
    export = run.run_dir / EXPORT_DIR_NAME
    state = {}
    for path in sorted(export.glob("*.safetensors")):
        state.update(load_file(path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(export))
    result = model.load_state_dict(state, strict=False, assign=True)
    golden(
        "native_qwen3",
        "trn2",
        "export_missing_keys",
        sorted(result.missing_keys),
        inputs=run.inputs,
    )
    golden(
        "native_qwen3",
        "trn2",
        "export_unexpected_keys",
        sorted(result.unexpected_keys),
        inputs=run.inputs,
    )


#: |torchtitan.train − harness| at step 1: an unmeasured allowance (harness.judge.unmeasured.TITAN_ENTRY says why).
TITAN_ENTRY = unmeasured.TITAN_ENTRY


@pytest.mark.launch("config2-as_published", "config2-torchtitan-train")
@requires_dataset  # native_qwen3_trn2() itself reads $QWEN3_DATASET_DIR; the run points it at c4_test
def test_torchtitan_train_runs_config_2_with_the_harness_step1_loss(
    shared_dir, tmp_path, record_property
):
    """torchtitan's own entry on the recipe's config function (README), on the as-published lane's text; run
    only when due (harness.night.standing: it moves with the versions, the inputs and the suite's launch code), else
    the standing difference of the night that measured it is carried and judged again."""
    from benchmarks.common import run_titan_train

    spec = nightly.LAUNCHES[
        "config2-torchtitan-train"
    ]  # the same lane as config2-as_published, torchtitan's entry
    due = diagnosis_due(spec.name, shared_dir)
    record_property(f"trn2.{spec.name}.due", {"due": due.due, "why": due.why})
    if due.due:
        harness_run = lane_run("config2-as_published", shared_dir)
        dataset = lanes.titan_checkout()[0] / lanes.TITAN_DATASET
        steps = run_titan_train(
            "recipes.native_qwen3",
            "native_qwen3_trn2",
            TRN2.nproc,
            tmp_path,
            "--training.steps",
            str(spec.steps),
            "--dataloader.dataset_path",
            str(dataset),
            timeout_s=TRN2.launch_timeout_s,
        )
        assert [s.step for s in steps] == [1], steps
        measured = {"step1_loss": steps[0].loss, "difference": steps[0].loss - harness_run.step1()}
    else:
        measured = due.standing["result"]
    record_property(f"{standing.PROPERTY_PREFIX}{spec.name}", standing.record(due, measured))
    difference = measured["difference"]
    record_property("native_qwen3.trn2.torchtitan_train_step1_loss", measured["step1_loss"])
    record_property("native_qwen3.trn2.torchtitan_train_minus_harness", difference)
    assert math.isfinite(measured["step1_loss"]), measured
    verdict = abs(difference) <= TITAN_ENTRY.value
    record_property(
        "native_qwen3.trn2.torchtitan_train_verdict",
        ("pass" if verdict else "FAIL")
        if TITAN_ENTRY.measured
        else f"unmeasured: {TITAN_ENTRY.reason}",
    )
    assert verdict or not TITAN_ENTRY.measured, difference

"""Tutorial config 1 (HF Transformers backend) at full size on a trn2.48xlarge: 6.54, 12.43, export round trip.

Every published number here is judged on config 1 *as published* (``harness.options.lanes``,
lane ``as_published``): torchtitan's test tokenizer and ``c4_test`` from the TorchTitan
checkout the tutorial ran in, upstream's RoPE init. The suite's corrected recipe is a
separate lane, held to the host reference (tests/neuron/test_reference_neuron.py), never
to 6.54. The runs are the night's shared lane runs (``harness.night.plan.LAUNCHES``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from lane_runs import lane_run
from requires import (
    requires_dataset,
    requires_neuron_device,
    requires_qwen3_4b_weights,
    requires_titan_assets,
    requires_torch_neuronx,
)

MODEL_DIR = Path(os.environ.get("QWEN3_4B_DIR", "QWEN3_4B_DIR-is-not-set"))

# The as-published lane reads the checkout's tests/assets/c4_test; only the export's corrected lane needs
# $QWEN3_DATASET_DIR.
pytestmark = [
    requires_neuron_device,
    requires_torch_neuronx,
    requires_qwen3_4b_weights,
    requires_titan_assets,
]


@pytest.mark.launch("config1-as_published")
def test_published_step1_loss_from_pretrained_weights(shared_dir, golden, record_property):
    run = lane_run("config1-as_published", shared_dir)
    record_property("hf_backend.trn2.as_published.provenance", run.result.get("provenance"))
    record_property("hf_backend.trn2.as_published.stopped", run.stopped)
    golden("hf_backend", "trn2", "step1_loss_hf", run.step1(), inputs=run.inputs)


@pytest.mark.launch("config1-as_published-random")
def test_published_step1_loss_from_random_init(shared_dir, golden):
    run = lane_run("config1-as_published-random", shared_dir)
    golden("hf_backend", "trn2", "step1_loss_random", run.step1(), inputs=run.inputs)


@pytest.mark.launch("config1-corrected")
@requires_dataset  # the corrected lane reads $QWEN3_DATASET_DIR
def test_export_round_trip(shared_dir, golden, record_property):
    """Config 1's export loads into transformers with only the tied head missing, under the source's config.

    Judged on the corrected lane, whose 20-step run exports every night: the as-published run stops at a
    non-finite loss before its export, and what corrected changes (the inv_freq buffer, tokenizer, text) is read
    by nothing the exported keys are (harness.night.plan.CLAIM_JUDGES says why)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from harness.rank.export import EXPORT_DIR_NAME

    run = lane_run("config1-corrected", shared_dir)
    run.finished("the export round trip")
    export = run.run_dir / EXPORT_DIR_NAME
    source = json.loads((MODEL_DIR / "config.json").read_text())
    source.pop("torch_dtype", None)
    assert json.loads((export / "config.json").read_text()) == {**source, "dtype": "bfloat16"}

    state = {}
    for path in sorted(export.glob("*.safetensors")):
        state.update(load_file(path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(export))
    result = model.load_state_dict(state, strict=False, assign=True)
    record_property("hf_backend.trn2.export_missing_keys", sorted(result.missing_keys))
    golden(
        "hf_backend", "trn2", "export_missing_keys", sorted(result.missing_keys), inputs=run.inputs
    )
    golden(
        "hf_backend",
        "trn2",
        "export_unexpected_keys",
        sorted(result.unexpected_keys),
        inputs=run.inputs,
    )
    assert all(torch.isfinite(tensor).all() for tensor in state.values())

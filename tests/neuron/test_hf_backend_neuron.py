"""Tutorial config 1 (HF Transformers backend) at full size on a trn2.48xlarge: 6.54, 12.43, export round trip."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from requires import requires_dataset, requires_neuron_device, requires_qwen3_4b_weights, requires_torch_neuronx

MODEL_DIR = Path(os.environ.get("QWEN3_4B_DIR", "QWEN3_4B_DIR-is-not-set"))
NPROC = 64

pytestmark = [requires_neuron_device, requires_torch_neuronx, requires_qwen3_4b_weights, requires_dataset]


@pytest.fixture(scope="module")
def trn2_hf_run(recipe_run, shared_dir):
    return recipe_run(
        "trn2-hf-backend-hf",
        recipe="hf_backend",
        tier="trn2",
        nproc=NPROC,
        steps=3,
        init="hf",
        model_dir=MODEL_DIR,
        export_dir=shared_dir / "trn2-hf-backend-export",
        seed=0,
    )


def test_published_step1_loss_from_pretrained_weights(trn2_hf_run, golden, record_property):
    record_property("hf_backend.trn2.provenance", trn2_hf_run["provenance"])
    golden("hf_backend", "trn2", "step1_loss_hf", trn2_hf_run["losses"][0])


def test_published_step1_loss_from_random_init(recipe_run, golden):
    run = recipe_run(
        "trn2-hf-backend-random", recipe="hf_backend", tier="trn2", nproc=NPROC, steps=1, init="random",
        model_dir=MODEL_DIR, seed=0, export=False,
    )  # fmt: skip
    golden("hf_backend", "trn2", "step1_loss_random", run["losses"][0])


def test_export_round_trip(trn2_hf_run, golden, record_property):
    """The export loads into transformers with only the tied head missing, under the source's config."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    export = Path(trn2_hf_run["export_dir"])
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
    golden("hf_backend", "trn2", "export_missing_keys", sorted(result.missing_keys))
    golden("hf_backend", "trn2", "export_unexpected_keys", sorted(result.unexpected_keys))
    assert all(torch.isfinite(tensor).all() for tensor in state.values())

"""Tutorial config 2 at full size on a trn2.48xlarge: the published 6.54 / 12.43 and the export round trip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from requires import requires_dataset, requires_neuron_device, requires_qwen3_4b_weights, requires_torch_neuronx

pytestmark = [requires_neuron_device, requires_torch_neuronx, requires_qwen3_4b_weights, requires_dataset]

MODEL_DIR = Path(os.environ.get("QWEN3_4B_DIR", "QWEN3_4B_DIR-is-not-set"))


@pytest.fixture(scope="module")
def trn2_hf_run(recipe_run, shared_dir):
    return recipe_run(
        "trn2-native-hf",
        recipe="native_qwen3",
        tier="trn2",
        nproc=64,
        steps=3,
        init="hf",
        model_dir=MODEL_DIR,
        export_dir=shared_dir / "trn2-native-export",
        seed=0,
        # The tutorial's model_registry("4B") uses RoPE theta 1e6; Instruct-2507's config.json
        # says 5e6. The published 6.54 comes from the tutorial's config, so reproduce that and
        # let provenance record the difference.
        allow_mismatch=["rope_theta"],
    )


def test_published_step1_loss_from_pretrained_weights(trn2_hf_run, golden, record_property):
    record_property("native_qwen3.trn2.provenance", trn2_hf_run["provenance"])
    golden("native_qwen3", "trn2", "step1_loss_hf", trn2_hf_run["losses"][0])


def test_published_step1_loss_from_random_init(recipe_run, golden):
    run = recipe_run(
        "trn2-native-random", recipe="native_qwen3", tier="trn2", nproc=64, steps=1, init="random",
        model_dir=MODEL_DIR, seed=0, export=False,
    )  # random init loads no weights, so there is no config.json to disagree with
    golden("native_qwen3", "trn2", "step1_loss_random", run["losses"][0])


def test_export_round_trip_keys(trn2_hf_run, golden):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    export = Path(trn2_hf_run["export_dir"])
    state = {}
    for path in sorted(export.glob("*.safetensors")):
        state.update(load_file(path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(export))
    result = model.load_state_dict(state, strict=False, assign=True)
    golden("native_qwen3", "trn2", "export_missing_keys", sorted(result.missing_keys))
    golden("native_qwen3", "trn2", "export_unexpected_keys", sorted(result.unexpected_keys))


def test_torchtitan_train_runs_config_2_with_the_harness_step1_loss(trn2_hf_run, tmp_path, record_property):
    """torchtitan's own entry on the recipe's config function (README): the harness's step-1 loss.

    Same config, weights and first batch; the tolerance allows bf16 reduction-order
    differences between two launches (not measured yet on trn2: record and tighten).
    """
    from benchmarks.common import run_titan_train

    steps = run_titan_train(
        "recipes.native_qwen3", "native_qwen3_trn2", 64, tmp_path, "--training.steps", "1", timeout_s=7200
    )
    assert [s.step for s in steps] == [1], steps
    record_property("torchtitan_train_trn2_step1_loss", steps[0].loss)
    assert abs(steps[0].loss - trn2_hf_run["losses"][0]) <= 1e-2

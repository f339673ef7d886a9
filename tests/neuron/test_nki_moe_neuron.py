"""Tutorial config 3 on a trn2.48xlarge: the shrunk 30B-A3B with NKI kernels, eager, 64 ranks."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.neuron


@pytest.mark.requires("device", "torch_neuronx", "nkilib", "dataset")
def test_nki_moe_trains_in_eager_mode_on_64_ranks(recipe_run, record_property):
    run = recipe_run("trn2-nki-moe", recipe="nki_moe", tier="trn2", nproc=64, steps=5, init="random", seed=0)
    losses = run["losses"]
    record_property("trn2_nki_moe_losses", losses)
    record_property("trn2_nki_moe_tokens_per_s", [s["tokens_per_s"] for s in run["steps"]])
    assert len(losses) == 5
    assert all(math.isfinite(x) for x in losses), losses

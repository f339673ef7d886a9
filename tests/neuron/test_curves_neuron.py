"""A 20-step trn2 loss curve of each recipe inside its band (issue 15).

trn2 runs are not bitwise repeatable (bf16, nondeterministic collectives and kernels), so
the curve is judged against a band: per step, mean ± max(k·std, floor) over N repeated
seeded runs, recorded with how it was made by ``python -m harness.band record RECIPE``
into ``fixtures/goldens/<recipe>/trn2-band.json`` (N, k, floor and the 20-step length are
stated and justified in harness/band.py). The run here is exactly the band's run
(``harness.band.band_options``).
"""

from __future__ import annotations

import pytest

from harness import band, goldens
from requires import (
    requires_dataset,
    requires_neuron_device,
    requires_nkilib,
    requires_qwen3_4b_weights,
    requires_torch_neuronx,
)

pytestmark = [requires_neuron_device, requires_torch_neuronx, requires_qwen3_4b_weights, requires_dataset]

RECIPES = ("native_qwen3", "hf_backend", pytest.param("nki_moe", marks=requires_nkilib))


@pytest.mark.parametrize("recipe", RECIPES)
def test_trn2_curve_stays_inside_its_band(recipe, recipe_run, golden, record_property):
    tier, key = band.band_tier("trn2"), band.band_key(band.BAND_STEPS)
    path = goldens.goldens_path(recipe, tier)
    _, values = goldens.load(recipe, tier) if path.exists() else ({}, {})
    if key not in values:
        pytest.fail(
            f"{path} has no {key!r}: record the band on a trn2.48xlarge with "
            f"`python -m harness.band record {recipe}` ({band.BAND_RUNS} runs of {band.BAND_STEPS} steps) and commit it",
            pytrace=False,
        )
    opts = band.band_options(recipe, "trn2", band.BAND_STEPS, seed=0)
    run = recipe_run(f"trn2-band-{recipe}", **{k: v for k, v in vars(opts).items() if k != "run_dir"})
    losses = run["losses"]
    g = values[key]
    record_property(f"{recipe}.trn2.band_distance", [abs(m - v) for m, v in zip(losses, g.value)])
    record_property(f"{recipe}.trn2.band_halfwidth", g.tolerance)
    golden(recipe, tier, key, losses)

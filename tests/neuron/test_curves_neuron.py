"""A 20-step trn2 loss curve of each recipe inside its band (issue 15).

trn2 runs are not bitwise repeatable (bf16, nondeterministic collectives and kernels), so
the curve is judged against a band: per step, mean ± max(k·std, floor) over N repeated
seeded runs, recorded with how it was made by ``python -m harness.judge.band record RECIPE``
into ``fixtures/goldens/<recipe>/trn2-band.json`` (N, k, floor and the 20-step length are
stated and justified in harness/judge/band.py). The curve is the recipe's band lane run of the
night (``harness.night.plan.BAND_LAUNCH``), the very run ``harness.judge.band.band_options`` repeats.

A band nobody has recorded yet judges nothing: the curve is "unmeasured" with
its values (``harness.judge.band.judge_curve``), and the test fails only when a recorded band
is left.
"""

from __future__ import annotations

import pytest
from lane_runs import lane_run
from requires import (
    requires_dataset,
    requires_neuron_device,
    requires_nkilib,
    requires_qwen3_4b_weights,
    requires_titan_assets,
    requires_torch_neuronx,
)

from harness.judge import band
from harness.night import plan as nightly

pytestmark = [requires_neuron_device, requires_torch_neuronx, requires_qwen3_4b_weights]

RECIPES = (
    pytest.param(
        "native_qwen3",
        marks=[requires_titan_assets, pytest.mark.launch(nightly.BAND_LAUNCH["native_qwen3"])],
    ),
    pytest.param(
        "hf_backend",
        marks=[requires_dataset, pytest.mark.launch(nightly.BAND_LAUNCH["hf_backend"])],
    ),
    pytest.param(
        "nki_moe",
        marks=[
            requires_nkilib,
            requires_titan_assets,
            pytest.mark.launch(nightly.BAND_LAUNCH["nki_moe"]),
        ],
    ),
)


@pytest.mark.parametrize("recipe", RECIPES)
def test_trn2_curve_stays_inside_its_band(recipe, shared_dir, record_property):
    run = lane_run(nightly.BAND_LAUNCH[recipe], shared_dir)
    run.finished("the band check")
    losses = run.losses
    verdict = band.judge_curve(recipe, "trn2", losses)
    tier, key = band.band_tier("trn2"), band.band_key(len(losses))
    record_property(f"{recipe}.{tier}.{key}", losses)
    record_property(f"{recipe}.{tier}.{key}.verdict", verdict.kind)
    if verdict.golden.value:
        record_property(
            f"{recipe}.trn2.band_distance",
            [abs(m - v) for m, v in zip(losses, verdict.golden.value)],
        )
        record_property(f"{recipe}.trn2.band_halfwidth", verdict.golden.tolerance)
    assert verdict.passed is not False, verdict.message()

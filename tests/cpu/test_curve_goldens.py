"""Curves in the goldens files: a list value is judged step by step, in every lane that holds one.

No launches: the rules of harness.judge.goldens on made-up curves (the real curves are
asserted in tests/cpu/test_curves.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.judge import goldens, verdicts

CURVE = [2.0, 1.5, 1.25, 1.0]
EXACT = {
    "value": CURVE,
    "tolerance": 0.0,
    "lane": "exact",
    "reason": "deterministic",
    "portable_rtol": 1e-5,
}
BAND = {
    "value": CURVE,
    "tolerance": [0.1, 0.1, 0.2, 0.2],
    "lane": "band",
    "reason": "repeated runs",
    "band": {
        "n": 2,
        "k": 3.0,
        "min_halfwidth": 0.1,
        "std": [0.0, 0.0, 0.05, 0.05],
        "runs": [CURVE, CURVE],
        "command": "python -m harness.judge.band ...",
        "environment": {"versions": {"torch": "x"}},
    },
}


def write(path: Path, values: dict, metadata: dict | None = None) -> Path:
    path.write_text(json.dumps({"metadata": metadata or {}, "values": values}))
    return path


def load_one(tmp_path, entry) -> goldens.Golden:
    return goldens.load("r", "t", write(tmp_path / "g.json", {"curve": entry}))[1]["curve"]


def env() -> dict:
    return goldens.environment_metadata()


def other_cpu() -> dict:
    here = env()
    return {**here, "cpu": {**here["cpu"], "cpu_model": "Some Other CPU"}}


def test_an_exact_curve_is_bitwise_here_and_within_its_portable_rtol_per_step_elsewhere(tmp_path):
    g = load_one(tmp_path, EXACT)
    assert g.portable_rtol == 1e-5
    values = {"curve": g}
    assert verdicts.compare("curve", list(CURVE), values, env(), env()).kind == "pass"
    nudged = [CURVE[0], CURVE[1] * (1 + 5e-6), CURVE[2], CURVE[3]]
    assert verdicts.compare("curve", nudged, values, env(), env()).kind == "regression"
    assert (
        verdicts.compare("curve", nudged, values, other_cpu(), env()).kind
        == "pass, other environment"
    )
    # Per element: 5e-6 of step 2's value is within 1e-5 of it, 2e-5 of step 4's is not,
    # even though it is within 1e-5 of the curve's largest value.
    far = [CURVE[0], CURVE[1], CURVE[2], CURVE[3] * (1 + 2e-5)]
    stale = verdicts.compare("curve", far, values, other_cpu(), env())
    assert (stale.kind, stale.passed) == ("stale golden", False)
    assert (
        "1 of 4 steps outside; first at step 4" in stale.message()
        and "make goldens ACCEPT=1" in stale.message()
    )


def test_an_exact_curve_without_its_own_rtol_gets_the_suite_wide_one(tmp_path):
    g = load_one(tmp_path, {k: v for k, v in EXACT.items() if k != "portable_rtol"})
    assert g.portable_rtol is None and verdicts.portable_rtol(g) == goldens.PORTABLE_RTOL
    nudged = [CURVE[0] * (1 + 5e-6), *CURVE[1:]]
    assert (
        verdicts.compare("curve", nudged, {"curve": g}, other_cpu(), env()).kind == "stale golden"
    )


@pytest.mark.parametrize(
    "measured, fragment",
    [
        (CURVE[:3], "measured 3 steps, golden 4 steps"),
        ([*CURVE[:3], float("nan")], "1 of 4 steps outside; first at step 4"),
        ([*CURVE, 0.5], "measured 5 steps"),
    ],
)
def test_a_curve_of_another_length_or_with_nan_never_passes(tmp_path, measured, fragment):
    values = {"curve": load_one(tmp_path, EXACT)}
    verdict = verdicts.compare("curve", measured, values, other_cpu(), env())
    assert not verdict.passed and fragment in verdict.message()


def test_a_band_holds_each_step_to_its_own_half_width(tmp_path):
    g = load_one(tmp_path, BAND)
    values = {"curve": g}
    here = g.band["environment"]
    inside = [2.09, 1.41, 1.44, 0.81]
    assert verdicts.compare("curve", inside, values, {}, here).kind == "pass"
    outside = [2.0, 1.5, 1.25, 0.79]  # step 4 is 0.21 below a ±0.2 band
    verdict = verdicts.compare("curve", outside, values, {}, here)
    assert verdict.kind == "regression" and "first at step 4" in verdict.message()
    assert (
        verdicts.compare("curve", outside, values, {}, {"versions": {"torch": "y"}}).kind
        == "stale golden"
    )


@pytest.mark.parametrize(
    "entry, message",
    [
        ({**EXACT, "value": [1.0, float("nan")]}, "not finite"),
        ({**EXACT, "portable_rtol": -1}, "portable_rtol -1"),
        ({**EXACT, "portable_rtol": float("inf")}, "portable_rtol inf"),
        ({**BAND, "portable_rtol": 1e-5}, "only exact values have a 'portable_rtol'"),
        ({**EXACT, "band": BAND["band"]}, "only lane 'band' has a 'band' record"),
        ({**BAND, "tolerance": 0.1}, "one finite half-width ≥ 0 per step (4)"),
        ({**BAND, "tolerance": [0.1, 0.1, 0.1]}, "one finite half-width ≥ 0 per step (4)"),
        ({**BAND, "tolerance": [0.1, 0.1, 0.1, -0.1]}, "one finite half-width ≥ 0 per step (4)"),
        ({**BAND, "value": 1.5}, "'value' must be the per-step means"),
        ({k: v for k, v in BAND.items() if k != "band"}, "a band without how it was made"),
        ({**BAND, "band": {**BAND["band"], "n": 1, "runs": [CURVE]}}, "band n=1 must be ≥ 2"),
        ({**BAND, "band": {**BAND["band"], "n": 3}}, "count its runs (2)"),
        ({**BAND, "claim": "step1_loss_hf"}, "is a band entry and cannot name a claim"),
    ],
)
def test_loader_rejects_untrustworthy_curves_and_bands(tmp_path, entry, message):
    with pytest.raises(goldens.GoldenError) as error:
        load_one(tmp_path, entry)
    assert message in str(error.value)


def test_make_goldens_lists_a_changed_curve_by_steps_and_keeps_its_portable_rtol(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(goldens, "GOLDENS_DIR", tmp_path)
    (tmp_path / "r").mkdir()
    write(tmp_path / "r" / "t.json", {"curve": EXACT, "band": BAND})
    new_curve = [2.0, 1.5, 1.25 + 3e-7, 1.0 + 1e-6]
    proposals = [
        {"recipe": "r", "tier": "t", "key": "curve", "value": new_curve, "reason": ""},
        {
            "recipe": "r",
            "tier": "t",
            "key": "fresh",
            "value": [3.0] * 100,
            "reason": "new",
            "portable_rtol": 2e-2,
        },
    ]
    changes = goldens.proposed_changes(proposals)
    assert goldens.format_changes(changes, 2).splitlines() == [
        "goldens: 2 exact value(s) measured, 2 would change",
        "  changed  r/t curve: [2.0, 1.5, 1.25, 1.0] → [2.0, 1.5, 1.2500003, 1.000001]"
        "  (2 of 4 steps differ, from step 3; max |Δ| 1e-06)",
        "  new      r/t fresh = [100 steps: 3.0, 3.0, …, 3.0]  (portable_rtol None → 0.02)",
    ]
    goldens.apply_changes(changes)
    _, values = goldens.load("r", "t")
    assert values["curve"].value == new_curve and values["curve"].portable_rtol == 1e-5  # kept
    assert (
        values["fresh"].portable_rtol == 2e-2 and values["band"].lane == "band"
    )  # the band untouched
    with pytest.raises(goldens.GoldenError, match="only `python -m harness.judge.band` writes it"):
        goldens.update_exact("r", "t", {"band": CURVE}, {"band": "x"})


def test_a_changed_portable_rtol_alone_is_a_change_to_record(tmp_path, monkeypatch):
    monkeypatch.setattr(goldens, "GOLDENS_DIR", tmp_path)
    (tmp_path / "r").mkdir()
    write(tmp_path / "r" / "t.json", {"curve": EXACT})
    proposals = [
        {
            "recipe": "r",
            "tier": "t",
            "key": "curve",
            "value": CURVE,
            "reason": "",
            "portable_rtol": 3e-5,
        }
    ]
    (change,) = goldens.proposed_changes(proposals)
    assert change.line() == "  changed  r/t curve: value unchanged  (portable_rtol 1e-05 → 3e-05)"
    same = [{**proposals[0], "portable_rtol": 1e-5}]
    assert goldens.proposed_changes(same) == []

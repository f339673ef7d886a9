"""``python -m harness.judge.band``: the trn2 curve band's statistics and files, on synthetic runs.

The band is made on trn2 from N repeated 64-rank runs; here its logic runs on made-up
curves (and a fake launcher), so a wrong mean, std, floor or file is caught on every push.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.judge import band, goldens, verdicts

RUNS = [
    [6.50, 6.40, 6.30],
    [6.52, 6.40, 6.33],
    [6.54, 6.40, 6.36],
]


def fake_run(run_dir: Path, losses: list[float], **options) -> Path:
    """A finished run directory as harness.launch.lifecycle leaves it: steps.jsonl and run.json."""
    run_dir.mkdir(parents=True)
    (run_dir / "steps.jsonl").write_text(
        "".join(json.dumps({"step": i + 1, "loss": x}) + "\n" for i, x in enumerate(losses))
    )
    opts = {
        "recipe": "native_qwen3",
        "tier": "trn2",
        "steps": len(losses),
        "seed": 0,
        "run_dir": str(run_dir),
        **options,
    }
    (run_dir / "run.json").write_text(json.dumps(opts))
    return run_dir


@pytest.fixture
def goldens_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(goldens, "GOLDENS_DIR", tmp_path / "goldens")
    return tmp_path / "goldens"


def test_mean_std_and_half_width_per_step():
    stats = band.compute_band(RUNS, k=4.0, min_halfwidth=0.005)
    assert stats["mean"] == pytest.approx([6.52, 6.40, 6.33])
    assert stats["std"] == pytest.approx([0.02, 0.0, 0.03])  # sample std (n - 1)
    # step 2: all runs agree, so the floor holds the band open
    assert stats["halfwidth"] == pytest.approx([0.08, 0.005, 0.12])


@pytest.mark.parametrize(
    "runs, k, floor, message",
    [
        ([[1.0, 2.0]], 4.0, 0.005, "at least 2 runs"),
        ([[1.0, 2.0], [1.0]], 4.0, 0.005, "same number of steps"),
        ([[], []], 4.0, 0.005, "same number of steps"),
        ([[1.0, math.nan], [1.0, 2.0]], 4.0, 0.005, "run 0 has a non-finite loss"),
        ([[1.0, 2.0], [1.0, math.inf]], 4.0, 0.005, "run 1 has a non-finite loss"),
        ([[1.0, 2.0], [1.0, 2.0]], 0.0, 0.005, "k must be > 0"),
        ([[1.0, 2.0], [1.0, 2.0]], 4.0, -1.0, "the floor ≥ 0"),
    ],
)
def test_a_band_is_refused_from_runs_it_cannot_be_made_of(runs, k, floor, message):
    with pytest.raises(band.BandError, match=message):
        band.compute_band(runs, k, floor)


def test_the_stated_false_alarm_rate_is_students_t():
    assert band.t_tail(2.776445, 4) == pytest.approx(0.05, abs=1e-6)  # t_{0.975, 4}
    assert band.t_tail(12.7062, 1) == pytest.approx(0.05, abs=1e-5)
    assert band.t_tail(1.959964, 10**6) == pytest.approx(0.05, abs=1e-5)  # the normal limit
    # The defaults the module docstring states: N = 5, k = 4 -> 2.2 % per step; k = 3 -> 5.2 %.
    assert (band.BAND_RUNS, band.BAND_K) == (5, 4.0)
    assert band.false_alarm_per_step(5, 4.0) == pytest.approx(0.0217, abs=5e-4)
    assert band.false_alarm_per_step(5, 3.0) == pytest.approx(0.052, abs=5e-4)


def test_compute_writes_a_band_the_goldens_loader_takes_and_judges(tmp_path, goldens_dir, capsys):
    dirs = [fake_run(tmp_path / f"run{i}", r) for i, r in enumerate(RUNS)]
    assert band.main(["compute", "native_qwen3", "--tier", "trn2", *map(str, dirs)]) == 0
    path = goldens_dir / "native_qwen3" / "trn2-band.json"
    assert str(path) in capsys.readouterr().out
    _, values = goldens.load("native_qwen3", band.band_tier("trn2"))
    g = values["loss_curve_3"]
    assert g.lane == "band" and g.value == pytest.approx([6.52, 6.40, 6.33])
    assert g.tolerance == pytest.approx([0.08, 0.005, 0.12])
    made = g.band
    assert (made["n"], made["k"], made["min_halfwidth"], made["runs"]) == (3, 4.0, 0.005, RUNS)
    assert made["command"].startswith("python -m harness.judge.band compute native_qwen3")
    assert made["options"] == {"recipe": "native_qwen3", "tier": "trn2", "steps": 3, "seed": 0}
    assert made["environment"] == goldens.environment_metadata()
    assert "over 3 repeated runs" in g.reason and "the floor set 1 of 3 steps" in g.reason
    here = made["environment"]
    assert verdicts.compare("loss_curve_3", [6.59, 6.404, 6.22], values, {}, here).kind == "pass"
    low = verdicts.compare(
        "loss_curve_3", [6.52, 6.394, 6.33], values, {}, here
    )  # step 2: 0.006 > 0.005
    assert low.kind == "regression" and "first at step 2" in low.message()
    elsewhere = {**here, "versions": {**here["versions"], "torch-neuronx": "9.9"}}
    assert (
        verdicts.compare("loss_curve_3", [6.52, 6.394, 6.33], values, {}, elsewhere).kind
        == "stale golden"
    )


def test_a_second_band_keeps_the_first_and_bad_runs_write_nothing(tmp_path, goldens_dir, capsys):
    three = [fake_run(tmp_path / f"a{i}", r) for i, r in enumerate(RUNS)]
    five = [fake_run(tmp_path / f"b{i}", [*r, 6.2, 6.1]) for i, r in enumerate(RUNS)]
    assert band.main(["compute", "native_qwen3", *map(str, three)]) == 0
    assert band.main(["compute", "native_qwen3", *map(str, five)]) == 0
    _, values = goldens.load("native_qwen3", "trn2-band")
    assert set(values) == {"loss_curve_3", "loss_curve_5"}
    before = (goldens_dir / "native_qwen3" / "trn2-band.json").read_text()
    mixed = [three[0], five[1]]
    assert band.main(["compute", "native_qwen3", *map(str, mixed)]) == 2
    assert "same number of steps" in capsys.readouterr().err
    other = fake_run(tmp_path / "moe", RUNS[0], recipe="nki_moe")
    assert band.main(["compute", "native_qwen3", str(three[0]), str(other)]) == 2
    assert "not only 'native_qwen3'" in capsys.readouterr().err
    assert band.main(["compute", "native_qwen3", str(tmp_path / "nothing")]) == 2
    assert "not a finished run directory" in capsys.readouterr().err
    assert (goldens_dir / "native_qwen3" / "trn2-band.json").read_text() == before


def test_record_launches_n_runs_of_the_band_options_then_writes_their_band(tmp_path, goldens_dir):
    launched = []

    def launch(opts):
        curve = RUNS[len(launched) % len(RUNS)]
        launched.append(opts)
        fake = json.loads(opts.to_json())
        opts.run_dir.mkdir(parents=True)
        (opts.run_dir / "steps.jsonl").write_text(
            "".join(json.dumps({"loss": x}) + "\n" for x in curve)
        )
        (opts.run_dir / "run.json").write_text(json.dumps(fake))
        return SimpleNamespace(losses=curve)

    dirs = band.record("native_qwen3", "cpu", 3, 3, [0, 1], tmp_path / "work", launch=launch)
    assert [o.seed for o in launched] == [0, 1, 0]  # seeds cycle over the runs
    assert all(o.steps == 3 and o.nproc == 2 and o.init == "hf" and not o.export for o in launched)
    path = band.make_band(
        "native_qwen3", "cpu", dirs, 4.0, 0.005, "python -m harness.judge.band record native_qwen3"
    )
    g = goldens.load("native_qwen3", "cpu-band", path)[1]["loss_curve_3"]
    assert g.band["seeds"] == [0, 1, 0] and g.band["options"]["recipe"] == "native_qwen3"
    assert (
        "seed" not in g.band["options"]
    )  # it differs between the runs, so it is not a shared option


def test_band_options_are_the_nightlys_band_lane_runs():
    """On trn2 the band is made of, and judges, the night's lane run of each recipe (harness.night.plan.BAND_LAUNCH)."""
    from harness.night import plan as nightly

    native, backend, moe = (
        band.band_options(r, "trn2") for r in ("native_qwen3", "hf_backend", "nki_moe")
    )
    assert (native.nproc, native.steps, native.init, native.export) == (
        64,
        band.BAND_STEPS,
        "hf",
        False,
    )
    assert native.allow_mismatch == [
        "rope_theta"
    ]  # the tutorial's model_registry("4B") theta: as published
    assert str(native.dataset_dir).endswith(
        "tests/assets/c4_test"
    )  # the checkout's, as the tutorial read it
    assert (backend.init, backend.allow_mismatch, backend.dataset_dir) == (
        "hf",
        [],
        None,
    )  # corrected: $QWEN3_DATASET_DIR
    assert (moe.init, moe.allow_mismatch) == ("random", [])
    for recipe, opts in (("native_qwen3", native), ("hf_backend", backend), ("nki_moe", moe)):
        launch = nightly.LAUNCHES[nightly.BAND_LAUNCH[recipe]]
        assert launch.steps == band.BAND_STEPS and "band" in launch.serves
        assert opts == dataclasses.replace(launch.options(), export=False)


def test_a_band_never_recorded_is_recorded_not_judged_with_the_values(goldens_dir):
    """Issue 25 point 7: no band yet judges nothing; the curve is kept with its verdict, never red."""
    curve = [6.5, 6.4, 6.3]
    verdict = band.judge_curve("native_qwen3", "trn2", curve)
    assert (verdict.kind, verdict.passed, verdict.measured) == (goldens.NOT_JUDGED, None, curve)
    assert "python -m harness.judge.band record native_qwen3" in verdict.message()
    assert "unmeasured: loss_curve_3 measured [6.5, 6.4, 6.3]" in verdict.message()


def test_a_recorded_band_that_the_curve_leaves_fails(tmp_path, goldens_dir):
    dirs = [fake_run(tmp_path / f"run{i}", r) for i, r in enumerate(RUNS)]
    assert band.main(["compute", "native_qwen3", "--tier", "trn2", *map(str, dirs)]) == 0
    here = goldens.environment_metadata()
    inside = band.judge_curve("native_qwen3", "trn2", [6.52, 6.40, 6.33], here)
    left = band.judge_curve("native_qwen3", "trn2", [6.52, 6.50, 6.33], here)
    assert (inside.kind, inside.passed) == ("pass", True)
    assert (left.kind, left.passed) == ("regression", False) and "first at step 2" in left.message()
    # another length has no band of its own yet: unmeasured
    assert band.judge_curve("native_qwen3", "trn2", [6.5, 6.4], here).kind == goldens.NOT_JUDGED


def test_a_curve_trains_only_when_it_falls_by_more_than_its_noise():
    """``trains`` tests assert a fall beyond the run's measured noise, not a finite loss."""
    import random

    rng = random.Random(0)
    falling = [12.4 - 0.02 * i + rng.gauss(0, 0.01) for i in range(20)]
    flat = [12.4 + rng.gauss(0, 0.01) for _ in range(20)]
    rising = list(reversed(falling))
    assert band.loss_fall(falling)["trains"] and band.loss_fall(falling)["fall"] == pytest.approx(
        0.38, abs=0.03
    )
    assert not band.loss_fall(flat)["trains"]
    assert not band.loss_fall(rising)["trains"]
    assert not band.loss_fall([12.4, math.nan, 12.0])["trains"]
    tiny_fall_big_noise = [12.4 - 0.001 * i + (0.2 if i % 2 else -0.2) for i in range(20)]
    fall = band.loss_fall(tiny_fall_big_noise)
    assert not fall["trains"] and fall["noise"] > 0.1 and abs(fall["fall"]) < 3 * fall["se"]

"""Verdicts that are neither pass nor fail, and the nightly guards over them (issue 24 points 10-11, issue 25 point 6).

* a golden keyed by its inputs is "unmeasured" until a night's input key is
  recorded, then "inputs differ from the recorded run" whenever a night reads other bytes;
* an unmeasured tolerance is "unmeasured";
* ``harness.night.ci require-claims`` fails for a published claim left either way, and
  ``record-inputs`` writes the first night's keys;
* ``harness.night.ci require-ran`` does not count a test that failed in setup.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import provenance
from harness.judge import goldens, verdicts
from harness.night import ci
from harness.options.run_options import RunOptions
from recipes.tiers import FIXTURES, REPO_ROOT

KEY = {
    "weights": {"model.safetensors": "a" * 64},
    "config.json": {"config.json": "b" * 64},
    "tokenizer": {"tokenizer.json": "c" * 64},
    "dataset": {"data.json": "d" * 64},
    "allow_mismatch": ["tokenizer"],
    "kept_defects": ["inv_freq"],
}


@pytest.fixture
def trn2_goldens(tmp_path, monkeypatch) -> Path:
    """A copy of the shipped goldens, so recording writes nowhere real."""
    root = tmp_path / "goldens"
    shutil.copytree(goldens.GOLDENS_DIR, root)
    # As after the night that measures the trn2 random-init spread: only the inputs then decide.
    path = root / "hf_backend" / "trn2.json"
    data = json.loads(path.read_text())
    del data["values"]["step1_loss_random"]["unmeasured"]
    path.write_text(json.dumps(data))
    monkeypatch.setattr(goldens, "GOLDENS_DIR", root)
    return root


def test_the_trn2_random_init_tolerance_is_unmeasured_until_a_night_measures_its_spread():
    for recipe in ("native_qwen3", "hf_backend"):
        golden = values(recipe)["step1_loss_random"]
        assert golden.tolerance == 0.03 and "not measured" in golden.unmeasured, golden
        verdict = verdicts.compare("step1_loss_random", 12.43, values(recipe), {}, inputs=KEY)
        assert verdict.kind == goldens.NOT_JUDGED and golden.unmeasured in verdict.message()


def values(recipe: str = "hf_backend"):
    return goldens.load(recipe, "trn2")[1]


def test_a_golden_keyed_by_inputs_is_recorded_not_judged_until_its_inputs_are_recorded(
    trn2_goldens,
):
    found = values()
    golden = found["step1_loss_random"]
    assert golden.keyed_by_inputs and golden.inputs is None and not golden.unmeasured
    verdict = verdicts.compare("step1_loss_random", 12.44, found, {}, inputs=KEY)
    assert (verdict.kind, verdict.passed) == (goldens.NOT_JUDGED, None)
    assert (
        verdict.message().startswith("unmeasured: ")
        and "no night's inputs are recorded for it yet" in verdict.message()
    )


def test_recorded_inputs_judge_the_same_inputs_and_refuse_to_judge_others(trn2_goldens):
    path = trn2_goldens / "hf_backend" / "trn2.json"
    data = json.loads(path.read_text())
    data["values"]["step1_loss_random"]["inputs"] = KEY
    path.write_text(json.dumps(data))
    found = values()
    assert verdicts.compare("step1_loss_random", 12.44, found, {}, inputs=KEY).kind == "pass"
    assert verdicts.compare("step1_loss_random", 11.0, found, {}, inputs=KEY).kind == "regression"
    other = {**KEY, "dataset": {"data.json": "e" * 64}, "kept_defects": []}
    verdict = verdicts.compare("step1_loss_random", 11.0, found, {}, inputs=other)
    assert (verdict.kind, verdict.passed) == (goldens.INPUTS_DIFFER, None)
    assert verdict.differs == ("dataset.data.json", "kept_defects")
    assert verdict.message().startswith(
        "inputs differ from the recorded run (dataset.data.json, kept_defects)"
    )


def test_an_unmeasured_tolerance_is_recorded_not_judged_even_on_recorded_inputs(trn2_goldens):
    path = trn2_goldens / "native_qwen3" / "trn2.json"
    data = json.loads(path.read_text())
    data["values"]["step1_loss_hf"]["inputs"] = KEY
    path.write_text(json.dumps(data))
    found = values("native_qwen3")
    assert found["step1_loss_hf"].unmeasured
    verdict = verdicts.compare("step1_loss_hf", 6.54, found, {}, inputs=KEY)
    assert (verdict.kind, verdict.passed) == (goldens.NOT_JUDGED, None)
    assert "python -m harness.judge.band record" in verdict.message()


@pytest.mark.parametrize(
    "bad, message", [({"inputs": 3}, "inputs must be null"), ({"unmeasured": "?"}, "must say why")]
)
def test_malformed_inputs_or_unmeasured_fields_are_refused(tmp_path, bad, message):
    path = tmp_path / "trn2.json"
    entry = {
        "claim": "step1_loss_hf",
        "tolerance": 0.02,
        "lane": "published",
        "reason": "r" * 30,
        **bad,
    }
    path.write_text(json.dumps({"values": {"step1_loss_hf": entry}}))
    with pytest.raises(goldens.GoldenError, match=message):
        goldens.load("hf_backend", "trn2", path)


# --- require-claims and record-inputs ------------------------------------------------------------------


def judged(
    name: str,
    verdict: str,
    measured=6.54,
    inputs=None,
    outcome: str = "passed",
    phase: str = "call",
) -> dict:
    props = {
        name: measured,
        f"{name}.verdict": verdict,
        **({f"{name}.inputs": inputs} if inputs else {}),
    }
    return {
        "test": f"tests/neuron/test_x.py::m[{name}]",
        "outcome": outcome,
        "phase": phase,
        "properties": props,
    }


def report(tmp_path: Path, tests: list[dict]) -> Path:
    path = tmp_path / "tests.json"
    path.write_text(json.dumps({"versions": {}, "goldens": [], "tests": tests}))
    return path


def test_require_claims_fails_for_a_claim_measured_but_not_judged(tmp_path, capsys):
    names = [c.name for c in ci.published_claims("trn2")]
    unjudged = {
        "hf_backend.trn2.step1_loss_hf": goldens.NOT_JUDGED,
        "native_qwen3.trn2.step1_loss_hf": goldens.INPUTS_DIFFER,
    }
    path = report(tmp_path, [judged(n, unjudged.get(n, "pass")) for n in names])
    assert ci.require_claims(path, "trn2") == 1
    err = capsys.readouterr().err
    assert f"2 of {len(names)} published trn2 claims were measured but not judged" in err
    assert (
        "UNMEASURED    hf_backend.trn2.step1_loss_hf (published 6.54): measured 6.54, unmeasured: "
        in err
    )
    assert (
        "INPUTS DIFFER native_qwen3.trn2.step1_loss_hf (published 6.54): measured 6.54, inputs differ"
        in err
    )
    assert "NOT MEASURED" not in err


def test_record_inputs_writes_first_night_keys_only_and_replace_overwrites(
    tmp_path, trn2_goldens, capsys
):
    other = {**KEY, "weights": {"model.safetensors": "f" * 64}}
    path = report(
        tmp_path,
        [
            judged("hf_backend.trn2.step1_loss_hf", goldens.NOT_JUDGED, inputs=KEY),
            judged(
                "hf_backend.trn2.step1_loss_random",
                goldens.NOT_JUDGED,
                inputs=KEY,
                outcome="failed",
                phase="setup",
            ),
            judged(
                "nki_moe.trn2.rope_q_max_abs_diff", "pass", 0.0, inputs=KEY
            ),  # not keyed by inputs: never written
        ],
    )
    assert ci.record_inputs(path, goldens_dir=trn2_goldens) == 0
    assert "recorded the inputs of step1_loss_hf in" in capsys.readouterr().out
    found = values()
    assert (
        found["step1_loss_hf"].inputs == KEY and found["step1_loss_random"].inputs is None
    )  # setup failure: nothing
    assert not values("nki_moe")["rope_q_max_abs_diff"].keyed_by_inputs
    again = report(
        tmp_path, [judged("hf_backend.trn2.step1_loss_hf", goldens.INPUTS_DIFFER, inputs=other)]
    )
    ci.record_inputs(again, goldens_dir=trn2_goldens)
    assert values()["step1_loss_hf"].inputs == KEY  # a recorded key stays
    ci.record_inputs(again, replace=True, goldens_dir=trn2_goldens)
    assert values()["step1_loss_hf"].inputs == other


# --- require-ran: a setup failure ran nothing (issue 25 point 6) ---------------------------------------


def require_ran(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.night.ci", "require-ran", str(path), "--marker", "neuron"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )


def test_require_ran_does_not_count_tests_that_failed_in_setup(tmp_path):
    tests = [
        {
            "test": "tests/neuron/test_a.py::t1",
            "outcome": "failed",
            "phase": "setup",
            "properties": {},
        },
        {
            "test": "tests/neuron/test_a.py::t2",
            "outcome": "skipped",
            "phase": "setup",
            "properties": {"skip_reason": "no Neuron device"},
        },
    ]
    out = require_ran(report(tmp_path, tests))
    assert out.returncode == 1, out.stdout
    assert "0 of 2 neuron tests actually ran (1 failed in setup, the rest skipped)" in out.stderr
    tests.append(
        {
            "test": "tests/neuron/test_a.py::t3",
            "outcome": "failed",
            "phase": "call",
            "properties": {},
        }
    )
    out = require_ran(report(tmp_path, tests))
    assert out.returncode == 0 and "1 of 3 neuron tests ran" in out.stdout


def test_a_verdict_recorded_by_a_test_that_failed_in_setup_is_not_measured(tmp_path, capsys):
    names = [c.name for c in ci.published_claims("trn2")]
    broken = "native_qwen3.trn2.step1_loss_random"
    tests = [
        judged(
            n,
            "pass",
            outcome="failed" if n == broken else "passed",
            phase="setup" if n == broken else "call",
        )
        for n in names
    ]
    assert ci.require_claims(report(tmp_path, tests), "trn2") == 1
    assert f"NOT MEASURED  {broken}" in capsys.readouterr().err


# --- the input key: sha256 of every file a run reads ---------------------------------------------------


def test_input_key_hashes_every_weights_config_tokenizer_and_dataset_file(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "DIGEST_CACHE", tmp_path / "cache.json")
    model = tmp_path / "model"
    shutil.copytree(FIXTURES / "qwen3-tiny", model)
    opts = RunOptions(
        recipe="hf_backend",
        init="hf",
        model_dir=model,
        tokenizer_dir=model,
        dataset_dir=FIXTURES / "corpus",
        allow_mismatch=["rope_theta"],
    ).resolved()
    key = provenance.input_key(opts, ["inv_freq"])
    sha = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert key["weights"] == {"model.safetensors": sha(model / "model.safetensors")}
    assert key["config.json"] == {"config.json": sha(model / "config.json")}
    assert key["tokenizer"] == {
        n: sha(model / n) for n in ("tokenizer.json", "tokenizer_config.json")
    }
    assert key["dataset"] == {"train.jsonl": sha(FIXTURES / "corpus" / "train.jsonl")}
    assert (key["allow_mismatch"], key["kept_defects"]) == (["rope_theta"], ["inv_freq"])
    assert json.loads((tmp_path / "cache.json").read_text())  # digests kept for the next launch
    (model / "config.json").write_text((model / "config.json").read_text() + " ")
    changed = provenance.input_key(opts, ["inv_freq"])
    assert verdicts.input_differences(key, changed) == ("config.json.config.json",)
    random_init = provenance.input_key(
        RunOptions(init="random", dataset_dir=FIXTURES / "corpus").resolved()
    )
    assert random_init["weights"] == {} and random_init["config.json"] == {}


# --- what cannot fail yet ---------------------------------------------------------------------------------


def test_every_trn2_check_that_cannot_fail_yet_is_listed_with_why():
    """Published goldens with no recorded inputs or an unmeasured tolerance, unrecorded bands, the trn2
    reference tolerance and the torchtitan-entry allowance: each named, each with why."""
    from harness.judge import unmeasured
    from harness.night.plan import BAND_LAUNCH

    found = {u.check: u.why for u in unmeasured.cannot_fail_yet("trn2")}
    assert all(len(why) > 40 for why in found.values()), found
    can_wait = {
        c.name
        for c in ci.published_claims("trn2")
        if (g := values(c.recipe)[c.key]).unmeasured or (g.keyed_by_inputs and g.inputs is None)
    }
    assert len(can_wait) == 8 and can_wait <= set(found), (
        can_wait
    )  # the rope diffs (0.0, exact) can fail tonight
    assert "nki_moe.trn2.rope_q_max_abs_diff" not in found
    assert {f"{r}.trn2-band.loss_curve_20" for r in BAND_LAUNCH} <= set(found)
    assert any(c.startswith("reference.trn2 ") for c in found)
    assert any(c.startswith("native_qwen3.trn2.torchtitan_train_minus_harness ") for c in found)
    assert "not measured" in found["native_qwen3.trn2.step1_loss_random"]


def test_a_recorded_band_and_a_measured_golden_leave_the_list(trn2_goldens):
    """The list follows the goldens: what a night records or measures can fail, and is no longer listed."""
    from harness.judge import unmeasured

    before = {u.check for u in unmeasured.cannot_fail_yet("trn2")}
    path = trn2_goldens / "hf_backend" / "trn2.json"
    data = json.loads(path.read_text())
    data["values"]["step1_loss_random"]["inputs"] = (
        KEY  # the fixture already dropped its `unmeasured`
    )
    path.write_text(json.dumps(data))
    band = {
        "value": [2.0] * 20,
        "tolerance": [0.1] * 20,
        "lane": "band",
        "reason": "r" * 30,
        "band": {
            "n": 5,
            "k": 4,
            "min_halfwidth": 0.01,
            "std": [0.01] * 20,
            "runs": [[2.0] * 20] * 5,
            "command": "python -m harness.judge.band record hf_backend",
            "environment": {},
        },
    }
    (trn2_goldens / "hf_backend" / "trn2-band.json").write_text(
        json.dumps({"values": {"loss_curve_20": band}})
    )
    after = {u.check for u in unmeasured.cannot_fail_yet("trn2")}
    assert before - after == {
        "hf_backend.trn2.step1_loss_random",
        "hf_backend.trn2-band.loss_curve_20",
    }


def test_require_claims_and_the_night_report_list_what_cannot_fail_yet(tmp_path, capsys):
    from harness.judge import unmeasured
    from harness.pytest_plugins import report as pytest_report

    names = [c.name for c in ci.published_claims("trn2")]
    ci.require_claims(report(tmp_path, [judged(n, "pass") for n in names]), "trn2")
    heading = unmeasured.lines("trn2")[0]
    assert heading.startswith("### ") and "cannot fail yet" in heading
    assert heading in capsys.readouterr().out
    night = pytest_report.markdown([judged(names[0], "pass") | {"duration_s": 1.0}], [])
    assert heading in night
    day = pytest_report.markdown(
        [
            {
                "test": "tests/cpu/test_x.py::t",
                "outcome": "passed",
                "duration_s": 1.0,
                "properties": {},
            }
        ],
        [],
    )
    assert heading not in day

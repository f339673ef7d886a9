"""The nightly proves the published claims or fails: require-claims, the QWEN3_REQUIRE_TRN2 switch, the workflow."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.declare import published
from harness.judge import goldens
from harness.night import ci
from recipes.tiers import REPO_ROOT

NIGHTLY = REPO_ROOT / ".github" / "workflows" / "nightly-trn2.yml"


def claim_names() -> list[str]:
    return [c.name for c in ci.published_claims("trn2")]


def test_the_trn2_claims_are_read_from_the_shipped_goldens():
    names = claim_names()
    assert len(names) == len(set(names))
    for expected in (
        "native_qwen3.trn2.step1_loss_hf",
        "native_qwen3.trn2.step1_loss_random",
        "native_qwen3.trn2.export_missing_keys",
        "hf_backend.trn2.step1_loss_hf",
        "hf_backend.trn2.step1_loss_random",
    ):
        assert expected in names
    assert {c.value for c in ci.published_claims("trn2") if c.key == "step1_loss_hf"} == {6.54}
    assert ci.published_claims("no-such-tier") == []


def judged(name: str, outcome: str = "passed", verdict: str = "pass") -> dict:
    """A tests.json entry of a test that judged ``name`` (as the ``golden`` fixture records it)."""
    return {
        "test": f"tests/neuron/test_x.py::measures[{name}]",
        "outcome": outcome,
        "duration_s": 1.0,
        "properties": {name: 1.0, f"{name}.verdict": verdict},
    }


def write_report(tmp_path: Path, tests: list[dict]) -> Path:
    path = tmp_path / "tests.json"
    path.write_text(json.dumps({"versions": {}, "goldens": [], "tests": tests}))
    return path


def require_claims(report: Path, goldens_dir: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"QWEN3_GOLDENS_DIR": str(goldens_dir)} if goldens_dir else {})}
    return subprocess.run(
        [sys.executable, "-m", "harness.night.ci", "require-claims", str(report), "--tier", "trn2"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
        env=env,
    )


def test_every_claim_measured_passes_whatever_the_verdict(tmp_path):
    names = claim_names()
    verdicts = [
        "regression" if i == 0 else "pass" for i in range(len(names))
    ]  # a failed check is still measured
    report = write_report(
        tmp_path,
        [judged(n, "failed" if v != "pass" else "passed", v) for n, v in zip(names, verdicts)],
    )
    out = require_claims(report)
    assert out.returncode == 0, out.stderr
    assert f"all {len(names)} published trn2 claims were measured and judged" in out.stdout
    assert f"measured      {names[0]} " in out.stdout and ": regression" in out.stdout


def test_one_missing_claim_fails_and_is_named(tmp_path):
    names = claim_names()
    dropped = "native_qwen3.trn2.step1_loss_hf"
    report = write_report(tmp_path, [judged(n) for n in names if n != dropped])
    out = require_claims(report)
    assert out.returncode == 1
    assert f"1 of {len(names)} published trn2 claims were not measured" in out.stderr
    assert f"NOT MEASURED  {dropped} (published 6.54)" in out.stderr
    assert out.stderr.count("NOT MEASURED") == 1


def test_a_deleted_goldens_file_fails_the_gate_naming_the_file_and_its_claims(tmp_path):
    """The claims come from the catalogue, not from whichever goldens files exist: with one recipe's trn2
    goldens deleted, a night that judged every other claim still fails, and says which file and claims."""
    from harness.judge.goldens import GOLDENS_DIR

    copy = tmp_path / "goldens"
    shutil.copytree(GOLDENS_DIR, copy)
    (copy / "hf_backend" / "trn2.json").unlink()
    names = claim_names()
    report = write_report(tmp_path, [judged(n) for n in names if not n.startswith("hf_backend.")])
    out = require_claims(report, copy)
    assert out.returncode == 1, out.stdout
    assert (
        f"{copy / 'hf_backend' / 'trn2.json'}: published claim hf_backend.trn2.step1_loss_hf"
        in out.stderr
    )
    assert "all" not in out.stdout


def test_a_skipped_test_counts_as_not_measured(tmp_path):
    names = claim_names()
    skipped = "hf_backend.trn2.step1_loss_random"
    records = [judged(n, "skipped" if n == skipped else "passed") for n in names]
    out = require_claims(write_report(tmp_path, records))
    assert out.returncode == 1
    assert f"NOT MEASURED  {skipped} (published 12.43)" in out.stderr
    assert out.stderr.count("NOT MEASURED") == 1


def test_no_report_means_no_claim_was_measured(tmp_path):
    out = require_claims(tmp_path / "missing.json")
    assert out.returncode == 1
    assert (
        "the test run wrote no report" in out.stderr
        and f"none of {len(claim_names())} published trn2" in out.stderr
    )


# ------------------------------------------------------------- QWEN3_REQUIRE_TRN2 switch


NEURON_FILE = REPO_ROOT / "tests/neuron/test_native_qwen3_neuron.py"
#: Every test in that file must skip (or, with the switch, fail): counted, not written down.
NEURON_TESTS = NEURON_FILE.read_text().count("\ndef test_")


def run_neuron_file(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """pytest -m neuron on the real native_qwen3 trn2 file, on this machine (no Neuron device).

    ``-rN``: no short summary, whose lines pytest cuts to the terminal width (so a count of a
    message in stdout would depend on the machine's COLUMNS); the error sections are never cut.
    """
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("QWEN3_4B_DIR", "QWEN3_DATASET_DIR", "QWEN3_REQUIRE_TRN2")
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            "neuron",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            "tests/neuron/test_native_qwen3_neuron.py",
            f"--report-dir={tmp_path}",
            "-rN",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
        env={**clean, **env},
    )


#: The tests that judge a published claim run config 2 as published, on the TorchTitan checkout's
#: c4_test: they need the checkout, never $QWEN3_DATASET_DIR (issue 24 point 8).
AS_PUBLISHED_TESTS = (
    "test_published_step1_loss_from_pretrained_weights",
    "test_published_step1_loss_from_random_init",
    "test_export_round_trip_keys",
)


def test_without_the_switch_missing_requirements_skip_with_the_reason(tmp_path):
    out = run_neuron_file(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    tests = json.loads((tmp_path / "tests.json").read_text())["tests"]
    assert len(tests) == NEURON_TESTS >= 3 and all(t["outcome"] == "skipped" for t in tests)
    for t in tests:
        reason = t["properties"]["skip_reason"]
        assert "no Neuron device" in reason and "QWEN3_4B_DIR is not set" in reason
        assert "is not a TorchTitan checkout" in reason  # this venv's torchtitan is PyPI's wheel
        as_published = t["test"].rsplit("::", 1)[-1] in AS_PUBLISHED_TESTS
        assert ("QWEN3_DATASET_DIR is not set" in reason) != as_published, t["test"]


def test_with_the_switch_missing_requirements_fail_and_no_claim_counts(tmp_path):
    out = run_neuron_file(tmp_path, QWEN3_REQUIRE_TRN2="1")
    assert out.returncode == 1, out.stdout + out.stderr
    assert (
        out.stdout.count("QWEN3_REQUIRE_TRN2=1 (nightly): the trn2 tier is incomplete")
        == NEURON_TESTS
    )
    for gap in ("no Neuron device", "QWEN3_4B_DIR is not set", "QWEN3_DATASET_DIR is not set"):
        assert gap in out.stdout
    tests = json.loads((tmp_path / "tests.json").read_text())["tests"]
    assert [t["outcome"] for t in tests] == ["failed"] * NEURON_TESTS
    assert [t["phase"] for t in tests] == ["setup"] * NEURON_TESTS
    guard = require_claims(tmp_path / "tests.json")
    assert guard.returncode == 1
    assert "NOT MEASURED  native_qwen3.trn2.step1_loss_hf" in guard.stderr
    # Issue 25 point 6: a test that failed in setup ran nothing; the zero-tests guard says so.
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.night.ci",
            "require-ran",
            str(tmp_path / "tests.json"),
            "--marker",
            "neuron",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert (
        f"0 of {NEURON_TESTS} neuron tests actually ran ({NEURON_TESTS} failed in setup"
        in ran.stderr
    )


def test_a_malformed_switch_is_refused(tmp_path):
    out = run_neuron_file(tmp_path, QWEN3_REQUIRE_TRN2="sometimes")
    assert out.returncode != 0
    assert "QWEN3_REQUIRE_TRN2='sometimes': use 1" in out.stdout + out.stderr


# ------------------------------------------------------------------- the nightly workflow


def nightly_steps() -> list[dict]:
    return yaml.safe_load(NIGHTLY.read_text())["jobs"]["neuron"]["steps"]


def test_nightly_sets_the_switch_and_installs_with_one_command():
    job = yaml.safe_load(NIGHTLY.read_text())["jobs"]["neuron"]
    assert job["env"]["QWEN3_REQUIRE_TRN2"] == "1"
    assert job["env"]["QWEN3_4B_DIR"] and job["env"]["QWEN3_DATASET_DIR"]
    installs = [
        s
        for s in nightly_steps()
        if "pip install" in s.get("run", "") or "neuron-venv" in s.get("run", "")
    ]
    assert [s["run"].strip() for s in installs] == ["make neuron-venv"]


def test_nightly_checks_every_torchtitan_name_before_any_test():
    """Issue 24 point 4: the names check is the nightly's first step after installing the fork it checks."""
    runs = [s.get("run", "").strip() for s in nightly_steps()]
    install = runs.index("make neuron-venv")
    first_after = next(r for r in runs[install + 1 :] if r)
    assert first_after == "$NEURON_VENV_DIR/bin/python -m harness.checks.titan --tier trn2"
    assert runs.index(first_after) < min(i for i, r in enumerate(runs) if "-m pytest" in r)


def test_the_nights_venv_survives_checkout_and_one_variable_names_it_everywhere():
    """actions/checkout wipes the workspace: a venv there is rebuilt every night. Outside it, the install
    script's stamp (requirements, fork URL, ref, commit) makes a warm night install nothing."""
    job = yaml.safe_load(NIGHTLY.read_text())["jobs"]["neuron"]
    venv = job["env"]["NEURON_VENV_DIR"]
    assert venv.startswith("/") and "github.workspace" not in venv, venv
    runs = [s.get("run", "") for s in nightly_steps()]
    assert not [r for r in runs if ".venv-neuron" in r], (
        "a step names the venv inside the workspace"
    )
    pythons = [r for r in runs if "/bin/python" in r]
    assert pythons and all("$NEURON_VENV_DIR/bin/python" in r for r in pythons), pythons
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "PYTEST_ARGS")
    }
    out = subprocess.run(
        ["make", "-n", "neuron-venv"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
        env={**env, "NEURON_VENV_DIR": venv},
    )
    assert out.stdout.splitlines() == [f"VENV={venv} scripts/neuron_venv.sh"], (
        out.stdout + out.stderr
    )


def test_nightly_timeout_follows_from_the_plan():
    """Issue 24 point 12: the job's timeout is the plan's cold total with its margin (harness/night/plan.py)."""
    from harness.night import plan as nightly

    job = yaml.safe_load(NIGHTLY.read_text())["jobs"]["neuron"]
    assert job["timeout-minutes"] == nightly.workflow_timeout_minutes()
    assert nightly.workflow_timeout_minutes() >= nightly.totals().cold


def test_nightly_records_the_inputs_of_its_first_night():
    """The first night records the input keys (report/goldens-recorded, uploaded); later nights judge on them."""
    steps = nightly_steps()
    (record,) = [s for s in steps if "harness.night.ci record-inputs" in s.get("run", "")]
    assert record.get("if") == "always()"


def test_nightly_runs_every_neuron_test_then_both_guards_whatever_happened():
    steps = nightly_steps()
    runs = [s.get("run", "") for s in steps]
    pytest_steps = [i for i, r in enumerate(runs) if "-m pytest" in r]
    assert len(pytest_steps) == 1, "one pytest step: no version gate before the neuron tests"
    tests = steps[pytest_steps[0]]
    assert (
        "-m neuron" in tests["run"] and "tests/neuron/" not in tests["run"]
    )  # the whole marker, nothing selected out
    # whatever happened before, except a device-randomness preflight that did not return (its launches would hang)
    assert tests.get("if") == "${{ !cancelled() && steps.device_random.outcome == 'success' }}"
    (preflight,) = [s for s in steps if s.get("id") == "device_random"]
    assert preflight.get("if") == "${{ !cancelled() }}"
    for guard in (
        "harness.night.ci require-ran",
        "harness.night.ci require-claims report/tests.json --tier trn2",
    ):
        (index,) = [i for i, r in enumerate(runs) if guard in r]
        assert index > pytest_steps[0] and steps[index].get("if") == "always()", guard


# ------------------------------------------------------------- what the trn2 goldens hold


@pytest.mark.parametrize(
    "path", sorted(goldens.GOLDENS_DIR.glob("*/trn2.json")), ids=lambda p: p.parent.name
)
def test_trn2_goldens_hold_only_published_claims_with_their_reasons(path):
    """No run on trn2 has produced an environment yet, so none is recorded; each value says why its tolerance.

    Issue 24 points 10 and 11: a number that depends on the run's weights, tokenizer or text is keyed by
    its inputs (recorded by the first night); a tolerance that is not exact either cites what it was
    derived or measured from, or says it is unmeasured (then "unmeasured").
    """
    data = json.loads(path.read_text())
    assert set(data) == {"values"}, (
        f"{path}: only 'values'; environment metadata comes from a real run"
    )
    assert "shared/seed" not in path.read_text()
    metadata, values = goldens.load(path.parent.name, "trn2", path)
    assert metadata == {} and values
    for golden in values.values():
        assert golden.lane == "published" and len(golden.reason) > 20, golden
        assert golden.keyed_by_inputs == (not golden.key.startswith("rope_")), (
            golden
        )  # rope: synthetic tensors
        if golden.tolerance:
            assert golden.unmeasured or "measured" in golden.reason or "derived" in golden.reason, (
                golden
            )


def test_the_tutorial_is_cited_by_publisher_author_and_subject():
    assert (
        "AWS Machine Learning Blog" in published.SOURCE and "Josh Longenecker" in published.SOURCE
    )
    assert "trn2.48xlarge" in published.SOURCE

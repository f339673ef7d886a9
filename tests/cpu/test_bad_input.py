"""Bad input stops before any rank starts: one message naming the value and the fix, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest

from recipes.tiers import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.cpu

FIXTURE_DIR = FIXTURES / "qwen3-tiny"


def run_main(*args: str, report_dir) -> tuple[subprocess.CompletedProcess, float]:
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "recipes", "run", *args, "--report-dir", str(report_dir)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    return out, time.perf_counter() - started


def assert_refused(out: subprocess.CompletedProcess, elapsed: float, report_dir, *fragments: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    error_lines = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1, out.stderr
    for fragment in fragments:
        assert fragment in error_lines[0], (fragment, error_lines[0])
    assert not report_dir.exists(), "a refused run must write nothing"
    assert elapsed < 60, f"refusal took {elapsed:.0f} s"


def test_missing_model_dir(tmp_path):
    missing = tmp_path / "no-such-model"
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(missing), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(missing), "does not exist")


def test_model_dir_without_safetensors(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(FIXTURE_DIR / "config.json", model / "config.json")
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(model), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(model), "safetensors")


def test_model_dir_without_config(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(FIXTURE_DIR / "model.safetensors", model / "model.safetensors")
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(model), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(model), "config.json")


def test_config_sizes_that_disagree_with_the_recipe(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(FIXTURE_DIR, model)
    config = json.loads((model / "config.json").read_text())
    config["hidden_size"] = 256
    (model / "config.json").write_text(json.dumps(config))
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(model), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", "hidden_size", "256", "128", "config.json")


def test_export_dir_equal_to_source_dir(tmp_path):
    out, elapsed = run_main(
        "native_qwen3", "--init", "hf", "--model-dir", str(FIXTURE_DIR), "--export-dir", str(FIXTURE_DIR),
        report_dir=tmp_path / "r",
    )
    assert_refused(out, elapsed, tmp_path / "r", "--export-dir", "never written")


def test_unknown_recipe(tmp_path):
    out, elapsed = run_main("qwen9_native", report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", "qwen9_native", "native_qwen3")


def test_unknown_tier(tmp_path):
    out, elapsed = run_main("native_qwen3", "--tier", "tpu", report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", "'tpu'", "cpu, trn2")


def test_trn2_tier_without_a_neuron_device(tmp_path):
    out, elapsed = run_main("native_qwen3", "--tier", "trn2", report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", "--tier trn2", "no Neuron device", "--tier cpu")

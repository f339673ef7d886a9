"""Bad input stops before any rank starts: one message naming the value and the fix, exit 2, nothing written.

Most refusals call ``python -m harness``'s ``main`` in this process (the same code, without
importing torch again for every case); ``IN_A_FRESH_PROCESS`` cases run the real command line.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
import time

import pytest

from recipes.tiers import FIXTURES, REPO_ROOT


FIXTURE_DIR = FIXTURES / "qwen3-tiny"


def run_main(*args: str, report_dir, fresh_process: bool = False) -> tuple[subprocess.CompletedProcess, float]:
    """``python -m harness run ARGS --report-dir DIR``: its exit code, stdout and stderr, and how long it took."""
    argv = ["run", *args, "--report-dir", str(report_dir)]
    started = time.perf_counter()
    if fresh_process:
        out = subprocess.run(
            [sys.executable, "-m", "harness", *argv], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
        )
        return out, time.perf_counter() - started
    from harness.__main__ import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(argv)
        except SystemExit as e:  # the CLI parser's own refusals
            code = e.code
    return subprocess.CompletedProcess(argv, code, stdout.getvalue(), stderr.getvalue()), time.perf_counter() - started


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
    out, elapsed = run_main("qwen9_native", report_dir=tmp_path / "r", fresh_process=True)
    assert_refused(out, elapsed, tmp_path / "r", "qwen9_native", "native_qwen3")


def test_unknown_tier(tmp_path):
    out, elapsed = run_main("native_qwen3", "--tier", "tpu", report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", "'tpu'", "cpu, trn2")


def test_trn2_tier_without_a_neuron_device(tmp_path):
    out, elapsed = run_main("native_qwen3", "--tier", "trn2", report_dir=tmp_path / "r", fresh_process=True)
    assert_refused(out, elapsed, tmp_path / "r", "--tier trn2", "no Neuron device", "--tier cpu")


def copy_fixture(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(FIXTURE_DIR, model)
    return model


def test_truncated_safetensors(tmp_path):
    model = copy_fixture(tmp_path)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(model), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(weights), "truncated")


def test_corrupt_safetensors_header(tmp_path):
    model = copy_fixture(tmp_path)
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:40] = b"\xff" * 32
    weights.write_bytes(bytes(data))
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(model), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(weights), "corrupt safetensors header")


def test_checkpoint_tensor_with_the_wrong_shape_names_key_and_both_shapes(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    model = copy_fixture(tmp_path)
    weights = model / "model.safetensors"
    state = load_file(weights)
    state["model.layers.0.mlp.up_proj.weight"] = torch.zeros(100, 128)
    save_file(state, weights)
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(model), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", "'model.layers.0.mlp.up_proj.weight'", "[100, 128]", "[384, 128]")


def test_checkpoint_missing_a_tensor_names_it(tmp_path):
    from safetensors.torch import load_file, save_file

    model = copy_fixture(tmp_path)
    weights = model / "model.safetensors"
    state = load_file(weights)
    del state["model.norm.weight"]
    save_file(state, weights)
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(model), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", "'model.norm.weight'", "[128]")


def test_tokenizer_missing_from_model_dir(tmp_path):
    model = copy_fixture(tmp_path)
    (model / "tokenizer.json").unlink()
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(model), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(model / "tokenizer.json"), "does not exist")


def test_dataset_dir_that_does_not_exist(tmp_path):
    missing = tmp_path / "no-corpus"
    out, elapsed = run_main("native_qwen3", "--dataset-dir", str(missing), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(missing), "does not exist")


@pytest.mark.parametrize("content, fragment", [("", "holds no text"), ('{"url": "x"}\n', 'no non-empty "text"')])
def test_dataset_without_text(tmp_path, content, fragment):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.jsonl").write_text(content)
    out, elapsed = run_main("native_qwen3", "--dataset-dir", str(corpus), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(corpus / "train.jsonl"), fragment)


def test_non_empty_export_dir_is_refused_without_overwrite(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "keep.txt").write_text("a previous export")
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--export-dir", str(export), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(export), "--overwrite")
    assert (export / "keep.txt").read_text() == "a previous export"

"""Tutorial config 3 (NKI MoE) on the cpu tier, and kernel overrides inside real training runs."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from recipes.tiers import REPO_ROOT

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def moe_config():
    from recipes.nki_moe import qwen3_nki_moe_config

    return qwen3_nki_moe_config("30B-A3B", tier="cpu")


def test_config_is_the_tutorials_shrunk_30b_a3b(moe_config):
    from torchtitan.models.common.attention import ScaledDotProductAttention

    from recipes.kernels.grouped_experts import TrnGroupedExperts
    from recipes.kernels.rope import NKIRoPE

    layers = moe_config.model_spec.model.layers
    assert len(layers) == 4
    for layer in layers:
        assert layer.moe.num_experts == 64
        assert layer.moe.router.top_k == 4
        assert type(layer.moe.routed_experts.inner_experts) is TrnGroupedExperts.Config
        assert type(layer.attention.rope) is NKIRoPE.Config
        assert type(layer.attention.inner_attention) is ScaledDotProductAttention.Config
    assert moe_config.compile.enable is False
    assert moe_config.parallelism.tensor_parallel_degree == 1
    assert moe_config.parallelism.expert_parallel_degree == 1
    assert moe_config.parallelism.data_parallel_shard_degree == -1


def test_shrunk_moe_trains_on_two_processes(recipe_run, golden, record_property):
    run = recipe_run("nki-moe-2proc", recipe="nki_moe", tier="cpu", nproc=2, steps=4, init="random", seed=0)
    losses = run["losses"]
    record_property("nki_moe_losses", losses)
    record_property("nki_moe_tokens_per_s", [s["tokens_per_s"] for s in run["steps"]])
    golden(
        "nki_moe", "cpu", "step1_loss_random", losses[0],
        reason="torchtitan's random init, seed 0, 2 ranks × 2 × 256 tokens: deterministic on the pinned cpu lock",
    )
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], losses


def test_rope_override_on_some_layers_leaves_training_bitwise_identical(recipe_run, record_property):
    """The custom-op RoPE is CosSinRoPE's exact twin: swapping it in changes no loss bit."""
    common = dict(recipe="native_qwen3", tier="cpu", nproc=1, steps=3, init="hf", seed=7)
    stock = recipe_run("native-determinism-1", **common)
    swapped = recipe_run("native-rope-hf-layer1", overrides=["rope_hf=layers.1.attention.rope"], **common)
    record_property("rope_override_losses", swapped["losses"])
    record_property("stock_losses", stock["losses"])
    assert swapped["losses"] == stock["losses"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "recipes", "run", *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
    )


@pytest.mark.parametrize("seq_len", [200, 384])
def test_seq_len_guard_refuses_before_training(tmp_path, seq_len):
    out = run_cli("nki_moe", "--tier", "cpu", "--seq-len", str(seq_len), "--report-dir", str(tmp_path / "r"))
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert f"seq_len={seq_len} is not a multiple of 128×LNC=256 (LNC=2)" in out.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("seq_len", [256, 512])
def test_seq_len_guard_accepts_multiples_of_256(seq_len):
    from recipes.options import RunOptions
    from recipes.preflight import preflight
    from recipes.train import build_config

    config = build_config(preflight(RunOptions(recipe="nki_moe", tier="cpu", init="random", seq_len=seq_len)))
    assert config.training.seq_len == seq_len


def test_override_glob_matching_nothing_is_refused_before_any_rank(tmp_path):
    out = run_cli(
        "native_qwen3", "--tier", "cpu", "--init", "random",
        "--override", "rope_hf=layers.1[0-9].attention.rope", "--report-dir", str(tmp_path / "r"),
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert "glob 'layers.1[0-9].attention.rope' matched no node; the model has layers 0–1" in out.stderr

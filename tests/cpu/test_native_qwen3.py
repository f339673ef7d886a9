"""Tutorial config 2 (native Qwen3) on the cpu tier: launch, load, random init, export, determinism."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from recipes.tiers import FIXTURES, TINY_DENSE

pytestmark = pytest.mark.cpu

FIXTURE_DIR = FIXTURES / "qwen3-tiny"
STEPS = 5


@pytest.fixture(scope="module")
def hf_run(recipe_run, shared_dir):
    """2 processes, gloo, fixture weights, HF export published to an export dir."""
    return recipe_run(
        "native-hf-2proc",
        recipe="native_qwen3",
        tier="cpu",
        nproc=2,
        steps=STEPS,
        init="hf",
        model_dir=FIXTURE_DIR,
        export_dir=shared_dir / "native-hf-export",
        seed=0,
    )


@pytest.fixture(scope="module")
def random_run(recipe_run):
    return recipe_run("native-random-2proc", recipe="native_qwen3", tier="cpu", nproc=2, steps=STEPS, init="random", seed=0)


def test_two_process_run_trains(hf_run, record_property):
    losses = hf_run["losses"]
    record_property("native_hf_losses", losses)
    assert hf_run["returncode"] == 0
    assert len(losses) == STEPS
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], f"loss did not decrease over {STEPS} steps: {losses}"


def test_pretrained_step1_loss_is_far_below_random_init(hf_run, random_run, record_property):
    pretrained, random = hf_run["losses"][0], random_run["losses"][0]
    record_property("native_step1_loss_hf", pretrained)
    record_property("native_step1_loss_random", random)
    assert pretrained < random - 2.0, (pretrained, random)


def test_random_init_loss_matches_first_principles(random_run, record_property):
    """CE of a tied output at init ≈ ln V + d·σ²/2 (σ = 0.02 output init std)."""
    expected = math.log(TINY_DENSE.vocab_size) + TINY_DENSE.hidden_size * 0.02**2 / 2
    measured = random_run["losses"][0]
    record_property("native_step1_loss_random_expected", expected)
    # 2 ranks × 2 × 256 sampled tokens: the sampling spread of CE is ~0.02 here.
    assert measured == pytest.approx(expected, abs=0.06)


def test_failing_rank_log_lines_reach_the_failure(tmp_path):
    """A rank that raises makes launch() fail with that rank's traceback tail."""
    from recipes.launch import LaunchError, launch
    from recipes.options import RunOptions
    from recipes.preflight import preflight

    opts = preflight(RunOptions(recipe="native_qwen3", tier="cpu", nproc=2, steps=1, init="random", run_dir=tmp_path))
    with pytest.raises(LaunchError) as failure:
        launch(opts, ["--training.local_batch_size", "0"], echo=lambda line: None, timeout_s=300)
    message = str(failure.value)
    assert "rank 0" in message and "rank 1" in message
    assert "Traceback" in message or "Error" in message

"""The forward-only step-1 scorer (harness.rank.step1_forward) gives the trainer's own step-1 loss, bit for bit.

The 4B-width random-init proxies (test_native_qwen3.py, test_hf_backend.py) score their
step 1 through it instead of training a step, so it must score what a launch's step 1
scores: the same config, model, init, batch and loss arithmetic. Each case here is a
real launch (``harness.launch.lifecycle.launch``, what ``python -m harness run`` starts) of one
optimizer step, and the scorer in new processes on the same options. (A third case, 2 ranks
of the MoE, is tests/cpu/test_export.py's nki_moe_initial_state.)
"""

from __future__ import annotations

import pytest

from harness.options.run_options import RunOptions
from recipes.tiers import FIXTURES

#: The recipes whose 4B-width proxies score through the scorer, on the tiny fixture, as the
#: proxies run: one process, random init, nothing saved. Launched with ``steps=1``.
CASES = {
    "native_qwen3-random": dict(recipe="native_qwen3", init="random"),
    "hf_backend-random": dict(
        recipe="hf_backend", init="random", model_dir=FIXTURES / "qwen3-tiny"
    ),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.slow
def test_forward_only_step1_loss_is_the_trainers_bitwise(
    case, recipe_run, tmp_path, record_property
):
    """Same fp32 ops in the same order (train_step's forward half, no_grad): equal, not close."""
    from harness.judge import proxy

    options = dict(tier="cpu", nproc=1, steps=1, seed=0, export=False, **CASES[case])
    trained = recipe_run(f"step1-{case}", **options)
    scored = proxy.run(RunOptions(run_dir=tmp_path / "forward", **options))
    record_property(f"{case}_trainer_step1_loss", trained["losses"][0])
    record_property(f"{case}_forward_only_step1_loss", scored["loss"])
    record_property(f"{case}_forward_only_wall_s", scored["wall_s"])
    assert (
        scored["global_valid_tokens"]
        == trained["seq_len"] * trained["local_batch_size"] * trained["nproc"]
    )
    assert scored["loss"] == trained["losses"][0], (
        f"forward-only {scored['loss']!r} vs the trainer's step 1 {trained['losses'][0]!r}"
    )


@pytest.mark.parametrize("case", CASES)
@pytest.mark.slow
def test_a_forward_only_launch_records_the_trainers_step1_loss(case, recipe_run, record_property):
    """The main job's full-width runs: a launch with ``forward_only`` (harness.rank.train scores step 1 through
    harness.rank.step1_forward instead of training it) records the trainer's step-1 loss as its step 1, bitwise."""
    options = dict(tier="cpu", nproc=1, steps=1, seed=0, export=False, **CASES[case])
    trained = recipe_run(f"step1-{case}", **options)
    launched = recipe_run(f"step1-{case}-forward-only-launch", forward_only=True, **options)
    record_property(f"{case}_forward_only_launch_step1_loss", launched["losses"])
    assert [s.get("forward_only") for s in launched["steps"]] == [True], launched["steps"]
    assert launched["steps"][0]["grad_norm"] is None  # no backward ran
    assert launched["losses"] == trained["losses"][:1], (launched["losses"], trained["losses"])


@pytest.mark.slow
def test_a_launch_gives_its_ranks_the_threads_it_was_given(recipe_run):
    """The main job's one-rank full-width runs get every core (``threads``); the rank records what torch used.
    Seen failing with child_env ignoring ``threads``: provenance threads 1."""
    launched = recipe_run(
        "step1-native-two-threads",
        tier="cpu",
        recipe="native_qwen3",
        init="random",
        nproc=1,
        steps=1,
        seed=0,
        export=False,
        forward_only=True,
        threads=2,
    )
    assert launched["provenance"]["threads"] == 2


def test_the_main_jobs_full_width_runs_take_every_core_but_under_xdist(monkeypatch):
    import os

    from harness.__main__ import one_rank_threads
    from harness.launch.lifecycle import child_env

    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert one_rank_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert one_rank_threads() == 1
    assert child_env(RunOptions(threads=3))["OMP_NUM_THREADS"] == "3"
    assert (
        child_env(RunOptions())["OMP_NUM_THREADS"] == "1"
    )  # the cpu tier's: ranks share the cores with xdist

"""Beyond step 1 (issue 15): 100-step loss curves, 1 vs 2 processes, native vs HF backend.

Every recipe's 100-step curve is an exact-lane golden, bitwise on the pinned lock in the
environment that recorded it. Elsewhere (another CPU model or kernel set) each step is held
to the entry's own ``portable_rtol``, measured by rerunning the 100 steps with other kernels
on this machine: ATen's scalar kernels (``ATEN_CPU_CAPABILITY=default``) and MKL's
reproducible mode (``MKL_CBWR=COMPATIBLE``) instead of AVX2. Those runs agree bitwise at step 1
and drift from step 2 by one ulp, growing to:

* native_qwen3: max 1.13e-6 relative over the 100 steps (1.67e-6 absolute, step 7-10);
* hf_backend: max 9.7e-7 relative;
* nki_moe: max 6.7e-3 relative (0.03 absolute). Its bf16 grouped experts and top-4
  routing turn the first ulp into a different routing decision somewhere between step 13
  and 25, after which the curves are two different, equally good trajectories.

So dense curves get ``portable_rtol`` 1e-5 per step (about 9× the largest drift measured;
any defect these tests exist for moves a loss by ≥ 1e-4), the MoE curve 2e-2 (3× its drift:
elsewhere it is a trend check; here it is bitwise).
"""

from __future__ import annotations

import dataclasses
import math

import curve_runs
import pytest
from curve_runs import STEPS

DENSE_PORTABLE_RTOL = 1e-5
MOE_PORTABLE_RTOL = 2e-2

#: 1 vs 2 processes on the same global batch from the same weights: the same math with the
#: loss and gradient sums split over two ranks (gloo reduce-scatter/all-reduce) instead of
#: one, so only summation order differs. Measured: 1 ulp (1.2e-7) at step 1 (the loss sum
#: of 4 sequences on one rank vs 2 + 2 all-reduced), ≤ 2.4e-7 (2 ulps) over 100 steps.
#: 5e-6 is 3× the largest ulp-seeded drift this model showed under other kernels (1.67e-6),
#: so it holds on another CPU too. A batch that is not the same is far above it: the 1-process
#: run on torchtitan's own contiguous sharding (same batch size, other documents) differs by
#: 0.014 at step 1 and up to 0.17.
PARALLEL_ATOL = 5e-6
#: native_qwen3 vs hf_backend with the same optimizer config: torchtitan's modules vs
#: transformers' doing the same fp32 math. Measured ≤ 3.6e-7 over 100 steps; same bound
#: and reasoning as PARALLEL_ATOL.
BACKEND_ATOL = 5e-6
#: Steps on which the two recipes as the tutorial configures them use the same learning
#: rates: warmup is 2 steps in both; qwen3_32b() decays linearly from step 3 on, while
#: transformers_modeling_backend_full() (decay_ratio 0.8) holds the peak until step 21.
#: A loss shows the rate of the step before it, so the curves may part from step 5.
SAME_SCHEDULE_STEPS = 4


def differences(a: list[float], b: list[float]) -> list[float]:
    assert len(a) == len(b) == STEPS, (len(a), len(b))
    return [abs(x - y) for x, y in zip(a, b)]


def divergence(diffs: list[float], atol: float) -> dict:
    """What the report says about two curves: the first step differing at all, beyond atol, the max."""
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    return {
        "first_step_differing": next((i + 1 for i, d in enumerate(diffs) if d), None),
        "first_step_beyond_tolerance": next((i + 1 for i, d in enumerate(diffs) if d > atol), None),
        "max_abs_diff": diffs[worst],
        "max_abs_diff_step": worst + 1,
    }


@pytest.fixture(scope="module")
def native(recipe_run):
    return curve_runs.native_curve(recipe_run)


@pytest.fixture(scope="module")
def backend(recipe_run):
    return curve_runs.hf_backend_curve(recipe_run)


# --- curve goldens ------------------------------------------------------------------------------------


CURVES = {
    "native_qwen3": (
        curve_runs.native_curve,
        DENSE_PORTABLE_RTOL,
        "fixture checkpoint, 1 rank × 2 × 256 tokens, seed 0, 100 steps (LR warmup 2, linear decay): "
        "bitwise on the pinned cpu lock; elsewhere 1e-5 per step (measured ≤ 1.13e-6 under other kernels)",
    ),
    "hf_backend": (
        curve_runs.hf_backend_curve,
        DENSE_PORTABLE_RTOL,
        "fixture checkpoint through the backend, 1 rank × 2 × 256 tokens, seed 0, 100 steps (LR warmup 2, "
        "WSD decay_ratio 0.8): bitwise on the pinned cpu lock; elsewhere 1e-5 per step (measured ≤ 9.7e-7)",
    ),
    "nki_moe": (
        curve_runs.nki_moe_curve,
        MOE_PORTABLE_RTOL,
        "torchtitan's random init, seed 0, 1 rank × 2 × 256 tokens, 100 steps: bitwise on the pinned cpu lock; "
        "elsewhere 2e-2 per step (measured ≤ 6.7e-3: bf16 experts + top-4 routing amplify the first ulp)",
    ),
}


@pytest.mark.parametrize("recipe", CURVES)
@pytest.mark.slow
def test_100_step_curve_matches_its_golden(recipe, recipe_run, golden, record_property):
    make, portable_rtol, reason = CURVES[recipe]
    run = make(recipe_run)
    losses = run["losses"]
    record_property(f"{recipe}.cpu.curve_wall_s", round(run["wall_s"], 1))
    assert [s["step"] for s in run["steps"]] == list(range(1, STEPS + 1))
    assert all(math.isfinite(x) for x in losses)
    golden(recipe, "cpu", f"loss_curve_{STEPS}", losses, reason=reason, portable_rtol=portable_rtol)
    assert sum(losses[-10:]) < sum(losses[:10]), "the curve does not go down"


# --- parallelism invariance ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def same_batch(recipe_run, shared_dir):
    return {n: curve_runs.same_batch_run(recipe_run, shared_dir, n) for n in (1, 2)}


def test_same_batch_corpora_put_the_same_sequences_in_each_global_batch(shared_dir):
    """Each document is one whole sequence, and the 1-process order is the 2 ranks' batches interleaved."""
    import json

    from tokenizers import Tokenizer

    from recipes.tiers import CPU

    one, two = curve_runs.same_batch_corpora(shared_dir)

    def read(d):
        return [json.loads(line)["text"] for line in (d / "train.jsonl").read_text().splitlines()]

    docs_one, docs_two = read(one), read(two)
    tokenizer = Tokenizer.from_file(str(CPU.tokenizer_dir / "tokenizer.json"))
    assert {len(tokenizer.encode(t).ids) for t in docs_two} == {CPU.seq_len}
    half, local = len(docs_two) // 2, curve_runs.SAME_BATCH_LOCAL
    for step in range(STEPS):
        rank0 = docs_two[step * local : (step + 1) * local]
        rank1 = docs_two[half + step * local : half + (step + 1) * local]
        assert docs_one[4 * step : 4 * step + 4] == rank0 + rank1, step


@pytest.mark.slow
def test_one_and_two_processes_give_the_same_curve(same_batch, record_property):
    one, two = same_batch[1], same_batch[2]
    assert (one["nproc"], one["local_batch_size"], two["nproc"], two["local_batch_size"]) == (
        1,
        4,
        2,
        2,
    )
    for run in (one, two):
        assert run["provenance"]["data"]["global_batch_size"] == 4
    diffs = differences(one["losses"], two["losses"])
    found = divergence(diffs, PARALLEL_ATOL)
    record_property("one_vs_two_processes_abs_diff", diffs)
    record_property("one_vs_two_processes", found)
    record_property("wall_s", {"1proc": round(one["wall_s"], 1), "2proc": round(two["wall_s"], 1)})
    assert found["first_step_beyond_tolerance"] is None, found


# --- backend parity over the curve -------------------------------------------------------------------------


def optimizer_relevant_config(recipe: str) -> dict:
    """Everything of a recipe's cpu Trainer.Config that steers the optimization, flattened."""
    from harness.checks.preflight import preflight
    from harness.config.build import build_config
    from harness.options.run_options import RunOptions

    opts = preflight(
        RunOptions(recipe=recipe, tier="cpu", nproc=1, steps=STEPS, init="hf", export=False)
    )
    config = build_config(opts)
    flat = {"debug.seed": config.debug.seed, "debug.deterministic": config.debug.deterministic}
    for section in ("optimizer", "lr_scheduler", "training", "parallelism"):
        value = getattr(config, section)
        flat.update({f"{section}.{k}": v for k, v in dataclasses.asdict(value).items()})
    return flat


def test_native_and_backend_differ_only_in_the_lr_schedule():
    """The cause of the divergence below, read from the two configs: decay_ratio, nothing else.

    Same AdamW (lr 8e-4, betas, eps, weight decay 0.1 on one catch-all group: norms and
    embeddings included in both), same clipping, warmup, steps, batch, seed, dtype.
    """
    native, backend = (
        optimizer_relevant_config("native_qwen3"),
        optimizer_relevant_config("hf_backend"),
    )
    differ = {
        k: (native.get(k), backend.get(k))
        for k in native.keys() | backend.keys()
        if native.get(k) != backend.get(k)
    }
    assert differ == {"lr_scheduler.decay_ratio": (None, 0.8)}
    (group,) = native["optimizer.param_groups"]
    assert group["pattern"] == ".*" and group["optimizer_kwargs"]["weight_decay"] == 0.1


def test_backend_follows_native_until_the_lr_schedules_part(native, backend, record_property):
    """As configured: bitwise-close while the learning rates agree, then apart by the schedule."""
    diffs = differences(native["losses"], backend["losses"])
    found = divergence(diffs, BACKEND_ATOL)
    record_property("native_vs_hf_backend_as_configured_abs_diff", diffs)
    record_property("native_vs_hf_backend_as_configured", found)
    assert max(diffs[:SAME_SCHEDULE_STEPS]) <= BACKEND_ATOL, diffs[:SAME_SCHEDULE_STEPS]
    # Measured: 2.2e-4 at step 5, max 0.021 (step 29); the step-100 losses differ by 3.3e-3.
    assert found["first_step_beyond_tolerance"] == SAME_SCHEDULE_STEPS + 1, found


@pytest.mark.slow
def test_backend_with_natives_lr_schedule_gives_the_native_curve(
    native, recipe_run, record_property
):
    aligned = curve_runs.hf_backend_native_schedule(recipe_run)
    diffs = differences(native["losses"], aligned["losses"])
    found = divergence(diffs, BACKEND_ATOL)
    record_property("native_vs_hf_backend_same_schedule_abs_diff", diffs)
    record_property("native_vs_hf_backend_same_schedule", found)
    grad_diffs = [
        abs(a["grad_norm"] - b["grad_norm"]) for a, b in zip(native["steps"], aligned["steps"])
    ]
    record_property("native_vs_hf_backend_same_schedule_grad_norm_abs_diff_max", max(grad_diffs))
    assert found["first_step_beyond_tolerance"] is None, found

"""Tutorial config 2 (native Qwen3) on the cpu tier: launch, load, random init.

Same seed, same losses in new processes: tests/cpu/test_resume.py::test_a_run_stopped_at_50_is_the_first_50_steps
(two launches, bit for bit) and tests/cpu/test_rank_start.py (exec vs preloaded ranks).
"""

from __future__ import annotations

import math

import pytest
import torch

from recipes.tiers import TINY_DENSE

STEPS = 5


def test_two_process_run_trains(native_hf_run, record_property):
    losses = native_hf_run["losses"]
    record_property("native_hf_losses", losses)
    assert native_hf_run["returncode"] == 0
    assert len(losses) == STEPS
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], f"loss did not decrease over {STEPS} steps: {losses}"


def test_pretrained_step1_loss_matches_golden(native_hf_run, golden):
    golden(
        "native_qwen3",
        "cpu",
        "step1_loss_hf",
        native_hf_run["losses"][0],
        reason="fixture checkpoint, 2 ranks × 2 × 256 tokens, seed 0: deterministic on the pinned cpu lock",
    )


@pytest.mark.slow
def test_pretrained_step1_loss_is_far_below_random_init(
    native_hf_run, native_random_run, record_property
):
    pretrained, random = native_hf_run["losses"][0], native_random_run["losses"][0]
    record_property("native_step1_loss_hf", pretrained)
    record_property("native_step1_loss_random", random)
    # The fixture was trained to ~0.94 on this corpus; random init sits at ~ln 1024 = 6.93.
    assert pretrained < random - 3.0, (pretrained, random)


#: Output init std of the recipe's lm_head (recipes/specs.py _LINEAR_INIT) and the resulting
#: first-principles step-1 loss: ln V + d·σ²/2 = 6.9315 + 0.0256 = 6.9571.
OUTPUT_INIT_STD = 0.02
#: The sampled step-1 loss (2 ranks × 2 × 256 corpus tokens) spreads over init seeds:
#: measured std 0.018, range 6.921–6.992 over seeds 0–19 (recipe model, loader's first batches).
#: 0.06 is 3.3 std, wider than the d·σ²/2 = 0.026 term, so this check claims "untrained, near
#: ln V" only; the d·σ²/2 claim is checked by test_init_scheme_matches_first_principles.
SAMPLED_RANDOM_INIT_ATOL = 0.06
#: Expected CE under a uniform target (logsumexp − mean logit), averaged over 512 positions:
#: measured 6.9595 ± 0.0003 (seeds 0–19; +0.0025 over the formula from the tied input
#: token's own logit). 0.005 is under the 0.026 effect claimed: a zero head (ln V) fails it.
UNIFORM_TARGET_CE_ATOL = 0.005


def first_principles_loss() -> float:
    """CE of a tied output at init ≈ ln V + d·σ²/2: a final RMSNorm makes ‖h‖² = d, logits have variance d·σ²."""
    return math.log(TINY_DENSE.vocab_size) + TINY_DENSE.hidden_size * OUTPUT_INIT_STD**2 / 2


def test_random_init_step1_loss_is_near_ln_vocab(native_random_run, record_property):
    """The live run's step-1 loss is an untrained model's; sampling noise hides the d·σ²/2 term."""
    expected = first_principles_loss()
    measured = native_random_run["losses"][0]
    record_property("native_step1_loss_random_expected", expected)
    record_property("native_step1_loss_random_abs_diff", abs(measured - expected))
    assert measured == pytest.approx(expected, abs=SAMPLED_RANDOM_INIT_ATOL)


def uniform_target_ce(model, tokens) -> float:
    """Mean over positions of the CE expected for a uniformly drawn target: no sampling noise from labels."""
    with torch.no_grad():
        logits = model(tokens).double()
    return (torch.logsumexp(logits, -1) - logits.mean(-1)).mean().item()


def test_init_scheme_matches_first_principles(record_property):
    """The recipe's init gives ln V + d·σ²/2 within a tolerance a zero-initialised head fails.

    In-process: the recipe's model spec, built and initialised as the trainer does
    (meta build, ``to_empty``, ``init_weights``), for several seeds.
    """
    from harness.checks.preflight import preflight
    from harness.config.build import build_config
    from harness.options.run_options import RunOptions

    spec = build_config(
        preflight(RunOptions(recipe="native_qwen3", tier="cpu", init="random"))
    ).model_spec
    tokens = torch.randint(
        TINY_DENSE.vocab_size, (2, 256), generator=torch.Generator().manual_seed(0)
    )
    expected = first_principles_loss()
    measured = {}
    for seed in range(4):
        torch.manual_seed(seed)
        with torch.device("meta"):
            model = spec.model.build()
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        measured[seed] = uniform_target_ce(model, tokens)
    assert model.lm_head.weight is model.tok_embeddings.weight, (
        "the recipe's model is no longer tied"
    )
    with torch.no_grad():
        model.lm_head.weight.zero_()
    zero_head = uniform_target_ce(model, tokens)
    record_property("uniform_target_ce_by_seed", measured)
    record_property("uniform_target_ce_expected", expected)
    record_property("uniform_target_ce_zero_head", zero_head)
    for seed, value in measured.items():
        assert value == pytest.approx(expected, abs=UNIFORM_TARGET_CE_ATOL), f"seed {seed}"
    # The control: what the tolerance must reject.
    assert abs(zero_head - expected) > UNIFORM_TARGET_CE_ATOL, zero_head


#: Qwen3-4B's width and vocab (fixtures/qwen3-4b-instruct-2507/config.json): the proxy's model.
WIDTH_4B, VOCAB_4B = 2560, 151936


@pytest.mark.xdist_group(
    "real-4b-width"
)  # one worker runs both real-width proxies: none waits on the lock
@pytest.mark.slow
def test_random_init_proxy_at_4b_width_one_layer_is_near_published_12_43(
    random_init_proxy, golden, record_property
):
    """A cpu PROXY of the tutorial's random-init step-1 loss 12.43: near it, not a reproduction of it.

    Measured: step 1 of config 2 from torchtitan's random init (tied head, std 0.02) at the real
    Qwen3-4B width and vocab, built and initialised by the trainer from the recipe's own config
    function and scored forward-only (harness.rank.step1_forward, bitwise the trainer's step 1).
    Assumed, so that this number stands for the tutorial's:

    * depth does not matter: ONE layer, not 36. A final RMSNorm gives ‖h‖² = d at any depth, so
      the logits' variance is d·σ² and CE ≈ ln V + d·σ²/2 = 12.443;
    * the data does not matter beyond sampling noise: 2048 tokens of the fixture corpus through
      the cpu tier's 1,024-id tokenizer, seed 0, not the tutorial's 64 × 2048 tokens of its own
      data and tokenizer;
    * neither do precision and placement: fp32 in one CPU process, not bf16 on 64 trn2 ranks.

    The tolerance is the golden's, 0.21: the mean's offset from 12.43 plus 3 sigma of this
    number's spread over init seeds with the batch fixed (measured n=20, seeds 0-19: mean 12.4557,
    sigma 0.0603; the reason states it). It tells 12.43 from ln V = 11.93 (a zero head), not
    12.443 from 12.43.
    """
    from harness.judge import goldens

    # The control, before the cost: a zero head scores ln V, which the tolerance must reject.
    entry = goldens.load("native_qwen3", "cpu")[1]["step1_loss_random_4b_width"]
    assert abs(math.log(VOCAB_4B) - entry.value) > entry.tolerance, entry
    result = random_init_proxy("native_qwen3")
    model = result["model"]
    assert (model["hidden_size"], model["vocab_size"], model["num_hidden_layers"]) == (
        WIDTH_4B,
        VOCAB_4B,
        1,
    )
    assert result["global_valid_tokens"] == 2048
    record_property(
        "native_random_init_proxy_first_principles",
        math.log(VOCAB_4B) + WIDTH_4B * OUTPUT_INIT_STD**2 / 2,
    )
    record_property("native_random_init_proxy_wall_s", result["wall_s"])
    record_property("native_random_init_proxy_cpu_s", result["children_cpu_s"])
    golden("native_qwen3", "cpu", "step1_loss_random_4b_width", result["loss"])

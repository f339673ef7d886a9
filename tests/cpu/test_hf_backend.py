"""Tutorial config 1 (HF Transformers backend) on the cpu tier: parity with transformers, training, export.

The backend's logits are compared with ``AutoModelForCausalLM.from_pretrained``
on the same tokens in this process; ``recipes.hf_compat`` keeps transformers
as shipped (workaround 5), so the reference is transformers itself.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from harness.checks.preflight import PreflightError, preflight
from harness.declare.published import CLAIMS
from harness.options.run_options import RunOptions
from recipes.tiers import CPU, FIXTURES, REPO_ROOT

DENSE_DIR = FIXTURES / "qwen3-tiny"
MOE_DIR = FIXTURES / "qwen3-moe-tiny"
STEPS = 5  # the native recipe's shared run (tests/cpu/conftest.py) trains 5 steps too
MOE_STEPS = 3

#: Per-step losses and grad norms of the two recipes over the 5-step run: the backend
#: trains the tied model the native one does (an untied head would change every loss
#: from step 2 on and the grad norm from step 1, by > 1e-3). Measured: |Δ loss| ≤ 1.2e-7,
#: |Δ grad norm| ≤ 2.4e-7 (1 ulp each); 1e-6 is about 4× the larger. Step 1 is the same
#: safetensors on the same first batch through transformers' vs torchtitan's modules: the
#: same fp32 math, only summation order may differ (measured 0.0; 1e-6 is 8 fp32 ulps at 1.5).
TRAJECTORY_VS_NATIVE_ATOL = 1e-6
#: MoE: the backend swaps HF's experts for torchtitan's GroupedExperts, which compute
#: in bf16 (upstream design, not a workaround), so its logits are transformers' fp32
#: logits up to that rounding. Measured per position (2 × 256 corpus tokens): max |Δ logit|
#: median 0.0094, max 0.024 where routing is not near-tied; 0.05 is about 2× that max.
MOE_LOGITS_ATOL = 0.05
#: A position whose top-k router probability beats the next expert by less than this at
#: some layer (in transformers' fp32 run) may route differently after the bf16 experts
#: of the layer before: measured 2 of 512 positions, one of them flipped (|Δ logit| 0.41).
MOE_NEAR_TIE = 1e-4
#: At most this share of positions may be near-tied and left out of the logits comparison.
MOE_MAX_NEAR_TIED = 0.01


# --- helpers -------------------------------------------------------------------


def corpus_tokens(model_dir: Path, batch: int = 2, seq_len: int = CPU.seq_len) -> torch.Tensor:
    """The first ``batch × seq_len`` tokens of the fixture corpus, with the model's tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids: list[int] = []
    with (CPU.dataset_path / "train.jsonl").open() as corpus:
        for line in corpus:
            ids += tokenizer.encode(json.loads(line)["text"]).ids
            if len(ids) >= batch * seq_len:
                break
    return torch.tensor(ids[: batch * seq_len]).view(batch, seq_len)


def backend_model(model_dir: Path, weights_dir: Path | None = None):
    """The recipe's backend model for ``model_dir``, built as the trainer builds it, weights loaded.

    Weights come from ``weights_dir`` (default ``model_dir``) through the
    recipe's own state-dict adapter; no FSDP, fp32, eval mode.
    """
    from safetensors.torch import load_file
    from torchtitan.experiments.transformers_modeling_backend.moe_replacement import (
        build_and_swap_native_moe,
    )

    from recipes.hf_backend import hf_backend

    config = hf_backend(
        RunOptions(recipe="hf_backend", tier="cpu", model_dir=model_dir).resolved().recipe_inputs()
    )
    spec = config.model_spec
    spec.model.update_from_config(config=config)
    with torch.device("meta"):
        model = spec.model.build()
    if spec.model.is_moe:  # parallelize_hf_transformers' first step
        build_and_swap_native_moe(model, SimpleNamespace(ep_enabled=False, tp_enabled=False))
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    weights_dir = weights_dir or model_dir
    hf_state = {}
    for path in sorted(weights_dir.glob("*.safetensors")):
        hf_state.update(load_file(path))
    adapter = spec.state_dict_adapter(spec.model, str(weights_dir))
    model.load_state_dict(adapter.from_hf(hf_state), strict=True)
    return model.eval()


def transformers_logits(model_dir: Path, tokens: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    with torch.no_grad():
        return model(tokens).logits


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten()).item()


#: One rank of the recipe, in a process of its own: build the trainer exactly
#: as harness.rank.train does, train, and report whether embedding and head are one tensor.
TRAINER_PROBE = r"""
import json, os, socket, sys
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
from recipes import platform
platform.install("cpu")
import torch
from harness.options.run_options import RunOptions
from harness.config.build import build_config
from harness.base.run_dir import STEPS_FILE
from harness.rank.train import record_steps

opts = RunOptions.from_json(sys.argv[1])
opts.run_dir.mkdir(parents=True, exist_ok=True)
trainer = build_config(opts).build()
model = trainer.model_parts[0]
tied = lambda: model.tok_embeddings.weight is model.lm_head.weight
result = {"tied_after_build": tied()}
record_steps(trainer, opts.run_dir / STEPS_FILE)
trainer.train()
result["tied_after_step"] = tied()
result["losses"] = [json.loads(line)["loss"] for line in (opts.run_dir / STEPS_FILE).read_text().splitlines()]
trainer.close()
torch.distributed.destroy_process_group()
print("PROBE " + json.dumps(result))
"""


# --- shared runs -------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_run(hf_backend_hf_run):
    """2 processes, gloo, fixture weights, HF export published to an export dir (tests/cpu/conftest.py)."""
    return hf_backend_hf_run


@pytest.fixture(scope="module")
def hf_rerun(recipe_run):
    """The same run again, in new processes."""
    return recipe_run(
        "hf-backend-2proc-rerun",
        recipe="hf_backend",
        tier="cpu",
        nproc=2,
        steps=STEPS,
        init="hf",
        model_dir=DENSE_DIR,
        seed=0,
        export=False,
    )


@pytest.fixture(scope="module")
def moe_run(hf_backend_moe_run):
    return hf_backend_moe_run


@pytest.fixture(scope="module")
def random_init_probe(tmp_path_factory) -> dict:
    """One rank from random init, one optimizer step, inside the trainer."""
    from harness.launch.lifecycle import child_env

    opts = preflight(
        RunOptions(
            recipe="hf_backend",
            tier="cpu",
            nproc=1,
            steps=1,
            init="random",
            model_dir=DENSE_DIR,
            run_dir=tmp_path_factory.mktemp("hf-backend-random-probe"),
        )
    )
    out = subprocess.run(
        [sys.executable, "-c", TRAINER_PROBE, opts.to_json()],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=child_env(opts),
        timeout=600,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("PROBE ")]
    assert out.returncode == 0 and lines, out.stderr[-4000:]
    return json.loads(lines[-1].removeprefix("PROBE "))


@pytest.fixture(scope="module")
def dense_tokens() -> torch.Tensor:
    return corpus_tokens(DENSE_DIR)


# --- parity with transformers ------------------------------------------------------


def test_logits_equal_transformers_exactly_in_fp32(dense_tokens, record_property):
    """Fails on an unpatched backend: without workaround 1 RoPE runs on uninitialised memory."""
    expected = transformers_logits(DENSE_DIR, dense_tokens)
    with torch.no_grad():
        actual = backend_model(DENSE_DIR)(dense_tokens)
    diff = (actual - expected).abs().max().item()
    record_property("hf_backend_logits_max_abs_diff_fp32", diff)
    assert torch.equal(actual, expected), f"max abs diff {diff}"


def test_logits_match_transformers_in_bf16(dense_tokens, record_property):
    """bf16 parameters (what FSDP mixed precision computes with) vs ``from_pretrained(dtype=bf16)``.

    Tolerance: torch's bf16 defaults (rtol 1.6e-2, atol 1e-5), one bf16
    rounding; the buffers (RoPE ``inv_freq``) stay fp32 on both sides.
    """
    expected = transformers_logits(DENSE_DIR, dense_tokens, torch.bfloat16)
    model = backend_model(DENSE_DIR)
    for param in model.parameters():
        param.data = param.data.to(torch.bfloat16)
    with torch.no_grad():
        actual = model(dense_tokens)
    record_property(
        "hf_backend_logits_max_abs_diff_bf16",
        (actual.float() - expected.float()).abs().max().item(),
    )
    torch.testing.assert_close(actual, expected)


# --- training ---------------------------------------------------------------------------


def test_two_process_run_trains(hf_run, record_property):
    losses = hf_run["losses"]
    record_property("hf_backend_losses", losses)
    assert len(losses) == STEPS
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], f"loss did not decrease over {STEPS} steps: {losses}"


def test_step1_loss_matches_golden(hf_run, golden):
    golden(
        "hf_backend",
        "cpu",
        "step1_loss_hf",
        hf_run["losses"][0],
        reason="fixture checkpoint through the backend, 2 ranks × 2 × 256 tokens, seed 0: deterministic on the pinned cpu lock",
    )


@pytest.mark.slow
def test_step1_loss_is_far_below_random_init(hf_run, random_init_probe, record_property):
    pretrained, random = hf_run["losses"][0], random_init_probe["losses"][0]
    record_property("hf_backend_step1_loss_random", random)
    assert pretrained < random - 3.0, (pretrained, random)


# --- random init: every number in the main job's table, explained -------------------------------------

#: Variance of a normal truncated at ±3σ, in units of σ²: 1 − 2·3·φ(3) / (2Φ(3) − 1).
TRUNCATED_AT_3_SIGMA = 1 - 6 * math.exp(-4.5) / math.sqrt(2 * math.pi) / math.erf(3 / math.sqrt(2))
#: |predicted − measured| for the random-init step-1 loss. The prediction averages the label's
#: own logit to 0; over the 1,024 labels of a cpu step that average has std √(v/1024) ≈ 0.03,
#: so 0.1 is ~3σ. The explanation it checks moves the number by ln 2 = 0.69 (one vs two copies).
RANDOM_INIT_PREDICTION_ATOL = 0.1


def backend_random_model(model_dir: Path = DENSE_DIR, seed: int = 0, **options):
    """The recipe's backend model from the backend's own random init, built as the trainer does, one process."""
    from recipes.hf_backend import hf_backend

    config = hf_backend(
        RunOptions(recipe="hf_backend", tier="cpu", model_dir=model_dir, init="random", **options)
        .resolved()
        .recipe_inputs()
    )
    spec = config.model_spec
    spec.model.update_from_config(config=config)
    with torch.device("meta"):
        model = spec.model.build()
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return model.eval()


def tied_random_init_loss(hidden_size: int, vocab_size: int, cosine: float, copies: int) -> float:
    """First-principles step-1 CE of the backend's tied random init.

    Upstream's init (``_init_weights_patched`` in torchtitan's
    experiments/transformers_modeling_backend/model.py) draws the tied embedding = lm_head at
    std d^-1/2 truncated at ±3σ, so a row has ‖e‖² = d·σ²·0.973 = v = 0.973 and a logit
    e_j·n(h) (final RMSNorm: ‖n(h)‖² = d) has variance v. That gives ln V + v/2 only when the
    head is independent of h. It is not: h is the input token's own embedding plus what the
    layers add, so the input token's logit is s = cos(h, e_x)·√(v·d), about 11 at d = 128,
    and every one of the ``copies`` identical rows of that token scores it too:
    CE ≈ ln(copies·e^s + (V − copies)·e^{v/2}).
    """
    v = TRUNCATED_AT_3_SIGMA
    s = cosine * math.sqrt(v * hidden_size)
    return math.log(copies * math.exp(s) + (vocab_size - copies) * math.exp(v / 2))


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes, so equality is bitwise (-0.0 vs 0.0 and NaN payloads count)."""
    return t.detach().contiguous().view(torch.uint8)


def test_tied_head_draw_is_skipped_and_every_weight_stays_upstreams(monkeypatch, record_property):
    """Workaround 6 (``recipes.hf_compat.skip_tied_head_draw``) changes the init's time, not its values.

    The control is the same build with upstream's full pass (the head drawn, then tied away):
    every parameter and buffer bitwise equal, and the generator after init differs, which shows
    the skip ran (the two builds are not the same code twice).
    """
    from recipes import hf_compat

    skipped = backend_random_model()
    skipped_rng = torch.get_rng_state()
    monkeypatch.setattr(hf_compat, "head_draw_is_discarded", lambda model: False)
    drawn = backend_random_model()
    drawn_rng = torch.get_rng_state()

    assert not torch.equal(skipped_rng, drawn_rng), (
        "the head was drawn in both builds: the skip did not run"
    )
    hf = skipped.model
    assert hf.lm_head.weight is hf.get_input_embeddings().weight
    ours, upstream = skipped.state_dict(), drawn.state_dict()
    assert list(ours) == list(upstream)
    differing = [name for name in ours if not torch.equal(bits(ours[name]), bits(upstream[name]))]
    record_property("hf_backend_tied_head_skip_state_entries", len(ours))
    assert not differing, differing


@pytest.fixture(scope="module")
def tied_geometry(dense_tokens) -> dict:
    """cos(h, e_x) of the backend's random init on corpus tokens, and the untied control's CE."""
    model = backend_random_model()
    hf = model.model
    with torch.no_grad():
        hidden = hf.model(input_ids=dense_tokens).last_hidden_state
        head = hf.lm_head.weight
        cosine = F.cosine_similarity(hidden, head[dense_tokens], dim=-1).mean().item()
        untied = torch.empty_like(head)
        std = hf.config.hidden_size**-0.5
        torch.nn.init.trunc_normal_(untied, std=std, a=-3 * std, b=3 * std)
        untied_ce = next_token_loss(hidden @ untied.T, dense_tokens)
    return {
        "cosine": cosine,
        "untied_ce": untied_ce,
        "d": hf.config.hidden_size,
        "V": hf.config.vocab_size,
    }


@pytest.mark.slow
def test_random_init_step1_loss_is_explained_from_first_principles(
    tied_geometry, random_init_probe, hf_backend_random_run, record_property
):
    """The main job's 11.75 (2 ranks) and 11.08 (1 rank) vs the ~7.4 of ln V + d·σ²/2.

    Two causes, both measured: (1) the head is tied to the embedding and the tiny model's
    layers barely move h off the input token's own embedding (cos ≈ 0.99), so the input
    token's logit is ≈ √(v·d) ≈ 11 and dominates the softmax: a freshly drawn, untied head
    of the same init gives ln V + v/2 ≈ 7.42 on the same hidden states. (2) On the cpu tier
    with N ranks, FSDP shards each parameter N ways and every rank draws its shard from the
    same generator state: DTensor's random ops fall back to local ops on a cpu mesh
    (torch/distributed/tensor/_random.py ``is_rng_supported_mesh``: torch.cpu has no
    ``set_rng_state``), so each embedding row has N identical copies, all scoring ≈ 11:
    + ln N. At the real width neither matters: with d = 2560 the layers dominate h (measured
    cos(h, e_x) = 0.03 at one layer; see the 4B-width test), no logit dominates, and repeated
    rows leave ln V + v/2 unchanged. (Whether the Neuron generator gives DTensor distinct
    shards on trn2 is unverified; by the same argument it does not move the 12.43 claim.)
    """
    d, V, cosine = tied_geometry["d"], tied_geometry["V"], tied_geometry["cosine"]
    naive = math.log(V) + TRUNCATED_AT_3_SIGMA / 2
    one_rank, two_ranks = (tied_random_init_loss(d, V, cosine, copies) for copies in (1, 2))
    measured_1, measured_2 = random_init_probe["losses"][0], hf_backend_random_run["losses"][0]
    for name, value in dict(
        naive_ln_v_plus_half_v=naive,
        cosine_h_e_input=cosine,
        untied_head_ce=tied_geometry["untied_ce"],
        predicted_1_rank=one_rank,
        measured_1_rank=measured_1,
        predicted_2_ranks=two_ranks,
        measured_2_ranks=measured_2,
    ).items():
        record_property(f"hf_backend_random_init_{name}", value)
    # The naive formula is right for an independent head ...
    assert tied_geometry["untied_ce"] == pytest.approx(naive, abs=RANDOM_INIT_PREDICTION_ATOL)
    # ... but the recipe's head is the embedding, which h nearly equals in the tiny model.
    assert cosine > 0.9
    assert measured_1 == pytest.approx(one_rank, abs=RANDOM_INIT_PREDICTION_ATOL)
    assert measured_2 == pytest.approx(two_ranks, abs=RANDOM_INIT_PREDICTION_ATOL)
    # The row copies are what separates the two: one copy does not explain the 2-rank number.
    assert abs(measured_2 - one_rank) > 5 * RANDOM_INIT_PREDICTION_ATOL
    # Canary for cause (2): once torch's CPU generator can be offset per shard, the copies go away.
    assert not hasattr(torch.cpu, "set_rng_state"), (
        "DTensor random ops may now shard on cpu: re-derive the 2-rank value"
    )


@pytest.mark.xdist_group(
    "real-4b-width"
)  # one worker runs both real-width proxies: none waits on the lock
@pytest.mark.slow
def test_random_init_proxy_at_4b_width_one_layer_is_near_published_12_43(
    random_init_proxy, golden, record_property
):
    """A cpu PROXY of config 1's published random-init loss 12.43: near it, not a reproduction of it.

    Measured: step 1 of the Transformers backend from its own random init (tied head, std
    d^-1/2 truncated at 3 sigma) built from Qwen3-4B-Instruct-2507's config.json in fixtures/
    (no weights) with ONE layer, by the trainer from the recipe's own config function, scored
    forward-only (harness.rank.step1_forward, bitwise the trainer's step 1). Assumed, so that this
    number stands for the tutorial's:

    * depth does not matter: one layer, not 36 (a final RMSNorm gives ‖h‖² = d at any depth,
      so logits have variance v = 0.973 and CE ≈ ln V + v/2 = 12.418); at this width the input
      token's own tied logit is negligible (cos(h, e_x) = 0.03 at one layer), unlike the tiny
      model's (test_random_init_step1_loss_is_explained_from_first_principles);
    * the data does not matter beyond sampling noise: 2048 tokens of the fixture corpus through
      the cpu tier's 1,024-id tokenizer (random init loads nothing for it to disagree with),
      seed 0, not 64 × 2048 tokens of the tutorial's data and tokenizer;
    * neither do precision and placement: fp32 in one CPU process, not bf16 on 64 trn2 ranks.

    The tolerance is the golden's, 0.19: the mean's offset from 12.43 plus 3 sigma of this
    number's spread over init seeds with the batch fixed (measured n=20, seeds 0-19: mean 12.4087,
    sigma 0.0561; the reason states it). It tells 12.43 from ln V = 11.93 (a zero head), not
    12.418 from 12.43.
    """
    from harness.judge import goldens

    # The control, before the cost: a zero head scores ln V, which the tolerance must reject.
    entry = goldens.load("hf_backend", "cpu")[1]["step1_loss_random_4b_width"]
    assert abs(math.log(151936) - entry.value) > entry.tolerance, entry
    result = random_init_proxy("hf_backend")
    model = result["model"]
    assert (model["hidden_size"], model["vocab_size"], model["num_hidden_layers"]) == (
        2560,
        151936,
        1,
    )
    assert result["global_valid_tokens"] == 2048
    record_property(
        "hf_backend_random_init_proxy_first_principles", math.log(151936) + TRUNCATED_AT_3_SIGMA / 2
    )
    record_property("hf_backend_random_init_proxy_wall_s", result["wall_s"])
    record_property("hf_backend_random_init_proxy_cpu_s", result["children_cpu_s"])
    record_property("hf_backend_random_init_proxy_build_s", result["build_s"])
    record_property("hf_backend_random_init_proxy_score_s", result["score_s"])
    golden("hf_backend", "cpu", "step1_loss_random_4b_width", result["loss"])


@pytest.mark.slow
def test_same_seed_gives_identical_losses_in_new_processes(hf_run, hf_rerun):
    assert hf_rerun["losses"] == hf_run["losses"]


@pytest.mark.slow
def test_tied_embeddings_stay_tied(random_init_probe, hf_run, native_hf_run):
    """One tensor after the trainer's build and after an optimizer step; trains as the tied native model,
    from step 1 (same safetensors, same first batch: same loss) on."""
    assert random_init_probe["tied_after_build"] and random_init_probe["tied_after_step"], (
        random_init_probe
    )
    for backend, native in zip(hf_run["steps"], native_hf_run["steps"], strict=True):
        assert backend["loss"] == pytest.approx(native["loss"], abs=TRAJECTORY_VS_NATIVE_ATOL)
        assert backend["grad_norm"] == pytest.approx(
            native["grad_norm"], abs=TRAJECTORY_VS_NATIVE_ATOL
        )


# --- export --------------------------------------------------------------------------------


def test_export_reloads_with_only_the_tied_head_missing(hf_run, record_property):
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    export = Path(hf_run["export_dir"])
    state = {}
    for path in sorted(export.glob("*.safetensors")):
        state.update(load_file(path))
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(export))
    result = model.load_state_dict(state, strict=False)
    record_property("hf_backend_export_missing_keys", sorted(result.missing_keys))
    assert sorted(result.missing_keys) == CLAIMS["export_missing_keys"].value
    assert sorted(result.unexpected_keys) == CLAIMS["export_unexpected_keys"].value


def test_export_config_is_the_source_models(hf_run):
    source = json.loads((DENSE_DIR / "config.json").read_text())
    exported = json.loads((Path(hf_run["export_dir"]) / "config.json").read_text())
    assert exported == {**source, "dtype": "float32"}


def test_reloaded_logits_equal_trained_backend(hf_run, dense_tokens, record_property):
    """transformers on the export == the backend holding the trained weights, exactly (fp32 export)."""
    export = Path(hf_run["export_dir"])
    expected = transformers_logits(export, dense_tokens)
    with torch.no_grad():
        actual = backend_model(DENSE_DIR, weights_dir=export)(dense_tokens)
    record_property("hf_backend_export_logits_max_abs_diff", (actual - expected).abs().max().item())
    assert torch.equal(actual, expected)


# --- Qwen3-MoE --------------------------------------------------------------------------------


def test_moe_trains_two_processes_from_hf_weights(moe_run, record_property):
    losses = moe_run["losses"]
    record_property("hf_backend_moe_losses", losses)
    assert len(losses) == MOE_STEPS
    assert all(math.isfinite(x) for x in losses)
    # Loaded, not random: the fixture was trained to ~1.0; random init sits near ln 1024 = 6.93.
    assert losses[0] < 3.0, losses


def min_router_margin(router_logits, top_k: int) -> torch.Tensor:
    """Per position, the smallest (k-th − (k+1)-th) router probability over all layers."""
    margins = []
    for layer_logits in router_logits:
        probs = layer_logits.reshape(-1, layer_logits.shape[-1]).float().softmax(-1)
        ranked = probs.sort(-1, descending=True).values
        margins.append(ranked[:, top_k - 1] - ranked[:, top_k])
    return torch.stack(margins).amin(0)


def test_moe_backend_logits_match_transformers_on_hf_weights(record_property):
    """Every position's logits within bf16 expert rounding of transformers', except near-tied routes."""
    from transformers import AutoModelForCausalLM

    tokens = corpus_tokens(MOE_DIR)
    reference = AutoModelForCausalLM.from_pretrained(MOE_DIR, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = reference(tokens, output_router_logits=True)
        actual = backend_model(MOE_DIR)(tokens)
    per_position = (actual - expected.logits).abs().amax(-1).flatten()
    near_tied = (
        min_router_margin(expected.router_logits, reference.config.num_experts_per_tok)
        < MOE_NEAR_TIE
    )
    compared = per_position[~near_tied]
    record_property("hf_backend_moe_logits_max_abs_diff", per_position.max().item())
    record_property("hf_backend_moe_logits_max_abs_diff_not_near_tied", compared.max().item())
    record_property("hf_backend_moe_logits_median_abs_diff", per_position.median().item())
    record_property("hf_backend_moe_near_tied_positions", int(near_tied.sum()))
    record_property("hf_backend_moe_loss", next_token_loss(actual, tokens))
    record_property("transformers_moe_loss", next_token_loss(expected.logits, tokens))
    assert near_tied.float().mean().item() <= MOE_MAX_NEAR_TIED, (
        f"{int(near_tied.sum())} near-tied positions"
    )
    worst = compared.argmax().item()
    assert compared.max().item() <= MOE_LOGITS_ATOL, (
        f"max |Δ logit| {compared.max().item():.4g} at a position routed without a near tie (index {worst} of the kept ones)"
    )


def test_moe_export_reloads_into_transformers(moe_run):
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(moe_run["export_dir"], output_loading_info=True)
    assert sorted(info["missing_keys"]) == [] and sorted(info["unexpected_keys"]) == [], info


# --- bad input ---------------------------------------------------------------------------------


def hf_options(**overrides) -> RunOptions:
    return RunOptions(recipe="hf_backend", tier="cpu", nproc=2, **overrides)


def test_hub_id_is_refused_offline():
    with pytest.raises(PreflightError, match="offline") as refusal:
        preflight(hf_options(model_dir=Path("Qwen/Qwen3-4B-Instruct-2507")))
    assert "not a local directory" in str(refusal.value)


def test_no_model_dir_means_the_hub_id_and_is_refused_offline():
    from harness.checks.preflight import check_hf_model
    from recipes.hf_backend import HUB_ID

    opts = RunOptions(recipe="hf_backend", tier="trn2", model_dir=None)  # trn2 without QWEN3_4B_DIR
    with pytest.raises(PreflightError, match="QWEN3_4B_DIR") as refusal:
        check_hf_model(opts)
    assert HUB_ID in str(refusal.value) and "offline" in str(refusal.value)


def test_directory_without_config_json_is_refused(tmp_path):
    with pytest.raises(PreflightError, match="has no config.json"):
        preflight(hf_options(model_dir=tmp_path))


def test_directory_without_weights_is_refused(tmp_path):
    (tmp_path / "config.json").write_text((DENSE_DIR / "config.json").read_text())
    with pytest.raises(PreflightError, match=r"no \*\.safetensors"):
        preflight(hf_options(model_dir=tmp_path))


def test_non_qwen3_architecture_is_refused(tmp_path):
    config = json.loads((DENSE_DIR / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps({**config, "architectures": ["LlamaForCausalLM"]})
    )
    with pytest.raises(PreflightError, match="LlamaForCausalLM"):
        preflight(hf_options(model_dir=tmp_path, init="random"))


@pytest.mark.slow
def test_refusal_happens_before_any_rank_starts(tmp_path):
    """``python -m harness run hf_backend`` exits 2 with one message and launches nothing."""
    report_dir = tmp_path / "report"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "hf_backend",
            "--model-dir",
            "Qwen/Qwen3-4B-Instruct-2507",
            "--report-dir",
            str(report_dir),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "offline" in out.stderr, out.stderr
    assert not report_dir.exists()

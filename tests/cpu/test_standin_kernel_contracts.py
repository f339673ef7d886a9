"""The stand-in kernels refuse what the real nki-library kernels refuse (issue 45 item 4).

A rehearsal's kernel checks are worth something only if a call the real kernel would reject fails there
too: each input check of aws-neuron/nki-library's ``rope_hf``, ``moe_cte`` (shard_on_I) and
``blockwise_mm_bwd`` (shapes, dtypes, divisibility, packed row-major layout) is made by the stand-in
under rehearsal/standins/neuronx-cc/nkilib, cited there by path and line. Each case below breaks one
of them and expects the real kernel's kind of message (``kernel_assert``: ``[NCC_INKI016] Kernel
validation exception``); the suite's own launches (recipes/kernels/rope.py, grouped_experts.py) still
pass (tests/cpu/test_standin_device.py runs them). All calls run in one child whose sys.path names the
stand-ins' sources: this process never imports them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from recipes.tiers import REPO_ROOT

STANDINS = REPO_ROOT / "rehearsal" / "standins"
SOURCE_DIRS = [STANDINS / name for name in ("torch-neuronx", "neuronx-cc", "nki")]

pytestmark = pytest.mark.slow  # one child that imports torch and the stand-ins (about 5 s)

#: The real kernels' assertion text (nkilib/core/utils/kernel_assert.py).
KIND = "[NCC_INKI016] Kernel validation exception"

CASES = r"""
import json, os, traceback, torch
import torch_neuronx
from nkilib.core.embeddings.rope_hf import rope_hf
from nkilib.core.moe.moe_cte import moe_cte, MoECTESpec, MoECTEImplementation, ShardOnIConfig
from nkilib.core.moe.moe_cte.moe_cte import SkipMode
from nkilib.experimental.moe.bwd.blockwise_mm_backward import blockwise_mm_bwd
from nkilib.core.utils.common_types import ExpertAffinityScaleMode
from torch_neuronx.nki_hop import wrap_nki

results = {}

def outcome(name, call):
    try:
        call()
        results[name] = "ok"
    except AssertionError as e:
        results[name] = "AssertionError: " + str(e)
    except Exception as e:  # recorded, then compared: an unexpected error fails its expected outcome
        results[name] = f"{type(e).__name__}: {e}"

# --- rope_hf: q/k [B, heads, S, D], cos/sin [(B,) S, D] ---------------------------------------------
B, S, D = 1, 256, 32
def rope_args(**over):
    q = torch.randn(B, 4, S, D); k = torch.randn(B, 2, S, D)
    a = dict(q=q, k=k, q_out=torch.empty_like(q), k_out=torch.empty_like(k),
             cos=torch.randn(S, D), sin=torch.randn(S, D))
    a.update(over)
    return a
def rope(lnc=2, **over):
    return lambda: rope_hf[(lnc,)](**rope_args(**over))

outcome("rope_ok", rope())
outcome("rope_ok_cache", rope(cos=None, sin=None, rope_cache=torch.randn(B, S, 2 * D)))
noncontig_q = torch.randn(B, S, 4, D).transpose(1, 2)  # [B, heads, S, D] read through strides
outcome("rope_noncontiguous_q", rope(q=noncontig_q))
outcome("rope_noncontiguous_cos", rope(cos=torch.randn(D, S).t()))
outcome("rope_noncontiguous_q_out", rope(q_out=torch.empty(B, S, 4, D).transpose(1, 2)))
outcome("rope_q_3d", rope(q=torch.randn(4, S, D), q_out=torch.empty(4, S, D)))
outcome("rope_head_dim_mismatch", rope(k=torch.randn(B, 2, S, 16), k_out=torch.empty(B, 2, S, 16)))
outcome("rope_cache_width", rope(cos=None, sin=None, rope_cache=torch.randn(S, D)))
outcome("rope_cache_and_cos", rope(rope_cache=torch.randn(S, 2 * D)))
outcome("rope_no_tables", rope(cos=None, sin=None))
outcome("rope_cos_sin_shapes", rope(sin=torch.randn(2 * S, D)))
outcome("rope_cos_width", rope(cos=torch.randn(S, 16), sin=torch.randn(S, 16)))
outcome("rope_cos_batch", rope(cos=torch.randn(3, S, D), sin=torch.randn(3, S, D)))
outcome("rope_cos_too_short", rope(cos=torch.randn(128, D), sin=torch.randn(128, D)))
outcome("rope_seq_not_tiles", rope(lnc=2, q=torch.randn(B, 4, 128, D), k=torch.randn(B, 2, 128, D),
                                   q_out=torch.empty(B, 4, 128, D), k_out=torch.empty(B, 2, 128, D)))
outcome("rope_k_seq", rope(k=torch.randn(B, 2, 2 * S, D), k_out=torch.empty(B, 2, 2 * S, D)))
outcome("rope_q_out_shape", rope(q_out=torch.empty(B, 4, S, 2 * D)))
# through wrap_nki on the device: strict by default; QWEN3_STANDIN_WRAP_NKI_CONTIGUOUS=1 hands the kernel
# contiguous copies, as the public development copy's argument processor does with its prologue off
dev = {k: (v.to("neuron") if isinstance(v, torch.Tensor) else v) for k, v in rope_args(q=noncontig_q).items()}
outcome("rope_wrap_nki_noncontiguous_q", lambda: wrap_nki(rope_hf)[(2,)](**dev))

# --- moe_cte (shard_on_I, activations checkpointed) -------------------------------------------------
def moe_args(T=40, H=512, I=64, E=2, Bk=256, dtype=torch.bfloat16, **over):
    n_blocks = -(-T // Bk) + E
    ids = torch.full((n_blocks * Bk,), T, dtype=torch.int32)
    ids[:T // 2] = torch.arange(T // 2, dtype=torch.int32)
    ids[Bk:Bk + T - T // 2] = torch.arange(T // 2, T, dtype=torch.int32)
    b2e = torch.zeros(n_blocks, 1, dtype=torch.int32); b2e[1] = 1
    a = dict(hidden_states=torch.randn(T + 1, H, dtype=dtype),
             expert_affinities_masked=torch.ones((T + 1) * E, 1, dtype=dtype),
             gate_up_proj_weight=torch.randn(E, H, 2, I, dtype=dtype) * 0.05,
             down_proj_weight=torch.randn(E, I, H, dtype=dtype) * 0.05,
             token_position_to_id=ids, block_to_expert=b2e, block_size=Bk,
             spec=MoECTESpec(implementation=MoECTEImplementation.shard_on_i,
                             shard_on_I=ShardOnIConfig(checkpoint_activation=True)),
             expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE)
    a.update(over)
    return a
def moe(lnc=2, **kw):
    over = {k: v for k, v in kw.items() if k not in ("T", "H", "I", "E", "Bk", "dtype")}
    sizes = {k: v for k, v in kw.items() if k in ("T", "H", "I", "E", "Bk", "dtype")}
    return lambda: moe_cte[(lnc,)](**{**moe_args(**sizes), **over})

outcome("moe_ok", moe())
outcome("moe_block_256", moe(Bk=128))
outcome("moe_h_range", moe(H=256))
outcome("moe_h_psum", moe(H=768))
outcome("moe_i_16", moe(I=40))
outcome("moe_skip_weight", moe(skip_dma=SkipMode(False, True)))
outcome("moe_shards", moe(lnc=4))
outcome("moe_dtype", moe(gate_up_proj_weight=torch.randn(2, 512, 2, 64)))
outcome("moe_ids_int32", moe(token_position_to_id=torch.full((3 * 256,), 40, dtype=torch.int64)))
outcome("moe_affinity_shape", moe(expert_affinities_masked=torch.ones(41, 2, dtype=torch.bfloat16)))
outcome("moe_gate_up_layout", moe(gate_up_proj_weight=torch.randn(2, 2, 512, 64, dtype=torch.bfloat16)))
outcome("moe_down_shape", moe(down_proj_weight=torch.randn(2, 64, 256, dtype=torch.bfloat16)))
outcome("moe_ids_blocks", moe(token_position_to_id=torch.full((3 * 256 + 8,), 40, dtype=torch.int32)))
outcome("moe_block_to_expert_shape", moe(block_to_expert=torch.zeros(3, dtype=torch.int32)))
outcome("moe_noncontiguous_gate_up",
        moe(gate_up_proj_weight=torch.randn(2, 2, 64, 512, dtype=torch.bfloat16).permute(0, 3, 1, 2)))

# --- blockwise_mm_bwd -------------------------------------------------------------------------------
def bwd_args(H=512, I=64, Bk=256, **over):
    a = moe_args(H=H, I=I, Bk=Bk)
    n = a["block_to_expert"].shape[0]
    gu = torch.zeros(n, 2, I, Bk, dtype=torch.bfloat16)
    dn = torch.zeros(n, Bk, H, dtype=torch.bfloat16)
    b = dict(hidden_states=a["hidden_states"], expert_affinities_masked=a["expert_affinities_masked"],
             gate_up_proj_weight=a["gate_up_proj_weight"], down_proj_weight=a["down_proj_weight"],
             gate_up_proj_act_checkpoint_T=gu, down_proj_act_checkpoint=dn,
             token_position_to_id=a["token_position_to_id"], block_to_expert=a["block_to_expert"],
             output_hidden_states_grad=torch.randn_like(a["hidden_states"]), block_size=Bk)
    b.update(over)
    return b
def bwd(lnc=2, H=512, I=64, Bk=256, **over):
    return lambda: blockwise_mm_bwd[(lnc,)](**{**bwd_args(H=H, I=I, Bk=Bk), **over})

outcome("bwd_ok", bwd())
outcome("bwd_block", bwd(block_size=192))
outcome("bwd_i_even", bwd(I=33))
outcome("bwd_h_even", bwd(lnc=1, H=513))
outcome("bwd_h_shards", bwd(lnc=3, H=512))
outcome("bwd_h_32", bwd(lnc=2, H=544))
outcome("bwd_i_32", bwd(lnc=2, I=48))
outcome("bwd_grad_shape", bwd(output_hidden_states_grad=torch.randn(40, 512, dtype=torch.bfloat16)))
outcome("bwd_checkpoint_shape", bwd(gate_up_proj_act_checkpoint_T=torch.zeros(3, 2, 256, 64, dtype=torch.bfloat16)))
outcome("bwd_noncontiguous_grad",
        bwd(output_hidden_states_grad=torch.randn(512, 41, dtype=torch.bfloat16).t()))
print(json.dumps(results))
"""


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QWEN3_STANDIN_", "NEURON_"))}
    env.update(PYTHONPATH=os.pathsep.join(map(str, SOURCE_DIRS)), OMP_NUM_THREADS="1", **extra)
    env.pop("QWEN3_HIDE_NEURON_DEVICES", None)
    return env


def run_cases(**env: str) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CASES)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
        env=child_env(**env),
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def strict() -> dict[str, str]:
    """Every case with the stand-ins' switches at their defaults."""
    return run_cases()


def test_a_non_contiguous_q_fails_rope_hf_with_the_kernels_kind_of_message(strict):
    """The real rope_hf reads q through access patterns computed from its shape alone (packed row-major):
    a transposed view would be read as other elements. The stand-in refuses it, as kernel_assert words it."""
    got = strict["rope_noncontiguous_q"]
    assert got.startswith("AssertionError") and KIND in got and "q" in got, got
    assert "packed row-major" in got, got
    for name in ("rope_noncontiguous_cos", "rope_noncontiguous_q_out"):
        assert KIND in strict[name] and "packed row-major" in strict[name], strict[name]
    assert KIND in strict["rope_wrap_nki_noncontiguous_q"], strict["rope_wrap_nki_noncontiguous_q"]


def test_with_wrap_nki_making_inputs_contiguous_the_same_call_passes():
    """The switch's other side: wrap_nki hands the kernel packed copies (the public development copy does when its
    prologue is off); the kernel's own refusal of a non-contiguous tensor called directly stays."""
    got = run_cases(QWEN3_STANDIN_WRAP_NKI_CONTIGUOUS="1")
    assert got["rope_wrap_nki_noncontiguous_q"] == "ok", got["rope_wrap_nki_noncontiguous_q"]
    assert KIND in got["rope_noncontiguous_q"]


#: Each case that breaks one input check of the real kernel, and a word of the message it must give.
REFUSED = {
    "rope_q_3d": "4D tensors",
    "rope_head_dim_mismatch": "Head dim mismatch",
    "rope_cache_width": "head_dim*2",
    "rope_cache_and_cos": "got both",
    "rope_no_tables": "got none",
    "rope_cos_sin_shapes": "doesn't match shape of sin",
    "rope_cos_width": "Head dim mismatch",
    "rope_cos_batch": "batch size",
    "rope_cos_too_short": "smaller than q seq len",
    "rope_seq_not_tiles": "multiple of 128 * LNC=2",
    "rope_k_seq": "k",
    "rope_q_out_shape": "q_out",
    "moe_block_256": "multiple of 256",
    "moe_h_range": "between 512 and 8192",
    "moe_h_psum": "multiples of 512",
    "moe_i_16": "divisible by 16",
    "moe_skip_weight": "DMA weight skipping",
    "moe_shards": "unsupported NUM_SHARDS",
    "moe_dtype": "same floating point dtype",
    "moe_ids_int32": "int32",
    "moe_affinity_shape": "expert_affinities_masked",
    "moe_gate_up_layout": "gate_up_proj_weight",
    "moe_down_shape": "down_proj_weight",
    "moe_ids_blocks": "divisible by B",
    "moe_block_to_expert_shape": "block_to_expert",
    "moe_noncontiguous_gate_up": "packed row-major",
    "bwd_block": "block_size must be 128, 256, 512, or 1024",
    "bwd_i_even": "I_TP must be divisible by 2",
    "bwd_h_even": "H must be divisible by 2",
    "bwd_h_shards": "must be divisible by num_shards",
    "bwd_h_32": "H dim when sharded",
    "bwd_i_32": "I_TP dim when sharded",
    "bwd_grad_shape": "output_hidden_states_grad",
    "bwd_checkpoint_shape": "gate_up_proj_act_checkpoint_T",
    "bwd_noncontiguous_grad": "packed row-major",
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_each_input_check_of_the_real_kernel_refuses_a_bad_call(strict, case):
    got = strict[case]
    assert got.startswith("AssertionError") and KIND in got, got
    assert REFUSED[case] in got, got


def test_well_formed_calls_pass(strict):
    """Calls in the kernels' contract (the shapes the suite builds) are taken."""
    assert {
        k: strict[k] for k in ("rope_ok", "rope_ok_cache", "moe_ok", "bwd_ok")
    } == dict.fromkeys(("rope_ok", "rope_ok_cache", "moe_ok", "bwd_ok"), "ok")

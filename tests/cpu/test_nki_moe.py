"""Tutorial config 3 (NKI MoE) on the cpu tier, and kernel overrides inside real training runs."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from recipes.tiers import REPO_ROOT


@pytest.fixture(scope="module")
def moe_config():
    from recipes.nki_moe import qwen3_nki_moe_config

    return qwen3_nki_moe_config("30B-A3B", tier="cpu")


def test_config_is_the_tutorials_shrunk_30b_a3b(moe_config):
    from torchtitan.models.common.attention import ScaledDotProductAttention

    from recipes.kernels.grouped_experts import TrnGroupedExperts
    from recipes.kernels.rope import SlicedCosSinRoPE
    from recipes.nki_moe import KERNEL_OVERRIDES

    assert KERNEL_OVERRIDES == ("grouped_experts",)  # rope_hf is opt-in, not part of config 3
    layers = moe_config.model_spec.model.layers
    assert len(layers) == 4
    for layer in layers:
        assert layer.moe.num_experts == 64
        assert layer.moe.router.top_k == 4
        assert type(layer.moe.routed_experts.inner_experts) is TrnGroupedExperts.Config
        assert type(layer.attention.rope) is SlicedCosSinRoPE.Config  # "RoPE without gather"
        assert type(layer.attention.inner_attention) is ScaledDotProductAttention.Config
    assert moe_config.compile.enable is False
    assert moe_config.parallelism.tensor_parallel_degree == 1
    assert moe_config.parallelism.expert_parallel_degree == 1
    assert moe_config.parallelism.data_parallel_shard_degree == -1


def test_shrunk_moe_trains_on_two_processes(recipe_run, golden, record_property):
    run = recipe_run(
        "nki-moe-2proc", recipe="nki_moe", tier="cpu", nproc=2, steps=4, init="random", seed=0
    )
    losses = run["losses"]
    record_property("nki_moe_losses", losses)
    record_property("nki_moe_tokens_per_s", [s["tokens_per_s"] for s in run["steps"]])
    assert run["provenance"]["rope"] == {
        "torchtitan CosSinRoPE, sliced cache (positions dropped: no gather)": [0, 1, 2, 3]
    }
    assert run["provenance"]["rope_gather_ops"] == {
        "torchtitan CosSinRoPE, sliced cache (positions dropped: no gather)": []
    }
    # Config 3's grouped-experts kernel override replaced the experts of every layer.
    assert run["provenance"]["overrides"] == {
        "grouped_experts": [f"layers.{i}.moe.routed_experts.inner_experts" for i in range(4)]
    }
    golden(
        "nki_moe",
        "cpu",
        "step1_loss_random",
        losses[0],
        reason="torchtitan's random init, seed 0, 2 ranks × 2 × 256 tokens: deterministic on the pinned cpu lock",
    )
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], losses


@pytest.mark.slow
def test_rope_override_on_some_layers_leaves_training_bitwise_identical(
    recipe_run, record_property
):
    """The custom-op RoPE is CosSinRoPE's exact twin: swapping it in changes no loss bit."""
    common = dict(recipe="native_qwen3", tier="cpu", nproc=1, steps=3, init="hf", seed=7)
    stock = recipe_run("native-determinism-1", **common)
    swapped = recipe_run(
        "native-rope-hf-layer1", overrides=["rope_hf=layers.1.attention.rope"], **common
    )
    record_property("rope_override_losses", swapped["losses"])
    record_property("stock_losses", stock["losses"])
    record_property("rope_override_replaced", swapped["provenance"]["overrides"])
    # Identical losses alone cannot tell "applied" from "silently not applied": the run's
    # provenance names exactly the node the override replaced, and the stock run none.
    assert swapped["provenance"]["overrides"] == {"rope_hf": ["layers.1.attention.rope"]}
    assert stock["provenance"]["overrides"] == {}
    assert swapped["losses"] == stock["losses"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", "run", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )


@pytest.mark.parametrize("seq_len", [200, 384])
@pytest.mark.slow
def test_seq_len_guard_refuses_before_training(tmp_path, seq_len):
    out = run_cli(
        "nki_moe",
        "--tier",
        "cpu",
        "--seq-len",
        str(seq_len),
        "--override",
        "rope_hf",
        "--report-dir",
        str(tmp_path / "r"),
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert f"seq_len={seq_len} is not a multiple of 128×LNC=256 (LNC=2)" in out.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("seq_len", [256, 512])
def test_seq_len_guard_accepts_multiples_of_256(seq_len):
    config = build("nki_moe", seq_len=seq_len, overrides=["rope_hf"])
    assert config.training.seq_len == seq_len


def test_config3_without_rope_hf_takes_any_seq_len():
    """Config 3's own RoPE is torchtitan's: nkilib's 128 × LNC rule does not apply to it."""
    assert build("nki_moe", seq_len=200).training.seq_len == 200


def build(recipe: str, **options):
    from harness.checks.preflight import preflight
    from harness.config.build import build_config
    from harness.options.run_options import RunOptions

    return build_config(preflight(RunOptions(recipe=recipe, tier="cpu", init="random", **options)))


def test_user_rope_hf_glob_on_config3_replaces_exactly_those_layers(record_property):
    """The tutorial's rope_hf example, scoped, on config 3 (refused as matching nothing before)."""
    from recipes.kernels import rope_in_use
    from recipes.kernels.rope import NKIRoPE, SlicedCosSinRoPE

    config = build("nki_moe", overrides=["rope_hf=layers.[12].attention.rope"])
    types = [type(layer.attention.rope) for layer in config.model_spec.model.layers]
    assert types == [
        SlicedCosSinRoPE.Config,
        NKIRoPE.Config,
        NKIRoPE.Config,
        SlicedCosSinRoPE.Config,
    ]
    used = rope_in_use(config)
    record_property("nki_moe_rope_in_use", used)
    assert sorted(used.values()) == [[0, 3], [1, 2]]


@pytest.mark.slow
def test_override_glob_matching_nothing_is_refused_before_any_rank(tmp_path):
    out = run_cli(
        "native_qwen3",
        "--tier",
        "cpu",
        "--init",
        "random",
        "--override",
        "rope_hf=layers.1[0-9].attention.rope",
        "--report-dir",
        str(tmp_path / "r"),
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert (
        "glob 'layers.1[0-9].attention.rope' matched no node; the model has layers 0–1"
        in out.stderr
    )


# ---------------------------------------------------------------------------
# The trn2 MoE path without a device: shape guard, launches, no fallback
# ---------------------------------------------------------------------------

TUTORIAL_MOE = dict(dim=2048, hidden_dim=768, lnc=2, block_size=256)  # 30B-A3B's H and moe I


def test_tutorials_moe_passes_every_kernel_constraint():
    from harness.checks.kernels import check_moe_shapes
    from recipes.nki_moe import QWEN3_30B_A3B

    assert (QWEN3_30B_A3B.hidden_size, QWEN3_30B_A3B.moe_intermediate_size) == (2048, 768)
    check_moe_shapes(**TUTORIAL_MOE)
    check_moe_shapes(**{**TUTORIAL_MOE, "lnc": 1})


@pytest.mark.parametrize(
    "change, failing",
    [
        (dict(block_size=128), ["moe_cte needs block size % 256 == 0"]),
        (dict(block_size=768), ["blockwise_mm_bwd needs block size in {128, 256, 512, 1024}"]),
        (dict(dim=9216), ["moe_cte needs 512 <= H <= 8192"]),
        (dict(dim=2304), ["moe_cte needs H % 512 == 0"]),
        # I % 16 != 0 always breaks the backward's (I/LNC) % 32 as well
        (
            dict(hidden_dim=776),
            ["moe_cte needs I % 16 == 0", "blockwise_mm_bwd needs (I/LNC) % 32 == 0"],
        ),
        (dict(hidden_dim=784), ["blockwise_mm_bwd needs (I/LNC) % 32 == 0"]),
    ],
)
def test_moe_shape_guard_names_the_failing_constraint(change, failing):
    from harness.checks.errors import PreflightError
    from harness.checks.kernels import check_moe_shapes
    from recipes.kernels.grouped_experts import MoEShapeError, assert_moe_shapes

    with pytest.raises(PreflightError) as err:
        check_moe_shapes(**{**TUTORIAL_MOE, **change})
    message = str(err.value)
    assert all(rule in message for rule in failing), message
    assert message.count(" needs ") == len(failing), (
        message
    )  # only the failing constraints are named
    assert "aws-neuron/nki-library" in message and "drop the grouped_experts override" in message
    with pytest.raises(
        MoEShapeError
    ) as device:  # the kernel asserts the same rules, without the harness's fix
        assert_moe_shapes(**{**TUTORIAL_MOE, **change})
    assert str(device.value) in message and "override" not in str(device.value)


def test_moe_backward_h_constraint_depends_on_lnc():
    """H=512·k passes moe_cte; (H/LNC) % 32 only fails when the LNC split is odd: never for H % 512 == 0."""
    from recipes.kernels.grouped_experts import MOE_CONSTRAINTS, MoEShape

    (h_rule,) = [c for c in MOE_CONSTRAINTS if c.rule == "(H/LNC) % 32 == 0"]
    assert h_rule.holds(MoEShape(dim=2048, hidden_dim=768, block_size=256, lnc=2))
    assert not h_rule.holds(
        MoEShape(dim=2080, hidden_dim=768, block_size=256, lnc=2)
    )  # 1040 % 32 != 0
    assert h_rule.holds(MoEShape(dim=2080, hidden_dim=768, block_size=256, lnc=1))


class RecordingKernel:
    """Stands in for a ``wrap_nki`` kernel: records the grid and every positional tensor."""

    def __init__(self, result):
        self.result, self.grids, self.args, self.kwargs = result, [], [], []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self

    def __call__(self, *args, **kwargs):
        self.args.append(args)
        self.kwargs.append(kwargs)
        return self.result


def _tiny_blockwise_inputs():
    import torch

    from recipes.kernels.grouped_experts import blockwise_inputs

    g = torch.Generator().manual_seed(0)
    E, D, F = 4, 32, 48
    w1, w3 = torch.randn(E, F, D, generator=g), torch.randn(E, F, D, generator=g)
    w2 = torch.randn(E, D, F, generator=g)
    counts = torch.tensor([3, 0, 5, 2])
    x = torch.randn(int(counts.sum()), D, generator=g)
    return blockwise_inputs(x, counts, w1, w2, w3, block_size=16)


def test_moe_cte_launch_gets_contiguous_tensors_on_a_tuple_grid():
    from recipes.kernels.grouped_experts import launch_moe_cte

    inputs = _tiny_blockwise_inputs()
    assert not inputs.down.is_contiguous()  # w2 transposed: the layout change leaves a strided view
    kernel = RecordingKernel(result=("out", "gate_up_act_T", "down_act"))
    mode = object()
    result = launch_moe_cte(
        kernel,
        2,
        inputs.hidden,
        inputs.affinities,
        inputs.gate_up,
        inputs.down,
        inputs.token_position_to_id,
        inputs.block_to_expert,
        16,
        scaling_mode=mode,
    )
    assert result == ("out", "gate_up_act_T", "down_act")
    assert kernel.grids == [(2,)]
    (args,) = kernel.args
    assert all(t.is_contiguous() for t in args)
    # moe_cte's order: hidden, affinities, gate_up [E,H,2,I], down [E,I,H], token ids, block_to_expert
    assert [tuple(t.shape) for t in args] == [
        tuple(inputs.hidden.shape),
        tuple(inputs.affinities.shape),
        (4, 32, 2, 48),
        (4, 48, 32),
        tuple(inputs.token_position_to_id.shape),
        tuple(inputs.block_to_expert.shape),
    ]
    assert torch_equal(args[3], inputs.down)
    assert kernel.kwargs == [dict(block_size=16, expert_affinities_scaling_mode=mode)]


def test_every_constant_the_moe_launches_pass_through_wrap_nki_is_hashable():
    """torch_neuronx hashes every non-tensor argument of a wrap_nki call (recipes/kernels/kernel_op.py).

    moe_cte's own ``spec`` is a non-frozen @dataclass (unhashable): the launch passes none.
    """
    import enum

    import torch

    from recipes.kernels.grouped_experts import launch_blockwise_mm_bwd, launch_moe_cte

    class ScaleMode(enum.Enum):  # nkilib's ExpertAffinityScaleMode is an Enum
        POST_SCALE = 0

    inputs = _tiny_blockwise_inputs()
    moe_cte, bwd = RecordingKernel(result=None), RecordingKernel(result=None)
    launch_moe_cte(
        moe_cte,
        2,
        inputs.hidden,
        inputs.affinities,
        inputs.gate_up,
        inputs.down,
        inputs.token_position_to_id,
        inputs.block_to_expert,
        16,
        scaling_mode=ScaleMode.POST_SCALE,
    )
    n = inputs.block_to_expert.shape[0]
    launch_blockwise_mm_bwd(
        bwd,
        2,
        inputs.hidden,
        inputs.affinities,
        inputs.gate_up,
        inputs.down,
        torch.zeros(n, 2, 48, 16),
        torch.zeros(n, 16, 32),
        inputs.token_position_to_id,
        inputs.block_to_expert,
        torch.zeros_like(inputs.hidden),
        16,
    )
    for kernel in (moe_cte, bwd):
        (args,), (kwargs,) = kernel.args, kernel.kwargs
        constants = [a for a in args if not isinstance(a, torch.Tensor)] + list(kwargs.values())
        assert constants and all(hash(c) is not None for c in constants), constants


def test_an_unhashable_kernel_constant_is_refused_before_launch():
    from dataclasses import dataclass

    from recipes.kernels.kernel_op import require_hashable

    @dataclass
    class Spec:  # as nkilib's MoECTESpec: @dataclass, not frozen, so __hash__ is None
        implementation: int

    with pytest.raises(
        TypeError, match=r"moe_cte: the constant argument spec=Spec\(\.\.\.\) is not hashable"
    ):
        require_hashable("moe_cte", {"block_size": 256, "spec": Spec(1)})
    require_hashable("moe_cte", {"block_size": 256, "mode": None, "flag": True})


def test_moe_cte_kernel_takes_the_launchs_arguments_and_builds_its_spec_inside():
    """recipes/kernels/moe_cte_checkpointed.py imports nki (trn2 only): read, not imported, here."""
    import ast
    import inspect

    from recipes.kernels import grouped_experts

    tree = ast.parse((REPO_ROOT / "recipes" / "kernels" / "moe_cte_checkpointed.py").read_text())
    (kernel,) = [f for f in tree.body if isinstance(f, ast.FunctionDef)]
    assert [ast.unparse(d) for d in kernel.decorator_list] == ["nki.jit(mode='trace')"]
    assert [a.arg for a in kernel.args.args] == [
        "hidden_states",
        "expert_affinities_masked",
        "gate_up_proj_weight",
        "down_proj_weight",
        "token_position_to_id",
        "block_to_expert",
        "block_size",
        "expert_affinities_scaling_mode",
    ]
    launch = inspect.getsource(grouped_experts.launch_moe_cte)
    assert '"block_size": block_size, "expert_affinities_scaling_mode": scaling_mode' in launch
    (call,) = [
        n for n in ast.walk(kernel) if isinstance(n, ast.Call) and ast.unparse(n.func) == "moe_cte"
    ]
    assert {k.arg: ast.unparse(k.value) for k in call.keywords}["spec"] == "spec"
    built = [
        n
        for n in ast.walk(kernel)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "MoECTESpec"
    ]
    assert [ast.unparse(k) for k in built[0].keywords] == [
        "implementation=MoECTEImplementation.shard_on_i",
        "shard_on_I=ShardOnIConfig(checkpoint_activation=True, expert_affinity_multiply_on_I=False)",
    ]


def test_blockwise_mm_bwd_launch_order_and_contiguity():
    import torch

    from recipes.kernels.grouped_experts import launch_blockwise_mm_bwd

    inputs = _tiny_blockwise_inputs()
    n_blocks = inputs.block_to_expert.shape[0]
    gate_up_act_T = torch.zeros(n_blocks, 2, 48, 16)
    down_act = torch.zeros(n_blocks, 16, 32)
    grad_out = torch.ones(32, inputs.hidden.shape[0]).T  # strided, like a transposed upstream grad
    kernel = RecordingKernel(result=("d_hidden", "d_aff", "d_gate_up", "d_down"))
    result = launch_blockwise_mm_bwd(
        kernel,
        1,
        inputs.hidden,
        inputs.affinities,
        inputs.gate_up,
        inputs.down,
        gate_up_act_T,
        down_act,
        inputs.token_position_to_id,
        inputs.block_to_expert,
        grad_out,
        16,
    )
    assert result == ("d_hidden", "d_aff", "d_gate_up", "d_down")
    assert kernel.grids == [(1,)]
    (args,) = kernel.args
    assert all(t.is_contiguous() for t in args)
    assert [tuple(t.shape) for t in args[4:6]] == [(n_blocks, 2, 48, 16), (n_blocks, 16, 32)]
    assert torch_equal(args[8], grad_out)
    assert kernel.kwargs == [dict(block_size=16)]


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


def test_missing_nkilib_is_an_error_naming_it(monkeypatch):
    import sys

    from recipes.kernels import grouped_experts as ge

    monkeypatch.setitem(sys.modules, "nkilib", None)  # as on a machine without neuronx-cc
    ge._kernels.cache_clear()
    try:
        with pytest.raises(ge.NkiMissingError, match="needs nkilib and torch_neuronx"):
            ge._kernels()
    finally:
        ge._kernels.cache_clear()


def test_grouped_experts_refuse_devices_they_have_no_path_for():
    import torch
    from torchtitan.models.common.moe import GroupedExperts

    from recipes.kernels.grouped_experts import grouped_experts

    with torch.device("meta"):
        experts = grouped_experts(
            GroupedExperts.Config(dim=64, hidden_dim=96, num_experts=4)
        ).build()
        x = torch.empty(8, 64)
    with pytest.raises(RuntimeError, match="got meta"):
        experts(x, torch.tensor([2, 2, 2, 2]))

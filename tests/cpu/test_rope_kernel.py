"""Claim: the rope_hf custom op equals torchtitan's CosSinRoPE bit for bit on the cpu tier.

The published claim is "rope diff 0.0". On cpu the op's torch implementation
builds cos/sin from positions × inv_freq (no table gather) with CosSinRoPE's
operations in CosSinRoPE's order, so forward and backward must be *exactly*
equal, not merely close. The seq-len guard that protects nkilib's kernel
(seq_len % (128 × LNC) == 0) is checked on this tier too.
"""

from __future__ import annotations

import pytest
import torch
from torchtitan.models.common.rope import CosSinRoPE

from harness.checks.errors import PreflightError
from harness.checks.kernels import check_seq_len
from recipes.kernels import rope as rope_module
from recipes.kernels.rope import NKIRoPE, SeqLenError, assert_seq_len, rope_hf, rope_hf_op
from recipes.platform.neuron import LNCError

# Pinned: Qwen3 head_dim 128, theta 1e6, GQA 4 q heads / 2 kv heads, seq 256 (valid at LNC=2).
B, L, NQ, NKV, H = 2, 256, 4, 2, 128
SEED = 1234


def _rope_config(**kw) -> CosSinRoPE.Config:
    return CosSinRoPE.Config(dim=H, max_seq_len=4096, theta=1_000_000.0, **kw)


def _qk(dtype=torch.float32, seq_len=L):
    g = torch.Generator().manual_seed(SEED)
    q = torch.randn(B, seq_len, NQ, H, generator=g).to(dtype)
    k = torch.randn(B, seq_len, NKV, H, generator=g).to(dtype)
    return q, k


def _positions(kind: str, seq_len=L):
    """None (torchtitan's default prefix), one row shared by the batch, or one row per sample."""
    if kind == "default":
        return None
    g = torch.Generator().manual_seed(SEED + 1)
    rows = 1 if kind == "shared" else B
    return torch.randint(0, 4096, (rows, seq_len), generator=g)


@pytest.fixture
def lnc2(monkeypatch):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")


@pytest.fixture
def modules(lnc2):
    cfg = _rope_config()
    return cfg.build(), rope_hf(cfg).build()


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def test_override_builds_nkirope_with_same_fields():
    cfg = _rope_config()
    new = rope_hf(cfg)
    assert type(new) is NKIRoPE.Config
    assert (new.dim, new.max_seq_len, new.theta) == (cfg.dim, cfg.max_seq_len, cfg.theta)
    assert new.enforce_kernel_constraints is True


def test_published_rope_diff_in_float32(modules, golden):
    """The tutorial's number: rope_hf vs torchtitan's PyTorch RoPE, float32, max abs diff 0.0."""
    ref, new = modules
    q, k = _qk(torch.float32)
    q_ref, k_ref = ref(q, k, None)
    q_new, k_new = new(q, k, None)
    golden("nki_moe", "cpu", "rope_twin_q_max_abs_diff", _max_abs(q_new, q_ref))
    golden("nki_moe", "cpu", "rope_twin_k_max_abs_diff", _max_abs(k_new, k_ref))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("positions", ["default", "shared", "per_sample"])
def test_forward_equals_cossinrope_exactly(modules, dtype, positions, record_property):
    ref, new = modules
    q, k = _qk(dtype)
    pos = _positions(positions)
    q_ref, k_ref = ref(q, k, pos)
    q_new, k_new = new(q, k, pos)
    q_diff, k_diff = _max_abs(q_new, q_ref), _max_abs(k_new, k_ref)
    record_property("rope_q_max_abs_diff", q_diff)
    record_property("rope_k_max_abs_diff", k_diff)
    assert q_new.dtype == dtype and k_new.dtype == dtype
    assert q_diff == 0.0 and k_diff == 0.0
    assert torch.equal(q_new, q_ref) and torch.equal(k_new, k_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("positions", ["default", "per_sample"])
def test_backward_equals_cossinrope_exactly(modules, dtype, positions, record_property):
    ref, new = modules
    q, k = _qk(dtype)
    pos = _positions(positions)
    g = torch.Generator().manual_seed(SEED + 2)
    grad_q = torch.randn(q.shape, generator=g).to(dtype)
    grad_k = torch.randn(k.shape, generator=g).to(dtype)

    grads = []
    for module in (ref, new):
        q_in, k_in = q.clone().requires_grad_(), k.clone().requires_grad_()
        q_out, k_out = module(q_in, k_in, pos)
        torch.autograd.backward((q_out, k_out), (grad_q, grad_k))
        grads.append((q_in.grad, k_in.grad))
    (dq_ref, dk_ref), (dq_new, dk_new) = grads
    dq_diff, dk_diff = _max_abs(dq_new, dq_ref), _max_abs(dk_new, dk_ref)
    record_property("rope_dq_max_abs_diff", dq_diff)
    record_property("rope_dk_max_abs_diff", dk_diff)
    assert dq_diff == 0.0 and dk_diff == 0.0
    assert torch.equal(dq_new, dq_ref) and torch.equal(dk_new, dk_ref)


def _small_fp64_inputs():
    """A small fp64 case: gradcheck's finite differences need fp64 and few elements."""
    g = torch.Generator().manual_seed(SEED)
    q = torch.randn(2, 8, 2, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 8, 1, 8, generator=g, dtype=torch.float64, requires_grad=True)
    positions = torch.randint(0, 64, (2, 8), generator=g)
    inv_freq = 1.0 / (10_000.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    return q, k, positions, inv_freq


@pytest.mark.parametrize("backward", [False, True], ids=["rotation", "transposed"])
def test_gradcheck_and_gradgradcheck_fp64(backward):
    q, k, positions, inv_freq = _small_fp64_inputs()

    def op(q, k):
        return rope_hf_op(q, k, positions, inv_freq, backward)

    assert torch.autograd.gradcheck(op, (q, k))
    assert torch.autograd.gradgradcheck(op, (q, k))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("backward", [False, True], ids=["rotation", "transposed"])
def test_opcheck(dtype, backward):
    q, k, positions, inv_freq = _small_fp64_inputs()
    q = q.detach().to(dtype).requires_grad_()
    k = k.detach().to(dtype).requires_grad_()
    torch.library.opcheck(rope_hf_op.op, (q, k, positions, inv_freq.float(), backward))


# ---------------------------------------------------------------------------
# The seq-len guard: seq_len % (128 × LNC) == 0, checked before the kernel
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "seq_len, suggestion",
    [(200, "use 256."), (384, "use 256 or 512."), (100, "use 256."), (513, "use 512 or 768.")],
)
def test_check_seq_len_rejects_with_the_fix(seq_len, suggestion):
    with pytest.raises(PreflightError) as err:
        check_seq_len(seq_len, 2)
    message = str(err.value)
    assert f"seq_len={seq_len} is not a multiple of 128×LNC=256 (LNC=2)" in message
    assert suggestion in message
    assert "training.seq_len" in message and "NEURON_LOGICAL_NC_CONFIG=1" in message


@pytest.mark.parametrize("seq_len", [256, 512, 2048])
def test_check_seq_len_accepts_multiples(seq_len):
    check_seq_len(seq_len, 2)


def test_lnc1_needs_multiples_of_128():
    check_seq_len(384, 1)
    with pytest.raises(
        PreflightError,
        match=r"seq_len=200 is not a multiple of 128×LNC=128 \(LNC=1\); use 128 or 256",
    ):
        check_seq_len(200, 1)


def test_check_seq_len_refuses_unsupported_lnc():
    with pytest.raises(PreflightError, match="NEURON_LOGICAL_NC_CONFIG"):
        check_seq_len(256, 4)


@pytest.mark.parametrize("seq_len, lnc", [(200, 2), (384, 2), (200, 1), (0, 1)])
def test_the_kernel_asserts_only_what_rope_hf_asserts(seq_len, lnc):
    """The kernel's own check is the device's rule; the fix (which flag to change) is the harness's refusal."""
    with pytest.raises(SeqLenError) as err:
        assert_seq_len(seq_len, lnc)
    assert str(err.value) == (
        f"seq_len={seq_len} is not a multiple of 128×LNC={128 * lnc} (LNC={lnc}): "
        "nkilib's rope_hf asserts S % (128 * LNC) == 0"
    )
    assert_seq_len(128 * lnc * 3, lnc)
    with pytest.raises(LNCError):
        assert_seq_len(256, 4)


@pytest.mark.parametrize("seq_len", [200, 384])
def test_module_guard_fires_before_the_op(modules, monkeypatch, seq_len):
    _, new = modules

    def must_not_run(*args, **kwargs):
        raise AssertionError("the op was called before the seq-len check")

    monkeypatch.setattr(rope_module, "rope_hf_op", must_not_run)
    q, k = _qk(seq_len=seq_len)
    with pytest.raises(SeqLenError, match=f"seq_len={seq_len} is not a multiple of 128×LNC=256"):
        new(q, k)


@pytest.mark.parametrize("seq_len", [256, 512])
def test_module_guard_passes_valid_lengths(modules, seq_len):
    ref, new = modules
    q, k = _qk(seq_len=seq_len)
    assert all(torch.equal(a, b) for a, b in zip(new(q, k), ref(q, k)))


@pytest.mark.parametrize("value", ["3", "0", "two", "4"])
def test_bad_lnc_env_raises(monkeypatch, value):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", value)
    new = rope_hf(_rope_config()).build()
    q, k = _qk()
    with pytest.raises(LNCError, match="NEURON_LOGICAL_NC_CONFIG"):
        new(q, k)


def test_guard_can_be_relaxed_off_device(lnc2):
    """With enforcement off, the torch path accepts any length (and still equals CosSinRoPE)."""
    cfg = _rope_config()
    ref = cfg.build()
    new = NKIRoPE.Config(
        dim=H, max_seq_len=4096, theta=1_000_000.0, enforce_kernel_constraints=False
    ).build()
    q, k = _qk(seq_len=200)
    assert all(torch.equal(a, b) for a, b in zip(new(q, k), ref(q, k)))


# ---------------------------------------------------------------------------
# The device path's launch, with a recording stand-in for the wrapped kernel
# ---------------------------------------------------------------------------


class RecordingRopeKernel:
    """Stands in for ``wrap_nki(rope_hf)``: records the grid and what each call receives."""

    def __init__(self):
        self.grids, self.calls = [], []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self

    def __call__(self, q, k, q_out, k_out, *, cos, sin, backward):
        self.calls.append(dict(tensors=[q, k, q_out, k_out, cos, sin], backward=backward))
        return q_out.copy_(q), k_out.copy_(k)  # identity: enough to check the layout round trip


def test_device_path_hands_rope_hf_contiguous_tensors_on_a_tuple_grid(lnc2, monkeypatch):
    kernel = RecordingRopeKernel()
    monkeypatch.setattr(rope_module, "_rope_hf_kernel", lambda: kernel)
    q, k = _qk()
    q_strided, k_strided = q.transpose(0, 1).contiguous().transpose(0, 1), k[:, :, :, :]
    assert not q_strided.is_contiguous()  # the precondition that makes this test able to fail
    inv_freq = rope_hf(_rope_config()).build().inv_freq
    q_out, k_out = rope_module._rope_nki(
        q_strided, k_strided, _positions("shared"), inv_freq, False
    )

    assert kernel.grids == [(2,)]
    (call,) = kernel.calls
    assert all(t.is_contiguous() for t in call["tensors"])
    q_in, k_in, _, _, cos, sin = call["tensors"]
    assert q_in.shape == (B, NQ, L, H) and k_in.shape == (
        B,
        NKV,
        L,
        H,
    )  # kernel layout [B, heads, S, D]
    assert (
        cos.shape == sin.shape == (L, H) and cos.dtype == q_in.dtype
    )  # shared positions: [S, D], q's dtype
    torch.testing.assert_close(q_out, q, rtol=0, atol=0)
    torch.testing.assert_close(k_out, k, rtol=0, atol=0)


# ---------------------------------------------------------------------------
# Config 3's RoPE: torchtitan's sliced-cache path, no gather
# ---------------------------------------------------------------------------

GATHER_OPS = {
    "aten.gather.default",
    "aten.index.Tensor",
    "aten.index_select.default",
    "aten.take_along_dim.default",
}


def _aten_ops(fn) -> set[str]:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(str(func))
            return func(*args, **(kwargs or {}))

    with Record() as mode:
        fn()
    return mode.ops


@pytest.fixture(scope="module")
def config3_rope():
    from recipes.nki_moe import qwen3_nki_moe_config

    config = qwen3_nki_moe_config("30B-A3B", tier="cpu")
    return config.model_spec.model.layers[0].attention.rope


def test_config3_rope_runs_no_gather_although_the_dataloader_passes_positions(
    config3_rope, record_property
):
    """torchtitan's text dataloader always yields per-document positions; config 3 must not gather them."""
    from recipes.kernels.rope import SlicedCosSinRoPE

    assert type(config3_rope) is SlicedCosSinRoPE.Config
    sliced = config3_rope.build()
    stock = CosSinRoPE.Config(
        **{f: getattr(config3_rope, f) for f in ("dim", "max_seq_len", "theta")}
    ).build()
    q, k = _qk(seq_len=L)
    q, k = q[..., : config3_rope.dim], k[..., : config3_rope.dim]
    per_doc = torch.cat([torch.arange(100), torch.arange(L - 100)]).expand(
        B, L
    )  # two documents per row

    ops = _aten_ops(lambda: sliced(q, k, per_doc))
    stock_ops = _aten_ops(lambda: stock(q, k, per_doc))
    record_property("config3_rope_aten_ops", sorted(ops))
    assert not ops & GATHER_OPS, sorted(ops & GATHER_OPS)
    assert "aten.slice.Tensor" in ops
    assert stock_ops & GATHER_OPS  # control: the same call through stock CosSinRoPE gathers
    # and it is exactly the stock slice path (positions None): rotation by 0..L-1
    for ours, theirs in zip(sliced(q, k, per_doc), stock(q, k, None)):
        assert torch.equal(ours, theirs)


def test_rope_hf_on_config3_keeps_config3_positions(config3_rope, lnc2):
    """rope_hf swapped into config 3 also rotates by 0..L-1, so only the kernel changes."""
    swapped = rope_hf(config3_rope)
    assert type(swapped) is NKIRoPE.Config and swapped.drop_positions
    q, k = _qk()
    q, k = q[..., : config3_rope.dim], k[..., : config3_rope.dim]
    per_doc = torch.cat([torch.arange(100), torch.arange(L - 100)]).expand(B, L)
    ours = swapped.build()(q, k, per_doc)
    theirs = config3_rope.build()(q, k, per_doc)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
    assert not rope_hf(_rope_config()).drop_positions  # stock CosSinRoPE keeps its positions

"""The kernels' custom ops: defined on first use, as torch_neuronx's nki_op where torch_neuronx is loaded.

Each case runs in a fresh interpreter (an op name can be defined once per process).
Where torch_neuronx is needed, a stand-in package written here provides
``torch_neuronx.nki_hop.nki_op`` with the public contract (a custom op whose fake is
the body), recording how it was called: what is under test is which constructor the
suite picks and that the op it gets computes and differentiates as on the cpu tier.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from recipes.kernels.kernel_op import CUSTOM_OP, NKI_OP
from recipes.tiers import REPO_ROOT

STAND_IN_NKI_HOP = textwrap.dedent("""
    import torch

    CALLS = []


    def nki_op(name, fn=None, mutates_args={}):
        CALLS.append([name, list(mutates_args)])
        op = torch.library.custom_op(name, fn, mutates_args=mutates_args)
        op.register_fake(fn)
        return op
""")

PROBE = textwrap.dedent("""
    import json, sys
    import torch
    {preload}
    import recipes.kernels.grouped_experts as ge
    import recipes.kernels.rope as rope
    defined_at_import = hasattr(torch.ops.qwen3_trn_repro, "rope_hf")
    neuronx_at_import = "torch_neuronx" in sys.modules and not hasattr(sys.modules["torch_neuronx"], "STAND_IN")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, 2, 16, generator=g, requires_grad=True)
    k = torch.randn(1, 8, 1, 16, generator=g, requires_grad=True)
    positions = torch.arange(8).unsqueeze(0)
    inv_freq = 1.0 / (10_000.0 ** (torch.arange(0, 16, 2).float() / 16))
    q_out, k_out = rope.rope_hf_op(q, k, positions, inv_freq)
    (q_out.sum() + k_out.square().sum()).backward()
    try:
        rope.rope_hf_op.require_nki_op()
        refusal = None
    except RuntimeError as e:
        refusal = str(e)
    nki_hop = sys.modules.get("torch_neuronx.nki_hop")
    print(json.dumps({{
        "defined_at_import": defined_at_import,
        "torch_neuronx_imported_by_recipes": neuronx_at_import,
        "flavour": rope.rope_hf_op.flavour,
        "moe_flavour": ge.moe_blockwise_op.flavour,
        "registered": hasattr(torch.ops.qwen3_trn_repro, "rope_hf"),
        "nki_op_calls": getattr(nki_hop, "CALLS", None),
        "q_out": q_out.detach().flatten().tolist(), "dq": q.grad.flatten().tolist(), "dk": k.grad.flatten().tolist(),
        "refusal": refusal,
    }}))
""")


def probe(tmp_path: Path, preload: str = "") -> dict:
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO_ROOT}"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(preload=preload)],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


@pytest.fixture
def stand_in_torch_neuronx(tmp_path) -> str:
    package = tmp_path / "torch_neuronx"
    package.mkdir()
    (package / "__init__.py").write_text("STAND_IN = True\n")
    (package / "nki_hop.py").write_text(STAND_IN_NKI_HOP)
    return (
        "import torch_neuronx  # as recipes.platform.neuron.install does, before any model is built"
    )


@pytest.mark.slow
def test_on_cpu_the_op_is_a_torch_custom_op_defined_on_first_use(tmp_path):
    result = probe(tmp_path)
    assert result["defined_at_import"] is False, (
        "importing recipes must define no op (and import no torch_neuronx)"
    )
    assert result["torch_neuronx_imported_by_recipes"] is False
    assert (result["flavour"], result["registered"]) == (CUSTOM_OP, True)
    assert result["moe_flavour"] is None, "an op nothing called is not defined"
    assert result["nki_op_calls"] is None
    assert result["refusal"].startswith(f"qwen3_trn_repro::rope_hf was defined as {CUSTOM_OP}")


@pytest.mark.slow
def test_where_torch_neuronx_is_loaded_the_op_is_its_nki_op_and_computes_the_same(
    tmp_path, stand_in_torch_neuronx
):
    on_cpu = probe(tmp_path)
    with_neuronx = probe(tmp_path, preload=stand_in_torch_neuronx)
    assert with_neuronx["flavour"] == NKI_OP
    assert with_neuronx["nki_op_calls"] == [["qwen3_trn_repro::rope_hf", []]]
    assert with_neuronx["refusal"] is None
    for key in ("q_out", "dq", "dk"):  # same body, same autograd: bitwise the same on cpu tensors
        assert with_neuronx[key] == on_cpu[key], key

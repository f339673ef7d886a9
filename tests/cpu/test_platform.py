"""recipes/platform: each cpu shim patch is still needed (canaries), and Neuron detection is precise.

A canary here fails when upstream fixes what the patch works around: delete the
patch (and the canary) then.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from recipes.platform import neuron
from recipes.tiers import REPO_ROOT

pytestmark = pytest.mark.cpu


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
    )


def test_canary_torchtitan_still_defaults_to_cuda_without_an_accelerator():
    """Upstream: tools.utils.get_device_info falls back to "cuda"; the shim sets "cpu"."""
    out = run_python("import torchtitan.tools.utils as u; print(u.device_type)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cuda"


def test_canary_gloo_still_rejects_premul_sum():
    """Upstream: FSDP2 reduce-scatters with PREMUL_SUM after divide factor 1.0; gloo lacks it."""
    out = run_python(
        """
        import os, torch, torch.distributed as dist
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK="0", WORLD_SIZE="1")
        store = dist.HashStore()
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        op = dist._make_nccl_premul_sum(0.5)
        out = torch.zeros(4)
        try:
            dist.reduce_scatter_tensor(out, torch.ones(4), op=op)
            print("SUPPORTED")
        except Exception as e:
            print("REJECTED", type(e).__name__, e)
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("REJECTED"), out.stdout


def test_shim_points_every_device_copy_at_cpu():
    out = run_python(
        """
        from recipes.platform import install
        install("cpu")
        import importlib
        from recipes.platform.cpu import _DEVICE_COPIES
        for name in _DEVICE_COPIES:
            m = importlib.import_module(name)
            print(name, getattr(m, "device_type", "cpu"), getattr(m, "device_module", None).__name__ if hasattr(m, "device_module") else "-")
        from torchtitan.tools.utils import get_local_device
        print("local", get_local_device())
        """
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "local cpu"
    for line in lines[:-1]:
        name, device_type, module = line.split()
        assert device_type == "cpu", line
        assert module in ("CpuDeviceModule", "-"), line


def test_shim_forces_sum_reduction_when_divide_factor_is_set():
    out = run_python(
        """
        import torch, torch.distributed as dist
        from recipes.platform import install
        install("cpu")
        from torch.distributed.fsdp import fully_shard
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        model = fully_shard(torch.nn.Linear(4, 4))
        groups = model._get_fsdp_state()._fsdp_param_groups
        print([g.force_sum_reduction_for_comms for g in groups])
        model.set_gradient_divide_factor(1.0)
        print([g.force_sum_reduction_for_comms for g in groups])
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[False]", "[True]"]


def test_neuron_status_names_what_is_missing():
    status = neuron.neuron_status(("torch_neuronx", "nkilib"))
    assert not status.ready
    reason = status.reason()
    assert "no Neuron device" in reason
    assert "torch_neuronx" in reason and "nkilib" in reason


@pytest.mark.parametrize("value, expected", [(None, 2), ("1", 1), ("2", 2)])
def test_logical_neuron_cores(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    else:
        monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", value)
    assert neuron.logical_neuron_cores() == expected


@pytest.mark.parametrize("value", ["0", "3", "4", "two"])
def test_bad_logical_neuron_cores_is_refused(monkeypatch, value):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", value)
    with pytest.raises(neuron.LNCError, match="NEURON_LOGICAL_NC_CONFIG"):
        neuron.logical_neuron_cores()


def test_xdist_workers_get_disjoint_neuron_cores():
    slices = [neuron.parse_visible_cores(neuron.worker_cores(w, 4, 64)) for w in range(4)]
    assert [len(s) for s in slices] == [16, 16, 16, 16]
    assert sorted(c for s in slices for c in s) == list(range(64))
    assert neuron.worker_cores(3, 64, 64) == "3"
    with pytest.raises(ValueError, match="cannot each get a NeuronCore"):
        neuron.worker_cores(0, 65, 64)


def test_a_64_rank_job_refuses_a_core_slice():
    from recipes.preflight import PreflightError, check_visible_cores

    check_visible_cores(64, None)
    check_visible_cores(1, "5")
    check_visible_cores(16, "0-15")
    with pytest.raises(PreflightError, match="64 ranks need 64 NeuronCores but NEURON_RT_VISIBLE_CORES=0-15 leaves 16"):
        check_visible_cores(64, "0-15")


def test_canary_torchtitan_still_rejects_sdpa_for_language_models():
    """Upstream: 0.3.0 refuses model_registry(..., attn_backend="sdpa"); recipes.specs wires SDPA itself."""
    from torchtitan.models.qwen3 import model_registry

    with pytest.raises(ValueError, match="sdpa is no longer supported"):
        model_registry("4B", attn_backend="sdpa")

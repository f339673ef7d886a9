"""recipes/platform: each cpu shim patch is still needed (canaries), and Neuron detection is precise.

A canary here fails when upstream fixes what the patch works around: delete the
patch (and the canary) then.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from recipes.platform import neuron
from recipes.tiers import REPO_ROOT


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
    )


@pytest.mark.slow
def test_canary_torchtitan_still_defaults_to_cuda_without_an_accelerator():
    """Upstream: tools.utils.get_device_info falls back to "cuda"; the shim sets "cpu"."""
    out = run_python("import torchtitan.tools.utils as u; print(u.device_type)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cuda"


@pytest.mark.slow
def test_neuron_install_repoints_a_torchtitan_imported_before_torch_neuronx():
    """``torchrun -m torchtitan.train --module recipes.native_qwen3`` with TORCH_DEVICE_BACKEND_AUTOLOAD=0: torchtitan
    fixed "cuda" before the config function's ``install``; once a "neuron" PrivateUse1 backend is registered (as
    ``import torch_neuronx`` does; here torch's own registration calls, no Neuron package), every copy says "neuron"."""
    out = run_python(
        """
        import importlib, types, torch
        from recipes.platform.device_copies import DEVICE_COPIES
        copies = [importlib.import_module(name) for name in DEVICE_COPIES]
        print("before", sorted({getattr(m, "device_type", "-") for m in copies} - {"-"}))
        torch.utils.rename_privateuse1_backend("neuron")
        torch._register_device_module("neuron", types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1))
        from recipes.platform.neuron import point_torchtitan_at_neuron
        point_torchtitan_at_neuron()
        print("after", sorted({getattr(m, "device_type", "-") for m in copies} - {"-"}),
              sorted({type(m.device_module).__name__ for m in copies if hasattr(m, "device_module")}))
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["before ['cuda']", "after ['neuron'] ['SimpleNamespace']"]


@pytest.mark.slow
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
        except RuntimeError as e:  # anything else fails the run, with its traceback
            print("REJECTED", type(e).__name__, e)
        """
    )
    assert out.returncode == 0, out.stderr
    # The specific refusal the shim works around, not any error (torch 2.14: c10d's gloo backend).
    assert out.stdout.startswith(
        "REJECTED RuntimeError Cannot use ReduceOp.PREMUL_SUM with Gloo"
    ), out.stdout


@pytest.mark.slow
def test_shim_points_every_device_copy_at_cpu():
    out = run_python(
        """
        from recipes.platform import install
        install("cpu")
        import importlib
        from recipes.platform.device_copies import DEVICE_COPIES
        for name in DEVICE_COPIES:
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


@pytest.mark.slow
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


def test_a_user_set_visible_cores_is_refused_for_every_multi_rank_job():
    """torchrun hands each rank the same NEURON_RT_VISIBLE_CORES: every rank would claim the same cores."""
    from harness.checks.preflight import PreflightError, check_visible_cores

    check_visible_cores(64, None)
    check_visible_cores(1, "5")
    check_visible_cores(1, "0-15")
    for nproc, visible in ((64, "0-15"), (16, "0-15"), (2, "0-63")):
        with pytest.raises(PreflightError) as err:
            check_visible_cores(nproc, visible)
        assert f"NEURON_RT_VISIBLE_CORES={visible} is set" in str(err.value)
        assert f"each of the {nproc} ranks" in str(err.value)
    with pytest.raises(PreflightError, match="'3-1' is not a core index or an inclusive range"):
        check_visible_cores(1, "3-1")


def test_trn2_without_a_dataset_is_refused_before_launch(monkeypatch, tmp_path):
    from harness.checks.preflight import PreflightError, check_trn2_dataset, preflight
    from harness.options.run_options import RunOptions
    from recipes.tiers import TRN2

    check_trn2_dataset(RunOptions(recipe="native_qwen3", tier="trn2", dataset_dir=tmp_path))
    opts = RunOptions(recipe="native_qwen3", tier="trn2", init="random")
    monkeypatch.setattr(
        "harness.checks.preflight.check_tier", lambda opts: None
    )  # as on a trn2 with its device
    if TRN2.dataset_path is None:  # QWEN3_DATASET_DIR unset when recipes.tiers was imported
        with pytest.raises(
            PreflightError,
            match="--tier trn2 needs a dataset and has no fallback: set QWEN3_DATASET_DIR",
        ):
            preflight(opts)
    with pytest.raises(PreflightError, match="set QWEN3_DATASET_DIR"):
        check_trn2_dataset(RunOptions(recipe="native_qwen3", tier="trn2", dataset_dir=None))


def test_trn2_dataset_comes_only_from_qwen3_dataset_dir(tmp_path):
    """Read at import, so checked in fresh interpreters (reloading recipes.tiers here would
    give later tests in this process a second MoEDims class and a model without experts)."""

    def trn2_dataset(env_value: str | None) -> str:
        env = {k: v for k, v in os.environ.items() if k != "QWEN3_DATASET_DIR"}
        if env_value is not None:
            env["QWEN3_DATASET_DIR"] = env_value
        code = "from recipes.tiers import TRN2; print(TRN2.dataset_path)"
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert trn2_dataset(None) == "None"  # no fixture-corpus fallback
    assert trn2_dataset(str(tmp_path)) == str(tmp_path)


def test_launch_timeout_comes_from_the_tier(monkeypatch, tmp_path):
    """A launch without timeout_s ends at its tier's launch_timeout_s (patched short here)."""
    import dataclasses

    from harness.launch import lifecycle as launch_module
    from harness.launch.lifecycle import LaunchError
    from harness.options import run_options as options
    from recipes.tiers import CPU, TRN2

    assert TRN2.launch_timeout_s >= 4 * CPU.launch_timeout_s  # cold NEFF compiles of 64 ranks
    # "exec": torchrun_command is what starts (a "preloaded" tier would start harness.launch.elastic)
    monkeypatch.setitem(
        options.TIERS, "cpu", dataclasses.replace(CPU, launch_timeout_s=2, rank_start="exec")
    )
    monkeypatch.setattr(
        launch_module,
        "torchrun_command",
        lambda opts, cli: [sys.executable, "-c", "import time; time.sleep(60)"],
    )
    opts = options.RunOptions(
        recipe="native_qwen3", tier="cpu", run_dir=tmp_path / "run"
    ).resolved()
    with pytest.raises(LaunchError, match="timed out after 2 s"):
        launch_module.launch(opts, echo=lambda line: None)


# ---------------------------------------------------------------------------
# Logical NeuronCores from `neuron-ls -j`
# ---------------------------------------------------------------------------


def neuron_ls_json(
    devices: int = 16, with_ids: bool = True, nc_count: int = 4, lnc: int | None = 2
) -> list[dict]:
    """A trn2.48xlarge's ``neuron-ls -j`` as aws-neuron/aws-neuron-sdk
    tools/neuron-sys-tools/neuron-ls.rst shows it (connected_to, bdf, processes abridged)."""
    out = []
    for d in range(devices):
        device = {
            "neuron_device": d,
            "bdf": f"{0xCC - d:02x}:00.0",
            "cpu_affinity": "48-95,144-191",
            "numa_node": "1",
            "connected_to": [(d + 12) % 16, (d + 3) % 16, (d + 4) % 16, (d + 1) % 16],
            "nc_count": nc_count,
            "memory_size": 103079215104,
            "neuron_processes": [],
        }
        if lnc is not None:
            device["logical_neuroncore_config"] = lnc
        if with_ids:
            device["neuroncore_ids"] = list(range(d * nc_count, (d + 1) * nc_count))
        out.append(device)
    return out


@pytest.fixture
def fake_neuron_ls(tmp_path, monkeypatch):
    """Put a `neuron-ls` on PATH that prints the given JSON for `-j`."""

    def install(devices: list[dict]) -> None:
        (tmp_path / "neuron-ls.json").write_text(json.dumps(devices, indent=4))
        exe = tmp_path / "neuron-ls"
        exe.write_text(f'#!/bin/sh\n[ "$1" = "-j" ] || exit 2\ncat {tmp_path / "neuron-ls.json"}\n')
        exe.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")

    return install


@pytest.mark.parametrize("lnc, expected", [("2", 64), ("1", 128)])
def test_logical_cores_of_a_trn2_48xlarge_from_neuron_ls(
    fake_neuron_ls, monkeypatch, lnc, expected
):
    fake_neuron_ls(neuron_ls_json())
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", lnc)
    assert neuron.logical_core_count() == expected


def test_neuron_ls_without_core_ids_counts_nc_count_as_logical(monkeypatch):
    """The first JSON neuron-ls (docs of April 2025) had nc_count and logical_neuroncore_config only."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    assert neuron.logical_core_count(neuron_ls_json(with_ids=False)) == 64


def test_neuron_ls_physical_nc_count_disagreeing_with_core_ids_is_an_error():
    devices = neuron_ls_json()
    devices[3]["nc_count"] = 8  # physical count beside 4 logical ids
    with pytest.raises(
        neuron.NeuronDetectionError, match="device 3: nc_count=8 but neuroncore_ids lists 4 cores"
    ):
        neuron.logical_core_count(devices, lnc=2)


def test_trn1_style_output_without_lnc_field_is_physical(monkeypatch):
    assert neuron.logical_core_count(neuron_ls_json(devices=16, nc_count=2, lnc=None), lnc=1) == 32


def test_missing_neuron_ls_is_an_error_naming_the_tool(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(neuron.NeuronDetectionError, match="install aws-neuronx-tools"):
        neuron.logical_core_count()


def test_xdist_slices_cover_the_64_logical_cores(fake_neuron_ls, monkeypatch):
    """What pytest_configure hands each of 8 workers on a trn2.48xlarge at LNC=2."""
    fake_neuron_ls(neuron_ls_json())
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    total = neuron.logical_core_count()
    slices = [neuron.worker_cores(w, 8, total) for w in range(8)]
    assert slices[0] == "0-7" and slices[-1] == "56-63"
    assert sorted(c for s in slices for c in neuron.parse_visible_cores(s)) == list(range(64))


def test_pytest_configure_gives_each_xdist_worker_its_slice(
    fake_neuron_ls, monkeypatch, pytestconfig
):
    (root_conftest,) = [
        p
        for p in pytestconfig.pluginmanager.get_plugins()
        if getattr(p, "__file__", None) == str(REPO_ROOT / "conftest.py")
    ]
    fake_neuron_ls(neuron_ls_json())
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    # set, then deleted: monkeypatch then restores "absent" after the test (a bare delenv of an unset
    # name records nothing, and pytest_configure's value below would leak into every later test)
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "set-by-this-test")
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES")
    monkeypatch.setattr(neuron, "device_nodes", lambda: [f"/dev/neuron{i}" for i in range(16)])
    for cpu_expression in ("cpu", "cpu and not slow", "not neuron"):
        monkeypatch.setattr(pytestconfig.option, "markexpr", cpu_expression)
        root_conftest.pytest_configure(pytestconfig)
        assert "NEURON_RT_VISIBLE_CORES" not in os.environ, (
            f"a -m {cpu_expression!r} session holds no NeuronCore"
        )
    monkeypatch.setattr(pytestconfig.option, "markexpr", "neuron")
    root_conftest.pytest_configure(pytestconfig)
    assert os.environ["NEURON_RT_VISIBLE_CORES"] == "48-63"


def test_canary_torchtitan_still_rejects_sdpa_for_language_models():
    """Upstream: 0.3.0 refuses model_registry(..., attn_backend="sdpa"); recipes.specs wires SDPA itself."""
    from torchtitan.models.qwen3 import model_registry

    with pytest.raises(ValueError, match="sdpa is no longer supported"):
        model_registry("4B", attn_backend="sdpa")

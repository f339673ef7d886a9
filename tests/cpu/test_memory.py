"""Issue 46 item 4: the ranks' peak host memory, estimated from the built config, is weighed before any rank starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.checks import memory
from harness.checks.errors import PreflightError
from harness.config.build import checked_config
from harness.declare import catalogue
from harness.judge.proxy import proxy_options
from harness.options.run_options import RunOptions
from recipes.registry import RECIPES
from recipes.tiers import REHEARSAL_SETTINGS_ENV

DEFAULT_RUNS = [
    *((name, init) for name, recipe in RECIPES.items() for init in recipe.inits),
    *((name, "4B-width proxy") for name in catalogue.with_proxy()),
]


def options(recipe: str, init: str) -> RunOptions:
    if init == "4B-width proxy":
        return proxy_options(recipe, seed=0, run_dir=Path("/nonexistent/run"))
    return RunOptions(recipe=recipe, tier="cpu", init=init)


@pytest.mark.parametrize("recipe,init", DEFAULT_RUNS, ids=[f"{r}-{i}" for r, i in DEFAULT_RUNS])
def test_every_default_cpu_run_passes_with_its_estimate_said(recipe, init, monkeypatch):
    """The main job's every launch on the cpu tier (each recipe, each init, the 4B-width proxy) fits a 16 GB host."""
    monkeypatch.setattr(memory, "host_available", lambda: (16e9, "a 16 GB host"))
    opts, config = checked_config(options(recipe, init))
    said = memory.check_memory(opts, config)
    assert said.startswith("memory: --local-batch-size") and "of 16.0 GB available" in said, said


def test_the_issues_batch_is_refused_with_each_term_the_total_and_the_fix(monkeypatch):
    monkeypatch.setattr(memory, "host_available", lambda: (19.7e9, "MemAvailable in /proc/meminfo"))
    opts, config = checked_config(RunOptions(recipe="native_qwen3", tier="cpu", init="hf"))
    config.training.local_batch_size = 5000
    with pytest.raises(PreflightError) as refused:
        memory.check_memory(opts, config)
    line = str(refused.value)
    for term in ("parameters", "gradients", "AdamW states", "activations", "logits", "runtime"):
        assert f"{term} " in line, (term, line)
    assert "--local-batch-size 5000 (x seq_len 256 x vocab 1024)" in line
    assert "x 2 rank(s) = " in line and "19.7 GB this host has available (MemAvailable" in line
    fits = int(line.split("choose --local-batch-size ")[1].split()[0])
    config.training.local_batch_size = fits  # the fix it names passes, one more row does not
    assert memory.check_memory(opts, config)
    config.training.local_batch_size = fits + 1
    with pytest.raises(PreflightError):
        memory.check_memory(opts, config)


def test_a_model_too_large_for_any_batch_names_the_model_not_the_batch(monkeypatch):
    opts, config = checked_config(RunOptions(recipe="native_qwen3", tier="cpu", init="hf"))
    monkeypatch.setattr(memory, "host_available", lambda: (0.5e9, "the cgroup limit"))
    with pytest.raises(
        PreflightError, match=r"not one row fits: the model and runtime alone need 0\.66 GB"
    ):
        memory.check_memory(opts, config)


def test_trn2_device_memory_is_not_weighed_against_the_host_but_a_rehearsal_is(monkeypatch):
    monkeypatch.delenv(REHEARSAL_SETTINGS_ENV, raising=False)
    assert memory.on_host(RunOptions(recipe="native_qwen3", tier="cpu"))
    assert not memory.on_host(RunOptions(recipe="native_qwen3", tier="trn2"))
    monkeypatch.setenv(REHEARSAL_SETTINGS_ENV, "/some/settings.json")
    assert memory.on_host(RunOptions(recipe="native_qwen3", tier="trn2"))


def test_the_host_has_the_smaller_of_memavailable_and_the_cgroup_limit(tmp_path, monkeypatch):
    meminfo, limit, unlimited = tmp_path / "meminfo", tmp_path / "memory.max", tmp_path / "v1"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n")
    limit.write_text("8000000000\n")
    unlimited.write_text("max\n")
    monkeypatch.setattr(memory, "MEMINFO", meminfo)
    monkeypatch.setattr(memory, "CGROUP_LIMITS", (limit, unlimited))
    assert memory.host_available() == (8e9, f"the cgroup limit {limit}")
    limit.write_text("max\n")
    assert memory.host_available() == (20000000 * 1024, f"MemAvailable in {meminfo}")

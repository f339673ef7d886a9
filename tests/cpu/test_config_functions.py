"""The recipes as torchtitan config functions: torchtitan's own entry runs them as the harness does.

    torchrun -m torchtitan.train --module recipes.native_qwen3 --config native_qwen3_cpu

torchtitan's ConfigManager imports ``--module`` and calls ``--config`` with no
arguments (torchtitan/config/manager.py ``_load_config``).
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from recipes.tiers import REPO_ROOT


#: (module, config function, recipe, tier, init)
CONFIG_FUNCTIONS = [
    ("recipes.native_qwen3", "native_qwen3_trn2", "native_qwen3", "trn2", "hf"),
    ("recipes.native_qwen3", "native_qwen3_trn2_random_init", "native_qwen3", "trn2", "random"),
    ("recipes.native_qwen3", "native_qwen3_cpu", "native_qwen3", "cpu", "hf"),
    ("recipes.hf_backend", "hf_backend_trn2", "hf_backend", "trn2", "hf"),
    ("recipes.hf_backend", "hf_backend_cpu", "hf_backend", "cpu", "hf"),
    ("recipes.nki_moe", "nki_moe_trn2", "nki_moe", "trn2", "random"),
    ("recipes.nki_moe", "nki_moe_cpu", "nki_moe", "cpu", "random"),
]
CPU_FUNCTIONS = [c for c in CONFIG_FUNCTIONS if c[3] == "cpu"]
TRN2_FUNCTIONS = [c for c in CONFIG_FUNCTIONS if c[3] == "trn2"]


@pytest.mark.parametrize("module, function, recipe, tier, init", CONFIG_FUNCTIONS)
def test_each_config_function_takes_no_arguments(module, function, recipe, tier, init):
    fn = getattr(importlib.import_module(module), function)
    assert inspect.signature(fn).parameters == {}, f"{module}.{function} must be callable as torchtitan calls it"


def _described(config) -> str:
    return re.sub(r" at 0x[0-9a-f]+", "", repr(config))


@pytest.mark.parametrize("module, function, recipe, tier, init", CPU_FUNCTIONS)
def test_torchtitans_config_manager_builds_what_the_harness_builds(module, function, recipe, tier, init):
    from harness.options import RunOptions
    from harness.checks import preflight
    from recipes.titan import ConfigManager
    from harness.config import build_config

    cli = ["--training.steps", "3"]
    loaded = ConfigManager().parse_args(["--module", module, "--config", function, *cli])
    harness = build_config(preflight(RunOptions(recipe=recipe, tier=tier, init=init)), cli)
    # repr without addresses: init functions are partials and closures, equal only by identity
    assert _described(loaded) == _described(harness)
    assert loaded.training.steps == 3


@pytest.mark.parametrize("module, function, recipe, tier, init", TRN2_FUNCTIONS)
def test_trn2_config_functions_refuse_in_one_line_without_a_device(module, function, recipe, tier, init):
    """The product's own refusal (``recipes.errors.RecipeError``): torchtitan's entry imports no harness."""
    from recipes.errors import RecipeError

    with pytest.raises(RecipeError, match="--tier trn2 cannot run on this machine") as refusal:
        getattr(importlib.import_module(module), function)()
    assert "\n" not in str(refusal.value)


@pytest.mark.slow
def test_torchtitan_train_runs_config_2_to_the_golden_step1_loss(tmp_path, record_property):
    """torchtitan's own entry, no harness launcher or rank entry: the same step-1 loss as the golden."""
    from benchmarks.common import run_titan_train
    from harness import goldens

    steps = run_titan_train(
        "recipes.native_qwen3", "native_qwen3_cpu", 2, tmp_path, "--training.steps", "1", timeout_s=600
    )
    assert [s.step for s in steps] == [1], steps
    _, values = goldens.load("native_qwen3", "cpu")
    golden = values["step1_loss_hf"].value
    record_property("torchtitan_train_step1_loss", steps[0].loss)
    # torchtitan prints 5 decimals: equal to the golden at the precision it prints.
    assert abs(steps[0].loss - golden) <= 0.5e-5, (steps[0].loss, golden)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_torchtitan_train_launch_ends_with_its_caller(tmp_path, signum):
    """``run_titan_train``'s torchrun must not outlive pytest (a cancelled night, the rehearsal's watchdog): on
    trn2 its 64 ranks would keep every NeuronCore. Seen failing in the rehearsal: after the runner ended the
    pytest step, config 2's torchtitan.train ranks ran on until the host's memory was gone."""
    pid_file = tmp_path / "launch.pid"
    launch = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    caller = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from benchmarks.common import run_bound
        run_bound([sys.executable, "-c", {launch!r}], timeout_s=600)
    """)], cwd=REPO_ROOT)  # fmt: skip
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline and caller.poll() is None, "the launch never started"
        time.sleep(0.1)
    launched = int(pid_file.read_text())
    caller.send_signal(signum)
    caller.wait(timeout=30)
    for _ in range(100):
        state = Path(f"/proc/{launched}/stat")
        if not state.exists() or state.read_text().split(") ")[1].startswith("Z"):
            break
        time.sleep(0.1)
    else:
        os.kill(launched, signal.SIGKILL)
        pytest.fail(f"the launch {launched} outlived its caller")

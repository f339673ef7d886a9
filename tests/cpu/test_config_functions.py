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
    assert inspect.signature(fn).parameters == {}, (
        f"{module}.{function} must be callable as torchtitan calls it"
    )


def _described(config) -> str:
    return re.sub(r" at 0x[0-9a-f]+", "", repr(config))


@pytest.mark.parametrize("module, function, recipe, tier, init", CPU_FUNCTIONS)
def test_torchtitans_config_manager_builds_what_the_harness_builds(
    module, function, recipe, tier, init, tmp_path, monkeypatch
):
    """The same config but the dump folder: the entry's own per config and run, the harness's its run dir."""
    from harness.checks.preflight import preflight
    from harness.config.build import build_config
    from harness.options.run_options import RunOptions
    from recipes.titan import ConfigManager

    monkeypatch.chdir(tmp_path)  # no earlier run in ./outputs
    cli = ["--training.steps", "3"]
    loaded = ConfigManager().parse_args(["--module", module, "--config", function, *cli])
    harness = build_config(preflight(RunOptions(recipe=recipe, tier=tier, init=init)), cli)
    assert Path(loaded.dump_folder) == Path("outputs", f"{recipe}_{tier}_{init}", "run-1")
    assert (
        harness.dump_folder == "./outputs"
    )  # torchtitan's default: a harness run sets its run dir on top
    harness.dump_folder = loaded.dump_folder
    # repr without addresses: init functions are partials and closures, equal only by identity
    assert _described(loaded) == _described(harness)
    assert loaded.training.steps == 3


@pytest.mark.parametrize("module, function, recipe, tier, init", TRN2_FUNCTIONS)
def test_trn2_config_functions_refuse_in_one_line_without_a_device(
    module, function, recipe, tier, init
):
    """The product's own refusal (``recipes.errors.RecipeError``): torchtitan's entry imports no harness."""
    from recipes.errors import RecipeError

    with pytest.raises(RecipeError, match="--tier trn2 cannot run on this machine") as refusal:
        getattr(importlib.import_module(module), function)()
    assert "\n" not in str(refusal.value)


@pytest.mark.slow
def test_torchtitan_train_runs_config_2_to_the_golden_step1_loss(tmp_path, record_property):
    """torchtitan's own entry, no harness launcher or rank entry: the same step-1 loss as the golden."""
    from benchmarks.common import run_titan_train
    from harness.judge import goldens

    steps = run_titan_train(
        "recipes.native_qwen3",
        "native_qwen3_cpu",
        2,
        tmp_path,
        "--training.steps",
        "1",
        timeout_s=600,
    )
    assert [s.step for s in steps] == [1], steps
    _, values = goldens.load("native_qwen3", "cpu")
    golden = values["step1_loss_hf"].value
    record_property("torchtitan_train_step1_loss", steps[0].loss)
    # torchtitan prints 5 decimals: equal to the golden at the precision it prints.
    assert abs(steps[0].loss - golden) <= 0.5e-5, (steps[0].loss, golden)


#: The README's command in one working directory: one recipe twice, then another; golden key of each step-1 loss.
RELAUNCHES = [
    ("recipes.native_qwen3", "native_qwen3_cpu", "native_qwen3", "step1_loss_hf"),
    ("recipes.native_qwen3", "native_qwen3_cpu", "native_qwen3", "step1_loss_hf"),
    ("recipes.nki_moe", "nki_moe_cpu", "nki_moe", "step1_loss_random"),
]


@pytest.mark.slow
def test_the_readme_command_trains_again_and_after_another_recipe(
    tmp_path, monkeypatch, record_property
):
    """Each launch of torchtitan's entry trains from its recipe's own start (its step-1 golden) and keeps its export.

    Seen failing before ``recipes.entry_folder``: the second launch took the first's HF-format last save in
    ``./outputs/checkpoint/step-1`` for a DCP checkpoint and died (``metadata is None``).
    """
    from benchmarks.common import parse_titan_steps, run_bound, titan_train_command
    from harness.judge import goldens
    from recipes.entry_folder import HF_INDEX

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    )
    for n, (module, function, recipe, key) in enumerate(RELAUNCHES, 1):
        log_dir = tmp_path / f"logs-{n}"
        cmd = titan_train_command(module, function, 2, log_dir, "--training.steps", "1")
        returncode, stderr = run_bound(cmd, timeout_s=600, cwd=work)
        rank0 = "".join(
            p.read_text(errors="replace") for p in sorted(log_dir.glob("*/attempt_0/0/std*.log"))
        )
        assert returncode == 0, (
            f"launch {n} ({function}) exited {returncode}:\n{stderr[-2000:]}\nrank 0:\n{rank0[-3000:]}"
        )
        steps = parse_titan_steps(rank0)
        assert [s.step for s in steps] == [1], (n, function, steps)
        golden = goldens.load(recipe, "cpu")[1][key].value
        record_property(f"readme_launch_{n}_{function}_step1_loss", steps[0].loss)
        # torchtitan prints 5 decimals: equal to the golden at the precision it prints.
        assert abs(steps[0].loss - golden) <= 0.5e-5, (n, function, steps[0].loss, golden)
    exports = sorted(p.parent.relative_to(work) for p in work.rglob(HF_INDEX))
    assert len(exports) == len(RELAUNCHES), (
        f"each launch's last save kept, none overwritten: {exports}"
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_torchtitan_train_launch_ends_with_its_caller(tmp_path, signum):
    """``run_titan_train``'s torchrun must not outlive pytest (a cancelled night, the rehearsal's watchdog): on
    trn2 its 64 ranks would keep every NeuronCore. Seen failing in the rehearsal: after the runner ended the
    pytest step, config 2's torchtitan.train ranks ran on until the host's memory was gone."""
    pid_file = tmp_path / "launch.pid"
    launch = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    )
    caller = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from benchmarks.common import run_bound
        run_bound([sys.executable, "-c", {launch!r}], timeout_s=600)
    """),
        ],
        cwd=REPO_ROOT,
    )
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

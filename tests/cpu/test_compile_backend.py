"""Where compile runs on trn2 it compiles with TorchNeuron's backend, never torchtitan's default inductor.

aws-neuron/aws-neuron-sdk training/torchtitan/about-torchtitan-neuron.rst: "--compile.enable
--compile.backend neuron". Checked on the trn2 dry run, which builds the config exactly as
the launcher and every rank do (harness.config.build.finish_config), on any machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.checks.errors import PreflightError
from recipes.tiers import CPU, REPO_ROOT, TRN2

TRN2_UNSET = (
    "QWEN3_4B_DIR",
    "QWEN3_DATASET_DIR",
    "NEURON_LOGICAL_NC_CONFIG",
    "NEURON_RT_VISIBLE_CORES",
)


def dry_run(report_dir: Path, *cli: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in TRN2_UNSET}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "native_qwen3",
            "--tier",
            "trn2",
            "--init",
            "random",
            "--dry-run",
            "--report-dir",
            str(report_dir),
            *cli,
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_tiers_name_their_compile_backends():
    assert (CPU.compile_backend, TRN2.compile_backend) == ("inductor", "neuron")


@pytest.mark.slow
def test_compile_enabled_on_trn2_compiles_with_the_neuron_backend(tmp_path):
    out = dry_run(tmp_path, "--compile.enable")
    assert out.returncode == 0, out.stdout + out.stderr
    config = json.loads((tmp_path / "dry-run" / "native_qwen3-trn2-random.json").read_text())[
        "config"
    ]
    assert config["compile"]["enable"] is True
    assert config["compile"]["backend"] == "neuron"


@pytest.mark.slow
def test_inductor_on_trn2_is_refused_before_launch_naming_the_backend(tmp_path):
    out = dry_run(tmp_path, "--compile.enable", "--compile.backend", "inductor")
    assert out.returncode == 2, out.stdout + out.stderr
    assert (
        "compile.enable with compile.backend='inductor' cannot compile for --tier trn2: "
        "use --compile.backend neuron"
    ) in out.stdout


@pytest.mark.parametrize(
    "tier, enable, backend, refused",
    [
        ("trn2", True, "inductor", True),
        ("trn2", True, "neuron", False),
        ("trn2", False, "inductor", False),
        ("cpu", True, "inductor", False),
        ("cpu", True, "neuron", True),
    ],
)
def test_check_compile(tier, enable, backend, refused):
    from harness.checks.built_config import check_compile
    from recipes.titan import CompileConfig

    class Config:
        compile = CompileConfig(enable=enable, backend=backend)

    if refused:
        with pytest.raises(
            PreflightError, match=f"compile.backend={backend!r} cannot compile for --tier {tier}"
        ):
            check_compile(Config, tier)
    else:
        check_compile(Config, tier)

"""The night's first stage, ``python -m harness.night.device_random``, on the stand-in device.

The preflight runs a launch's random-init ops (DTensor ``trunc_normal_``, ``normal_``, ``uniform_`` on
``neuron``) in a child on one core with a hard limit. With the stand-in's CPU-generator fallback
(``QWEN3_STANDIN_DEVICE_RANDOM=0``) ``trunc_normal_`` never returns: the preflight must then print the one line
rehearsal/night.py expects of a device-random night and exit non-zero, with no child left behind. Each
check runs in a child interpreter whose sys.path names the stand-ins' sources: this process never imports them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from harness.night import device_random
from recipes.tiers import REPO_ROOT
from rehearsal.night import STOP_LINE

STANDINS = REPO_ROOT / "rehearsal" / "standins"
SOURCE_DIRS = [STANDINS / name for name in ("torch-neuronx", "neuronx-cc", "nki")]

pytestmark = (
    pytest.mark.slow
)  # a child that imports torch and torch_neuronx: seconds, then the limit

#: Long enough for the child's setup (import torch, the process group) on a loaded 2-core machine (~10 s).
LIMIT_S = 25


def preflight(**extra: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QWEN3_STANDIN_", "NEURON_"))}
    env.pop("QWEN3_HIDE_NEURON_DEVICES", None)
    env.update(PYTHONPATH=os.pathsep.join(map(str, SOURCE_DIRS)), OMP_NUM_THREADS="1", **extra)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "harness.night.device_random", "--limit", str(LIMIT_S)],
        capture_output=True,
        text=True,
        timeout=LIMIT_S + 60,
        cwd=REPO_ROOT,
        env=env,
    )
    return done, time.monotonic() - started


def lines(done: subprocess.CompletedProcess) -> list[str]:
    return [x for x in (done.stdout + done.stderr).splitlines() if x.strip()]


def test_a_hanging_trunc_normal_stops_the_night_in_one_line():
    """Seen failing with the child's progress lines not read: the line named setup, not trunc_normal_."""
    done, seconds = preflight(QWEN3_STANDIN_DEVICE_RANDOM="0")
    assert done.returncode == device_random.EXIT_STOP
    assert len(lines(done)) == 1 and STOP_LINE.fullmatch(lines(done)[0]), lines(done)
    assert f"did not return in {LIMIT_S} s" in lines(done)[0]
    assert seconds < LIMIT_S + 15  # the child's process group killed at the limit, not waited for


def test_device_random_ops_that_return_pass_in_one_line():
    done, _ = preflight()
    assert done.returncode == 0, lines(done)
    assert len(lines(done)) == 1 and lines(done)[0].startswith(
        "device random: DTensor trunc_normal_ "
    )
    assert "NEURON_RT_VISIBLE_CORES=0" in lines(done)[0]


def test_a_failing_op_is_one_line_naming_it(monkeypatch):
    """A child that fails (here: no torch_neuronx at all, so no ``neuron`` device) is one line too."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code, line = device_random.check(LIMIT_S, env)
    assert code == device_random.EXIT_STOP
    assert line.startswith("device random: ") and line.endswith("; no launch started")
    assert "\n" not in line and "failed: " in line

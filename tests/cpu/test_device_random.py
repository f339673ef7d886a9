"""The night's first stage, ``python -m harness.night.device_random``, on the stand-in device.

The preflight runs a launch's random-init ops (DTensor ``trunc_normal_``, ``normal_``, ``uniform_`` on
``neuron``) in a child on one core with a hard limit. With the stand-in's CPU-generator fallback
(``QWEN3_STANDIN_DEVICE_RANDOM=0``) ``trunc_normal_`` never returns: the preflight must then print the one line
rehearsal/night.py expects of a device-random night and exit non-zero, with no child left behind. Each
check runs in a child interpreter whose sys.path names the stand-ins' sources: this process never imports them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from harness.base.device_files import open_device_files
from harness.night import device_random
from recipes.tiers import REPO_ROOT
from rehearsal import settings as rehearsal_settings
from rehearsal.night import STOP_LINE

STANDINS = REPO_ROOT / "rehearsal" / "standins"
SOURCE_DIRS = [STANDINS / name for name in ("torch-neuronx", "neuronx-cc", "nki")]

pytestmark = (
    pytest.mark.slow
)  # a child that imports torch and torch_neuronx: seconds, then the limit

#: Long enough for the child's setup (import torch, the process group) on a loaded 2-core machine (~10 s).
LIMIT_S = 25


def preflight(*args: str, **extra: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QWEN3_STANDIN_", "NEURON_"))}
    env.pop("QWEN3_HIDE_NEURON_DEVICES", None)
    env.update(PYTHONPATH=os.pathsep.join(map(str, SOURCE_DIRS)), OMP_NUM_THREADS="1", **extra)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "harness.night.device_random", "--limit", str(LIMIT_S), *args],
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


def rehearsal_env(tmp_path) -> dict[str, str]:
    """What a rehearsal night exports (rehearsal/settings.py): fake nodes in tmp_path/dev, shared core locks."""
    path = tmp_path / "rehearsal-settings.json"
    path.write_text(json.dumps({"device_dir": str(tmp_path / "dev")}))
    settings = rehearsal_settings.load(path)
    assert settings.device_nodes() == [str(tmp_path / "dev" / "neuron0")]
    return {rehearsal_settings.SETTINGS_ENV: str(path), **settings.env()}


def test_held_guard_passes_when_the_runtime_holding_core_0_holds_its_device_node(tmp_path):
    """The stand-in runtime opens the rehearsal's fake node as it starts (torch_neuronx/_runtime.py). Seen
    failing with the stand-in's ``_open_devices()`` call removed (exit 2, the blind line)."""
    held = tmp_path / "held-guard.json"
    done, _ = preflight("--held-out", str(held), **rehearsal_env(tmp_path))
    assert done.returncode == 0, lines(done)
    done, _ = preflight("--held-guard", str(held))
    assert done.returncode == 0, lines(done)
    assert lines(done) == [
        f"held-device guard: a process holding NeuronCore 0 holds {tmp_path / 'dev' / 'neuron0'} open, "
        "as tests/neuron/neuron_cores.py fail_if_device_held reads it"
    ]


def test_held_guard_says_in_one_line_that_the_guard_is_blind_when_no_device_file_is_open(tmp_path):
    """The same runtime reserving core 0 (its lock) without opening any device node: the step fails, in one
    line, with EXIT_GUARD_BLIND. Seen failing with guard_verdict passing whatever the child held."""
    env = rehearsal_env(tmp_path)
    env.pop("QWEN3_STANDIN_DEVICE_DIR")
    held = tmp_path / "held-guard.json"
    done, _ = preflight("--held-out", str(held), **env)
    assert done.returncode == 0, "the random ops pass: only the next step fails"
    done, _ = preflight("--held-guard", str(held))
    assert done.returncode == device_random.EXIT_GUARD_BLIND != device_random.EXIT_STOP
    assert len(lines(done)) == 1, lines(done)
    assert "cannot see held cores on this release" in lines(done)[0]
    assert (tmp_path / "core-locks" / "core0.lock").exists(), "the child did reserve core 0"


def test_the_guard_verdict_reads_an_fd_table(tmp_path):
    """guard_verdict on what harness.base.device_files reads from an fd directory built here."""
    fds = tmp_path / "fd"
    fds.mkdir()
    (fds / "0").symlink_to("/dev/null")
    assert device_random.guard_verdict(open_device_files(fds))[0] == device_random.EXIT_GUARD_BLIND
    (fds / "7").symlink_to("/dev/neuron0")
    code, line = device_random.guard_verdict(open_device_files(fds))
    assert code == 0 and "holds /dev/neuron0 open" in line and "\n" not in line
    code, line = device_random.guard_verdict(None)  # no held line from the child: not a pass
    assert code == device_random.EXIT_GUARD_BLIND and "\n" not in line

"""Each rank's NeuronCores: the suite maps LOCAL_RANK to its own core (recipes.platform.neuron.set_rank_cores),
and the stand-in runtime reserves cores as the runtime guide says (rehearsal/standins/torch-neuronx/
torch_neuronx/_runtime.py): a process without NEURON_RT_VISIBLE_CORES reserves every core, and a second
claim on a held core fails with the runtime's message.

Two rank processes claim cores through the stand-in, as a 2-rank launch's ranks do (each starts its runtime
with its first tensor on ``neuron``), with the stand-in's own LOCAL_RANK mapping switched off
(``QWEN3_STANDIN_LOCAL_RANK_CORES=0``, the flipped rehearsal): with the suite's mapping both start; without
it the second fails. With the switch on the stand-in's process group maps them instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.platform.neuron import rank_cores, set_rank_cores
from recipes.tiers import REPO_ROOT

STANDIN = REPO_ROOT / "rehearsal" / "standins" / "torch-neuronx"

RANK = """
import json, os, sys
if sys.argv[1] == "1":
    from recipes.platform.neuron import set_rank_cores
    set_rank_cores()  # the suite's mapping, as recipes.platform.neuron.install runs it
import torch, torch_neuronx
from torch_neuronx.distributed.backend import set_rt_visible_cores
set_rt_visible_cores()  # what the stand-in's "neuron" process group does first (the switch)
try:
    torch.ones(2, device="neuron")  # the runtime starts: it reserves this process's cores
except RuntimeError as e:
    print(json.dumps({"ok": False, "error": str(e)}), flush=True)
    sys.exit(0)
print(json.dumps({"ok": True, "visible": os.environ.get("NEURON_RT_VISIBLE_CORES")}), flush=True)
sys.stdin.read()  # hold the cores until the test says
"""


def start_rank(
    local_rank: int, mapping: bool, switch: str, locks, **extra: str
) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QWEN3_STANDIN_", "NEURON_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(STANDIN), str(REPO_ROOT)]),
        OMP_NUM_THREADS="1",
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE="2",
        QWEN3_STANDIN_CORES="2",
        QWEN3_STANDIN_CORE_LOCKS=str(locks),
        QWEN3_STANDIN_LOCAL_RANK_CORES=switch,
    )
    env.update(extra)
    return subprocess.Popen(
        [sys.executable, "-c", RANK, "1" if mapping else "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env=env,
    )


def two_ranks(tmp_path, mapping: bool, switch: str) -> list[dict]:
    """Rank 0 starts its runtime and holds its cores while rank 1 starts its own."""
    first = start_rank(0, mapping, switch, tmp_path / "locks")
    try:
        line = first.stdout.readline()
        assert line, first.communicate(timeout=60)
        second = start_rank(1, mapping, switch, tmp_path / "locks")
        out, err = second.communicate(timeout=120)
        assert out, err[-3000:]
        return [json.loads(line), json.loads(out.splitlines()[-1])]
    finally:
        first.communicate(input="", timeout=60)


@pytest.mark.slow
def test_the_suites_mapping_gives_each_rank_its_core(tmp_path):
    ranks = two_ranks(tmp_path, mapping=True, switch="0")
    assert ranks == [{"ok": True, "visible": "0"}, {"ok": True, "visible": "1"}], ranks


@pytest.mark.slow
def test_without_any_mapping_the_second_rank_cannot_start_its_runtime(tmp_path):
    """The flipped night with the suite's mapping removed: rank 0 reserved every core."""
    first, second = two_ranks(tmp_path, mapping=False, switch="0")
    assert first == {"ok": True, "visible": None}, first
    assert not second["ok"], second
    assert "NRT:nrt_allocate_neuron_cores" in second["error"], second
    assert "NeuronCore(s) not available - Requested:nc0-nc1 Available:0" in second["error"], second


@pytest.mark.slow
def test_the_standins_own_mapping_alone_also_separates_them(tmp_path):
    ranks = two_ranks(tmp_path, mapping=False, switch="1")
    assert ranks == [{"ok": True, "visible": "0"}, {"ok": True, "visible": "1"}], ranks


@pytest.mark.slow
def test_a_started_runtime_holds_the_device_node_of_its_core_open(tmp_path):
    """As a driver-backed runtime: while it holds its core, the rank's fd table shows that core's device node
    (the reading tests/neuron/neuron_cores.py fail_if_device_held and the night's --held-guard rely on).
    Two fake devices of two cores each: core 3 is on neuron1. Seen failing with _open_devices not called."""
    from harness.base.device_files import open_device_files

    dev = tmp_path / "dev"
    dev.mkdir()
    nodes = [str(dev / f"neuron{i}") for i in range(2)]
    for node in nodes:
        Path(node).touch()
    rank = start_rank(
        3, True, "0", tmp_path / "locks", QWEN3_STANDIN_CORES="4", QWEN3_STANDIN_DEVICE_DIR=str(dev)
    )
    try:
        line = rank.stdout.readline()
        assert json.loads(line) == {"ok": True, "visible": "3"}, rank.communicate(timeout=60)
        held = open_device_files(Path(f"/proc/{rank.pid}/fd"), nodes)
    finally:
        rank.communicate(input="", timeout=60)
    assert held == [nodes[1]], held


def test_set_rank_cores_keeps_a_users_value_and_leaves_non_ranks_alone():
    assert set_rank_cores({}) is None, "no LOCAL_RANK: not a torchrun rank"
    env = {"LOCAL_RANK": "5", "NEURON_RT_VISIBLE_CORES": "0-63"}
    assert set_rank_cores(env) is None and env["NEURON_RT_VISIBLE_CORES"] == "0-63"
    env = {"LOCAL_RANK": "5"}
    assert set_rank_cores(env) == "5" == env["NEURON_RT_VISIBLE_CORES"]
    assert rank_cores(3, per_rank=2) == "6-7"

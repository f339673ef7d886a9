"""Scale-out through torchrun's own c10d rendezvous: 2 nodes × 1 process == 1 node × 2 processes."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from recipes.launch import launch
from recipes.options import RunOptions
from recipes.preflight import preflight
from recipes.tiers import FIXTURES

pytestmark = pytest.mark.cpu


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_localhost_match_one_node_with_two_processes(tmp_path, native_hf_run, record_property):
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [
        preflight(
            RunOptions(
                recipe="native_qwen3", tier="cpu", nproc=1, nnodes=2, node_rank=rank, rdzv_endpoint=endpoint,
                steps=len(native_hf_run["steps"]), seq_len=native_hf_run["seq_len"],
                local_batch_size=native_hf_run["local_batch_size"], init="hf", model_dir=FIXTURES / "qwen3-tiny",
                seed=native_hf_run["seed"], run_dir=tmp_path / f"node{rank}", export=False,
            )
        )
        for rank in (0, 1)
    ]  # fmt: skip
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda o: launch(o, echo=lambda line: None, timeout_s=600), nodes))
    assert all(r.returncode == 0 for r in results)
    # Global rank 0 (which records the losses) lands on whichever node the rendezvous ranks first.
    losses = next(r.losses for r in results if r.losses)
    record_property("two_node_losses", losses)
    record_property("one_node_losses", native_hf_run["losses"])
    assert losses == native_hf_run["losses"]

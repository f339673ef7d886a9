"""Scale-out through torchrun's own c10d rendezvous: 2 nodes × 1 process == 1 node × 2 processes.

Over the whole 100-step curve (issue 15): the 1 × 2 side is the 2-process run of the
parallelism-invariance test (tests/cpu/test_curves.py), the same global batch of four
one-document sequences, so one launch serves both claims.
"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import curve_runs
import pytest

from harness.checks.preflight import preflight
from harness.launch.lifecycle import launch
from harness.options.run_options import RunOptions


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_on_localhost_match_one_node_with_two_processes(
    tmp_path, recipe_run, shared_dir, record_property
):
    one_node = curve_runs.same_batch_run(recipe_run, shared_dir, nproc=2)
    options = {**curve_runs.same_batch_options(shared_dir, nproc=2), "nproc": 1}
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [
        preflight(
            RunOptions(
                **options,
                nnodes=2,
                node_rank=rank,
                rdzv_endpoint=endpoint,
                run_dir=tmp_path / f"node{rank}",
            )
        )
        for rank in (0, 1)
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda o: launch(o, echo=lambda line: None, timeout_s=600), nodes))
    assert all(r.returncode == 0 for r in results)
    # Global rank 0 (which records the losses) lands on whichever node the rendezvous ranks first.
    losses = next(r.losses for r in results if r.losses)
    record_property("two_node_losses", losses)
    record_property("one_node_losses", one_node["losses"])
    record_property("two_node_wall_s", round(max(r.wall_s for r in results), 1))
    assert len(losses) == curve_runs.STEPS
    assert losses == one_node["losses"]

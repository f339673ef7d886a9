"""A multi-node launch's wait for its other nodes: a line every so often, and a one-line why if they never come.

torchrun's c10d rendezvous waits ``join_timeout`` seconds (``--rdzv-timeout``; torch's
``DynamicRendezvousHandler``, default 600) for ``--nnodes`` nodes and starts no rank before they
have all joined. Until then nothing else prints: this says what it waits for and how to end the wait.
"""

from __future__ import annotations

import time
from pathlib import Path

from harness.base.run_dir import LOGS_DIR
from harness.options.run_options import RunOptions

#: Seconds between two "waiting for the other nodes" lines.
WAIT_NOTE_S = 15.0


def ranks_started(run_dir: Path) -> bool:
    """torchrun makes each local rank's log directory (``logs/<run id>/attempt_N/<rank>``) once the rendezvous completed."""
    return any(p.is_dir() for p in (Path(run_dir) / LOGS_DIR).glob("*/attempt_*/*"))


class RendezvousWait:
    """``poll()`` from the launch loop: a line every :data:`WAIT_NOTE_S` until this node's ranks start."""

    def __init__(self, opts: RunOptions, echo, started: float | None = None) -> None:
        self.opts, self.echo = opts, echo
        self.started = time.perf_counter() if started is None else started
        self.done = opts.nnodes == 1
        self.next_note = WAIT_NOTE_S

    def poll(self) -> None:
        if self.done:
            return
        if ranks_started(self.opts.run_dir):
            self.done = True
            self.echo(
                f"  all {self.opts.nnodes} nodes joined the rendezvous at {self.opts.rdzv_endpoint}; ranks starting"
            )
            return
        waited = time.perf_counter() - self.started
        if waited >= self.next_note:
            self.next_note += WAIT_NOTE_S
            self.echo(
                f"  waiting {waited:.0f} s of --rdzv-timeout {self.opts.rdzv_timeout} s for all "
                f"{self.opts.nnodes} nodes to join the rendezvous at {self.opts.rdzv_endpoint} "
                f"(this is node {self.opts.node_rank}; start every other node with the same --nnodes and "
                "--rdzv-endpoint, or Ctrl-C)"
            )

    def failure(self) -> str | None:
        """Why the run ended before its ranks started, when the other nodes never joined; else None."""
        if self.opts.nnodes == 1 or ranks_started(self.opts.run_dir):
            return None
        return (
            f"the rendezvous at {self.opts.rdzv_endpoint} did not gather --nnodes {self.opts.nnodes} nodes "
            f"within --rdzv-timeout {self.opts.rdzv_timeout} s, so no rank started; start every node with the "
            "same --nnodes and --rdzv-endpoint (node 0 first), or check that the endpoint is reachable"
        )

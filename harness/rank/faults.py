"""Test-only fault injection: make one rank die, hang or produce a NaN loss at a given step.

Set ``QWEN3_REPRO_FAULT=KIND@RANK:STEP`` (``die@1:2``, ``hang@1:2``, ``nan@0:2``, ``kill@1:1``: SIGKILL,
as the kernel's OOM killer ends a rank)
in a rank's environment; step 0 is the rank's start, before the trainer is built and before rank 0
writes provenance.json (``die@0:0``: a run whose ranks fail before any record). The launcher's tests
use it to prove that failures end the run within a bounded time, with the failing rank's log lines,
and leave no process behind. Unset, nothing here runs.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

from recipes import titan

ENV = "QWEN3_REPRO_FAULT"
KINDS = ("die", "hang", "nan", "kill")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int

    @classmethod
    def parse(cls, text: str) -> "Fault":
        try:
            kind, where = text.split("@")
            rank, step = where.split(":")
            fault = cls(kind=kind, rank=int(rank), step=int(step))
        except ValueError:
            raise ValueError(
                f"{ENV}={text!r} must look like KIND@RANK:STEP, e.g. die@1:2"
            ) from None
        if fault.kind not in KINDS:
            raise ValueError(f"{ENV}={text!r}: KIND must be one of {', '.join(KINDS)}")
        return fault


def from_env() -> Fault | None:
    text = os.environ.get(ENV)
    return Fault.parse(text) if text else None


def at_start(rank: int) -> None:
    """Fire a step-0 fault on its rank: before the trainer is built, so nothing of the run is recorded yet."""
    fault = from_env()
    if fault is not None and fault.step == 0 and fault.rank == rank:
        _fire(fault, rank, trainer=None)


def install(trainer, rank: int) -> None:
    """Wrap the declared hook ``Trainer.train_step`` so the configured fault fires on its rank and step."""

    fault = from_env()
    if fault is None or fault.rank != rank:
        return
    titan.wrap_hook(
        trainer, "Trainer.train_step", lambda original: _faulty(trainer, fault, rank, original)
    )


def _faulty(trainer, fault: Fault, rank: int, original):
    """``original`` (the trainer's ``train_step``), with ``fault`` fired first at its step."""

    def train_step(*args, **kwargs):
        if trainer.step == fault.step:
            _fire(fault, rank, trainer)
        return original(*args, **kwargs)

    return train_step


def _fire(fault: Fault, rank: int, trainer) -> None:
    print(
        f"[fault injection] {fault.kind} on rank {rank} at step {fault.step}",
        file=sys.stderr,
        flush=True,
    )
    if fault.kind == "die":
        os._exit(17)
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.kind == "hang":
        while True:
            time.sleep(3600)
    if fault.kind == "nan" and trainer is not None:
        import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light

        with torch.no_grad():
            for part in trainer.model_parts:
                next(part.parameters()).fill_(float("nan"))

"""Why a launch failed, cause first, from what its ranks left: a timeout, a vanished run directory, a
non-finite loss torchtitan stopped at, the first rank's exception, or a signal (``harness.launch.deaths``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from harness.base.run_dir import ERROR_FILE, LOGS_DIR, vanished
from harness.launch import deaths

LOG_TAIL_LINES = 40
NON_FINITE = re.compile(r"Loss is not finite \(global_avg_loss=([^)]*)\) at step (\d+)")


def rank_log_tails(run_dir: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of every rank's stderr, failing ranks' tracebacks included."""
    parts = []
    for log in sorted((run_dir / LOGS_DIR).glob("*/attempt_*/*/stderr.log")):
        text = log.read_text(errors="replace").splitlines()
        if text:
            rank = log.parent.name
            parts.append(f"--- rank {rank}: last {min(lines, len(text))} lines of {log}")
            parts.extend(text[-lines:])
    return "\n".join(parts)


def non_finite_stop(run_dir: Path) -> tuple[str, int] | None:
    """``(value, step)`` when torchtitan stopped the run at a non-finite loss (its trainer raises before logging
    the step, so the rank's stderr is the only record), else None."""
    for log in sorted((run_dir / LOGS_DIR).glob("*/attempt_*/*/stderr.log")):
        match = NON_FINITE.search(log.read_text(errors="replace"))
        if match:
            return match.group(1), int(match.group(2))
    return None


def non_finite_summary(run_dir: Path, steps: list[dict]) -> str | None:
    """'loss became non-finite at step N (last good loss L at step N-1)', if that is what ended the run."""
    stop = non_finite_stop(run_dir)
    if stop is None:
        return None
    good = (
        f"last good loss {steps[-1]['loss']:.6f} at step {steps[-1]['step']}"
        if steps
        else "no good step"
    )
    return f"loss became non-finite ({stop[0]}) at step {stop[1]}; {good}"


def first_failure(run_dir: Path) -> str | None:
    """'rank R failed first: ExcType: message', from the error file torchrun copied for it.

    torchrun's ``@record`` main copies the earliest failed rank's error file to its
    own ``TORCHELASTIC_ERROR_FILE`` (torch/distributed/elastic/multiprocessing/errors/
    __init__.py ``record``); harness.rank.train adds the rank number. None when no rank
    recorded an exception (killed by a signal, or ``os._exit``).
    """
    path = run_dir / ERROR_FILE
    if not path.is_file():
        return None
    message = json.loads(path.read_text()).get("message")
    if not isinstance(message, dict):  # torch's plain-string format: no rank, no traceback
        return f"a rank failed first: {message}"
    rank = message.get("extraInfo", {}).get("rank", "?")
    text = str(message.get("message", "")).strip().splitlines()
    return f"rank {rank} failed first: {text[-1] if text else 'no message'}"


def failure_summary(
    run_dir: Path, steps: list[dict], returncode: int, timeout_s: float | None
) -> str:
    """Why a run failed, cause first: the timeout, a non-finite loss, or the first failed rank."""
    if timeout_s is not None:
        return f"timed out after {timeout_s:.0f} s (a hung collective or a stuck rank); every rank was ended"
    gone = vanished(run_dir)
    if gone:
        return f"{gone} (the ranks could not write their steps, logs or provenance); torchrun exited {returncode}"
    why = non_finite_summary(run_dir, steps)
    if why:
        return why
    # A rank killed from outside leads: the exception a peer raised on losing it is a consequence.
    ranks = "; ".join(
        part for part in (deaths.killed_rank(run_dir), first_failure(run_dir)) if part
    )
    launcher = deaths.torchrun_killed(returncode) or f"torchrun exited {returncode}"
    return f"{launcher}; {ranks}" if ranks else launcher

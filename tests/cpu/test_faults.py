"""Faults end a run within a bounded time, with the failing rank's log lines, and leave no process behind.

Each test asserts what the failing rank itself wrote (its exception or the line
``harness/faults.py`` prints before it acts), found in that rank's section of the
failure message, not the harness's own headers ("--- rank N: ...") or summary.
"""

from __future__ import annotations

import os
import re
import time

import pytest

from harness.faults import ENV
from harness.launch import LaunchError, launch
from harness.options import RunOptions
from harness.checks import preflight


#: The header harness.launch.rank_log_tails puts before each rank's log tail.
RANK_HEADER = re.compile(r"^--- rank (\S+): last \d+ lines of .*$", re.MULTILINE)


def processes_started_from(run_dir) -> list[int]:
    """Live processes whose command line names this run's directory (torchrun and its ranks)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
        except OSError:
            continue
        if str(run_dir) in cmdline:
            found.append(int(pid))
    return found


def rank_sections(message: str) -> dict[str, str]:
    """Rank name → the log lines the failure message carries for it (headers removed)."""
    headers = list(RANK_HEADER.finditer(message))
    return {
        h.group(1): message[h.end() : headers[i + 1].start() if i + 1 < len(headers) else len(message)]
        for i, h in enumerate(headers)
    }


def launch_failing(tmp_path, cli_overrides=(), steps: int = 4, timeout_s: float = 240) -> tuple[LaunchError, float]:
    opts = preflight(
        RunOptions(recipe="native_qwen3", tier="cpu", nproc=2, steps=steps, init="random", run_dir=tmp_path, export=False)
    )
    started = time.perf_counter()
    with pytest.raises(LaunchError) as failure:
        launch(opts, list(cli_overrides), echo=lambda line: None, timeout_s=timeout_s)
    return failure.value, time.perf_counter() - started


def launch_with_fault(tmp_path, monkeypatch, fault: str, timeout_s: float) -> tuple[LaunchError, float]:
    monkeypatch.setenv(ENV, fault)
    return launch_failing(tmp_path, timeout_s=timeout_s)


def test_rank_sections_split_the_failure_message():
    message = "run failed: torchrun exited 1.\n--- rank 0: last 2 lines of /a/0/stderr.log\nzero\n--- rank 1: last 1 lines of /a/1/stderr.log\none"
    assert rank_sections(message) == {"0": "\nzero\n", "1": "\none"}


def test_a_raising_rank_shows_its_own_exception(tmp_path, record_property):
    """Both ranks fail torchtitan's batch check; each one's own traceback reaches the failure."""
    error, _ = launch_failing(tmp_path, ["--training.local_batch_size", "0"], steps=1, timeout_s=300)
    sections = rank_sections(str(error))
    record_property("failing_rank_sections", sorted(sections))
    assert sorted(sections) == ["0", "1"], str(error)[-2000:]
    for rank, text in sections.items():
        # torchtitan 0.3.0 Trainer.__init__: ``assert global_batch_size > 0``; torch elastic prefixes "[rankN]:".
        assert f"[rank{rank}]: AssertionError" in text, text
        assert "assert global_batch_size > 0" in text, text
    # The summary names the first rank to fail (torch elastic's error file) and its exception.
    record_property("failing_rank_summary", error.summary)
    assert re.search(r"rank [01] failed first: AssertionError", error.summary), error.summary


def test_a_rank_that_dies_mid_run_fails_the_run_with_its_log_lines(tmp_path, monkeypatch, record_property):
    error, elapsed = launch_with_fault(tmp_path, monkeypatch, "die@1:2", timeout_s=240)
    record_property("rank_death_seconds_to_fail", elapsed)
    sections = rank_sections(str(error))
    assert "[fault injection] die on rank 1 at step 2" in sections.get("1", ""), str(error)[-2000:]
    assert "[fault injection]" not in sections.get("0", "")
    assert "torchrun exited" in error.summary
    assert processes_started_from(tmp_path) == []


#: Test-only launch timeout for the hang: step 2 is reached ~8 s after launch here (about 15 s
#: on a loaded 2-core CI runner), so 40 s leaves room and spends no minute waiting (it was 75 s).
HANG_TIMEOUT_S = 40


def test_a_hung_collective_is_ended_by_the_timeout(tmp_path, monkeypatch, record_property):
    error, elapsed = launch_with_fault(tmp_path, monkeypatch, "hang@1:2", timeout_s=HANG_TIMEOUT_S)
    record_property("hang_seconds_to_fail", elapsed)
    assert f"timed out after {HANG_TIMEOUT_S} s" in error.summary
    assert "[fault injection] hang on rank 1 at step 2" in rank_sections(str(error)).get("1", ""), str(error)[-2000:]
    assert elapsed < HANG_TIMEOUT_S + 30
    assert processes_started_from(tmp_path) == []


def test_non_finite_loss_names_the_step_and_last_good_loss(tmp_path, monkeypatch, record_property):
    error, _ = launch_with_fault(tmp_path, monkeypatch, "nan@0:3", timeout_s=240)
    record_property("non_finite_summary", error.summary)
    # torchtitan 0.3.0 Trainer.train_step raises this on every rank (global_avg_loss is a SUM reduction).
    raised = "RuntimeError: Loss is not finite (global_avg_loss=nan) at step 3"
    sections = rank_sections(str(error))
    assert sorted(sections) == ["0", "1"] and all(raised in text for text in sections.values()), str(error)[-3000:]
    assert "loss became non-finite (nan) at step 3" in error.summary
    assert "last good loss" in error.summary and "at step 2" in error.summary
    assert [s["step"] for s in error.result.steps] == [1, 2]
    assert processes_started_from(tmp_path) == []

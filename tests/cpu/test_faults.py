"""Faults end a run within a bounded time, with the failing rank's log lines, and leave no process behind."""

from __future__ import annotations

import os
import time

import pytest

from recipes.faults import ENV
from recipes.launch import LaunchError, launch
from recipes.options import RunOptions
from recipes.preflight import preflight

pytestmark = pytest.mark.cpu


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


def launch_with_fault(tmp_path, monkeypatch, fault: str, timeout_s: float) -> tuple[LaunchError, float]:
    monkeypatch.setenv(ENV, fault)
    opts = preflight(
        RunOptions(recipe="native_qwen3", tier="cpu", nproc=2, steps=4, init="random", run_dir=tmp_path, export=False)
    )
    started = time.perf_counter()
    with pytest.raises(LaunchError) as failure:
        launch(opts, echo=lambda line: None, timeout_s=timeout_s)
    return failure.value, time.perf_counter() - started


def test_a_rank_that_dies_mid_run_fails_the_run_with_its_log_lines(tmp_path, monkeypatch, record_property):
    error, elapsed = launch_with_fault(tmp_path, monkeypatch, "die@1:2", timeout_s=240)
    record_property("rank_death_seconds_to_fail", elapsed)
    assert "[fault injection] die on rank 1 at step 2" in str(error)
    assert "torchrun exited" in error.summary
    assert processes_started_from(tmp_path) == []


def test_a_hung_collective_is_ended_by_the_timeout(tmp_path, monkeypatch, record_property):
    error, elapsed = launch_with_fault(tmp_path, monkeypatch, "hang@1:2", timeout_s=75)
    record_property("hang_seconds_to_fail", elapsed)
    assert "timed out after 75 s" in error.summary
    assert "[fault injection] hang on rank 1 at step 2" in str(error)
    assert elapsed < 75 + 30
    assert processes_started_from(tmp_path) == []


def test_non_finite_loss_names_the_step_and_last_good_loss(tmp_path, monkeypatch, record_property):
    error, _ = launch_with_fault(tmp_path, monkeypatch, "nan@0:3", timeout_s=240)
    record_property("non_finite_summary", error.summary)
    assert "loss became non-finite (nan) at step 3" in error.summary
    assert "last good loss" in error.summary and "at step 2" in error.summary
    assert [s["step"] for s in error.result.steps] == [1, 2]
    assert processes_started_from(tmp_path) == []

"""Faults end a run within a bounded time, with the failing rank's log lines, and leave no process behind.

Each test asserts what the failing rank itself wrote (its exception or the line
``harness/rank/faults.py`` prints before it acts), found in that rank's section of the
failure message, not the harness's own headers ("--- rank N: ...") or summary.
Each runs on both ways ranks start (the ``rank_start`` fixture: "exec", trn2's
torchrun, and "preloaded", the cpu tier's harness.launch.elastic), and a watch of the
run's processes must have seen torchrun and every rank alive before "none left"
is believed (tests/cpu/run_watch.py).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import pytest
from run_watch import RunWatch, describe, run_roles

from harness.checks.preflight import preflight
from harness.launch.lifecycle import GRACE_S, LaunchError, launch
from harness.options.run_options import RunOptions
from harness.rank.faults import ENV

NPROC = 2


#: The header harness.launch.failures.rank_log_tails puts before each rank's log tail.
RANK_HEADER = re.compile(r"^--- rank (\S+): last \d+ lines of .*$", re.MULTILINE)


def rank_sections(message: str) -> dict[str, str]:
    """Rank name → the log lines the failure message carries for it (headers removed)."""
    headers = list(RANK_HEADER.finditer(message))
    return {
        h.group(1): message[
            h.end() : headers[i + 1].start() if i + 1 < len(headers) else len(message)
        ]
        for i, h in enumerate(headers)
    }


@dataclass
class Failed:
    error: LaunchError
    #: Seconds from the launch to launch() raising, and to the launcher's last new step (None: no step).
    elapsed: float
    last_step_at: float | None
    watch: RunWatch


def launch_failing(tmp_path, cli_overrides=(), steps: int = 4, **limits) -> Failed:
    """Launch a run that must fail, watching its processes from before the launch to the end."""
    opts = preflight(
        RunOptions(
            recipe="native_qwen3",
            tier="cpu",
            nproc=NPROC,
            steps=steps,
            init="random",
            run_dir=tmp_path,
            export=False,
        )
    )
    started = time.perf_counter()
    shown = []
    with RunWatch(tmp_path) as watch, pytest.raises(LaunchError) as failure:
        launch(
            opts,
            list(cli_overrides),
            echo=lambda line: shown.append(time.perf_counter() - started),
            **limits,
        )
    # shown[0] is the launcher's "N process(es), run dir" line; each later one a new step.
    return Failed(
        failure.value, time.perf_counter() - started, shown[-1] if len(shown) > 1 else None, watch
    )


def launch_with_fault(tmp_path, monkeypatch, fault: str, **limits) -> Failed:
    monkeypatch.setenv(ENV, fault)
    return launch_failing(tmp_path, **limits)


def assert_none_left(watch: RunWatch, rank_start: str) -> None:
    """Torchrun (or harness.launch.elastic and its forkserver) and every rank were seen alive; none is alive now."""
    watch.saw(
        **run_roles(rank_start, NPROC, launcher=False)
    )  # the launcher is this test's own process
    assert watch.rank_starts() == {rank_start}, (
        f"ranks started {watch.rank_starts()}, not {rank_start!r} ({watch.summary()})"
    )
    left = watch.kill_left()
    assert left == [], f"{len(left)} process(es) of the run outlived launch(): {describe(left)}"


def test_rank_sections_split_the_failure_message():
    message = "run failed: torchrun exited 1.\n--- rank 0: last 2 lines of /a/0/stderr.log\nzero\n--- rank 1: last 1 lines of /a/1/stderr.log\none"
    assert rank_sections(message) == {"0": "\nzero\n", "1": "\none"}


@pytest.mark.slow
def test_a_raising_rank_shows_its_own_exception(tmp_path, rank_start, record_property):
    """Both ranks fail torchtitan's batch check; each one's own traceback reaches the failure."""
    failed = launch_failing(tmp_path, ["--training.local_batch_size", "0"], steps=1, timeout_s=300)
    error = failed.error
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
    assert_none_left(failed.watch, rank_start)


@pytest.mark.slow
def test_a_rank_that_dies_mid_run_fails_the_run_with_its_log_lines(
    tmp_path, monkeypatch, rank_start, record_property
):
    failed = launch_with_fault(tmp_path, monkeypatch, "die@1:2", timeout_s=240)
    record_property("rank_death_seconds_to_fail", failed.elapsed)
    sections = rank_sections(str(failed.error))
    assert "[fault injection] die on rank 1 at step 2" in sections.get("1", ""), str(failed.error)[
        -2000:
    ]
    assert "[fault injection]" not in sections.get("0", "")
    assert "torchrun exited" in failed.error.summary
    assert_none_left(failed.watch, rank_start)


@pytest.mark.slow
def test_a_rank_killed_by_a_signal_is_named_with_it(
    tmp_path, monkeypatch, rank_start, record_property
):
    """Issue 46 item 4: a SIGKILLed rank (what the OOM killer sends) is reported with the signal, not only
    'torchrun exited 1', ahead of the peer that failed on losing it.

    Exec ranks (trn2's start): torchrun lists every rank that had failed when it looked, and rank 1
    died before its peer could fail, so the SIGKILL is always there. Preloaded ranks: torch elastic's
    function-entrypoint context lists only the first rank its join saw (``MultiprocessContext._poll``),
    which on a loaded machine can be the peer; the CI of 2026-12-07 saw it. There the summary must
    still name the peer's error from the gloo collective that lost rank 1 ("Connection closed by peer",
    "Connection reset by peer" and "Broken pipe" were seen or are possible).
    """
    failed = launch_with_fault(tmp_path, monkeypatch, "kill@1:1", timeout_s=240)
    summary = failed.error.summary
    record_property("killed_rank_summary", summary)
    named = "rank 1 was killed by SIGKILL (signal 9, pid " in summary
    if rank_start == "exec":
        assert named, summary
    else:
        assert named or re.search(r"rank 0 failed first: RuntimeError: \[[^\]]*/gloo/", summary), (
            summary
        )
    assert_none_left(failed.watch, rank_start)


#: Test-only stall limit for the hang (``launch(stall_timeout_s=...)``): no new step for this
#: long after step 1 ends the run. A step takes ~0.4 s here (a few s on a loaded 2-core runner),
#: so 10 s leaves room; the whole launch's timeout (tested in test_platform.py) would have to
#: wait for start-up too (it was 40 s, and exec ranks start slower than preloaded ones).
STALL_S = 10


@pytest.mark.slow
def test_a_hung_collective_is_ended_by_the_stall_timeout(
    tmp_path, monkeypatch, rank_start, record_property
):
    failed = launch_with_fault(
        tmp_path, monkeypatch, "hang@1:2", timeout_s=240, stall_timeout_s=STALL_S
    )
    record_property("hang_seconds_to_fail", failed.elapsed)
    assert f"no new step for {STALL_S} s after step 1" in failed.error.summary, failed.error.summary
    sections = rank_sections(str(failed.error))
    assert "[fault injection] hang on rank 1 at step 2" in sections.get("1", ""), str(failed.error)[
        -2000:
    ]
    assert failed.last_step_at is not None
    ended_after = failed.elapsed - failed.last_step_at
    record_property("hang_seconds_from_last_step_to_fail", ended_after)
    # The stall limit, plus end_run's GRACE_S for torchrun to close its ranks, plus a margin.
    assert STALL_S <= ended_after < STALL_S + GRACE_S + 10
    assert_none_left(failed.watch, rank_start)


@pytest.mark.slow
def test_non_finite_loss_names_the_step_and_last_good_loss(
    tmp_path, monkeypatch, rank_start, record_property
):
    failed = launch_with_fault(tmp_path, monkeypatch, "nan@0:3", timeout_s=240)
    error = failed.error
    record_property("non_finite_summary", error.summary)
    # torchtitan 0.3.0 Trainer.train_step raises this on every rank (global_avg_loss is a SUM reduction).
    raised = "RuntimeError: Loss is not finite (global_avg_loss=nan) at step 3"
    sections = rank_sections(str(error))
    assert sorted(sections) == ["0", "1"] and all(raised in text for text in sections.values()), (
        str(error)[-3000:]
    )
    assert "loss became non-finite (nan) at step 3" in error.summary
    assert "last good loss" in error.summary and "at step 2" in error.summary
    assert [s["step"] for s in error.result.steps] == [1, 2]
    assert_none_left(failed.watch, rank_start)

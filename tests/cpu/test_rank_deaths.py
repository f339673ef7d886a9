"""Issue 46 item 4: a rank ended by a signal is named with it, and the OOM killer only where the kernel says so."""

from __future__ import annotations

import json

import pytest

from harness.base.run_dir import CONSOLE_FILE, ERROR_FILE
from harness.launch import deaths
from harness.launch.failures import failure_summary

#: torchrun's ChildFailedError as it printed one for a SIGKILLed rank (cpu tier, torch 2.14).
ROOT_CAUSE = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
harness.rank.train FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_13:07:40
  host      : host
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 24868)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 24868
============================================================
"""


@pytest.fixture
def no_oom_evidence(monkeypatch):
    """Neither the kernel log nor the cgroup says the OOM killer sent a kill."""
    monkeypatch.setattr(deaths, "kernel_says", lambda pid: None)
    monkeypatch.setattr(deaths, "oom_kills", lambda: dict(deaths.AT_START))


def console(tmp_path, text: str):
    (tmp_path / CONSOLE_FILE).write_text(text)
    return tmp_path


def test_a_sigkilled_rank_is_named_with_the_signal(tmp_path, no_oom_evidence):
    said = deaths.killed_rank(console(tmp_path, ROOT_CAUSE))
    assert said == "rank 1 was killed by SIGKILL (signal 9, pid 24868)", said


def test_the_oom_killer_is_named_when_the_kernel_log_says_so(tmp_path, monkeypatch):
    line = "Out of memory: Killed process 24868 (python) total-vm:12GB"
    monkeypatch.setattr(deaths, "kernel_says", lambda pid: line if pid == 24868 else None)
    said = deaths.killed_rank(console(tmp_path, ROOT_CAUSE))
    assert "the kernel's OOM killer sent it" in said and line in said, said


def test_the_oom_killer_is_named_when_the_cgroup_counts_a_new_kill(tmp_path, monkeypatch):
    events = tmp_path / "memory.events"
    monkeypatch.setattr(deaths, "kernel_says", lambda pid: None)
    monkeypatch.setattr(deaths, "AT_START", {events: 2})
    monkeypatch.setattr(deaths, "oom_kills", lambda: {events: 3})
    said = deaths.killed_rank(console(tmp_path, ROOT_CAUSE))
    assert f"{events} counts 1 OOM kill(s) since the launcher started" in said, said


#: The CI's run of kill@1:1 (torch 2.14): rank 1 SIGKILLed, rank 0's gloo error timed in the same second,
#: so torch elastic called rank 0 first (its smallest timestamp, ties to the lowest rank).
PEER_CALLED_FIRST = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
harness.rank.train FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-07_18:02:11
  host      : host
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 5120)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 5120
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_18:02:11
  host      : host
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 5119)
  error_file: /tmp/run/torchelastic/0/error.json
  traceback : Traceback (most recent call last):
    RuntimeError: Connection closed by peer [127.0.0.1]:49817.
============================================================
"""


def test_a_sigkilled_rank_leads_a_peer_torch_elastic_called_first(tmp_path, no_oom_evidence):
    """The CI failure of 2026-12-07: the SIGKILL is the cause even when a peer's exception is timed first."""
    console(tmp_path, PEER_CALLED_FIRST)
    (tmp_path / ERROR_FILE).write_text(
        json.dumps(
            {
                "message": {
                    "message": "RuntimeError: Connection closed by peer",
                    "extraInfo": {"rank": 0},
                }
            }
        )
    )
    said = failure_summary(tmp_path, [], 1, None)
    assert said == (
        "torchrun exited 1; rank 1 was killed by SIGKILL (signal 9, pid 5120); "
        "rank 0 failed first: RuntimeError: Connection closed by peer"
    ), said


def test_a_sigkill_leads_a_root_cause_another_signal_ended(tmp_path, no_oom_evidence):
    """Seen on this machine: rank 0 raised, wrote its error file, then was SIGTERMed by torchrun; its
    error file's earlier time made it the root cause, and rank 1's SIGKILL was listed beside it."""
    text = PEER_CALLED_FIRST.replace("exitcode  : 1 (pid: 5119)", "exitcode  : -15 (pid: 5119)")
    said = deaths.killed_rank(console(tmp_path, text))
    assert said.startswith("rank 1 was killed by SIGKILL (signal 9, pid 5120)"), said


def test_a_peer_ended_by_another_signal_does_not_lead(tmp_path):
    """Only a SIGKILL comes from outside for sure; a SIGABRT beside the root cause may be its consequence."""
    text = PEER_CALLED_FIRST.replace("-9 (pid: 5120)", "-6 (pid: 5120)")
    assert deaths.killed_rank(console(tmp_path, text)) is None


def test_a_rank_that_exited_is_no_signal(tmp_path):
    text = ROOT_CAUSE.replace("-9 (pid: 24868)  (SIGKILL)", "17 (pid: 24868)")
    assert deaths.killed_rank(console(tmp_path, text)) is None
    assert deaths.killed_rank(tmp_path / "missing") is None


def test_torchrun_killed_by_a_signal():
    assert deaths.torchrun_killed(-15) == "torchrun was killed by SIGTERM"
    assert deaths.torchrun_killed(1) is None

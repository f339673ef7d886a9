"""Issue 46 item 4: a rank ended by a signal is named with it, and the OOM killer only where the kernel says so."""

from __future__ import annotations

from harness.base.run_dir import CONSOLE_FILE
from harness.launch import deaths

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


def console(tmp_path, text: str):
    (tmp_path / CONSOLE_FILE).write_text(text)
    return tmp_path


def test_a_sigkilled_rank_is_named_with_the_signal(tmp_path, monkeypatch):
    monkeypatch.setattr(deaths, "kernel_says", lambda pid: None)
    monkeypatch.setattr(deaths, "oom_kills", lambda: dict(deaths.AT_START))
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


def test_a_rank_that_exited_is_no_signal(tmp_path):
    text = ROOT_CAUSE.replace("-9 (pid: 24868)  (SIGKILL)", "17 (pid: 24868)")
    assert deaths.killed_rank(console(tmp_path, text)) is None
    assert deaths.killed_rank(tmp_path / "missing") is None


def test_torchrun_killed_by_a_signal():
    assert deaths.torchrun_killed(-15) == "torchrun was killed by SIGTERM"
    assert deaths.torchrun_killed(1) is None

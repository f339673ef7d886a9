"""The launch watchdog (harness/launch/watchdog.py): a rank silent past its budget ends the launch with
every rank's stack and one line naming where the stalled rank stood.

The slow test stops one rank of a real cpu run with SIGSTOP mid-training, as a hang would stop it, with
the after-step-1 floor made small (``QWEN3_WATCHDOG_FLOOR_S``), and asserts the run ends within that
budget + 30 s, with a py-spy dump per rank in the run directory and the stall line naming the function.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_watch import RunWatch, describe

from harness.base import processes
from harness.base.run_dir import HEARTBEAT_DIR, STACKS_DIR
from harness.checks.preflight import preflight
from harness.launch import watchdog
from harness.launch.lifecycle import Stalled, launch
from harness.options.run_options import RunOptions

LINE = re.compile(r"^stalled: rank (\d+) in (\S+) \((.+):(\d+)\) after (\d+) s$")


@pytest.fixture
def sleeper():
    """A Python process asleep in a function of its own, ``nap``."""
    code = "import time\ndef nap():\n    while True:\n        time.sleep(0.1)\nnap()\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    time.sleep(1.0)
    yield proc
    proc.kill()
    proc.wait()


def test_py_spy_is_found_through_its_distribution_when_not_beside_the_interpreter(
    monkeypatch, tmp_path
):
    """A venv layered on another (the trn2 tier on the DLAMI's, the rehearsal's neuron venv) imports py-spy's
    distribution from the base venv, whose bin/ is neither beside its python nor on PATH. Seen failing before
    the distribution lookup (None: no stack on a stall)."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "layered" / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    found = watchdog.py_spy()
    assert found and Path(found).is_file() and Path(found).name == "py-spy", found


def test_py_spy_names_the_main_threads_top_frame_running_and_stopped(sleeper):
    """py-spy works here (ptrace), and a SIGSTOPped process is read with --nonblocking."""
    assert watchdog.py_spy(), "py-spy is in the lock (requirements.in)"
    frame = watchdog.top_frame(watchdog.dump_stack(sleeper.pid), sleeper.pid)
    assert frame == ("nap", "<string>", 4), frame
    os.kill(sleeper.pid, signal.SIGSTOP)
    try:
        frame = watchdog.top_frame(watchdog.dump_stack(sleeper.pid), sleeper.pid)
    finally:
        os.kill(sleeper.pid, signal.SIGCONT)
    assert frame == ("nap", "<string>", 4), frame


def test_a_failed_dump_says_why_and_the_line_still_appears(tmp_path):
    dumps = watchdog.dump_stacks(tmp_path, {"rank0": 2**22 + 7})  # no such process
    text = (tmp_path / STACKS_DIR / "rank0.txt").read_text()
    assert text.startswith("py-spy could not read the stack") and "exit" in text, text
    stall = watchdog.Stall(rank=0, pid=2**22 + 7, silent_s=91.4, phase="start", step=0)
    assert watchdog.stall_line(stall, dumps) == (
        "stalled: rank 0 in an unknown function (no stack) after 91 s"
    )


def test_budgets_by_phase():
    b = watchdog.CPU
    assert b.allowed("start", 0, 0.0) == b.allowed("built", 0, 0.0) == 90.0
    assert b.allowed("step", 1, 0.0) == 60.0, "after step 1, no step measured yet: the floor"
    assert b.allowed("step", 5, 0.4) == 60.0, "10 x 0.4 s is under the floor"
    assert b.allowed("step", 5, 12.0) == 120.0
    assert b.allowed("finish", 5, 12.0) == 90.0


def test_the_trn2_default_is_the_plans_costliest_launch():
    """watchdog.TRN2 (``python -m harness run --tier trn2``, no plan launch) equals the plan's largest budget."""
    from harness.night import plan

    budgets = [plan.watchdog_budgets(name) for name in plan.launch_estimates()]
    assert max(b.before_first_step_s for b in budgets) == watchdog.TRN2.before_first_step_s


def test_the_rank_named_is_the_one_behind_and_stopped_first(tmp_path, sleeper):
    dog = watchdog.Watchdog(tmp_path, 3, watchdog.CPU)
    beats = tmp_path / HEARTBEAT_DIR
    beats.mkdir()
    now = time.time()
    for rank, pid, step in ((0, os.getpid(), 7), (1, sleeper.pid, 7), (2, os.getpid(), 8)):
        record = {"rank": rank, "pid": pid, "phase": "step", "step": step, "step_s": 0.5}
        (beats / f"rank{rank}.json").write_text(json.dumps({**record, "unix_s": now - 100}))
    assert dog.check(now - 50) is None
    assert dog.check(now).rank == 0, "ranks 0 and 1 are behind; neither is stopped: the first"
    os.kill(sleeper.pid, signal.SIGSTOP)
    try:
        # SIGSTOP is delivered asynchronously: wait until the kernel shows the process stopped (state T)
        deadline = time.monotonic() + 10
        while processes.read(sleeper.pid).state not in ("T", "t") and time.monotonic() < deadline:
            time.sleep(0.01)
        stall = dog.check(now)
    finally:
        os.kill(sleeper.pid, signal.SIGCONT)
    assert (stall.rank, stall.step, round(stall.silent_s)) == (1, 7, 100)


#: The test's after-step-1 floor (the cpu tier's is 60 s): a step takes ~0.4 s here.
FLOOR_S = 10


@pytest.mark.slow
def test_a_stopped_rank_ends_the_run_with_stacks_and_one_line(
    tmp_path, monkeypatch, record_property
):
    monkeypatch.setenv(watchdog.FLOOR_ENV, str(FLOOR_S))
    opts = preflight(
        RunOptions(
            recipe="native_qwen3",
            tier="cpu",
            nproc=2,
            steps=2000,
            init="random",
            run_dir=tmp_path,
            export=False,
        )
    )
    lines, stopped = [], {}

    def echo(line: str) -> None:
        lines.append(line)
        beat = tmp_path / HEARTBEAT_DIR / "rank1.json"
        if not stopped and beat.exists():
            record = json.loads(beat.read_text())
            if record["step"] >= 3:  # mid-training: stop rank 1 where it stands
                os.kill(record["pid"], signal.SIGSTOP)
                stopped.update(record, at=time.monotonic())

    with RunWatch(tmp_path) as watch, pytest.raises(Stalled) as failure:
        launch(opts, echo=echo, timeout_s=600)
    ended_after = time.monotonic() - stopped["at"]
    record_property("stall_seconds_from_sigstop_to_end", ended_after)
    line = failure.value.summary
    record_property("stall_line", line)
    assert ended_after < FLOOR_S + 30, (ended_after, line)
    match = LINE.match(line)
    assert match, line
    assert line in lines, "the console says it"
    assert failure.value.result.stalled == line, "the report records it"
    assert match.group(1) == "1", f"rank 1 was stopped: {line}"
    dumps = {p.name: p.read_text() for p in (tmp_path / STACKS_DIR).iterdir()}
    assert set(dumps) == {"rank0.txt", "rank1.txt"}, sorted(dumps)
    function, file, number = watchdog.top_frame(dumps["rank1.txt"], stopped["pid"])
    assert (match.group(2), match.group(3), int(match.group(4))) == (function, file, number)
    for name, text in dumps.items():
        assert "Thread" in text and watchdog.top_frame(text, 0), f"{name}: {text[:2000]}"
    left = watch.kill_left()
    assert left == [], f"{len(left)} process(es) outlived the stalled launch: {describe(left)}"

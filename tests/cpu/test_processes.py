"""The suite's one process finder (harness.base.processes) and the watch the no-orphan tests rely on.

A real process tree, no launch: a parent that names its run only in its environment
(as a forked rank does), a child that cleared its environment (found through the
tree), and a process of a run whose directory shares a prefix (not found).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from run_watch import RunWatch

from harness.base import processes
from harness.base.processes import RANK_NAME, RUN_DIR_ENV, Process
from recipes.tiers import REPO_ROOT

#: A parent that starts a child with an empty environment, prints the child's pid, and sleeps.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env={})
print(child.pid, flush=True)
time.sleep(120)
"""


def start(run_dir, script: str = PARENT) -> tuple[subprocess.Popen, int | None]:
    env = {**os.environ, RUN_DIR_ENV: str(run_dir)}
    proc = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True
    )
    line = (
        proc.stdout.readline().strip()
    )  # once it prints, it runs the script (not the forking pytest)
    return proc, int(line) if line else None


def test_a_run_is_found_by_its_environment_and_its_tree_not_by_a_shared_prefix(tmp_path):
    run = tmp_path / "run"
    parent, child = start(run)
    other, _ = start(tmp_path / "run-other", "import time; print(flush=True); time.sleep(120)")
    try:
        found = {p.pid for p in processes.of_run(run)}
        assert found == {parent.pid, child}, (
            "the marker finds the parent, the tree its env-less child"
        )
        assert processes.read(child).run_dir is None
        assert other.pid not in found
        assert {parent.pid, child, other.pid} <= {p.pid for p in processes.of_run(tmp_path)}
        assert processes.of_run(tmp_path / "elsewhere") == []
    finally:
        for proc in (parent, other):
            proc.kill()
            proc.wait()
        os.kill(child, signal.SIGKILL)


def test_the_watch_keeps_an_orphan_the_tree_no_longer_reaches(tmp_path):
    """The env-less child outlives its SIGKILLed parent: re-parented, only the watch still knows it."""
    run = tmp_path / "run"
    with RunWatch(run) as watch:
        parent, child = start(run)
        deadline = time.monotonic() + 30
        while len(watch.seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        parent.kill()
        parent.wait()
    assert child not in {p.pid for p in processes.of_run(run)}, "the finder alone lost the orphan"
    assert [p.pid for p in watch.left()] == [child]
    assert [p.pid for p in watch.kill_left()] == [child]
    assert watch.seconds_until_gone(10) < 10


def test_a_watch_that_saw_nothing_fails_before_none_left_is_believed(tmp_path):
    with RunWatch(tmp_path, finder=lambda root, parents=(): []) as watch:
        time.sleep(0.2)
    assert watch.left() == []  # what a blind finder says about any run
    with pytest.raises(AssertionError, match=r"saw too few .*'rank': \(0, 2\).*all seen: nothing"):
        watch.saw(rank=2)


def proc(pid: int, ppid: int, *argv: str, name: str = "python") -> Process:
    return Process(pid=pid, ppid=ppid, state="S", started=pid, argv=argv, run_dir="/r", name=name)


FORKSERVER = (
    "python",
    "-B",
    "-c",
    "from multiprocessing.forkserver import main; main(3, 5, ['x'])",
)


@pytest.mark.parametrize(
    "argv, ppid, name, role",
    [
        (
            ("python", "-m", "harness", "run", "native_qwen3", "--report-dir", "/r"),
            1,
            "python",
            "launcher",
        ),
        (
            ("python", "-m", "torch.distributed.run", "--standalone", "-m", "harness.rank.train"),
            2,
            "python",
            "torchrun",
        ),
        (
            ("/venv/bin/torchrun", "--nproc_per_node=2", "-m", "harness.rank.train"),
            2,
            "torchrun",
            "torchrun",
        ),
        (
            ("python", "-m", "harness.launch.elastic", "--preload", "harness.rank.train"),
            2,
            "python",
            "torchrun",
        ),
        (("python", "-u", "-m", "harness.rank.train", "--run-dir", "/r"), 3, "python", "rank"),
        (FORKSERVER, 3, "python", "forkserver"),
        (
            FORKSERVER,
            4,
            RANK_NAME,
            "rank",
        ),  # forked from the forkserver: its command line, its own name
        # Forked from the forkserver and not (yet) exec'd: cuda.pathfinder's `ldconfig -p` while torch imports.
        (FORKSERVER, 4, "python", "other"),
        (
            ("python", "-B", "-c", "from multiprocessing.resource_tracker import main;main(3)"),
            3,
            "python",
            "other",
        ),
    ],
)
def test_each_process_of_a_run_has_its_role(argv, ppid, name, role):
    procs = {3: proc(3, 1, "python", "-m", "harness.launch.elastic"), 4: proc(4, 3, *FORKSERVER)}
    assert processes.role(proc(9, ppid, *argv, name=name), procs) == role


def test_a_rank_is_read_by_the_name_it_gives_itself(tmp_path):
    """A rank's name_this_rank (harness.launch.elastic.run_forked_rank) is what /proc shows and read() parses."""
    script = (
        f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); "
        "from harness.launch.child import name_this_rank; name_this_rank(); "
        "import time; print(flush=True); time.sleep(120)"
    )
    child, _ = start(tmp_path / "run", script)
    try:
        assert processes.read(child.pid).name == RANK_NAME
        assert processes.read(os.getpid()).name != RANK_NAME
    finally:
        child.kill()
        child.wait()


#: A launcher stand-in that leaves behind, in a session of its own and deaf to SIGTERM, a process carrying its
#: run marker (as multiprocessing's resource tracker does when its parent is killed), then exits.
LEAVES_A_STRAGGLER = """
import signal, subprocess, sys
straggler = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                              "print(flush=True); time.sleep(120)"], stdout=subprocess.PIPE, start_new_session=True)
straggler.stdout.readline()  # it ignores SIGTERM from here on
print(straggler.pid, flush=True)
"""


@pytest.mark.parametrize("given_run_dir", [True, False])
def test_end_run_leaves_nothing_that_carries_the_run_marker(given_run_dir, tmp_path, monkeypatch):
    """The CI failure of 2026-12-06: a resource tracker outlived its SIGKILLed harness.launch.elastic; end_run
    with the run's directory waits a grace, then SIGKILLs; without it (the control) the straggler stays."""
    import harness.launch.lifecycle as launch_mod

    monkeypatch.setattr(launch_mod, "GRACE_S", 0.5)
    run = tmp_path / "run"
    launcher, straggler = start(run, LEAVES_A_STRAGGLER)
    try:
        launch_mod.end_run(launcher, run if given_run_dir else None)
        left = [p.pid for p in processes.marked(run)]
        assert left == ([] if given_run_dir else [straggler])
    finally:
        try:
            os.kill(straggler, signal.SIGKILL)
        except ProcessLookupError:
            pass

"""Issue 27 goal 5: ``python -m benchmarks compare`` on a tiny git repository of its own, never the real suite.

The repository's Makefile has the measured targets (``test``, ``test-fast``, ``repro``) as
commands that burn a known amount of CPU; its baseline commit's ``test`` also leaves an
orphan burning CPU after its parent exited, which only a subreaper counts. A stamp rule
like the real Makefile's fails the target if make would rebuild the shared venv.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import pytest

from benchmarks import common, compare
from recipes.tiers import REPO_ROOT

BURN = '''"""python burn.py OWN [ORPHAN]: spend OWN CPU seconds; first start an orphan that spends ORPHAN after we exit."""
import subprocess, sys, time
if len(sys.argv) > 2:
    subprocess.Popen([sys.executable, __file__, sys.argv[2]], start_new_session=True)
while time.process_time() < float(sys.argv[1]):
    pass
'''

MAKEFILE = """PYTHON ?= python3
STAMP := .venv/.lock-installed
$(STAMP): requirements-lock.txt
\t@echo "make would rebuild the shared venv here"; exit 3
test: $(STAMP)
\t$(PYTHON) burn.py {test}
repro: $(STAMP)
\t$(PYTHON) burn.py {repro}
"""
FAST = "test-fast: $(STAMP)\n\t$(PYTHON) burn.py 0.05\n"
#: The current checkout's rehearsal of the night (CI runs it, then make test): 0.2 s.
REHEARSAL = "rehearse-trn2: $(STAMP)\n\t$(PYTHON) burn.py 0.2\n"
#: The baseline's make test: 0.1 s itself, then an orphan spending 0.5 s after it exited.
BASELINE_TEST_CPU_S = 0.6


def git(repo, *args: str) -> str:
    return subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.invalid",
            *args,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def add_venv(repo) -> None:
    """The checkout's .venv as ``make venv`` leaves it: a stamp equal to the lock, older than any checkout."""
    stamp = repo / ".venv" / ".lock-installed"
    stamp.parent.mkdir(exist_ok=True)
    shutil.copy(repo / "requirements-lock.txt", stamp)
    old = time.time() - 3600
    os.utime(stamp, (old, old))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """Commit 1 (baseline): no test-fast, make test leaves an orphan. Commit 2 (current): half the CPU, a test-fast,
    a rehearsal."""
    path = tmp_path_factory.mktemp("bench-repo") / "repo"
    path.mkdir()
    git(path, "init", "-q")
    (path / "burn.py").write_text(BURN)
    (path / "requirements-lock.txt").write_text("torch==2.14.0 --hash=sha256:0\n")
    (path / ".gitignore").write_text(".venv/\n")
    (path / "Makefile").write_text(MAKEFILE.format(test="0.1 0.5", repro="0.4"))
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "baseline")
    (path / "Makefile").write_text(MAKEFILE.format(test="0.3", repro="0.2") + FAST + REHEARSAL)
    git(path, "commit", "-q", "-am", "current")
    add_venv(path)
    return path


def run_compare(repo, tmp_path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks",
        "compare",
        "--repo",
        str(repo),
        "--baseline",
        "HEAD~1",
        "--history",
        str(tmp_path / "history.jsonl"),
        "--out",
        str(tmp_path / "compare.json"),
        *args,
    ]
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_the_reaper_counts_orphans_that_waiting_for_the_command_misses(tmp_path, record_property):
    """An orphan's CPU: counted under the subreaper, lost by ``os.wait4`` on the command (run_timed)."""
    burn = tmp_path / "burn.py"
    burn.write_text(BURN)
    cmd = [sys.executable, str(burn), "0.05", "0.5"]
    out = tmp_path / "reaped.json"
    subprocess.run(
        [sys.executable, str(compare.REAPER), "--out", str(out), "--", *cmd],
        check=True,
        timeout=120,
    )
    reaped = json.loads(out.read_text())
    assert (
        reaped["returncode"] == 0
        and reaped["orphans_reaped"] == 1
        and reaped["processes_reaped"] == 2
    )
    assert reaped["cpu_s"] >= 0.55  # both processes' CPU: 0.05 + 0.5 (+ two interpreters' start-up)
    assert (
        reaped["wall_s"] < reaped["wall_until_last_exit_s"]
    )  # wall is the command's; the orphan ran on after it
    waited = common.run_timed(
        cmd, env=dict(os.environ), log_path=tmp_path / "naive.log", timeout_s=120
    )
    assert waited.cpu_s < 0.4  # the orphan's 0.5 s are not in the command's own rusage
    record_property("reaper_vs_wait4_cpu_s", [round(reaped["cpu_s"], 3), round(waited.cpu_s, 3)])
    time.sleep(1.0)  # let the naive run's orphan finish its 0.5 s before the next test


@pytest.mark.slow
def test_compare_runs_both_checkouts_alternately_and_reports_each_goal(
    repo, tmp_path, record_property
):
    done = run_compare(repo, tmp_path, "--reps", "2", "--suite-reps", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "compare.json").read_text())
    assert doc["checkouts"]["baseline"]["targets"] == ["repro", "test"]
    assert doc["checkouts"]["current"]["targets"] == ["rehearse-trn2", "repro", "test", "test-fast"]
    assert doc["checkouts"]["current"]["commit"] == git(repo, "rev-parse", "HEAD")
    ms = [compare.Measurement(**m) for m in doc["measurements"]]
    # side by side, the order alternating per repetition; the baseline has no test-fast to run
    assert [(m.name, m.rep, m.side) for m in ms] == [
        ("fast", 0, "current"),
        ("fast", 1, "current"),
        ("suite", 0, "baseline"),
        ("suite", 0, "current"),
        ("suite", 1, "current"),
        ("suite", 1, "baseline"),
        ("repro", 0, "baseline"),
        ("repro", 0, "current"),
        ("repro", 1, "current"),
        ("repro", 1, "baseline"),
    ]
    assert all(m.returncode == 0 and not m.timed_out for m in ms), (
        "make rebuilt the venv stamp or a target failed"
    )
    base_suite = compare.of(ms, "suite", "baseline")
    assert all(m.cpu_s >= BASELINE_TEST_CPU_S and m.orphans >= 1 for m in base_suite)
    goals = {g["name"]: g for g in doc["goals"]}
    assert list(goals) == [
        "make test CPU",
        "make test wall",
        "make test-fast vs make test",
        "make repro wall",
    ]
    cur_suite = compare.of(ms, "suite", "current")
    cpu_ratios = [c.cpu_s / b.cpu_s for c, b in zip(cur_suite, base_suite)]
    assert goals["make test CPU"]["measured"] == statistics.median(cpu_ratios)
    assert goals["make test CPU"]["spread"] == {
        "median": statistics.median(cpu_ratios),
        "min": min(cpu_ratios),
        "max": max(cpu_ratios),
        "n": 2,
    }
    assert (
        0.3 < goals["make test CPU"]["measured"] < 0.7
    )  # 0.3 s against 0.6 s of burning, plus start-ups
    assert goals["make test CPU"]["met"] == (goals["make test CPU"]["measured"] <= 0.5)
    suite_wall = statistics.median(m.wall_s for m in cur_suite)
    fast = [m.wall_s / suite_wall for m in compare.of(ms, "fast", "current")]
    assert goals["make test-fast vs make test"]["measured"] == statistics.median(fast)
    assert goals["make repro wall"]["target"] == "current / baseline wall time ≤ 0.6"
    assert "CPU flags" in done.stdout and "median of 2; min-max" in done.stdout
    (line,) = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert line["goals"] == doc["goals"] and line["machine"]["cpu_flags"] == common.cpu_flags()
    # the baseline's worktree is gone, from the disk and from git
    assert not os.path.exists(doc["checkouts"]["baseline"]["path"])
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    record_property("goals", {n: g["measured"] for n, g in goals.items()})


def test_a_checkout_without_test_fast_makes_that_goal_not_measurable(repo, tmp_path):
    old = tmp_path / "old"
    git(tmp_path, "clone", "-q", str(repo), str(old))
    git(old, "checkout", "-q", "HEAD~1")
    add_venv(old)
    done = run_compare(old, tmp_path, "--only", "fast", "--baseline", "HEAD")
    assert done.returncode == 0, done.stderr
    assert (
        "goal make test-fast vs make test: test-fast wall / test wall ≤ 1/6, measured –: not measured "
        "(not measurable: no test-fast target)" in done.stdout
    )
    assert json.loads((tmp_path / "compare.json").read_text())["measurements"] == []


def test_a_baseline_with_another_lock_is_refused_in_one_line(repo, tmp_path):
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(repo), str(other))
    (other / "requirements-lock.txt").write_text("torch==2.15.0 --hash=sha256:1\n")
    git(other, "commit", "-q", "-am", "bump torch")
    add_venv(other)
    done = run_compare(other, tmp_path)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    base = git(other, "rev-parse", "HEAD~1")[:9]
    assert line.startswith(
        f"python -m benchmarks compare: error: requirements-lock.txt of {base} differs from "
    )
    assert "cannot reuse .venv" in line
    assert not (tmp_path / "history.jsonl").exists()


def test_ci_is_the_rehearsal_and_make_test_against_the_baselines_make_test(
    repo, tmp_path, record_property
):
    """Issue 37 goal 2: the baseline has no rehearse-trn2, so its CI is make test (0.1 s + a 0.5 s orphan); the
    current checkout's is its rehearsal (0.2 s) then make test (0.3 s), in one make."""
    done = run_compare(
        repo, tmp_path, "--only", "ci", "--reps", "3"
    )  # ci repeats --suite-reps (1) times
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "compare.json").read_text())
    ms = {m["side"]: compare.Measurement(**m) for m in doc["measurements"]}
    assert set(ms) == {"baseline", "current"} and all(m.returncode == 0 for m in ms.values())
    rows = [line.split()[:4] for line in done.stdout.splitlines() if line.startswith("make ")]
    assert rows == [["make", "test", "baseline", "1"], ["make", "rehearse-trn2", "test", "current"]]
    ran = [
        line.split("burn.py ")[1]
        for line in open(ms["current"].log).read().splitlines()
        if "burn.py " in line
    ]
    assert ran == ["0.2", "0.3"]  # make echoes each recipe: the rehearsal, then make test
    (goal,) = doc["goals"]
    assert goal["name"] == "CI CPU (make rehearse-trn2 test)"
    assert goal["measured"] == ms["current"].cpu_s / ms["baseline"].cpu_s
    assert (
        0.6 < goal["measured"] < 1.0 and goal["met"] is True
    )  # 0.5 s against 0.6 s, plus start-ups
    line = json.loads((tmp_path / "history.jsonl").read_text())
    assert (
        line["commit"] == git(repo, "rev-parse", "HEAD")
        and line["figures"]["compare"]["ci_current_cpu_s"] > 0
    )
    record_property("ci_ratio", goal["measured"])

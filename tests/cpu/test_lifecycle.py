"""A run ends cleanly whatever happens to it: no orphans, refusals before launch, nothing measured lost.

The signal tests start the real main job (``python -m harness run``: parent,
torchrun, two ranks), wait until rank 0 has logged a training step, signal the
parent the way a CI cancel (SIGTERM) or the OOM killer (SIGKILL) would, and then
watch /proc until no process of the run is left. The bound they assert is the
launcher's: ``GRACE_S`` for torchrun to close its ranks, plus a margin for the
kernel's parent-death signals and process exit on a loaded 2-core machine.
Each runs on both ways ranks start (the ``rank_start`` fixture), and "no process
left" counts only once a watch of the run (tests/cpu/run_watch.py) has seen the
launcher, torchrun and every rank alive.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_watch import RunWatch, describe, run_roles

from harness.base.run_dir import RUN_FILE
from harness.launch.lifecycle import GRACE_S
from harness.report import results as report
from recipes.tiers import FIXTURES, RANK_START_ENV, REPO_ROOT

#: Seconds from the signal to the last process of the run gone (GRACE_S + margin).
NO_ORPHANS_WITHIN_S = GRACE_S + 20


def start_long_run(report_dir: Path) -> subprocess.Popen:
    """The issue's case: native_qwen3, random init, 2000 steps, two ranks."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "native_qwen3",
            "--tier",
            "cpu",
            "--init",
            "random",
            "--steps",
            "2000",
            "--no-export",
            "--report-dir",
            str(report_dir),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextlib.contextmanager
def watched_long_run(report_dir: Path):
    """The long run under a watch of its processes; whatever the test asserts, the run never outlives it.

    A failed assertion inside the block would otherwise leave a 2000-step run (launcher, torchrun, ranks)
    training on for the rest of the suite: on the way out a launcher still alive is killed, and every
    process of the run the watch saw is ended (the test's own "none left" checks come after, unchanged).
    """
    with RunWatch(report_dir) as watch:
        parent = start_long_run(report_dir)
        try:
            yield parent, watch
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.communicate(timeout=30)
                watch.seconds_until_gone(NO_ORPHANS_WITHIN_S)
                watch.kill_left()


def wait_for_training(report_dir: Path, parent: subprocess.Popen, timeout_s: float = 240) -> Path:
    """The run's steps.jsonl once rank 0 has logged a step (the ranks are then training)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert parent.poll() is None, parent.communicate()
        for steps in report_dir.glob("runs/*/steps.jsonl"):
            if steps.read_text().strip():
                return steps
        time.sleep(0.2)
    parent.kill()
    pytest.fail(f"no training step within {timeout_s} s: {parent.communicate()}")


@pytest.mark.slow
def test_sigterm_ends_every_rank_and_keeps_the_steps_run(tmp_path, rank_start, record_property):
    report_dir = tmp_path / "report"
    with watched_long_run(report_dir) as (parent, watch):
        wait_for_training(report_dir, parent)
        watch.wait_for(30, **run_roles(rank_start))
        signalled = time.monotonic()
        parent.send_signal(signal.SIGTERM)
        out, err = parent.communicate(timeout=NO_ORPHANS_WITHIN_S + 30)
        gone_after = watch.seconds_until_gone(NO_ORPHANS_WITHIN_S)
    record_property("sigterm_seconds_to_parent_exit", time.monotonic() - signalled)
    record_property("sigterm_seconds_to_no_process", gone_after)
    left = watch.kill_left()
    assert left == [], f"torchrun or a rank outlived a SIGTERMed launcher: {describe(left)}"
    assert parent.returncode == 128 + signal.SIGTERM, (parent.returncode, err[-2000:])
    assert "INTERRUPTED by SIGTERM" in err, err[-2000:]
    runs = json.loads((report_dir / report.RESULTS_JSON).read_text())["runs"]
    assert [r["interrupted"] for r in runs] == ["SIGTERM"]
    assert 1 <= len(runs[0]["losses"]) < 2000, "the steps run before the signal are kept"
    record_property("sigterm_steps_kept", len(runs[0]["losses"]))


@pytest.mark.slow
def test_sigkill_of_the_launcher_leaves_no_process(tmp_path, rank_start, record_property):
    """The OOM killer's case: no handler runs; the kernel's parent-death signals end torchrun, then its ranks."""
    report_dir = tmp_path / "report"
    with watched_long_run(report_dir) as (parent, watch):
        wait_for_training(report_dir, parent)
        watch.wait_for(30, **run_roles(rank_start))
        parent.kill()
        parent.communicate(timeout=30)
        gone_after = watch.seconds_until_gone(NO_ORPHANS_WITHIN_S)
    record_property("sigkill_seconds_to_no_process", gone_after)
    left = watch.kill_left()  # never leave them to the rest of the suite
    assert left == [], (
        f"{len(left)} process(es) of the run outlived a SIGKILLed launcher: {describe(left)}"
    )
    assert gone_after < NO_ORPHANS_WITHIN_S


#: Seconds from SIGKILL of the launcher, while its prestarted forkserver still imports, to no process left:
#: the kernel's parent-death signals act at once; without them the forkserver would import on (~10 s).
NO_ORPHANS_WHILE_CHECKING_S = 5


def test_sigkill_while_the_launcher_checks_leaves_no_process(
    tmp_path, monkeypatch, record_property
):
    """Killed before its run is checked, the launcher leaves neither harness.launch.elastic nor its importing forkserver.

    "preloaded" only: an "exec" launcher starts nothing before its checks pass (the refusal
    tests below see, on that path, no process of the run but the launcher).
    """
    monkeypatch.setenv(RANK_START_ENV, "preloaded")
    report_dir = tmp_path / "report"
    with watched_long_run(report_dir) as (parent, watch):
        deadline = time.monotonic() + 120
        while watch.most["forkserver"] < 1:
            assert parent.poll() is None and time.monotonic() < deadline, (
                "no forkserver was prestarted"
            )
            time.sleep(0.05)
        watch.saw(launcher=1, torchrun=1, forkserver=1)
        # The run directory is claimed before the checks (harness.base.run_dir.claim); run.json is written at launch.
        launched = sorted(report_dir.glob(f"runs/*/{RUN_FILE}"))
        assert not launched, (
            f"the checks had already passed ({launched}): this test needs the launcher still checking"
        )
        parent.kill()
        parent.communicate(timeout=30)
        gone_after = watch.seconds_until_gone(NO_ORPHANS_WITHIN_S)
    record_property("sigkill_while_checking_seconds_to_no_process", gone_after)
    left = watch.kill_left()
    assert left == [], (
        f"{len(left)} process(es) outlived a launcher killed during its checks: {describe(left)}"
    )
    assert gone_after < NO_ORPHANS_WHILE_CHECKING_S, (
        f"the forkserver outlived its parent by {gone_after:.1f} s"
    )


def assert_refused_before_any_rank(watch: RunWatch, rank_start: str) -> None:
    """The launcher was seen; no rank ever was (nor, on "exec", anything else); nothing is left."""
    watch.saw(launcher=1)
    allowed = {"launcher"} | (
        {"torchrun", "forkserver", "other"} if rank_start == "preloaded" else set()
    )
    started = {role for role in watch.roles.values()} - allowed
    assert not started, f"a refused run started {sorted(started)} ({watch.summary()})"
    left = watch.kill_left()
    assert left == [], (
        f"the prestarted harness.launch.elastic (or its forkserver) outlived the refusal: {describe(left)}"
    )


@pytest.mark.slow
def test_unknown_torchtitan_option_is_refused_once_before_any_rank(tmp_path, rank_start):
    report_dir = tmp_path / "report"
    started = time.perf_counter()
    with RunWatch(report_dir) as watch:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "harness",
                "run",
                "all",
                "--tier",
                "cpu",
                "--report-dir",
                str(report_dir),
                "--training.stepz",
                "3",
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, out.stderr
    assert "--training.stepz" in errors[0] and "--training.steps" in errors[0], errors[0]
    assert "Traceback" not in out.stderr and "╭" not in out.stderr, (
        "tyro's box is turned into one line"
    )
    assert not report_dir.exists(), "nothing may start or be written"
    assert_refused_before_any_rank(watch, rank_start)
    assert time.perf_counter() - started < 120


def test_an_ill_typed_torchtitan_option_is_refused_with_its_name():
    from harness.checks.preflight import preflight
    from harness.config.build import build_config
    from harness.options.run_options import RunOptions
    from recipes.errors import RecipeError

    opts = preflight(RunOptions(recipe="native_qwen3", tier="cpu", init="random"))
    with pytest.raises(RecipeError, match=r"torchtitan option refused: .*--training\.steps"):
        build_config(opts, ["--training.steps", "three"])


def test_goldens_are_judged_on_what_the_config_really_holds():
    """``--training.seq_len 64`` through torchtitan's CLI is not the default launch: no golden applies."""
    from harness.checks.preflight import preflight
    from harness.config.build import as_configured, build_config
    from harness.judge.verdicts import golden_key
    from harness.options.run_options import RunOptions

    opts = preflight(RunOptions(recipe="native_qwen3", tier="cpu", init="random"))
    assert golden_key(as_configured(opts, build_config(opts))) == "step1_loss_random"
    changed = as_configured(opts, build_config(opts, ["--training.seq_len", "64"]))
    assert changed.seq_len == 64
    assert golden_key(changed) is None
    seeded = as_configured(opts, build_config(opts, ["--debug.seed", "3"]))
    assert golden_key(seeded) is None


@pytest.mark.slow
def test_a_malformed_line_deep_in_the_dataset_is_refused_with_file_and_line(tmp_path, rank_start):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    good = (FIXTURES / "corpus" / "train.jsonl").read_text().splitlines()[:50]
    (corpus / "train.jsonl").write_text(
        "\n".join(good[:37] + ["null-ish {not json"] + good[37:]) + "\n"
    )
    report_dir = tmp_path / "report"
    with RunWatch(report_dir) as watch:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "harness",
                "run",
                "native_qwen3",
                "--tier",
                "cpu",
                "--init",
                "random",
                "--dataset-dir",
                str(corpus),
                "--report-dir",
                str(report_dir),
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, out.stderr
    assert f"{corpus / 'train.jsonl'}:38: not JSON" in errors[0], errors[0]
    assert '{"text": "..."}' in errors[0]
    assert not report_dir.exists()
    assert_refused_before_any_rank(watch, rank_start)


def _add_runs(report_dir: str, writer: int, count: int) -> None:
    for i in range(count):
        run = {
            "recipe": "native_qwen3",
            "tier": "cpu",
            "init": "random",
            "nproc": 1,
            "seq_len": 8,
            "local_batch_size": 1,
            "losses": [],
            "steps": [],
            "writer": writer,
            "i": i,
        }
        report.update(Path(report_dir), runs=[run])


@pytest.mark.slow
def test_concurrent_runs_into_one_report_dir_keep_every_run(tmp_path):
    """Four processes add 10 runs each to one report directory; all 40 are there."""
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_add_runs, args=(str(tmp_path), w, 10)) for w in range(4)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=300)
        assert w.exitcode == 0
    runs = json.loads((tmp_path / report.RESULTS_JSON).read_text())["runs"]
    assert sorted((r["writer"], r["i"]) for r in runs) == [
        (w, i) for w in range(4) for i in range(10)
    ]

"""A run ends cleanly whatever happens to it: no orphans, refusals before launch, nothing measured lost.

The signal tests start the real main job (``python -m harness run``: parent,
torchrun, two ranks), wait until rank 0 has logged a training step, signal the
parent the way a CI cancel (SIGTERM) or the OOM killer (SIGKILL) would, and then
watch /proc until no process of the run is left. The bound they assert is the
launcher's: ``GRACE_S`` for torchrun to close its ranks, plus a margin for the
kernel's parent-death signals and process exit on a loaded 2-core machine.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import report
from harness.launch import GRACE_S
from recipes.tiers import FIXTURES, REPO_ROOT


#: Seconds from the signal to the last process of the run gone (GRACE_S + margin).
NO_ORPHANS_WITHIN_S = GRACE_S + 20


def processes_of(run_root: Path) -> list[int]:
    """Live (non-zombie) processes whose command line or environment names ``run_root``.

    The launcher and torchrun name it on their command lines; harness.launch.elastic, its
    forkserver and the ranks forked from it carry it in their environment (RUN_DIR_ENV).
    """
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if (str(run_root) in cmdline or str(run_root) in environ) and state != "Z":
            found.append(int(pid))
    return found


def start_long_run(report_dir: Path) -> subprocess.Popen:
    """The issue's case: native_qwen3, random init, 2000 steps, two ranks."""
    return subprocess.Popen(
        [sys.executable, "-m", "harness", "run", "native_qwen3", "--tier", "cpu", "--init", "random",
         "--steps", "2000", "--no-export", "--report-dir", str(report_dir)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


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


def seconds_until_gone(run_root: Path, limit_s: float) -> float:
    started = time.monotonic()
    while processes_of(run_root) and time.monotonic() - started < limit_s:
        time.sleep(0.1)
    return time.monotonic() - started


def test_sigterm_ends_every_rank_and_keeps_the_steps_run(tmp_path, record_property):
    report_dir = tmp_path / "report"
    parent = start_long_run(report_dir)
    wait_for_training(report_dir, parent)
    assert len(processes_of(report_dir)) >= 4, "the launcher, torchrun (harness.launch.elastic) and two ranks should be running"
    signalled = time.monotonic()
    parent.send_signal(signal.SIGTERM)
    out, err = parent.communicate(timeout=NO_ORPHANS_WITHIN_S + 30)
    gone_after = seconds_until_gone(report_dir, NO_ORPHANS_WITHIN_S)
    record_property("sigterm_seconds_to_parent_exit", time.monotonic() - signalled)
    record_property("sigterm_seconds_to_no_process", gone_after)
    assert processes_of(report_dir) == [], "torchrun or a rank outlived a SIGTERMed launcher"
    assert parent.returncode == 128 + signal.SIGTERM, (parent.returncode, err[-2000:])
    assert "INTERRUPTED by SIGTERM" in err, err[-2000:]
    runs = json.loads((report_dir / report.RESULTS_JSON).read_text())["runs"]
    assert [r["interrupted"] for r in runs] == ["SIGTERM"]
    assert 1 <= len(runs[0]["losses"]) < 2000, "the steps run before the signal are kept"
    record_property("sigterm_steps_kept", len(runs[0]["losses"]))


def test_sigkill_of_the_launcher_leaves_no_process(tmp_path, record_property):
    """The OOM killer's case: no handler runs; the kernel's parent-death signals end torchrun, then its ranks."""
    report_dir = tmp_path / "report"
    parent = start_long_run(report_dir)
    wait_for_training(report_dir, parent)
    children = processes_of(report_dir)
    assert len(children) >= 4, "the launcher, torchrun (harness.launch.elastic) and two ranks should be running"
    parent.kill()
    parent.communicate(timeout=30)
    gone_after = seconds_until_gone(report_dir, NO_ORPHANS_WITHIN_S)
    record_property("sigkill_seconds_to_no_process", gone_after)
    left = processes_of(report_dir)
    for pid in left:  # never leave them to the rest of the suite
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"{len(left)} process(es) of the run outlived a SIGKILLed launcher"
    assert gone_after < NO_ORPHANS_WITHIN_S


def forkserver_of(run_root: Path) -> int | None:
    """The pid of the run's prestarted forkserver (multiprocessing's, started by harness.launch.elastic), once it exists."""
    for pid in processes_of(run_root):
        try:
            if b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


#: Seconds from SIGKILL of the launcher, while its prestarted forkserver still imports, to no process left:
#: the kernel's parent-death signals act at once; without them the forkserver would import on (~10 s).
NO_ORPHANS_WHILE_CHECKING_S = 5


def test_sigkill_while_the_launcher_checks_leaves_no_process(tmp_path, record_property):
    """Killed before its run is checked, the launcher leaves neither harness.launch.elastic nor its importing forkserver."""
    report_dir = tmp_path / "report"
    parent = start_long_run(report_dir)
    deadline = time.monotonic() + 120
    while forkserver_of(report_dir) is None:
        assert parent.poll() is None and time.monotonic() < deadline, "no forkserver was prestarted"
        time.sleep(0.05)
    assert not report_dir.exists(), "the checks had already passed: this test needs the launcher still checking"
    parent.kill()
    parent.communicate(timeout=30)
    gone_after = seconds_until_gone(report_dir, NO_ORPHANS_WITHIN_S)
    record_property("sigkill_while_checking_seconds_to_no_process", gone_after)
    left = processes_of(report_dir)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"{len(left)} process(es) outlived a launcher killed during its checks"
    assert gone_after < NO_ORPHANS_WHILE_CHECKING_S, f"the forkserver outlived its parent by {gone_after:.1f} s"


def test_unknown_torchtitan_option_is_refused_once_before_any_rank(tmp_path):
    report_dir = tmp_path / "report"
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "harness", "run", "all", "--tier", "cpu", "--report-dir", str(report_dir),
         "--training.stepz", "3"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, out.stderr
    assert "--training.stepz" in errors[0] and "--training.steps" in errors[0], errors[0]
    assert "Traceback" not in out.stderr and "╭" not in out.stderr, "tyro's box is turned into one line"
    assert not report_dir.exists(), "nothing may start or be written"
    assert processes_of(report_dir) == [], "the prestarted harness.launch.elastic (or its forkserver) outlived the refusal"
    assert time.perf_counter() - started < 120


def test_an_ill_typed_torchtitan_option_is_refused_with_its_name():
    from recipes.errors import RecipeError
    from harness.options import RunOptions
    from harness.checks import preflight
    from harness.config import build_config

    opts = preflight(RunOptions(recipe="native_qwen3", tier="cpu", init="random"))
    with pytest.raises(RecipeError, match=r"torchtitan option refused: .*--training\.steps"):
        build_config(opts, ["--training.steps", "three"])


def test_goldens_are_judged_on_what_the_config_really_holds():
    """``--training.seq_len 64`` through torchtitan's CLI is not the default launch: no golden applies."""
    from harness.__main__ import golden_key
    from harness.config import as_configured
    from harness.options import RunOptions
    from harness.checks import preflight
    from harness.config import build_config

    opts = preflight(RunOptions(recipe="native_qwen3", tier="cpu", init="random"))
    assert golden_key(as_configured(opts, build_config(opts))) == "step1_loss_random"
    changed = as_configured(opts, build_config(opts, ["--training.seq_len", "64"]))
    assert changed.seq_len == 64
    assert golden_key(changed) is None
    seeded = as_configured(opts, build_config(opts, ["--debug.seed", "3"]))
    assert golden_key(seeded) is None


def test_a_malformed_line_deep_in_the_dataset_is_refused_with_file_and_line(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    good = (FIXTURES / "corpus" / "train.jsonl").read_text().splitlines()[:50]
    (corpus / "train.jsonl").write_text("\n".join(good[:37] + ["null-ish {not json"] + good[37:]) + "\n")
    report_dir = tmp_path / "report"
    out = subprocess.run(
        [sys.executable, "-m", "harness", "run", "native_qwen3", "--tier", "cpu", "--init", "random",
         "--dataset-dir", str(corpus), "--report-dir", str(report_dir)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, out.stderr
    assert f"{corpus / 'train.jsonl'}:38: not JSON" in errors[0], errors[0]
    assert '{"text": "..."}' in errors[0]
    assert not report_dir.exists()


def _add_runs(report_dir: str, writer: int, count: int) -> None:
    for i in range(count):
        run = {"recipe": "native_qwen3", "tier": "cpu", "init": "random", "nproc": 1, "seq_len": 8,
               "local_batch_size": 1, "losses": [], "steps": [], "writer": writer, "i": i}  # fmt: skip
        report.update(Path(report_dir), runs=[run])


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
    assert sorted((r["writer"], r["i"]) for r in runs) == [(w, i) for w in range(4) for i in range(10)]

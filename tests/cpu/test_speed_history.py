"""Issue 27 goal 4: each run's speed figures, the runs log, and ``python -m harness history`` over nights.

One real tiny launch writes its speed and its runs-log line through ``harness.launch.lifecycle``;
later nights are appended through the same ``harness.launch.speed.run_record``, one with a
changed version, and the history command's PNGs and plots.json are checked against them.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import pytest

from harness.launch import speed
from harness.night import ci
from harness.report import history
from harness.report import markdown as report_markdown
from harness.report import results as report
from recipes.tiers import REPO_ROOT

#: One xdist worker takes this module: its module launch runs once, on one worker.
pytestmark = pytest.mark.xdist_group("speed-history")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def another_version(version: str) -> str:
    """A version string that differs from ``version``: its last number plus one ("5.16.0" -> "5.16.1")."""
    head, dot, last = version.rpartition(".")
    return f"{head}{dot}{int(last) + 1}" if last.isdigit() else f"{version}.1"


def test_another_version_differs_from_any_installed_one():
    assert [another_version(v) for v in ("5.16.0", "5.23.0", "2.14.0+cu130", "1")] == [
        "5.16.1",
        "5.23.1",
        "2.14.0+cu130.1",
        "2",
    ]


def history_command(path, out) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", "history", str(path), "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    """One tiny real launch with $QWEN3_RUNS_LOG set: (RunResult, the log file)."""
    from harness.checks.preflight import preflight
    from harness.launch.lifecycle import launch
    from harness.options.run_options import RunOptions

    work = tmp_path_factory.mktemp("speed")
    log = work / "runs.jsonl"
    saved = {k: os.environ.get(k) for k in (speed.RUNS_LOG_ENV, speed.NIGHT_ENV)}
    os.environ[speed.RUNS_LOG_ENV], os.environ[speed.NIGHT_ENV] = str(log), "night-1"
    try:
        opts = preflight(
            RunOptions(
                recipe="native_qwen3",
                tier="cpu",
                init="random",
                nproc=1,
                steps=3,
                export=False,
                run_dir=work / "native_qwen3-cpu-random-20261204-030000",
            )
        )
        result = launch(opts, echo=lambda line: None)
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    return result, log


@pytest.mark.slow
def test_each_step_has_a_wall_clock_end_and_the_run_its_time_to_the_first_step(
    logged_run, record_property
):
    result, _ = logged_run
    ends = [s["unix_s"] for s in result.steps]
    assert len(ends) == 3 and ends == sorted(ends)
    assert result.started_unix_s < ends[0] and ends[-1] <= result.started_unix_s + result.wall_s
    first = result.speed["time_to_first_step_s"]
    assert first == pytest.approx(ends[0] - result.started_unix_s, abs=1e-9)
    assert 0 < first < result.wall_s
    record_property("time_to_first_step_s", round(first, 2))


def test_speed_figures_are_the_steps_after_the_first(logged_run, record_property):
    result, _ = logged_run
    s = result.speed
    assert s["step_time_s"] == pytest.approx(
        statistics.fmean(x["step_time_s"] for x in result.steps[1:]), rel=1e-12
    )
    assert s["tokens_per_s"] == pytest.approx(
        statistics.fmean(x["tokens_per_s"] for x in result.steps[1:]), rel=1e-12
    )
    assert s["tokens_per_s_node"] == pytest.approx(s["tokens_per_s"] * result.nproc, rel=1e-12)
    # cpu: no stated peak, no NEFF cache
    assert s["peak_tflops"] is None and s["mfu_pct"] is None and s["neff_cache"] == "n/a"
    table = report_markdown.markdown({"runs": [result.to_dict()]})
    (row,) = [line for line in table.splitlines() if line.startswith("| native_qwen3 | cpu |")]
    assert f"| n/a | {s['time_to_first_step_s']:.1f} | n/a |" in row
    record_property("speed", s)


@pytest.mark.slow
def test_the_run_appended_its_record_to_the_runs_log(logged_run):
    result, log = logged_run
    (line,) = [json.loads(x) for x in log.read_text().splitlines()]
    assert line["kind"] == "run" and line["night"] == "night-1"
    assert (
        line["label"] == "native_qwen3-cpu-random"
    )  # the launcher's time stamp dropped: the same run every night
    assert line["speed"] == result.speed
    assert line["step1_loss"] == result.losses[0] and line["steps"] == 3
    assert line["published"] == {"key": "step1_loss_random", "value": 12.43}
    assert line["versions"] == report.versions()


def test_history_plots_every_figure_across_nights_and_marks_the_version_change(
    logged_run, tmp_path
):
    result, log = logged_run
    history_file = tmp_path / "runs.jsonl"
    history_file.write_text(log.read_text())
    installed = report.versions()
    # Another version than the installed one, whatever that is (a fixed "5.23.0" failed once 5.23.0 was installed).
    other = another_version(installed["transformers"])
    bumped = {**installed, "transformers": other}
    later = {
        **result.to_dict(),
        "speed": {**result.speed, "step_time_s": 2 * result.speed["step_time_s"]},
    }
    speed.append_record(history_file, speed.run_record(later, versions=bumped, night="night-2"))
    speed.append_record(
        history_file, speed.run_record(result.to_dict(), versions=bumped, night="night-3")
    )
    out = tmp_path / "plots"
    done = history_command(history_file, out)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / history.SUMMARY).read_text())
    assert summary["nights"] == ["night-1", "night-2", "night-3"]
    assert summary["version_changes"] == [
        {
            "night": "night-2",
            "index": 1,
            "changes": {"transformers": [installed["transformers"], other]},
        }
    ]
    series = "cpu:native_qwen3-cpu-random"
    plots = summary["plots"]
    loss = result.losses[0]
    assert plots["step1_loss-cpu"]["series"] == {
        series: {"night-1": loss, "night-2": loss, "night-3": loss}
    }
    step = result.speed["step_time_s"]
    assert plots["speed-step_time_s"]["series"][series] == {
        "night-1": step,
        "night-2": 2 * step,
        "night-3": step,
    }
    expected = {
        f"speed-{k}" for k, v in result.speed.items() if k in speed.SPEED_FIGURES and v is not None
    }
    assert {p for p in plots if p.startswith("speed-")} == expected  # cpu: no MFU, no NEFF figures
    for plot in plots.values():
        assert (out / plot["file"]).read_bytes()[:8] == PNG_MAGIC
    assert "transformers" in done.stdout and "night-2" in done.stdout


def test_trn2_mfu_is_against_the_logical_core_peak_and_the_neff_cache_state_from_mtimes(
    tmp_path, monkeypatch
):
    """No chip here: the figures of a trn2 run's steps, and its NEFF cache as the launcher would find it."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    cache = tmp_path / "neff"
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(cache))
    started = time.time()
    steps = [
        {
            "step": i,
            "step_time_s": t,
            "tokens_per_s": 1000.0 / t,
            "tflops": 40.0 * i,
            "unix_s": started + 60 + i,
        }
        for i, t in ((1, 900.0), (2, 2.0), (3, 4.0))
    ]
    (cache / "a").mkdir(parents=True)
    old = cache / "a" / "old.neff"
    old.write_bytes(b"x")
    os.utime(old, (started - 3600, started - 3600))
    figures = speed.run_speed(steps, "trn2", 64, started)
    assert figures.peak_tflops == 158.0  # 79 BF16 TFLOPS per NeuronCore-v3 x LNC 2
    assert figures.tflops == 100.0 and figures.mfu_pct == pytest.approx(100 * 100.0 / 158.0)
    assert (
        figures.step_time_s == 3.0
        and figures.tokens_per_s == 375.0
        and figures.tokens_per_s_node == 64 * 375.0
    )
    assert figures.time_to_first_step_s == pytest.approx(61.0)
    assert (figures.neff_cache, figures.neffs_cached_before, figures.neffs_compiled) == (
        "warm",
        1,
        0,
    )
    (cache / "a" / "new.neff").write_bytes(b"y")  # compiled during this run
    assert speed.run_speed(steps, "trn2", 64, started).neff_cache == "partial"
    old.unlink()
    assert speed.run_speed(steps, "trn2", 64, started).neff_cache == "cold"
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "missing"))
    assert speed.run_speed(steps, "trn2", 64, started).neff_cache == "unknown"


def test_history_reads_the_benchmark_history(tmp_path):
    """The committed benchmarks/history.jsonl: each goal's measured value per benchmark run, its target drawn."""
    lines = [
        json.loads(x)
        for x in (REPO_ROOT / "benchmarks" / "history.jsonl").read_text().splitlines()
        if x.strip()
    ]
    done = history_command(REPO_ROOT / "benchmarks" / "history.jsonl", tmp_path)
    assert done.returncode == 0, done.stderr
    plots = json.loads((tmp_path / history.SUMMARY).read_text())["plots"]
    goals = {(g["benchmark"], g["name"]) for line in lines for g in line["goals"]}
    assert set(plots) == {f"bench-{b}-{n}" for b, n in goals}
    overhead = plots["bench-overhead-harness overhead"]
    measured = {
        line["date"]: g["measured"]
        for line in lines
        for g in line["goals"]
        if g["name"] == "harness overhead"
    }
    assert overhead["series"]["cpu"] == measured and overhead["reference"] == 1.1


def test_history_reads_the_nightly_trend_and_plots_its_published_values(tmp_path, monkeypatch):
    """The nightly's runs log: run records and ``python -m harness.night.ci trend`` lines of the same nights.

    Published-lane goldens are plotted per night (list values as match / no match); a trn2 run's
    step-1 loss is drawn against the published number its init measures.
    """
    log = tmp_path / "runs.jsonl"
    rows = [
        {
            "recipe": "native_qwen3",
            "tier": "trn2",
            "key": "step1_loss_hf",
            "lane": "published",
            "published": 6.54,
            "measured": 6.55,
        },
        {
            "recipe": "native_qwen3",
            "tier": "trn2",
            "key": "export_missing_keys",
            "lane": "published",
            "published": ["lm_head.weight"],
            "measured": ["lm_head.weight"],
        },
        {
            "recipe": "native_qwen3",
            "tier": "cpu",
            "key": "step1_loss_hf",
            "lane": "exact",
            "published": None,
            "measured": 1.5,
        },
    ]
    run = {
        "run_dir": "/runs/native_qwen3-as_published-hf",
        "recipe": "native_qwen3",
        "tier": "trn2",
        "init": "hf",
        "nproc": 64,
        "steps": [{"loss": 6.55}],
        "losses": [6.55],
        "speed": {"mfu_pct": 31.0, "neff_cache": "cold"},
    }
    for night, torch_version, measured in (
        ("night-a", "2.14.0", 6.55),
        ("night-b", "2.15.0", 6.61),
    ):
        monkeypatch.setenv(speed.NIGHT_ENV, night)
        rows[0]["measured"] = measured
        tests = tmp_path / "tests.json"
        tests.write_text(
            json.dumps({"versions": {"torch": torch_version}, "goldens": rows, "tests": []})
        )
        speed.append_record(log, speed.run_record(run, versions={"torch": torch_version}))
        assert ci.append_trend(tests, log) == 0
        run["speed"] = {"mfu_pct": 33.0, "neff_cache": "warm"}
    out = tmp_path / "plots"
    assert history_command(log, out).returncode == 0
    summary = json.loads((out / history.SUMMARY).read_text())
    assert summary["nights"] == [
        "night-a",
        "night-b",
    ]  # a night's run records and trend line share one point
    assert summary["version_changes"] == [
        {"night": "night-b", "index": 1, "changes": {"torch": ["2.14.0", "2.15.0"]}}
    ]
    plots = summary["plots"]
    published = {p for p in plots if p.startswith("published-")}
    assert published == {
        "published-step1_loss_hf",
        "published-export_missing_keys",
    }  # the exact lane is no claim
    assert plots["published-step1_loss_hf"]["series"] == {
        "native_qwen3.trn2": {"night-a": 6.55, "night-b": 6.61}
    }
    assert plots["published-step1_loss_hf"]["reference"] == 6.54
    assert plots["published-export_missing_keys"]["series"] == {
        "native_qwen3.trn2": {"night-a": 1.0, "night-b": 1.0}
    }
    assert plots["step1_loss-trn2"]["reference"] == 6.54
    series = "trn2:native_qwen3-as_published-hf"
    assert plots["speed-mfu_pct"]["series"] == {series: {"night-a": 31.0, "night-b": 33.0}}
    assert plots["speed-neff_cache"]["series"] == {series: {"night-a": 0.0, "night-b": 1.0}}


def test_an_unreadable_history_is_refused_in_one_line(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text('{"date": "2026-12-04", "kind": "run"}\nnot json\n')
    done = history_command(path, tmp_path / "out")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"python -m harness history: error: {path} line 2: not JSON (Expecting value); each line must be one JSON object"
    ]
    done = history_command(tmp_path / "absent.jsonl", tmp_path / "out")
    assert done.returncode == 2 and "absent.jsonl: no such file" in done.stderr

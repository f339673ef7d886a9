"""Both ways ranks start train the same thing, and a run says which way its ranks started.

"preloaded" (the cpu tier): ``harness.launch.elastic``, torchrun's parser and torch elastic,
ranks forked from a forkserver that imported torch and torchtitan once. "exec" (trn2,
the tutorial's own launch): torchrun, each rank a fresh interpreter. The exec run here
is the only real exec launch of the cpu tier, so trn2's start path stays exercised.
"""

from __future__ import annotations

import dataclasses

import pytest
from run_watch import RunWatch, describe

from harness.checks.preflight import preflight
from harness.launch.lifecycle import launch
from harness.options.run_options import RunOptions
from recipes.tiers import CPU, TIERS


@pytest.mark.slow
def test_exec_ranks_train_bitwise_like_the_preloaded_ones(
    native_random_run, tmp_path, monkeypatch, record_property
):
    assert CPU.rank_start == "preloaded"
    monkeypatch.setitem(TIERS, "cpu", dataclasses.replace(CPU, rank_start="exec"))
    steps = len(native_random_run["losses"])
    opts = preflight(
        RunOptions(
            recipe="native_qwen3",
            tier="cpu",
            nproc=2,
            steps=steps,
            init="random",
            seed=0,
            run_dir=tmp_path / "exec",
        )
    )
    exec_run = launch(opts, echo=lambda line: None)
    record_property("exec_losses", exec_run.losses)
    record_property("preloaded_losses", native_random_run["losses"])
    assert native_random_run["provenance"]["rank_start"] == "preloaded", (
        "the cpu tier's ranks did not start preloaded"
    )
    assert exec_run.provenance["rank_start"] == "exec"
    assert steps >= 2 and len(exec_run.losses) == steps
    assert exec_run.losses == native_random_run["losses"], "the two start paths trained differently"


def test_a_refused_run_leaves_no_prestarted_process(tmp_path, monkeypatch):
    """``python -m harness run`` prestarts harness.launch.elastic before its checks; a refusal ends it, rank-less.

    The prestarted process is seen alive through the launcher's own ``prestart`` (its Popen,
    observed, not replaced): a refusal from the options alone can end it within one sample of
    the process watch, so the watch only proves that no rank started and nothing is left.
    """
    import harness.launch.lifecycle
    from harness.__main__ import main

    monkeypatch.setitem(TIERS, "cpu", dataclasses.replace(CPU, rank_start="preloaded"))
    real_prestart, started = harness.launch.lifecycle.prestart, []

    def observed_prestart(opts):
        prestarted = real_prestart(opts)
        found = (
            {p.pid for p in watch.finder(watch.run_root, watch.parents)}
            if prestarted is not None
            else set()
        )
        started.append(
            (
                prestarted,
                prestarted is not None and prestarted.proc.poll() is None,
                prestarted is not None and prestarted.proc.pid in found,
            )
        )
        return prestarted

    monkeypatch.setattr(harness.launch.lifecycle, "prestart", observed_prestart)
    report_dir = tmp_path / "report"
    with RunWatch(report_dir) as watch:
        code = main(
            [
                "run",
                "native_qwen3",
                "--tier",
                "cpu",
                "--report-dir",
                str(report_dir),
                "--override",
                "nosuch",
            ]
        )
    assert code == 2
    assert started and started[0][1], (
        "harness.launch.elastic was not prestarted (alive) before the checks"
    )
    assert started[0][2], (
        "the watch's finder did not find the prestarted harness.launch.elastic: 'none left' would prove nothing"
    )
    assert started[0][0].proc.poll() is not None, (
        "the prestarted harness.launch.elastic outlived a refusal"
    )
    assert watch.most["rank"] == 0, f"a refused run started a rank ({watch.summary()})"
    left = watch.kill_left()
    assert left == [], (
        f"the prestarted harness.launch.elastic (or its forkserver) outlived a refusal: {describe(left)}"
    )
    assert not report_dir.exists(), "a refused run wrote something"

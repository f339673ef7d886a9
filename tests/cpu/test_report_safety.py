"""A failed run never poisons a report, and two runs never share a run directory (issue 35, points 1 and 3).

The readers of a run directory take a missing or partial file as a named state; two launches in one
second claim two directories. The bad targets of point 2 (an export or report dir that is, holds or
lies inside an input), and the good run into a report dir after failing ones, are rows of
tests/cpu/test_bad_inputs_table.py, which names each test here with one row.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from bad_inputs import one_step_command

from harness.base import marker, run_dir
from harness.launch.lifecycle import RunResult
from harness.report import results as report
from recipes.tiers import REPO_ROOT


def tree_sha256(path: Path) -> dict[str, str]:
    """Every file under ``path`` (or ``path`` itself), by relative name, with its sha256: what "unchanged" means."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


# --- a failed run never poisons a report -------------------------------------------------------------


def failed_before_provenance(report_dir: Path) -> dict:
    """The record the launcher keeps of a run whose ranks died before rank 0 wrote provenance.json.

    ``harness.launch.lifecycle.launch`` reads what the run directory holds (``run_dir.read_provenance``: nothing)
    and adds the input key the launcher computed itself: a provenance of "inputs" only.
    """
    where = report_dir / "runs" / "native_qwen3-cpu-hf-20260101-000000"
    where.mkdir(parents=True)
    result = RunResult(
        recipe="native_qwen3",
        tier="cpu",
        init="hf",
        nproc=2,
        seed=0,
        seq_len=256,
        local_batch_size=2,
        run_dir=str(where),
        export_dir=None,
        returncode=1,
        wall_s=4.0,
        provenance={
            **run_dir.read_provenance(where),
            "inputs": {"tokenizer": {"tokenizer.json": "ab"}},
        },
    )
    return {**result.to_dict(), "error": "torchrun exited 1; rank 0 failed first: AssertionError:"}


READERS = [
    # (what the run directory holds, the reader, what it must make of it)
    ("no provenance.json", {}, run_dir.NO_PROVENANCE),
    (
        "provenance.json cut short",
        {run_dir.PROVENANCE_FILE: '{"tokenizer": {"path": "/x", "vo'},
        run_dir.NO_PROVENANCE,
    ),
    ("provenance.json a list", {run_dir.PROVENANCE_FILE: "[]"}, run_dir.NO_PROVENANCE),
    (
        "provenance.json partial",
        {run_dir.PROVENANCE_FILE: '{"tokenizer": {}, "model": {}}'},
        "provenance.json is partial (no weights, data, seed, dtype, allowed_mismatches)",
    ),
]


@pytest.mark.parametrize("files, state", [r[1:] for r in READERS], ids=[r[0] for r in READERS])
def test_every_reader_names_a_missing_or_partial_provenance(files, state, tmp_path):
    from harness.rank.first_batch import IncompleteRecord
    from harness.reference.suspects import RunInfo

    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / run_dir.STEPS_FILE).write_text(
        '{"step": 1, "loss": 1.5}\n{"step": 2, "lo'
    )  # rank 0 killed mid-line
    assert run_dir.provenance_state(run_dir.read_provenance(tmp_path)) == state
    assert run_dir.read_steps(tmp_path) == [{"step": 1, "loss": 1.5}], (
        "a line cut short is not a step"
    )
    with pytest.raises(IncompleteRecord, match=state.replace("(", r"\(").replace(")", r"\)")):
        RunInfo.from_run_dir(tmp_path)  # the judgement's reader (harness.reference.diagnosis)


@pytest.mark.parametrize("files, state", [r[1:] for r in READERS], ids=[r[0] for r in READERS])
def test_the_launcher_keys_the_inputs_of_any_provenance_and_leaves_an_unreadable_one_as_it_is(
    files, state, tmp_path
):
    """``harness.config.provenance.add_input_key``, which the launcher calls after every run, ended or not: the key
    always, added to a provenance.json that is one JSON object, and no other file touched or made."""
    from harness.config.provenance import add_input_key
    from harness.options.run_options import RunOptions

    for name, text in files.items():
        (tmp_path / name).write_text(text)
    recorded = run_dir.read_provenance(tmp_path)
    key = add_input_key(
        tmp_path, RunOptions(recipe="native_qwen3", tier="cpu", init="hf").resolved()
    )
    assert key["weights"] and key["tokenizer"], key
    if recorded:
        assert run_dir.read_provenance(tmp_path) == {**recorded, "inputs": key}
    else:
        assert tree_sha256(tmp_path) == {
            n: hashlib.sha256(t.encode()).hexdigest() for n, t in files.items()
        }


def test_the_band_lane_reads_the_steps_a_killed_rank_left(tmp_path):
    """``harness.judge.band.read_run`` (the goldens' band lane) through the run directory's readers."""
    from harness.judge.band import read_run

    (tmp_path / run_dir.STEPS_FILE).write_text(
        '{"step": 1, "loss": 1.5}\n{"step": 2, "loss": 1.4}\n{"step": 3, "lo'
    )
    (tmp_path / run_dir.RUN_FILE).write_text('{"seed": 1, "recipe": "nat')
    assert read_run(tmp_path) == ([1.5, 1.4], {})


def test_a_run_that_failed_before_provenance_is_reported_with_what_is_known(tmp_path):
    """The report of issue 35: a KeyError 'tokenizer' in results.md on every later run into the report dir."""
    failed = failed_before_provenance(tmp_path)
    report.update(tmp_path, runs=[failed])
    report.update(
        tmp_path,
        timing={
            "wall_s": 1.0,
            "launches_s": 0.0,
            "training_steps_s": 0.0,
            "outside_training_share": 1.0,
        },
    )  # a later run's report: must not fail
    md = (tmp_path / report.RESULTS_MD).read_text()
    row = next(line for line in md.splitlines() if line.startswith("| native_qwen3 | cpu | hf |"))
    assert (
        f"FAILED: torchrun exited 1; rank 0 failed first: AssertionError:; {run_dir.NO_PROVENANCE}"
        in row
    )
    assert f"| native_qwen3 | hf | – ({run_dir.NO_PROVENANCE}) |" in md, (
        "the provenance table names the state"
    )


def test_an_unreadable_results_json_is_kept_aside_and_the_report_starts_again(tmp_path, capsys):
    (tmp_path / report.RESULTS_JSON).write_text('{"runs": [{"recipe": "native_qwen3", "ti')
    report.update(tmp_path, runs=[failed_before_provenance(tmp_path)])
    kept = tmp_path / f"{report.RESULTS_JSON}.unreadable-1"
    assert kept.read_text() == '{"runs": [{"recipe": "native_qwen3", "ti', (
        "the unreadable report is kept, unchanged"
    )
    assert len(json.loads((tmp_path / report.RESULTS_JSON).read_text())["runs"]) == 1
    assert f"kept as {kept.name}" in capsys.readouterr().err


def test_a_results_md_the_suite_did_not_write_is_kept_aside_and_said(tmp_path, capsys):
    """Issue 46 item 1: a report dir's own files are replaced only when the suite wrote them."""
    (tmp_path / report.RESULTS_MD).write_text("# my own notes\n")
    report.update(tmp_path, runs=[failed_before_provenance(tmp_path)])
    kept = tmp_path / f"{report.RESULTS_MD}.foreign-1"
    assert kept.read_text() == "# my own notes\n", "the foreign results.md is kept, unchanged"
    assert f"kept as {kept.name}" in capsys.readouterr().err
    assert marker.kind(tmp_path) == marker.REPORT
    report.update(tmp_path)  # the suite's own results.md is replaced, nothing more set aside
    assert not (tmp_path / f"{report.RESULTS_MD}.foreign-2").exists()
    assert capsys.readouterr().err == ""


def test_a_results_json_the_suite_did_not_write_is_merged_kept_as_it_was_and_said(tmp_path, capsys):
    """Issue 46 item 1: a foreign results.json's runs are merged (never lost) and the file is kept as it was."""
    run = failed_before_provenance(tmp_path)
    foreign = json.dumps({"runs": [run], "checks": [], "mine": True})
    (tmp_path / report.RESULTS_JSON).write_text(foreign)
    report.update(tmp_path, runs=[{**run, "seed": 1}])
    kept = tmp_path / f"{report.RESULTS_JSON}.foreign-1"
    assert kept.read_text() == foreign, "the foreign results.json is kept, unchanged"
    assert f"kept as {kept.name}" in capsys.readouterr().err
    runs = json.loads((tmp_path / report.RESULTS_JSON).read_text())["runs"]
    assert len(runs) == 2, "its run is merged with this command's"
    report.update(
        tmp_path
    )  # the suite's own results.json now: merged again, nothing more kept aside
    assert not (tmp_path / f"{report.RESULTS_JSON}.foreign-2").exists()
    assert capsys.readouterr().err == ""


def test_every_directory_the_suite_writes_says_what_wrote_it(tmp_path):
    run = run_dir.claim(tmp_path / "runs", "r-20260101-000000")
    assert marker.kind(run) == marker.RUN
    run_dir.release(run)
    assert not run.exists(), "a run that never started leaves nothing, its marker included"


# --- two runs never share a run directory ------------------------------------------------------------


def test_run_directories_are_claimed_exclusively(tmp_path):
    """The same name claimed twice (two launches in one second) gives two directories, each made by its claim."""
    first, second = (run_dir.claim(tmp_path / "runs", "r-20260101-000000") for _ in range(2))
    assert (first.name, second.name) == ("r-20260101-000000", "r-20260101-000000-2")
    run_dir.release(second)
    assert first.is_dir() and not second.exists()
    (first / run_dir.RUN_FILE).write_text("{}")
    run_dir.release(first)
    assert (first / run_dir.RUN_FILE).is_file(), "release never removes what a run wrote"


# --- real launches -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_launches_in_the_same_second_never_share_a_run_directory(tmp_path):
    """Seed 0 and seed 1 started together, each name they could get already taken: each run claims its own.

    The directories of every second of the next two minutes are made first (each with a file in
    it), so both launches meet a taken name whatever second they plan in, and race for the next.
    """
    shared = tmp_path / "report"
    now = time.time()
    taken = [
        shared
        / "runs"
        / f"native_qwen3-cpu-hf-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now + s))}"
        for s in range(-1, 120)
    ]
    for path in taken:
        path.mkdir(parents=True)
        (path / "mine.txt").write_text("not the run's")
    cmd = one_step_command(shared)
    procs = [
        subprocess.Popen(
            [*cmd, "--seed", str(seed)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for seed in (0, 1)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outs]
    assert all(sorted(os.listdir(p)) == ["mine.txt"] for p in taken), (
        "a taken directory was written to"
    )
    dirs = sorted(d for d in (shared / "runs").iterdir() if d not in taken)
    assert len(dirs) == 2 and all(d.name.rsplit("-", 1)[1] in ("2", "3") for d in dirs), dirs
    seeds = sorted(json.loads((d / run_dir.RUN_FILE).read_text())["seed"] for d in dirs)
    assert seeds == [0, 1]
    assert all(len(run_dir.read_steps(d)) == 1 for d in dirs), (
        "each run's steps alone in its directory"
    )


def test_the_checkpoint_folder_the_recipes_set_is_the_one_run_dir_names():
    """recipes/ cannot import the harness, so the name is written twice: they must agree (harness.rank.export reads it)."""
    from recipes.native_qwen3 import native_qwen3_cpu

    assert native_qwen3_cpu().checkpoint.folder == run_dir.CHECKPOINT_DIR

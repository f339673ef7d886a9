"""A failed run never poisons a report; nothing the user gave is deleted or overwritten; runs never share a directory.

Issue 35, points 1-3. Each refusal case (``REFUSALS``) runs ``python -m harness run`` in this
process (``harness_main.main_in_process``: the same checks as the command line, no ranks) and
asserts the exit code, the one-line message, that every input's files (names and sha256) are
as they were, and that nothing of the refused run is left in the report directory. The cases
that are about launching (a run whose ranks die before provenance.json, then a good run into
the same report directory; two launches in one second) launch for real and are ``slow``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness import report, run_dir
from harness.launch import RunResult
from recipes.tiers import FIXTURES, REPO_ROOT
from harness_main import main_in_process

TINY = FIXTURES / "qwen3-tiny"


def tree_sha256(path: Path) -> dict[str, str]:
    """Every file under ``path`` (or ``path`` itself), by relative name, with its sha256: what "unchanged" means."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@dataclass
class Inputs:
    """A run's inputs as copies in tmp_path (the tiny model, its tokenizer in a directory of its own, the corpus)."""

    root: Path
    model: Path
    tokenizer: Path
    dataset: Path
    report: Path
    #: Extra paths a case guards (the repository's fixtures/, tracked files), hashed before and after.
    guarded: list[Path] = field(default_factory=list)

    @classmethod
    def make(cls, tmp_path: Path) -> "Inputs":
        model, tokenizer, dataset = tmp_path / "in" / "model", tmp_path / "in" / "tokenizer", tmp_path / "in" / "data"
        shutil.copytree(TINY, model)
        tokenizer.mkdir(parents=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):  # the weights' own tokenizer, in a directory alone
            shutil.copy2(TINY / name, tokenizer / name)
        shutil.copytree(FIXTURES / "corpus", dataset)
        return cls(tmp_path / "in", model, tokenizer, dataset, tmp_path / "report")

    def args(self) -> list[str]:
        """The inputs as flags; the tokenizer is the model's own (a case that names --tokenizer-dir passes it)."""
        return ["--model-dir", str(self.model), "--dataset-dir", str(self.dataset)]

    def digest(self) -> dict[str, dict[str, str]]:
        return {str(p): tree_sha256(p) for p in [self.root, *self.guarded]}


@dataclass(frozen=True)
class Refusal:
    """One bad target: the arguments (``{model}``, ``{dataset}``, ``{tokenizer}``, ``{in}``, ``{repo}``, ``{live}``
    filled in), the fragments its one error line must hold, the paths it guards besides the inputs."""

    name: str
    args: tuple[str, ...]
    fragments: tuple[str, ...]
    guarded: tuple[str, ...] = ()
    #: Substrings the line must not hold (advice that would destroy an input).
    never: tuple[str, ...] = ()


REFUSALS = [
    Refusal("export dir is the tokenizer dir",
            ("--tokenizer-dir", "{tokenizer}", "--export-dir", "{tokenizer}", "--overwrite"),
            ("--export-dir {tokenizer} is --tokenizer-dir {tokenizer}", "never deletes or overwrites")),
    Refusal("export dir contains the model dir", ("--export-dir", "{in}", "--overwrite"),
            ("--export-dir {in} contains --model-dir {model}", "choose an --export-dir outside every input")),
    Refusal("export dir inside the dataset dir", ("--export-dir", "{dataset}/export", "--overwrite"),
            ("--export-dir {dataset}/export lies inside --dataset-dir {dataset}",)),
    Refusal("export dir is the dataset dir, no --overwrite", ("--export-dir", "{dataset}"),
            ("--export-dir {dataset} is --dataset-dir {dataset}",), never=("--overwrite",)),
    Refusal("export dir is fixtures/", ("--export-dir", "{repo}/fixtures", "--overwrite"),
            ("--export-dir {repo}/fixtures is the suite's fixtures/",), guarded=("{repo}/fixtures",)),
    Refusal("export dir holds tracked files", ("--export-dir", "{repo}/harness", "--overwrite"),
            ("--export-dir {repo}/harness contains", "tracked file(s) of the repository"), guarded=("{repo}/harness",)),
    Refusal("export dir is a tracked file", ("--export-dir", "{repo}/README.md", "--overwrite"),
            ("--export-dir {repo}/README.md is the tracked file README.md",), guarded=("{repo}/README.md",)),
    Refusal("export dir is a going run's directory", ("--export-dir", "{live}", "--overwrite"),
            ("--export-dir {live} is the run directory {live} of a run still going (pid",), guarded=("{live}",)),
    Refusal("export dir holds a going run's directory", ("--export-dir", "{live}/..", "--overwrite"),
            ("contains the run directory {live} of a run still going",), guarded=("{live}",)),
    Refusal("report dir inside the dataset dir", ("--report-dir", "{dataset}/report"),
            ("the run directory {dataset}/report/runs/", "lies inside --dataset-dir {dataset}",
             "pass a --report-dir outside every input")),
    Refusal("torchtitan's --dump_folder inside fixtures/", ("--dump_folder", "{repo}/fixtures/qwen3-tiny/run"),
            ("--dump_folder {repo}/fixtures/qwen3-tiny/run lies inside the suite's fixtures/",),
            guarded=("{repo}/fixtures",)),
]


@pytest.fixture
def going_run(tmp_path):
    """A process of a run still going, as the process finder sees one: its run directory in its environment.

    Started detached (``sh`` exits, its ``sleep`` is re-parented), as a run from another terminal
    is: not a descendant of this process. Ended here by its pid.
    """
    live = tmp_path / "elsewhere" / "runs" / "going"
    live.mkdir(parents=True)
    (live / run_dir.RUN_FILE).write_text("{}\n")
    env = {**os.environ, run_dir.RUN_DIR_ENV: str(live)}
    out = subprocess.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], env=env, capture_output=True, text=True,
                         check=True)  # fmt: skip
    pid = int(out.stdout.strip())
    yield live
    os.kill(pid, signal.SIGTERM)


def fill(text: str, inputs: Inputs, live: Path) -> str:
    return text.format(model=inputs.model, tokenizer=inputs.tokenizer, dataset=inputs.dataset, repo=REPO_ROOT,
                       live=live, **{"in": inputs.root})  # fmt: skip


def refuse(case: Refusal, inputs: Inputs, live: Path, report_dir: Path) -> str:
    """Run ``case`` in process; assert exit 2, one error line with its fragments, inputs unchanged. The line."""
    inputs.guarded = [Path(fill(g, inputs, live)).resolve() for g in case.guarded]
    before = inputs.digest()
    args = [fill(a, inputs, live) for a in case.args]
    if "--report-dir" not in args:
        args += ["--report-dir", str(report_dir)]
    out = main_in_process(["run", "native_qwen3", "--init", "hf", *inputs.args(), *args])
    assert out.returncode == 2, (case.name, out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, (case.name, out.stderr)
    for fragment in case.fragments:
        assert fill(fragment, inputs, live) in lines[0], (case.name, fill(fragment, inputs, live), lines[0])
    for word in case.never:
        assert word not in lines[0], (case.name, word, lines[0])
    assert inputs.digest() == before, f"{case.name}: an input changed"
    return lines[0]


@pytest.mark.parametrize("case", REFUSALS, ids=[c.name for c in REFUSALS])
def test_a_target_that_touches_an_input_or_a_going_run_is_refused_before_launch(case, tmp_path, going_run):
    inputs = Inputs.make(tmp_path)
    refuse(case, inputs, going_run, inputs.report)
    assert not inputs.report.exists(), "a refused run writes nothing: its claimed run directory is released"
    assert not (inputs.dataset / "report").exists(), "nothing is left inside an input"


def test_the_going_run_is_seen_by_the_finder_the_check_uses(going_run):
    """The refusals of a going run are not a finder that finds nothing: the same finder sees this one."""
    from harness.checks.targets import running_run_dirs

    assert going_run in running_run_dirs()


# --- a failed run never poisons a report -------------------------------------------------------------


def failed_before_provenance(report_dir: Path) -> dict:
    """The record the launcher keeps of a run whose ranks died before rank 0 wrote provenance.json.

    ``harness.launch.launch`` reads what the run directory holds (``run_dir.read_provenance``: nothing)
    and adds the input key the launcher computed itself: a provenance of "inputs" only.
    """
    where = report_dir / "runs" / "native_qwen3-cpu-hf-20260101-000000"
    where.mkdir(parents=True)
    result = RunResult(recipe="native_qwen3", tier="cpu", init="hf", nproc=2, seed=0, seq_len=256, local_batch_size=2,
                       run_dir=str(where), export_dir=None, returncode=1, wall_s=4.0,
                       provenance={**run_dir.read_provenance(where), "inputs": {"tokenizer": {"tokenizer.json": "ab"}}})
    return {**result.to_dict(), "error": "torchrun exited 1; rank 0 failed first: AssertionError:"}  # fmt: skip


READERS = [
    # (what the run directory holds, the reader, what it must make of it)
    ("no provenance.json", {}, run_dir.NO_PROVENANCE),
    ("provenance.json cut short", {run_dir.PROVENANCE_FILE: '{"tokenizer": {"path": "/x", "vo'}, run_dir.NO_PROVENANCE),
    ("provenance.json a list", {run_dir.PROVENANCE_FILE: "[]"}, run_dir.NO_PROVENANCE),
    ("provenance.json partial", {run_dir.PROVENANCE_FILE: '{"tokenizer": {}, "model": {}}'},
     "provenance.json is partial (no weights, data, seed, dtype, allowed_mismatches)"),
]


@pytest.mark.parametrize("files, state", [r[1:] for r in READERS], ids=[r[0] for r in READERS])
def test_every_reader_names_a_missing_or_partial_provenance(files, state, tmp_path):
    from harness.first_batch import IncompleteRecord
    from harness.reference.suspects import RunInfo

    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / run_dir.STEPS_FILE).write_text('{"step": 1, "loss": 1.5}\n{"step": 2, "lo')  # rank 0 killed mid-line
    assert run_dir.provenance_state(run_dir.read_provenance(tmp_path)) == state
    assert run_dir.read_steps(tmp_path) == [{"step": 1, "loss": 1.5}], "a line cut short is not a step"
    with pytest.raises(IncompleteRecord, match=state.replace("(", r"\(").replace(")", r"\)")):
        RunInfo.from_run_dir(tmp_path)  # the judgement's reader (harness.reference)


@pytest.mark.parametrize("files, state", [r[1:] for r in READERS], ids=[r[0] for r in READERS])
def test_the_launcher_keys_the_inputs_of_any_provenance_and_leaves_an_unreadable_one_as_it_is(files, state, tmp_path):
    """``harness.provenance.add_input_key``, which the launcher calls after every run, ended or not: the key
    always, added to a provenance.json that is one JSON object, and no other file touched or made."""
    from harness.options import RunOptions
    from harness.provenance import add_input_key

    for name, text in files.items():
        (tmp_path / name).write_text(text)
    recorded = run_dir.read_provenance(tmp_path)
    key = add_input_key(tmp_path, RunOptions(recipe="native_qwen3", tier="cpu", init="hf").resolved())
    assert key["weights"] and key["tokenizer"], key
    if recorded:
        assert run_dir.read_provenance(tmp_path) == {**recorded, "inputs": key}
    else:
        assert tree_sha256(tmp_path) == {n: hashlib.sha256(t.encode()).hexdigest() for n, t in files.items()}


def test_the_band_lane_reads_the_steps_a_killed_rank_left(tmp_path):
    """``harness.band.read_run`` (the goldens' band lane) through the run directory's readers."""
    from harness.band import read_run

    (tmp_path / run_dir.STEPS_FILE).write_text('{"step": 1, "loss": 1.5}\n{"step": 2, "loss": 1.4}\n{"step": 3, "lo')
    (tmp_path / run_dir.RUN_FILE).write_text('{"seed": 1, "recipe": "nat')
    assert read_run(tmp_path) == ([1.5, 1.4], {})


def test_a_run_that_failed_before_provenance_is_reported_with_what_is_known(tmp_path):
    """The report of issue 35: a KeyError 'tokenizer' in results.md on every later run into the report dir."""
    failed = failed_before_provenance(tmp_path)
    report.update(tmp_path, runs=[failed])
    report.update(tmp_path, timing={"wall_s": 1.0, "launches_s": 0.0, "training_steps_s": 0.0,
                                    "outside_training_share": 1.0})  # a later run's report: must not fail  # fmt: skip
    md = (tmp_path / report.RESULTS_MD).read_text()
    row = next(line for line in md.splitlines() if line.startswith("| native_qwen3 | cpu | hf |"))
    assert f"FAILED: torchrun exited 1; rank 0 failed first: AssertionError:; {run_dir.NO_PROVENANCE}" in row
    assert f"| native_qwen3 | hf | – ({run_dir.NO_PROVENANCE}) |" in md, "the provenance table names the state"


def test_an_unreadable_results_json_is_kept_aside_and_the_report_starts_again(tmp_path, capsys):
    (tmp_path / report.RESULTS_JSON).write_text('{"runs": [{"recipe": "native_qwen3", "ti')
    report.update(tmp_path, runs=[failed_before_provenance(tmp_path)])
    kept = tmp_path / f"{report.RESULTS_JSON}.unreadable-1"
    assert kept.read_text() == '{"runs": [{"recipe": "native_qwen3", "ti', "the unreadable report is kept, unchanged"
    assert len(json.loads((tmp_path / report.RESULTS_JSON).read_text())["runs"]) == 1
    assert f"kept as {kept.name}" in capsys.readouterr().err


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


def test_a_refused_plan_releases_only_what_it_claimed(tmp_path):
    """A report dir the user made stays, even empty; the runs/ the refused plan (hf, random, 4B-width) made is gone."""
    mine = tmp_path / "mine"
    mine.mkdir()
    out = main_in_process(["run", "native_qwen3", "--steps", "0", "--report-dir", str(mine)])
    assert out.returncode == 2, out.stderr
    assert mine.is_dir() and list(mine.iterdir()) == []


# --- real launches -----------------------------------------------------------------------------------


def harness_run(report_dir: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m harness run`` of one weights-loaded step, nothing exported (a launch of 2 ranks)."""
    cmd = [sys.executable, "-m", "harness", "run", "native_qwen3", "--tier", "cpu", "--init", "hf", "--steps", "1",
           "--no-export", "--report-dir", str(report_dir), *args]  # fmt: skip
    env = {**os.environ, **(env or {})}
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_after_every_failing_case_a_good_run_into_the_same_report_dir_succeeds(tmp_path, going_run):
    """Every refusal above into one report dir, then a run whose ranks die before provenance.json, then a good run."""
    inputs = Inputs.make(tmp_path)
    shared = tmp_path / "shared-report"
    for case in REFUSALS:
        if "--report-dir" not in case.args:
            refuse(case, inputs, going_run, shared)
    before = inputs.digest()
    died = harness_run(shared, *inputs.args(), env={"QWEN3_REPRO_FAULT": "die@0:0"})
    assert died.returncode == 1, died.stderr[-3000:]
    assert "Traceback (most recent call last)" not in died.stderr.split("--- rank")[0], died.stderr[-3000:]
    assert run_dir.NO_PROVENANCE in (shared / report.RESULTS_MD).read_text()
    good = harness_run(shared, *inputs.args())
    assert good.returncode == 0, good.stderr[-3000:]
    runs = json.loads((shared / report.RESULTS_JSON).read_text())["runs"]
    assert [bool(r.get("error")) for r in runs] == [True, False], [r.get("error") for r in runs]
    assert len({r["run_dir"] for r in runs}) == 2
    assert inputs.digest() == before


@pytest.mark.slow
def test_two_launches_in_the_same_second_never_share_a_run_directory(tmp_path):
    """Seed 0 and seed 1 started together, each name they could get already taken: each run claims its own.

    The directories of every second of the next two minutes are made first (each with a file in
    it), so both launches meet a taken name whatever second they plan in, and race for the next.
    """
    shared = tmp_path / "report"
    now = time.time()
    taken = [shared / "runs" / f"native_qwen3-cpu-hf-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now + s))}"
             for s in range(-1, 120)]  # fmt: skip
    for path in taken:
        path.mkdir(parents=True)
        (path / "mine.txt").write_text("not the run's")
    cmd = [sys.executable, "-m", "harness", "run", "native_qwen3", "--tier", "cpu", "--init", "hf", "--steps", "1",
           "--no-export", "--report-dir", str(shared)]  # fmt: skip
    procs = [subprocess.Popen([*cmd, "--seed", str(seed)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for seed in (0, 1)]  # fmt: skip
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outs]
    assert all(sorted(os.listdir(p)) == ["mine.txt"] for p in taken), "a taken directory was written to"
    dirs = sorted(d for d in (shared / "runs").iterdir() if d not in taken)
    assert len(dirs) == 2 and all(d.name.rsplit("-", 1)[1] in ("2", "3") for d in dirs), dirs
    seeds = sorted(json.loads((d / run_dir.RUN_FILE).read_text())["seed"] for d in dirs)
    assert seeds == [0, 1]
    assert all(len(run_dir.read_steps(d)) == 1 for d in dirs), "each run's steps alone in its directory"


def test_the_checkpoint_folder_the_recipes_set_is_the_one_run_dir_names():
    """recipes/ cannot import the harness, so the name is written twice: they must agree (harness.export reads it)."""
    from recipes.native_qwen3 import native_qwen3_cpu

    assert native_qwen3_cpu().checkpoint.folder == run_dir.CHECKPOINT_DIR

"""Inputs a user may give ``python -m harness run``, built in a test's tmp_path, and the two ways to run one.

The builders copy the fixtures and break one thing (with the real safetensors library); each
returns the paths it made by name (``model``, ``data``, ``tokenizer``, ``path``), which the table
of tests/cpu/test_bad_inputs_table.py fills into its command lines and messages. ``in_process``
runs ``main`` here and says at which stage it stopped; ``fresh`` is the real command line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
from harness_main import main_in_process

from recipes.tiers import FIXTURES, REPO_ROOT

FIXTURE_DIR = FIXTURES / "qwen3-tiny"
CORPUS = FIXTURES / "corpus" / "train.jsonl"
BOM = b"\xef\xbb\xbf"
#: --steps 1 and --init hf (no full-width random-init run is added): a check that fails to refuse costs no run here.
PLAIN = ("native_qwen3", "--init", "hf", "--steps", "1")
HF = (*PLAIN, "--model-dir")
#: What launch prints before torchrun starts; a refusal before launch prints neither it nor a rank's line.
LAUNCH_LINE = "process(es), run dir"


# --- builders: root is the row's own tmp_path/in -------------------------------------------------------


def copy_fixture(root: Path) -> Path:
    path = root / "model"
    shutil.copytree(FIXTURE_DIR, path)
    return path


def edit_config(model: Path, **changes) -> Path:
    """Change keys of ``model``'s config.json (None deletes one)."""
    path = model / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        config.pop(key) if value is None else config.__setitem__(key, value)
    path.write_text(json.dumps(config))
    return path


def model(**config):
    """A builder: the fixture checkpoint copied, its config.json changed by ``config``."""

    def build(root: Path) -> Path:
        path = copy_fixture(root)
        if config:
            edit_config(path, **config)
        return path

    return build


def model_with(change):
    """A builder: the fixture copied, then ``change(model_dir)`` (returns nothing)."""

    def build(root: Path) -> Path:
        path = copy_fixture(root)
        change(path)
        return path

    return build


def only(*names: str):
    """A builder: a model directory holding only ``names`` of the fixture's files."""

    def build(root: Path) -> Path:
        path = root / "model"
        path.mkdir()
        for name in names:
            shutil.copy(FIXTURE_DIR / name, path / name)
        return path

    return build


def safetensors_edit(edit):
    """``edit(state)`` applied to the fixture's tensors, saved back."""

    def change(path: Path) -> None:
        from safetensors.torch import load_file, save_file

        state = load_file(path / "model.safetensors")
        save_file(edit(state) or state, path / "model.safetensors")

    return change


def cut(name: str, keep):
    """The file ``name`` cut to ``keep(size)`` bytes."""

    def change(path: Path) -> None:
        data = (path / name).read_bytes()
        (path / name).write_bytes(data[: keep(len(data))])

    return change


def rewrite(name: str, new):
    def change(path: Path) -> None:
        (path / name).write_text(new((path / name).read_text()))

    return change


def shard_fixture(
    root: Path, names=("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
) -> Path:
    """The fixture's weights split into two shards with their index, as the Hub ships large models."""
    from safetensors.torch import load_file, save_file

    path = copy_fixture(root)
    state = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    keys = sorted(state)
    weight_map = {}
    for name, part in zip(names, (keys[: len(keys) // 2], keys[len(keys) // 2 :])):
        save_file({k: state[k] for k in part}, path / name)
        weight_map.update(dict.fromkeys(part, name))
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return path


def shards(then=None, names=None):
    def build(root: Path) -> Path:
        path = shard_fixture(root, names) if names else shard_fixture(root)
        if then:
            then(path)
        return path

    return build


def unlisted_shard(path: Path) -> None:
    """A third *.safetensors beside two shards and their index, which the index does not name."""
    from safetensors.torch import load_file, save_file

    part = load_file(path / "model-00002-of-00002.safetensors")
    key = sorted(part)[0]
    save_file({key: part[key]}, path / "model-00003-of-00003.safetensors")


def corpus(files: dict[str, bytes] | bytes):
    """A builder: a dataset directory holding ``files`` (bytes alone: train.jsonl)."""

    def build(root: Path) -> Path:
        path = root / "corpus"
        path.mkdir()
        for name, data in ({"train.jsonl": files} if isinstance(files, bytes) else files).items():
            (path / name).write_bytes(data)
        return path

    return build


def a_file(text: str = "not a directory", name: str = "report.txt"):
    def build(root: Path) -> Path:
        (root / name).write_text(text)
        return root / name

    return build


def previous_export(root: Path) -> Path:
    """An export an earlier run published: its files and the suite's marker listing them."""
    from harness.base import marker

    (root / "export").mkdir()
    (root / "export" / "config.json").write_text("{}")
    (root / "export" / "model.safetensors").write_text("a previous export")
    marker.mark_export(root / "export")
    return root / "export"


def export_with_a_foreign_file(root: Path) -> Path:
    """A previous export, and a file the user put there after it."""
    path = previous_export(root)
    (path / "notes.txt").write_text("the user's own notes")
    return path


def foreign_dir(root: Path) -> Path:
    """A directory of the user's own, with no marker: nothing in it is the suite's."""
    (root / "mine").mkdir()
    (root / "mine" / "thesis.tex").write_text("the user's own file")
    return root / "mine"


def earlier_report(root: Path) -> Path:
    """A report directory as ``python -m harness run`` leaves it: results, runs/ with a run directory."""
    from harness.base import run_dir
    from harness.report import results

    path = root / "old-report"
    results.update(path)
    run = run_dir.claim(path / "runs", "r-20260101-000000")
    (run / run_dir.RUN_FILE).write_text("{}")
    return path


def unmarked_report(root: Path) -> Path:
    """A report directory written before the suite marked its directories: no marker anywhere."""
    path = root / "old-report"
    (path / "runs" / "r-1").mkdir(parents=True)
    (path / "results.json").write_text('{"runs": []}')
    (path / "results.md").write_text("# results")
    (path / "runs" / "r-1" / "run.json").write_text("{}")
    return path


def symlink_loop(root: Path) -> Path:
    """A symlink to itself: ``Path.resolve()`` raises ``RuntimeError: Symlink loop``."""
    os.symlink("loop", root / "loop")
    return root / "loop"


def fifo(root: Path) -> Path:
    os.mkfifo(root / "fifo")
    return root / "fifo"


def unix_socket(root: Path) -> Path:
    """A Unix socket's file (left when its socket is closed)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(root / "sock"))
    return root / "sock"


def earlier_run_dir(root: Path) -> Path:
    return earlier_report(root) / "runs" / "r-20260101-000000"


def report_with_a_runs_file(root: Path) -> Path:
    path = root / "report"
    (path).mkdir()
    (path / "runs").write_text("")
    return path


def empty_dir(root: Path) -> Path:
    (root / "mine").mkdir()
    return root / "mine"


def unwritable_dir(root: Path) -> Path:
    """A directory this process cannot write: mode 0555 as a user; as root (which ignores modes), /proc/sys."""
    if os.geteuid() != 0:
        path = root / "read-only"
        path.mkdir(mode=0o555)
        return path
    path = Path("/proc/sys")
    if os.access(path, os.W_OK):
        pytest.skip(
            "running as root on a host whose /proc/sys is writable: no unwritable directory to test with"
        )
    return path


def copies(root: Path) -> dict[str, Path]:
    """The tiny model, its tokenizer in a directory of its own, and the corpus, as copies."""
    tokenizer = root / "tokenizer"
    tokenizer.mkdir()
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
    ):  # the weights' own tokenizer, in a directory alone
        shutil.copy2(FIXTURE_DIR / name, tokenizer / name)
    data = root / "data"
    shutil.copytree(FIXTURES / "corpus", data)
    return {"model": copy_fixture(root), "tokenizer": tokenizer, "data": data}


# --- what "unchanged" means -----------------------------------------------------------------------------


def digests(*roots: Path) -> dict[str, str]:
    """sha256 of every file under ``roots`` (or of a root that is a file), and every directory by name."""
    found = {}
    for root in map(Path, roots):
        paths = [root] if not root.is_dir() else [root, *sorted(root.rglob("*"))]
        for p in paths:
            if "__pycache__" in p.parts or not p.exists():
                continue
            if p.is_dir():
                found[str(p)] = "dir"
            elif not p.is_file():  # a FIFO, socket or device: never opened (a FIFO's read blocks)
                found[str(p)] = f"special {stat.S_IFMT(p.stat().st_mode):o}"
            else:
                found[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return found


# --- running a row --------------------------------------------------------------------------------------


def in_process(argv: list[str]) -> tuple[subprocess.CompletedProcess, str]:
    """``main(argv)`` here; the stage it stopped at: "options" (the parser) or "checks" (``cmd_run``'s checks).

    ``harness.launch.lifecycle.launch`` raises instead of starting torchrun: a check that stops refusing
    fails its row at once, with no run started.
    """
    import harness.__main__ as entry

    stages = ["options"]
    real_cmd_run = entry.cmd_run

    def cmd_run(*args, **kwargs):
        stages.append("checks")
        return real_cmd_run(*args, **kwargs)

    def launch(opts, *args, **kwargs):
        raise AssertionError(
            f"passed every check and would launch {opts.recipe}: the row's refusal is gone"
        )

    with (
        mock.patch.object(entry, "cmd_run", cmd_run),
        mock.patch("harness.launch.lifecycle.launch", launch),
    ):
        out = main_in_process(argv)
    return out, stages[-1]


def fresh(
    argv: list[str], report_dir: Path, env: dict, cwd: Path, watch: bool
) -> subprocess.CompletedProcess:
    """The real ``python -m harness ARGV``; with ``watch``, its prestarted launcher is seen and none is left."""
    from run_watch import RunWatch, describe

    cmd = [sys.executable, "-m", "harness", *argv]
    if not watch:
        return subprocess.run(
            cmd, capture_output=True, text=True, cwd=cwd, env={**os.environ, **env}, timeout=120
        )
    with RunWatch(report_dir) as watcher:
        out = subprocess.run(
            cmd, capture_output=True, text=True, cwd=cwd, env={**os.environ, **env}, timeout=120
        )
    left = watcher.kill_left()
    watcher.saw(
        launcher=1
    )  # the watch finds the run's processes: "none left" is not a blind finder's
    assert left == [], (
        f"a refused `python -m harness run` left {describe(left)} ({watcher.summary()})"
    )
    return out


def timed(run, *args) -> tuple[object, float]:
    started = time.perf_counter()
    out = run(*args)
    return out, time.perf_counter() - started


def fill(text: str, names: dict) -> str:
    return text.format(**names)


def run_row(row, root: Path, report: Path, live: Path | None, monkeypatch) -> tuple[str, float]:
    """Build the row's inputs in ``root``, run it into ``report``; assert its outcome and that nothing it was
    given changed. Its one stderr line (or stdout for a command that must work) and how long it took."""
    root.mkdir(parents=True)
    built = row.build(root) if row.build else None
    names = {
        "in": root,
        "repo": REPO_ROOT,
        "live": live,
        **(built if isinstance(built, dict) else {"model": built, "data": built, "path": built}),
    }
    args = [fill(a, names) for a in row.args]
    argv = (
        args
        if row.command
        else ["run", *args, *([] if "--report-dir" in args else ["--report-dir", str(report)])]
    )
    env = {k: fill(v, names) for k, v in row.env.items()}
    watched = [root, FIXTURES, report, *(Path(fill(g, names)).resolve() for g in row.guarded)]
    before = digests(*watched)
    if row.fresh:
        given = Path(argv[argv.index("--report-dir") + 1]) if "--report-dir" in argv else report
        out, elapsed = timed(
            fresh, argv, given, env, root if row.from_inputs else REPO_ROOT, row.watch
        )
        stage = row.stage
    else:
        with monkeypatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            if row.from_inputs:
                patch.chdir(root)
            (out, stage), elapsed = timed(in_process, argv)
    line = assert_outcome(row, out, stage, elapsed, names)
    assert digests(*watched) == before, f"{row.id}: an input, fixtures/ or the report dir changed"
    return line, elapsed


def assert_outcome(
    row, out: subprocess.CompletedProcess, stage: str, elapsed: float, names: dict
) -> str:
    assert out.returncode == row.code, (
        row.id,
        out.returncode,
        out.stdout[-2000:],
        out.stderr[-3000:],
    )
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert LAUNCH_LINE not in out.stdout and "[rank" not in out.stderr, "a rank started"
    assert stage == row.stage, f"{row.id} stopped at the {stage}, not the {row.stage}"
    assert elapsed < 60, f"{row.id} took {elapsed:.0f} s"
    if row.code == 0:  # a command that must still work
        assert out.stdout.strip() and not out.stderr.strip(), out.stderr
        return out.stdout.splitlines()[0]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(row.prefix), out.stderr
    for fragment in row.message:
        assert fill(fragment, names) in lines[0], (fill(fragment, names), lines[0])
    for word in row.never:
        assert word not in lines[0], (word, lines[0])
    return lines[0]


def one_step_command(report_dir: Path, *args: str) -> list[str]:
    """``python -m harness run native_qwen3`` for one step on the cpu tier, nothing exported."""
    return [
        *(sys.executable, "-m", "harness", "run", "native_qwen3", "--tier", "cpu"),
        *("--init", "hf", "--steps", "1", "--no-export", "--report-dir", str(report_dir), *args),
    ]


def harness_run(
    report_dir: Path, *args: str, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``python -m harness run`` of one weights-loaded step, nothing exported (a launch of 2 ranks)."""
    cmd = one_step_command(report_dir, *args)
    return subprocess.run(
        cmd,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def param_ids(fn) -> set[str]:
    """The ids of ``fn``'s own ``parametrize`` marks (explicit ids, an ids function, or ``pytest.param`` ids)."""
    found = set()
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        ids, values = mark.kwargs.get("ids"), mark.args[1]
        for i, value in enumerate(values):
            if getattr(value, "id", None):
                found.add(value.id)
            elif callable(ids):
                found.add(ids(value))
            elif ids:
                found.add(ids[i])
            else:
                found.add(str(value))
    return found

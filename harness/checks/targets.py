"""The directories a run writes or replaces: writable, and never an input (nothing the user gave is deleted or overwritten).

A run replaces ``--export-dir`` (with ``--overwrite``), writes its checkpoints and records into its
run directory (or torchtitan's ``--dump_folder``) and clears files there. Each such target is refused
before launch when it is, contains or lies inside an input of the run (the model, tokenizer and
dataset directories, the suite's ``fixtures/``, a tracked file of the repository) or the directory
of a run that is still going. Files in the report's own run directories are the harness's output, not
inputs, even if tracked.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from harness.base import marker
from harness.base.processes import descendants_of, table  # the one finder of a run's processes
from harness.base.run_dir import RUN_FILE, read_run_json
from harness.checks.errors import PreflightError
from harness.options.run_options import RunOptions
from recipes.tiers import FIXTURES, REPO_ROOT


def relation(target: Path, other: Path) -> str | None:
    """How ``target`` stands to ``other``: "is", "contains", "lies inside", or None (apart)."""
    if target == other:
        return "is"
    if target in other.parents:
        return "contains"
    if other in target.parents:
        return "lies inside"
    return None


def named_inputs(opts: RunOptions) -> list[tuple[str, Path]]:
    """The run's input directories, each with the name a refusal gives it (``opts`` resolved)."""
    named = [
        ("--model-dir", opts.model_dir),
        ("--tokenizer-dir", opts.tokenizer_dir),
        ("--dataset-dir", opts.dataset_dir),
        ("the suite's fixtures/", FIXTURES),
    ]
    return [(name, Path(path).resolve()) for name, path in named if path is not None]


@functools.cache
def tracked_files(root: Path = REPO_ROOT) -> tuple[Path, ...]:
    """Every file git tracks in the repository (none outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z"], capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if out.returncode != 0:
        return ()
    return tuple(root / name for name in out.stdout.decode(errors="replace").split("\0") if name)


def running_run_dirs() -> dict[Path, int]:
    """The run directory of every run still going (a live process's run marker), with one of its pids.

    The launcher's own processes (this one and what it started, e.g. its prestarted
    harness.launch.elastic, which carries the planned run's marker) are not another run.
    A fresh look each time (a run may start between two checks): 10-50 ms of /proc.
    """

    procs = table()
    own = {os.getpid(), *descendants_of(os.getpid(), procs)}
    return {
        Path(p.run_dir): pid
        for pid, p in sorted(procs.items())
        if p.run_dir and p.alive and pid not in own
    }


def check_target(target: Path, what: str, opts: RunOptions, fix: str) -> None:
    """Refuse ``target`` (the flag ``what`` names it) if writing or replacing it could touch an input or a going run."""
    target = Path(target).resolve()
    runs = opts.run_dir.parent.resolve() if opts.run_dir is not None else None
    for name, path in named_inputs(opts):
        how = relation(target, path)
        if how is not None:
            raise PreflightError(
                f"{what} {target} {how} {name} {path}; a run never deletes or overwrites its inputs: {fix}"
            )
    tracked = [
        f
        for f in tracked_files()
        if relation(target, f) is not None
        and not (runs is not None and relation(f, runs) == "lies inside")
    ]
    if tracked:
        held = (
            f"is the tracked file {tracked[0].relative_to(REPO_ROOT)}"
            if tracked[0] == target
            else f"contains {len(tracked)} tracked file(s) of the repository (e.g. {tracked[0].relative_to(REPO_ROOT)})"
        )
        raise PreflightError(
            f"{what} {target} {held}; a run never deletes or overwrites them: {fix}"
        )
    for run_dir, pid in running_run_dirs().items():
        how = relation(target, run_dir.resolve())
        if how is not None:
            raise PreflightError(
                f"{what} {target} {how} the run directory {run_dir} of a run still going (pid {pid}); "
                f"wait for it to end, or {fix}"
            )


def check_export_target(opts: RunOptions) -> None:
    """``--export-dir``: written, and replaced with ``--overwrite``; never a going run's own export dir."""
    if opts.export_dir is None:
        return
    check_target(
        opts.export_dir, "--export-dir", opts, "choose an --export-dir outside every input"
    )
    target = Path(opts.export_dir).resolve()
    for run_dir, pid in running_run_dirs().items():
        theirs = read_run_json(run_dir).get("export_dir")
        if theirs and Path(theirs).resolve() == target:
            raise PreflightError(
                f"--export-dir {target} is the --export-dir of a run still going (pid {pid}; "
                f"{run_dir / RUN_FILE} names it); wait for it to end, or choose another --export-dir"
            )


def check_replaceable_export(export_dir: Path) -> None:
    """A non-empty ``--export-dir`` may be replaced only when it is a previous export, every file of it
    the suite's (its marker, ``harness.base.marker``); else the refusal names the file that says why."""
    target = Path(export_dir).resolve()
    fix = "--overwrite replaces only a previous export: choose a new --export-dir"
    found = marker.read(target)
    if found is not None and found["kind"] != marker.EXPORT:
        raise PreflightError(
            f"--export-dir {target} is a {found['kind']} directory the suite wrote "
            f"({target / marker.MARKER} says so), not an export; {fix}"
        )
    for parent in target.parents:
        if marker.kind(parent) == marker.RUN:
            raise PreflightError(
                f"--export-dir {target} lies inside the run directory {parent} "
                f"({parent / marker.MARKER} says so); {fix}"
            )
    foreign = marker.foreign_files(target)
    if foreign:
        why = (
            f"no {target / marker.MARKER}"
            if found is None
            else f"not listed in {target / marker.MARKER}"
        )
        raise PreflightError(
            f"--export-dir {target} holds {len(foreign)} file(s) the suite did not write "
            f"(e.g. {foreign[0]}; {why}); {fix}, or move those files away yourself"
        )


def check_run_target(opts: RunOptions) -> None:
    """The run's directory (``REPORT_DIR/runs/NAME``: checkpoints, records, logs): written and cleared."""
    if opts.run_dir is not None:
        check_target(
            opts.run_dir, "the run directory", opts, "pass a --report-dir outside every input"
        )


def check_dump_folder_target(opts: RunOptions, dump_folder: Path) -> None:
    """torchtitan's ``--dump_folder``, where it moves the run's checkpoints and records."""
    check_target(
        dump_folder, "--dump_folder", opts, "drop --dump_folder, or pass one outside every input"
    )


def check_output_dir(path: Path, fix: str) -> None:
    """``path`` is a directory, or can be made one, and can be written.

    Nothing is created: the nearest existing ancestor must be a directory this process may
    write (``os.access``, which also says no on a read-only file system, for root too).
    """
    existing = next(p for p in (path, *path.parents) if p.exists())
    made = "written" if existing == path else "created"
    if not existing.is_dir():
        where = f"{path} is" if existing == path else f"{path} cannot be created: {existing} is"
        raise PreflightError(f"{where} a file, not a directory; {fix}")
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = os.statvfs(existing).f_flag & os.ST_RDONLY
        why = "is on a read-only file system" if read_only else "is not writable"
        raise PreflightError(f"{existing} {why}, so {path} cannot be {made}; {fix}")

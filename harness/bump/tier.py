"""One run of the cpu tier in a given venv, as ``make test`` runs it, into its own report dir.

Each run leaves ``tests.json`` (harness.pytest_plugins.report), ``junit.xml`` for the failure messages,
``pytest.log`` and ``run.json`` (this module's :class:`TierRun`), so that a baseline on the lock
can be reused while the lock and the code it ran are unchanged and it is recent.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.bump.plan import rel, sha256
from recipes.tiers import REPO_ROOT

#: The cpu tier, as ``make test`` runs it (the report dir and JUnit file are added per run).
PYTEST_ARGS = ("-m", "cpu", "-n", "auto", "-q", "-p", "no:cacheprovider")
#: What decides a baseline's verdicts besides the lock: reused only while these are unchanged.
CODE_PATHS = ("recipes", "harness", "tests", "fixtures", "conftest.py", "pytest.ini")
BASELINE_MAX_AGE_H = 24.0


@dataclass
class TierRun:
    """One ``pytest -m cpu`` run into its own report dir."""

    python: str
    report_dir: str
    returncode: int | None = None
    seconds: float | None = None
    finished: str | None = None
    lock_sha256: str | None = None
    code_sha256: str | None = None
    summary: str = ""

    @property
    def meta_path(self) -> Path:
        return Path(self.report_dir) / "run.json"

    def save(self) -> None:
        self.meta_path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, report_dir: Path) -> "TierRun | None":
        path = report_dir / "run.json"
        return cls(**json.loads(path.read_text())) if path.exists() else None


def code_sha256(root: Path = REPO_ROOT, paths: tuple[str, ...] = CODE_PATHS) -> str:
    """A hash of every tracked or new file under ``paths``: what a baseline's verdicts depend on."""
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "--", *paths],
        capture_output=True,
        text=True,
        cwd=root,
    )
    digest = hashlib.sha256()
    for name in sorted(out.stdout.splitlines()):
        path = root / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


#: Not passed to a run: another venv's, and make's (under `make bump` a test's own `make -n`
#: would print "make[1]: Entering directory", which `make test` never shows).
UNSET_IN_RUNS = (
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "PYTHONHOME",
    "MAKELEVEL",
    "MAKEFLAGS",
    "MFLAGS",
    "MAKEOVERRIDES",
)


def tier_env(python: Path, report_dir: Path, base: dict | None = None) -> dict[str, str]:
    """The environment of one run: as `make test` would see it, ``python``'s venv first on PATH."""
    env = {
        k: v for k, v in (os.environ if base is None else base).items() if k not in UNSET_IN_RUNS
    }
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    env["QWEN3_REPRO_REPORT_DIR"] = str(report_dir)
    return env


def tier_command(
    python: Path, report_dir: Path, basetemp: Path, tests: tuple[str, ...] = ()
) -> list[str]:
    """The cpu tier as ``make test`` runs it, or only ``tests`` (node ids), serially: a re-run of what broke."""
    args = (
        [*PYTEST_ARGS, *tests]
        if not tests
        else ["-m", "cpu", "-p", "no:xdist", "-q", "-p", "no:cacheprovider", *tests]
    )
    return [
        str(python),
        "-m",
        "pytest",
        *args,
        f"--report-dir={report_dir}",
        f"--junitxml={report_dir / 'junit.xml'}",
        f"--basetemp={basetemp}",
    ]


def run_tier(
    python: Path, report_dir: Path, lock: Path, log=print, tests: tuple[str, ...] = ()
) -> TierRun:
    """``pytest -m cpu -n auto`` with ``python`` (or only ``tests``, serially), its report in ``report_dir``
    (tests.json, junit.xml, pytest.log)."""
    if report_dir.exists():
        shutil.rmtree(report_dir)
    report_dir.mkdir(parents=True)
    run = TierRun(
        python=str(python),
        report_dir=str(report_dir),
        lock_sha256=sha256(lock),
        code_sha256=code_sha256(),
    )
    env = tier_env(python, report_dir)
    basetemp = (
        Path(os.environ.get("TMPDIR", "/tmp"))
        / f"qwen3-bump-{report_dir.parent.name}-{report_dir.name}"
    )
    command = tier_command(python, report_dir, basetemp, tests)
    what = f"{len(tests)} test(s) again" if tests else "the cpu tier"
    log(
        f"running {what} with {rel(python)} → {rel(report_dir)}"
        + ("" if tests else " (several minutes)")
    )
    start = time.monotonic()
    with open(report_dir / "pytest.log", "w") as out:
        run.returncode = subprocess.run(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT
        ).returncode
    run.seconds = round(time.monotonic() - start, 1)
    run.finished = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    lines = (report_dir / "pytest.log").read_text().strip().splitlines()
    run.summary = lines[-1].strip("= ") if lines else ""
    run.save()
    if run.returncode == 0:
        shutil.rmtree(basetemp, ignore_errors=True)
    else:  # the failures point at rank logs in there
        log(f"  rank logs and test files kept in {basetemp}")
    log(f"  {run.summary} in {run.seconds:.0f} s")
    return run


def baseline_is_current(
    run: TierRun | None, lock: Path, max_age_h: float, now: dt.datetime | None = None
) -> bool:
    """A recorded baseline stands while the lock and the code are the same and it is recent."""
    if run is None or run.finished is None or not (Path(run.report_dir) / "tests.json").exists():
        return False
    now = now or dt.datetime.now(dt.timezone.utc)
    age_h = (now - dt.datetime.fromisoformat(run.finished)).total_seconds() / 3600
    return (
        run.lock_sha256 == sha256(lock) and run.code_sha256 == code_sha256() and age_h <= max_age_h
    )

"""The TorchTitan Neuron ref and commit a trn2 run used: recorded at install, read back by runs, report and dry run.

A real git checkout (made here) and the record scripts/neuron_venv.sh writes for it (its own
``record_checkout``, sourced) stand in for the instance's ``.venv-neuron``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.platform import neuron_versions
from recipes.platform.torchtitan_checkout import RECORD_ENV, checkout_info, describe
from recipes.tiers import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "neuron_venv.sh"
GIT = [
    "git",
    "-c",
    "user.name=t",
    "-c",
    "user.email=t@example.invalid",
    "-c",
    "init.defaultBranch=main",
]


def commit(repo: Path, message: str) -> str:
    (repo / "f.txt").write_text(message)
    subprocess.run([*GIT, "-C", str(repo), "add", "f.txt"], check=True, capture_output=True)
    subprocess.run(
        [*GIT, "-C", str(repo), "commit", "-q", "-m", message], check=True, capture_output=True
    )
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def installed(tmp_path, monkeypatch) -> tuple[Path, str, Path]:
    """A checkout at one commit and the record the install script writes for it."""
    checkout = tmp_path / "src" / "torchtitan-neuron"
    checkout.mkdir(parents=True)
    subprocess.run([*GIT, "init", "-q", str(checkout)], check=True)
    sha = commit(checkout, "release")
    venv = tmp_path / "venv"
    venv.mkdir()
    script = (
        f'source "{SCRIPT}"; VENV="{venv}"; TORCHTITAN_NEURON_REF=release-2.33; REF_KIND=branch; '
        f'REF_COMMIT={sha}; record_checkout "{checkout}" {sha}'
    )
    subprocess.run(["bash", "-c", script], check=True, timeout=60)
    record = venv / "torchtitan-neuron.json"
    monkeypatch.setenv(RECORD_ENV, str(record))
    return checkout, sha, record


def test_the_record_the_script_writes_is_read_back_with_the_checkouts_head(installed):
    checkout, sha, record = installed
    info = checkout_info()
    assert {
        k: info[k]
        for k in (
            "installed",
            "url",
            "ref",
            "ref_kind",
            "ls_remote_commit",
            "commit",
            "head",
            "moved",
        )
    } == {
        "installed": True,
        "url": neuron_versions.TORCHTITAN_NEURON_URL,
        "ref": "release-2.33",
        "ref_kind": "branch",
        "ls_remote_commit": sha,
        "commit": sha,
        "head": sha,
        "moved": False,
    }
    assert info["checkout"] == str(checkout) and info["record"] == str(record)
    # this cpu venv's torchtitan is PyPI's, not the checkout: said, not hidden
    assert info["torchtitan_from_checkout"] is False
    assert describe(info) == (
        f"release-2.33 (branch) @ {sha}; but `import torchtitan` loads {info['torchtitan']}, "
        f"outside {checkout}"
    )


def test_a_checkout_moved_after_the_install_shows(installed):
    checkout, sha, _ = installed
    moved = commit(checkout, "local change")
    info = checkout_info()
    assert (info["commit"], info["head"], info["moved"]) == (sha, moved, True)
    assert f"the checkout's HEAD is now {moved}" in describe(info)


def test_without_a_record_the_expected_ref_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "absent.json"))
    info = checkout_info()
    assert info["installed"] is False
    assert describe(info) == (
        f"not installed here (expected {neuron_versions.TORCHTITAN_NEURON_REF} of "
        f"{neuron_versions.TORCHTITAN_NEURON_URL}; {tmp_path / 'absent.json'} is absent)"
    )


def test_the_report_versions_name_the_ref_and_commit(installed, tmp_path, monkeypatch):
    from harness.base.environment import versions

    _, sha, _ = installed
    assert versions()["torchtitan-neuron"] == describe(checkout_info())
    assert sha in versions()["torchtitan-neuron"]
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "absent.json"))
    assert versions()["torchtitan-neuron"] is None  # the cpu tier has none; the markdown omits it


def _dry_run(report_dir: Path, **env: str) -> subprocess.CompletedProcess:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("QWEN3_4B_DIR", "QWEN3_DATASET_DIR", RECORD_ENV)
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "native_qwen3",
            "--tier",
            "trn2",
            "--init",
            "random",
            "--dry-run",
            "--report-dir",
            str(report_dir),
        ],
        cwd=REPO_ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_the_trn2_dry_run_shows_the_checkout_it_would_run(installed, tmp_path):
    _, sha, record = installed
    out = _dry_run(tmp_path / "report", **{RECORD_ENV: str(record)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"  TorchTitan Neuron: release-2.33 (branch) @ {sha}" in out.stdout
    result = json.loads(
        (tmp_path / "report" / "dry-run" / "native_qwen3-trn2-random.json").read_text()
    )
    assert (result["torchtitan_neuron"]["commit"], result["torchtitan_neuron"]["ref"]) == (
        sha,
        "release-2.33",
    )


@pytest.mark.slow
def test_the_trn2_dry_run_without_an_install_says_so(tmp_path):
    out = _dry_run(tmp_path / "report", **{RECORD_ENV: str(tmp_path / "absent.json")})
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        f"  TorchTitan Neuron: not installed here (expected {neuron_versions.TORCHTITAN_NEURON_REF} of "
        in out.stdout
    )


def test_a_trn2_runs_provenance_records_the_checkout(installed):
    """harness.config.provenance adds it for trn2 runs only (a cpu run's torchtitan is PyPI's, in its versions)."""
    import inspect

    from harness.config import provenance

    _, sha, _ = installed
    assert provenance.torchtitan_neuron()["commit"] == sha
    assert '{"torchtitan_neuron": torchtitan_neuron()} if opts.tier == "trn2"' in inspect.getsource(
        provenance.provenance
    )

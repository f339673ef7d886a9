"""Exports are published atomically, and the suite never executes untrusted checkpoint code."""

from __future__ import annotations

import re
import shutil

import pytest

from harness.base import marker as written_by
from harness.rank import export
from recipes.tiers import REPO_ROOT


def make_export(path, marker: str):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_text(marker)
    written_by.mark_export(path)
    return path


def interrupt_copy(monkeypatch):
    """A copy that dies half-way, as a crash or a full disk would."""
    real_copy = shutil.copytree

    def copy_then_die(src, dst, **kwargs):
        real_copy(src, dst, **kwargs)
        (dst / "model.safetensors").write_text("half-written")
        raise OSError("No space left on device")

    monkeypatch.setattr(export.shutil, "copytree", copy_then_die)


def test_interrupted_export_leaves_the_previous_complete_export(tmp_path, monkeypatch):
    target = make_export(tmp_path / "export", "previous")
    source = make_export(tmp_path / "new", "new")
    interrupt_copy(monkeypatch)
    with pytest.raises(OSError):
        export.publish(source, target, overwrite=True)
    assert (target / "model.safetensors").read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "new"], (
        "no staging dir left behind"
    )


def test_interrupted_first_export_leaves_nothing(tmp_path, monkeypatch):
    source = make_export(tmp_path / "new", "new")
    interrupt_copy(monkeypatch)
    with pytest.raises(OSError):
        export.publish(source, tmp_path / "export", overwrite=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]


def test_overwrite_replaces_and_refusal_keeps(tmp_path):
    target = make_export(tmp_path / "export", "previous")
    source = make_export(tmp_path / "new", "new")
    with pytest.raises(FileExistsError):
        export.publish(source, target, overwrite=False)
    assert (target / "model.safetensors").read_text() == "previous"
    export.publish(source, target, overwrite=True)
    assert (target / "model.safetensors").read_text() == "new"


def test_overwrite_at_publish_refuses_a_directory_the_suite_did_not_write(tmp_path):
    """The rank's publish keeps the rule the checks apply before launch: a foreign file is never replaced."""
    target = make_export(tmp_path / "export", "previous")
    (target / "notes.txt").write_text("the user's")
    source = make_export(tmp_path / "new", "new")
    with pytest.raises(FileExistsError, match="notes.txt is not listed there"):
        export.publish(source, target, overwrite=True)
    assert (target / "notes.txt").read_text() == "the user's"


SOURCES = [
    p for d in ("recipes", "fixtures", "benchmarks", "tests") for p in (REPO_ROOT / d).rglob("*.py")
]


def test_no_pickle_loading_without_weights_only():
    offenders = []
    for path in SOURCES:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\btorch\.load\(", line) and "weights_only=True" not in line:
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}")
    assert not offenders, offenders


def test_trust_remote_code_is_never_enabled():
    pattern = re.compile(r"trust_remote_code\s*=\s*True")
    offenders = [
        str(p.relative_to(REPO_ROOT))
        for p in SOURCES
        if p.name != "test_export_safety.py" and pattern.search(p.read_text())
    ]
    assert not offenders, offenders

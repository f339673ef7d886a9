"""What the suite wrote: a marker file in every directory it writes (an export, a report, a run).

``.qwen3-repro.json`` says which kind of directory it is and, for a report or an export, each file
the suite wrote there (its sha256, or for an export its name only: an export is gigabytes). The
suite replaces only what a marker says it wrote: ``--overwrite`` only a previous export whose every
file is listed, a report's own file (results.md, a loss plot) only when its bytes are the ones
recorded; a file in its place the suite did not write is renamed aside and said on stderr.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

MARKER = ".qwen3-repro.json"
WRITER = "qwen3-trn-repro harness"
EXPORT, REPORT, RUN = "export", "report", "run"
KINDS = (EXPORT, REPORT, RUN)


def read(directory: Path) -> dict | None:
    """The marker of ``directory``; None when it has none (or one that is not the suite's)."""
    try:
        data = json.loads((Path(directory) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("kind") not in KINDS:
        return None
    return data


def kind(directory: Path) -> str | None:
    return (read(directory) or {}).get("kind")


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def mark(directory: Path, kind: str, files: dict[str, str] | None = None) -> Path:
    """Write (or rewrite) ``directory``'s marker: its kind and the files the suite wrote there."""
    assert kind in KINDS, kind
    path = Path(directory) / MARKER
    tmp = path.with_name(f"{MARKER}.tmp")
    tmp.write_text(
        json.dumps({"kind": kind, "written_by": WRITER, "files": files or {}}, indent=1) + "\n"
    )
    tmp.replace(path)
    return path


def mark_export(directory: Path) -> Path:
    """An export's marker: every file under ``directory`` by its relative name."""
    root = Path(directory)
    names = sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != MARKER
    )
    return mark(root, EXPORT, dict.fromkeys(names, ""))


def foreign_files(directory: Path) -> list[Path]:
    """The files under ``directory`` its marker does not list (all of them when it has none)."""
    root = Path(directory)
    listed = set((read(root) or {}).get("files", {}))
    return [
        p
        for p in sorted(root.rglob("*"))
        if not p.is_dir() and p.name != MARKER and str(p.relative_to(root)) not in listed
    ]


def keep_foreign(directory: Path, names: list[str], who: str) -> list[Path]:
    """Rename aside (``NAME.foreign-N``) each of ``names`` in ``directory`` whose bytes the marker does not
    record as the suite's; said on stderr by ``who``. The kept paths."""
    root = Path(directory)
    recorded = (read(root) or {}).get("files", {})
    kept = []
    for name in names:
        path = root / name
        if not path.is_file() or recorded.get(name) == digest(path):
            continue
        aside = next(
            root / f"{name}.foreign-{n}"
            for n in range(1, 10_000)
            if not (root / f"{name}.foreign-{n}").exists()
        )
        path.rename(aside)
        kept.append(aside)
        print(
            f"{who}: {path} was not written by the suite (no sha256 of it in {root / MARKER}); "
            f"kept as {aside.name}",
            file=sys.stderr,
        )
    return kept


def record(directory: Path, kind: str, names: list[str]) -> Path:
    """Add ``names`` (files the suite just wrote in ``directory``) with their sha256 to its marker."""
    root = Path(directory)
    files = dict((read(root) or {}).get("files", {}))
    files.update({n: digest(root / n) for n in names if (root / n).is_file()})
    return mark(root, kind, files)

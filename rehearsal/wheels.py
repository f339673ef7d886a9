"""A pure-Python distribution already installed in the cpu venv, packed back into a wheel for pip offline.

Why: Python 3.11's ``venv`` seeds setuptools 65.5 into every new venv (3.12 stopped seeding it), and
torch 2.14.0 requires setuptools>=77.0.3, so the layered .venv-neuron of a 3.11 rehearsal asks pip
for a newer setuptools, which an offline pip cannot find. The rehearsal's extra find-links dir holds
the cpu venv's own setuptools, repacked from its RECORD: the same files pip would unpack.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import zipfile
from pathlib import Path

_SKIP = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(distribution: str, dest: Path) -> Path:
    """``dest/<name>-<version>-py3-none-any.whl`` from the installed files of ``distribution``."""
    dist = importlib.metadata.distribution(distribution)
    name, version = dist.metadata["Name"].replace("-", "_"), dist.version
    info = f"{name}-{version}.dist-info"
    records, files = [], []
    for path in dist.files or []:
        parts = Path(path).parts
        if parts[0] == ".." or "__pycache__" in parts or (parts[0] == info and parts[-1] in _SKIP):
            continue
        files.append(str(path))
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as out:
        for rel in files:
            data = Path(dist.locate_file(rel)).read_bytes()
            out.writestr(rel, data)
            records.append(f"{rel},{_digest(data)},{len(data)}")
        records.append(f"{info}/RECORD,,")
        out.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    return wheel

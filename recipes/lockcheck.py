"""Installed packages vs the pinned requirements: name every package that drifted."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from recipes.tiers import REPO_ROOT

CPU_LOCK = REPO_ROOT / "requirements-lock.txt"
NEURON_REQUIREMENTS = REPO_ROOT / "requirements-neuron.txt"

_PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;\\#]+)")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a requirements file (``2.14.3.*`` kept as a prefix pin)."""
    found = {}
    for line in path.read_text().splitlines():
        match = _PIN.match(line.strip())
        if match:
            found[normalize(match.group(1))] = match.group(2)
    return found


def installed() -> dict[str, str]:
    return {normalize(d.metadata["Name"]): d.version for d in metadata.distributions()}


def _matches(version: str, pin: str) -> bool:
    local = version.split("+")[0]
    if pin.endswith(".*"):
        return local.startswith(pin[:-1]) or version.startswith(pin[:-1])
    return version == pin or local == pin


def drift(path: Path) -> list[str]:
    """One line per pinned package that is missing or at another version."""
    have = installed()
    problems = []
    for name, pin in sorted(pins(path).items()):
        version = have.get(name)
        if version is None:
            problems.append(f"{name}: pinned {pin} in {path.name}, not installed")
        elif not _matches(version, pin):
            problems.append(f"{name}: pinned {pin} in {path.name}, installed {version}")
    return problems

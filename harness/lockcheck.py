"""Installed and imported packages vs the pinned requirements: name every package that drifted.

Two views, because they can disagree: the distributions ``importlib.metadata``
lists (what pip installed), and the modules Python actually imports. A second
``transformers`` earlier on ``sys.path`` (``PYTHONPATH``, user site-packages, a
source checkout) is imported while metadata still reports the locked one; for the
packages the recipes import directly, the import is checked too.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from recipes.platform.neuron_versions import normalize, pins
from recipes.tiers import REPO_ROOT

CPU_LOCK = REPO_ROOT / "requirements-lock.txt"

#: Distribution name → top-level module of the packages whose imported copy is checked.
KEY_MODULES = {
    "torch": "torch",
    "torchtitan": "torchtitan",
    "transformers": "transformers",
    "tokenizers": "tokenizers",
    "safetensors": "safetensors",
    "datasets": "datasets",
}


def installed() -> dict[str, str]:
    """Name → version of the first distribution of each name on ``sys.path`` (what metadata.version reports)."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        found.setdefault(normalize(dist.metadata["Name"]), dist.version)
    return found


def _matches(version: str, pin: str) -> bool:
    local = version.split("+")[0]
    if pin.endswith(".*"):
        return local.startswith(pin[:-1]) or version.startswith(pin[:-1])
    return version == pin or local == pin


@dataclass(frozen=True)
class ImportedModule:
    """Where Python imports a module from, which distribution owns that file, and the version it says."""

    module: str
    origin: Path | None
    version: str | None
    #: Location (site-packages dir) of the distribution metadata reports for this name.
    dist_location: Path | None
    #: Whether that distribution's RECORD lists ``origin``.
    owned_by_dist: bool


def _origin(module: str) -> Path | None:
    """The file Python imports ``module`` from (the loaded one if already imported)."""
    spec = importlib.util.find_spec(module)
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("namespace", "built-in", "frozen"):
        return Path(spec.origin).resolve()
    locations = list(spec.submodule_search_locations or [])
    return Path(locations[0]).resolve() if locations else None


def _owns(dist: metadata.Distribution, origin: Path) -> bool:
    """Whether ``dist``'s RECORD lists ``origin`` (compared as paths relative to its site-packages)."""
    try:
        relative = origin.relative_to(Path(dist.locate_file("")).resolve()).as_posix()
    except ValueError:
        return False
    return any(str(f) == relative for f in dist.files or ())


def inspect_import(dist_name: str, module: str) -> ImportedModule:
    """Import ``module`` (as the recipes do) and compare it with the distribution metadata reports."""
    origin = _origin(module)
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        dist = None
    version = None
    if origin is not None:
        version = getattr(importlib.import_module(module), "__version__", None)
        if not isinstance(version, str):  # torch.__version__ is a str subclass; anything else is not a version
            version = str(version) if version is not None else None
    owned = dist is not None and origin is not None and _owns(dist, origin)
    if version is None and owned:
        version = dist.version
    return ImportedModule(
        module=module,
        origin=origin,
        version=version,
        dist_location=Path(dist.locate_file("")).resolve() if dist is not None else None,
        owned_by_dist=owned,
    )


def import_drift(path: Path) -> list[str]:
    """One line per key package whose imported copy is not the pinned, installed one."""
    problems = []
    pinned = pins(path)
    for dist_name, module in KEY_MODULES.items():
        pin = pinned.get(normalize(dist_name))
        if pin is None:
            continue
        found = inspect_import(dist_name, module)
        where = f"Python imports {module} from {found.origin}"
        if found.origin is None:
            problems.append(f"{dist_name}: pinned {pin} in {path.name}, but `import {module}` finds nothing")
        elif not found.owned_by_dist:
            installed_at = f"the installed one in {found.dist_location}" if found.dist_location else "no installed one"
            problems.append(
                f"{dist_name}: pinned {pin} in {path.name}; {where} (version {found.version or 'unknown'}), "
                f"which is not {installed_at}: remove that directory from PYTHONPATH / user site-packages "
                f"(or run with `python -s`)"
            )
        elif found.version is None or not _matches(found.version, pin):
            problems.append(f"{dist_name}: pinned {pin} in {path.name}; {where}, whose __version__ is {found.version}")
    return problems


def drift(path: Path) -> list[str]:
    """One line per pinned package that is missing, at another version, or imported from elsewhere."""
    have = installed()
    problems = []
    for name, pin in sorted(pins(path).items()):
        version = have.get(name)
        if version is None:
            problems.append(f"{name}: pinned {pin} in {path.name}, not installed")
        elif not _matches(version, pin):
            problems.append(f"{name}: pinned {pin} in {path.name}, installed {version}")
    return problems + import_drift(path)

"""The environment a run measured in: versions, the CPU's fingerprint, and the packages that drifted from the lock.

One place for what every report, golden and benchmark records about the machine and its
packages (the fingerprint), and for the lock check that names every package that drifted.

The lock check:

Two views, because they can disagree: the distributions ``importlib.metadata``
lists (what pip installed), and the modules Python actually imports. A second
``transformers`` earlier on ``sys.path`` (``PYTHONPATH``, user site-packages, a
source checkout) is imported while metadata still reports the locked one; for the
packages the recipes import directly, the import is checked too.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform as _platform
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from recipes.platform.neuron_versions import normalize, pins
from recipes.platform.torchtitan_checkout import checkout_info, describe
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
        if not isinstance(
            version, str
        ):  # torch.__version__ is a str subclass; anything else is not a version
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
            problems.append(
                f"{dist_name}: pinned {pin} in {path.name}, but `import {module}` finds nothing"
            )
        elif not found.owned_by_dist:
            installed_at = (
                f"the installed one in {found.dist_location}"
                if found.dist_location
                else "no installed one"
            )
            problems.append(
                f"{dist_name}: pinned {pin} in {path.name}; {where} (version {found.version or 'unknown'}), "
                f"which is not {installed_at}: remove that directory from PYTHONPATH / user site-packages "
                f"(or run with `python -s`)"
            )
        elif found.version is None or not _matches(found.version, pin):
            problems.append(
                f"{dist_name}: pinned {pin} in {path.name}; {where}, whose __version__ is {found.version}"
            )
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


# The fingerprint: what results.json, goldens and benchmarks record about this machine.

VERSIONED_PACKAGES = (
    "torch",
    "torchtitan",
    "transformers",
    "safetensors",
    "tokenizers",
    "datasets",
    "torch-neuronx",
    "neuronx-cc",
    "nki",
    "nkilib",
)


#: CPU flags that select which fp32 kernels torch, MKL and oneDNN run.
KERNEL_ISA_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
)
#: Environment variables that override those kernel choices.
KERNEL_ENV = (
    "ATEN_CPU_CAPABILITY",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "OPENBLAS_CORETYPE",
    "DNNL_MAX_CPU_ISA",
)


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), for fingerprints, benchmarks and cost figures."""
    return _cpuinfo().get("model name") or _platform.processor() or "unknown"


def _blas() -> str:
    """The BLAS / oneDNN builds torch was compiled with, from ``torch.__config__.show()``."""

    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light

    shown = torch.__config__.show()
    found = [
        m.group(0)
        for m in re.finditer(r"(Math Kernel Library Version \S+|MKL-DNN v\S+|BLAS_INFO=\w+)", shown)
    ]
    return "; ".join(found) or "unknown"


def cpu_fingerprint() -> dict:
    """What decides the bits of an fp32 CPU result beyond package versions.

    Two machines with the same capability name can still run different kernels
    (MKL picks its code path per CPU model), so the model, the ISA flags, the BLAS
    build and any kernel-selecting environment variable are all part of it.
    """
    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light

    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_model": cpu_model(),
        "isa": [f for f in KERNEL_ISA_FLAGS if f in flags],
        "blas": _blas(),
        "kernel_env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ},
    }


def versions() -> dict[str, str | None]:
    """Installed versions of the packages a result depends on (None: not installed)."""
    found = {}
    for name in VERSIONED_PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    found["torchtitan-neuron"] = torchtitan_neuron()
    found["python"] = _platform.python_version()
    found["machine"] = f"{_platform.machine()} {_platform.system()}"
    return found


def torchtitan_neuron() -> str | None:
    """TorchTitan Neuron's ref and commit as scripts/neuron_venv.sh installed them; None where it did not."""

    info = checkout_info()
    return describe(info) if info["installed"] else None

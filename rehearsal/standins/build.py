"""Build the stand-in wheels and the neuron-ls tool, offline: ``python -m rehearsal.standins build --out DIR``.

Writes ``DIR/wheelhouse/<dist>-<version>-py3-none-any.whl`` for torch-neuronx, neuronx-cc and nki
(``pip wheel --no-deps --no-build-isolation --no-index``: no network), and ``DIR/bin/neuron-ls``.
It checks each stand-in's version against requirements-neuron.txt and lists the other pins and
requirements the running interpreter does not satisfy: those are real PyPI packages, never faked.
"""

from __future__ import annotations

import argparse
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
REQUIREMENTS = REPO / "requirements-neuron.txt"
#: The stand-in distributions, by source directory.
STANDINS = ("torch-neuronx", "neuronx-cc", "nki")
_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)\s*(\S.*?)?\s*(?:#.*)?$")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_lines(path: Path = REQUIREMENTS) -> dict[str, str]:
    """``name -> specifier`` ("" when unpinned) for each requirement line of ``path``."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = _REQ.match(line)
        if match:
            found[_normalize(match.group(1))] = (match.group(2) or "").strip()
    return found


def _satisfied(name: str, spec: str) -> str | None:
    """Why the running interpreter does not satisfy ``name spec``, or None."""
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        return f"{name}{spec}: not installed"
    if not spec:
        return None
    try:
        from packaging.specifiers import SpecifierSet  # noqa: PLC0415 -- packaging may be absent: then pip's vendored copy
    except ImportError:
        from pip._vendor.packaging.specifiers import SpecifierSet  # noqa: PLC0415 -- packaging may be absent: then pip's vendored copy
    if not SpecifierSet(spec).contains(version, prereleases=True):
        return f"{name}{spec}: {version} installed"
    return None


def standin_versions() -> dict[str, str]:
    return {
        _normalize(d): tomllib.loads((HERE / d / "pyproject.toml").read_text())["project"][
            "version"
        ]
        for d in STANDINS
    }


def check_versions(requirements: dict[str, str]) -> list[str]:
    """Each stand-in's version must satisfy its pin; one line per mismatch."""
    from pip._vendor.packaging.specifiers import SpecifierSet  # noqa: PLC0415 -- packaging may be absent: then pip's vendored copy

    problems = []
    for name, version in standin_versions().items():
        spec = requirements.get(name)
        if spec is None:
            problems.append(f"{REQUIREMENTS}: pins no {name}; the stand-in has nothing to match")
        elif not SpecifierSet(spec).contains(version, prereleases=True):
            problems.append(
                f"rehearsal/standins/{name}/pyproject.toml: version {version} does not satisfy {name}{spec}"
            )
    return problems


def not_satisfied_here(requirements: dict[str, str]) -> list[str]:
    """Requirements of requirements-neuron.txt, other than the stand-ins, this interpreter lacks."""
    standins = set(standin_versions())
    return [
        why
        for name, spec in requirements.items()
        if name not in standins and (why := _satisfied(name, spec))
    ]


def build(out: Path) -> dict:
    """Wheels into ``out/wheelhouse``, ``out/bin/neuron-ls``; returns what was written and what is missing."""
    requirements = requirement_lines()
    problems = check_versions(requirements)
    if problems:
        raise SystemExit(
            "stand-in versions do not match requirements-neuron.txt:\n  " + "\n  ".join(problems)
        )
    wheelhouse, bin_dir = out / "wheelhouse", out / "bin"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    bin_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="standin-src-") as tmp:
        for name in (
            STANDINS
        ):  # built from a copy: setuptools writes build/ and *.egg-info beside the source
            src = Path(tmp) / name
            shutil.copytree(
                HERE / name,
                src,
                ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
            )
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                "--quiet",
                "-w",
                str(wheelhouse),
                str(src),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
            if done.returncode != 0:
                raise SystemExit(
                    f"building the {name} stand-in failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
                )
    tool = bin_dir / "neuron-ls"
    tool.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HERE / "neuron_ls.py"}" "$@"\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return {
        "wheels": sorted(p.name for p in wheelhouse.glob("*.whl")),
        "neuron_ls": str(tool),
        "not_satisfied_here": not_satisfied_here(requirements),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rehearsal.standins")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser(
        "build", help="write DIR/wheelhouse/*.whl and DIR/bin/neuron-ls (no network)"
    )
    b.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = build(args.out.resolve())
    for wheel in result["wheels"]:
        print(f"wheel: {wheel}")
    print(f"tool: {result['neuron_ls']}")
    for line in result["not_satisfied_here"]:
        print(f"not in this interpreter (a real package, not faked): {line}")
    return 0

"""Which nkilib the trn2 tier really imports: checked after nkilib's own import, not before it.

The bundled ``nkilib`` of neuronx-cc replaces itself with a standalone nki-library's
``nkilib_src.nkilib`` when one is installed (aws-neuron/nki-library
src/nkilib_src/nkilib/__init__.py). Here a site directory holds a stand-in of each,
written for this test with that behaviour and real ``*.dist-info`` records, and
``recipes.platform.nkilib_source`` imports them in a fresh interpreter as a run would.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from recipes.platform import nkilib_source
from recipes.tiers import REPO_ROOT

KERNEL_FILES = [m.replace(".", "/") + ".py" for m in nkilib_source.KERNEL_MODULES]

#: A bundled nkilib that behaves as neuronx-cc's: it gives way to an importable nkilib_src.nkilib.
BUNDLED_INIT = textwrap.dedent("""
    import importlib.util, os, sys
    _forced = os.environ.get("NKILIB_FORCE_BUNDLED_LIBRARY", "").lower() in ("1", "true", "yes", "on")
    if not _forced and importlib.util.find_spec("nkilib_src") is not None:
        import nkilib_src.nkilib as _standalone
        sys.modules[__name__] = _standalone
""")


def _package(site: Path, top: str, files: list[str], init: str = "") -> list[str]:
    written = []
    for rel in files:
        path = site / top / rel
        for parent in reversed(path.relative_to(site).parents[:-1]):
            init_file = site / parent / "__init__.py"
            if not init_file.exists():
                init_file.parent.mkdir(parents=True, exist_ok=True)
                init_file.write_text("")
                written.append(str(init_file.relative_to(site)))
        path.write_text("KERNEL = True\n")
        written.append(str(path.relative_to(site)))
    if init:
        (site / top.split("/")[0] / "__init__.py").write_text(init)
    return sorted(set(written))


def _dist_info(site: Path, name: str, version: str, files: list[str]) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))


@pytest.fixture
def site(tmp_path) -> Path:
    """neuronx-cc with its bundled nkilib (rope_hf, moe_cte, blockwise_mm_bwd), as installed."""
    site = tmp_path / "site-packages"
    site.mkdir()
    kernels = [f.removeprefix("nkilib/") for f in KERNEL_FILES]
    _dist_info(
        site, "neuronx-cc", "2.28.7631.0", _package(site, "nkilib", kernels, init=BUNDLED_INIT)
    )
    return site


def add_standalone_nki_library(site: Path) -> None:
    """``pip install nki-library``: the package nkilib_src (aws-neuron/nki-library pyproject.toml, package-dir src)."""
    kernels = [f.removeprefix("nkilib/") for f in KERNEL_FILES]
    _dist_info(site, "nki_library", "2.33.0", _package(site, "nkilib_src/nkilib", kernels))


def env_with(site: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != nkilib_source.FORCE_BUNDLED_ENV}
    return {**env, "PYTHONPATH": f"{site}{os.pathsep}{REPO_ROOT}", **extra}


def test_the_bundled_copy_alone_resolves_every_kernel_to_neuronx_cc(site):
    resolution = nkilib_source.resolve_in_child(env_with(site))
    assert nkilib_source.not_bundled(resolution) == []
    assert {
        name: (w["module"], w["distribution"]) for name, w in resolution["resolved"].items()
    } == {name: (name, "neuronx-cc") for name in ("nkilib", *nkilib_source.KERNEL_MODULES)}
    assert (
        Path(resolution["resolved"]["nkilib"]["file"])
        == (site / "nkilib" / "__init__.py").resolve()
    )
    assert resolution["nkilib_src_imported"] is False


def test_a_standalone_nki_library_that_takes_over_is_named(site):
    add_standalone_nki_library(site)
    # What a find_spec check sees: the bundled directory, so such a check passes (the defect fixed here).
    spec = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.util; print(importlib.util.find_spec('nkilib').origin)",
        ],
        env=env_with(site),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(spec) == (site / "nkilib" / "__init__.py").resolve()

    resolution = nkilib_source.resolve_in_child(env_with(site))
    assert resolution["nkilib_src_imported"] is True
    problems = nkilib_source.not_bundled(resolution)
    assert len(problems) == 1 + len(nkilib_source.KERNEL_MODULES), problems
    assert problems[0].startswith("`import nkilib` gave the module nkilib_src.nkilib")
    for name, problem in zip(nkilib_source.KERNEL_MODULES, problems[1:]):
        assert problem.startswith(f"{name} is {site.resolve() / 'nkilib_src'}"), problem
        assert problem.endswith("installed by nki-library, not by neuronx-cc"), problem


def test_nkilib_force_bundled_library_keeps_the_bundled_copy(site):
    add_standalone_nki_library(site)
    resolution = nkilib_source.resolve_in_child(env_with(site, NKILIB_FORCE_BUNDLED_LIBRARY="1"))
    assert nkilib_source.not_bundled(resolution) == []
    assert resolution["NKILIB_FORCE_BUNDLED_LIBRARY"] == "1"


def test_a_kernel_file_no_distribution_owns_is_named(site):
    """A copy dropped on PYTHONPATH by hand is not neuronx-cc's either."""
    (site / "neuronx_cc-2.28.7631.0.dist-info" / "RECORD").write_text("nkilib/__init__.py,,\n")
    problems = nkilib_source.not_bundled(nkilib_source.resolve_in_child(env_with(site)))
    assert problems == [
        f"{name} is {(site / (name.replace('.', '/') + '.py')).resolve()}, installed by no "
        "distribution, not by neuronx-cc"
        for name in nkilib_source.KERNEL_MODULES
    ]


def test_a_missing_nkilib_is_an_error_with_the_childs_message():
    with pytest.raises(RuntimeError, match="No module named 'nkilib'"):
        nkilib_source.resolve_in_child({**os.environ, "PYTHONPATH": str(REPO_ROOT)})


def test_every_nkilib_module_the_kernels_import_is_resolved():
    """The check covers what recipes/kernels really imports, no more, no less."""
    imported = set()
    for path in (REPO_ROOT / "recipes" / "kernels").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "nkilib":
                imported.add(node.module)
    assert imported == set(nkilib_source.KERNEL_MODULES)


def test_the_trn2_version_test_uses_the_resolution_after_import():
    text = (REPO_ROOT / "tests" / "neuron" / "test_versions_neuron.py").read_text()
    assert "nkilib_source.resolve_in_child(" in text and "nkilib_source.not_bundled(" in text
    assert "find_spec" not in text

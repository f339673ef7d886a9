"""The product (``recipes/``) stands alone: torchtitan's own entry can run it without the harness."""

from __future__ import annotations

import ast
import re

import pytest

from recipes.tiers import REPO_ROOT

#: Packages whose code only the harness and the tests may import.
HARNESS_PACKAGES = ("harness", "benchmarks", "tests", "conftest")


def imported_modules(path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, at any depth (function-level imports count too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def harness_imports(root) -> list[str]:
    return [
        f"{path.relative_to(REPO_ROOT)}:{line}: imports {module}"
        for path in sorted(root.rglob("*.py"))
        for line, module in imported_modules(path)
        if module.split(".")[0] in HARNESS_PACKAGES
    ]


def test_the_product_imports_nothing_from_the_harness():
    assert harness_imports(REPO_ROOT / "recipes") == []


def test_the_check_finds_an_import_of_the_harness(tmp_path):
    """The scan sees imports inside functions, as the product's lazy imports are."""
    (tmp_path / "leaky.py").write_text(
        "def build():\n    from harness.options.run_options import RunOptions\n"
    )
    found = [module for _, module in imported_modules(tmp_path / "leaky.py")]
    assert found == ["harness.options.run_options"]


#: A harness file named by path (``harness/rank/train.py``): a rename there would leave the product's text stale.
HARNESS_FILE = re.compile(r"\b(?:harness|benchmarks)/[\w/]*\.py\b")


def harness_files_named(root) -> list[str]:
    return [
        f"{path.relative_to(root)}:{number}: names {name}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for name in HARNESS_FILE.findall(line)
    ]


def test_the_product_names_no_harness_file():
    """Which harness file relies on a torchtitan name is the harness's to say (harness.checks.titan)."""
    assert harness_files_named(REPO_ROOT / "recipes") == []


def test_the_check_finds_a_named_harness_file(tmp_path):
    (tmp_path / "stale.py").write_text(
        'NAMES = (TitanName("x", files=("harness/rank/train.py",)),)\n'
    )
    assert harness_files_named(tmp_path) == ["stale.py:1: names harness/rank/train.py"]


@pytest.mark.slow
def test_torchtitan_entry_builds_a_recipe_without_importing_the_harness():
    """In a fresh interpreter, the way ``torchtitan.train --module recipes.native_qwen3`` loads it."""
    import subprocess
    import sys

    code = (
        "import sys; from recipes.native_qwen3 import native_qwen3_cpu; config = native_qwen3_cpu(); "
        "leaked = sorted(m for m in sys.modules if m.split('.')[0] == 'harness'); "
        "print(config.training.steps, config.checkpoint.last_save_in_hf, leaked)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[-2] == "5 True []", out.stdout[-2000:]


def test_trn2_tests_name_each_requirement_with_its_decorator():
    """One decorator per requirement (tests/neuron/requires.py), as transformers' testing_utils has."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "requires", REPO_ROOT / "tests" / "neuron" / "requires.py"
    )
    requires = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(requires)
    decorated = {
        mark.args[0]
        for name, mark in vars(requires).items()
        if name.startswith("requires_") and getattr(mark, "name", None) == "requires"
    }
    assert decorated == set(requires.REQUIREMENTS)
    raw = [
        p.name
        for p in sorted((REPO_ROOT / "tests" / "neuron").glob("test_*.py"))
        if "mark.requires(" in p.read_text()
    ]
    assert raw == [], (
        f"use the requires_* decorators of tests/neuron/requires.py instead of pytest.mark.requires: {raw}"
    )


def test_a_tests_tier_is_its_folder():
    """The root conftest marks tests/cpu as cpu and tests/neuron as neuron; no file marks itself."""
    marked = [
        p.relative_to(REPO_ROOT).as_posix()
        for p in sorted((REPO_ROOT / "tests").rglob("test_*.py"))
        if any(f"pytest.mark.{tier}" in p.read_text() for tier in ("cpu", "neuron"))
    ]
    assert marked == []

"""The docs cannot go stale unnoticed: every repository path, file name, module and dotted name they name exists.

Read from README.md, docs/*.md and the other READMEs, inside `code spans` and fenced blocks (the
architecture's picture). A path that starts at a top-level folder of the repository must match the tree
(``<recipe>`` and ``*`` match anything); a path inside a package (``checks/kernels.py``) must end some
tracked path; a bare file name must be some tracked file's name; ``python -m NAME`` must be an importable
module; a dotted name of the suite (``harness.judge.verdicts.compare``, or ``verdicts.compare`` for a module of
harness/ or recipes/) must import and resolve, so a renamed file, module or function fails here.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from recipes.tiers import REPO_ROOT

DOCS = [
    "README.md",
    *sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "docs").glob("*.md")),
    "rehearsal/README.md",
    "fixtures/README.md",
]
#: Folders a run writes (never tracked): a doc may name files in them that exist only after a run.
GENERATED = {"report", "runs", "outputs"}
#: Paths the docs name that are not this repository's, or not written yet, each with why.
ELSEWHERE = {
    "tests/assets/c4_test": "torchtitan's own test assets, in a TorchTitan (Neuron) checkout",
    "tests/assets/tokenizer": "torchtitan's own test assets, in a TorchTitan (Neuron) checkout",
    "fixtures/goldens/<recipe>/trn2-band.json": "written by `python -m harness.judge.band record` on a trn2 night",
}
FILE_NAME = re.compile(r"^[\w.-]+\.(py|md|yml|yaml|json|jsonl|sh|txt|toml|ini)$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
#: Top-level packages of the suite: a dotted name starting with one must resolve.
PACKAGES = ("harness", "recipes", "benchmarks", "fixtures", "rehearsal")


def tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def top_level() -> set[str]:
    return {path.split("/")[0] for path in tracked() if "/" in path} - GENERATED


def spans(text: str) -> list[str]:
    """Inline code spans, and every line of a fenced block."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    inline = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", inline) + [
        line for block in fenced for line in block.splitlines()
    ]


@functools.cache
def submodules() -> frozenset[str]:
    """Every module and package name inside harness/ and recipes/ (``verdicts``, ``checks``, ``titan``, ...)."""
    return frozenset(short_names())


@functools.cache
def short_names() -> dict[str, tuple[str, ...]]:
    """Each module or package name inside harness/ and recipes/ -> the dotted modules of that name."""
    found: dict[str, set[str]] = {}
    for path in tracked():
        parts = path.removesuffix(".py").removesuffix("/__init__").split("/")
        if parts[0] in ("harness", "recipes") and path.endswith(".py") and len(parts) > 1:
            found.setdefault(parts[-1], set()).add(".".join(parts))
    return {name: tuple(sorted(mods)) for name, mods in found.items()}


def mentions(text: str) -> tuple[set[str], set[str], set[str], set[str], set[str]]:
    """(repository paths, package paths, bare file names, modules, dotted names) named in ``text``."""
    paths, inside, names, modules, dotted = set(), set(), set(), set(), set()
    tops = top_level()
    for span in spans(text):
        modules.update(re.findall(r"python3? -m ([\w.]+)", span))
        for token in span.split():
            token = token.strip(",;:()[]'\"").removesuffix("()")
            first = token.split("/")[0]
            if first in tops and "/" in token:
                paths.add(token)
            elif (
                "/" in token
                and FILE_NAME.match(token.rsplit("/", 1)[-1])
                and first
                and not first.startswith((".", "~"))
                and first not in GENERATED
            ):
                inside.add(token)
            elif FILE_NAME.match(token) and "/" not in token:
                names.add(token)
            elif DOTTED.match(token) and (
                token.split(".")[0] in PACKAGES or token.split(".")[0] in submodules()
            ):
                dotted.add(token)
    return paths, inside, names, modules, dotted


def written_by_the_harness() -> set[str]:
    """File names the harness writes (a run directory's files, the report's): string literals in harness/."""
    text = "\n".join(p.read_text() for p in (REPO_ROOT / "harness").rglob("*.py"))
    return set(re.findall(r"[\"']([\w.-]+\.(?:json|jsonl|md|log))[\"']", text))


def exists(path: str) -> bool:
    pattern = re.sub(r"<[^>]+>", "*", path).rstrip("/")
    return any(REPO_ROOT.glob(pattern)) if "*" in pattern else (REPO_ROOT / pattern).exists()


def ends_a_tracked_path(path: str) -> bool:
    return any(p.endswith("/" + path) for p in tracked())


def resolves(name: str) -> bool:
    """``name`` (``harness.judge.verdicts.compare``, or ``verdicts.compare`` inside harness/ or recipes/) imports and
    resolves: the longest importable module prefix, then attributes."""
    first = name.split(".")[0]
    rest = name[len(first) :]
    candidates = [name] if first in PACKAGES else [m + rest for m in short_names().get(first, ())]
    for candidate in candidates:
        parts = candidate.split(".")
        for i in range(len(parts), 0, -1):
            module = ".".join(parts[:i])
            try:
                spec = importlib.util.find_spec(module)
            except (ImportError, ValueError):
                spec = None
            if spec is None:
                continue
            obj = importlib.import_module(module)
            for attribute in parts[i:]:
                if not hasattr(obj, attribute):
                    break
                obj = getattr(obj, attribute)
            else:
                return True
            break
    return False


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_file_and_module_a_doc_names_exists(doc):
    paths, inside, names, modules, dotted = mentions((REPO_ROOT / doc).read_text())
    files = {Path(p).name for p in tracked()}
    missing = sorted(p for p in paths if not exists(p) and p not in ELSEWHERE)
    missing += sorted(
        f"{p} (no tracked path ends so)" for p in inside if not ends_a_tracked_path(p)
    )
    missing += sorted(f"{d} (does not resolve)" for d in dotted if not resolves(d))
    missing += sorted(
        f"{n} (no tracked file has this name, and harness/ writes none)"
        for n in names
        if n not in files and n not in written_by_the_harness()
    )
    missing += sorted(
        f"python -m {m} (not importable)" for m in modules if importlib.util.find_spec(m) is None
    )
    assert not missing, f"{doc} names what the tree does not have: {missing}"


def test_the_check_sees_a_renamed_file(tmp_path):
    """A doc naming a file that was renamed fails (here: harness/reference.py, now a package)."""
    paths, _, names, modules, _ = mentions(
        "see `harness/reference.py`, `nosuch_module.py` and `python -m harness.nosuch`"
    )
    assert paths == {"harness/reference.py"} and not exists("harness/reference.py")
    assert names == {"nosuch_module.py"} and modules == {"harness.nosuch"}
    assert importlib.util.find_spec("harness.nosuch") is None
    assert exists("harness/reference/") and exists("fixtures/goldens/<recipe>/trn2.json")


def test_the_check_sees_renamed_modules_functions_and_package_paths():
    """Round 3's renames, as a doc that missed them would name them: each is caught, and its new name passes."""
    text = """
```
  2 checks      harness/checks/
        │         config.py        the built config
```
`checks/config.py` holds `harness.checks.config.check_compile`; `harness.launch.elastic.rank_entry`,
`verdicts.nosuch`, `goldens.compare` and `harness.config.tree.config3_comparison`.
"""
    _, inside, names, _, dotted = mentions(text)
    assert inside == {"checks/config.py"} and not ends_a_tracked_path("checks/config.py")
    assert "config.py" in names and "config.py" not in {Path(p).name for p in tracked()}
    assert dotted == {
        "harness.checks.config.check_compile",
        "harness.launch.elastic.rank_entry",
        "verdicts.nosuch",
        "goldens.compare",
        "harness.config.tree.config3_comparison",
    }
    assert not any(resolves(d) for d in dotted)
    renamed = [
        "harness.checks.built_config.check_compile",
        "harness.launch.elastic.run_forked_rank",
        "verdicts.compare",
        "harness.night.config3_fork.config3_comparison",
        "recipes.tutorial.tutorial_settings",
    ]
    assert all(resolves(d) for d in renamed) and ends_a_tracked_path("checks/built_config.py")

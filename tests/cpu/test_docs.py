"""The docs cannot go stale unnoticed: every repository path, file name and module they name exists.

Read from README.md, docs/*.md and the other READMEs, inside `code spans` only. A path that starts at a
top-level folder of the repository must match the tree (``<recipe>`` and ``*`` match anything); a bare
file name must be some tracked file's name; ``python -m NAME`` must be an importable module.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from recipes.tiers import REPO_ROOT

DOCS = ["README.md", *sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "docs").glob("*.md")),
        "rehearsal/README.md", "fixtures/README.md"]  # fmt: skip
#: Folders a run writes (never tracked): a doc may name files in them that exist only after a run.
GENERATED = {"report", "runs", "outputs"}
#: Paths the docs name that are not this repository's, or not written yet, each with why.
ELSEWHERE = {
    "tests/assets/c4_test": "torchtitan's own test assets, in a TorchTitan (Neuron) checkout",
    "tests/assets/tokenizer": "torchtitan's own test assets, in a TorchTitan (Neuron) checkout",
    "fixtures/goldens/<recipe>/trn2-band.json": "written by `python -m harness.band record` on a trn2 night",
}
FILE_NAME = re.compile(r"^[\w.-]+\.(py|md|yml|yaml|json|jsonl|sh|txt|toml|ini)$")


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


def top_level() -> set[str]:
    return {path.split("/")[0] for path in tracked() if "/" in path} - GENERATED


def spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def mentions(text: str) -> tuple[set[str], set[str], set[str]]:
    """(repository paths, bare file names, modules) named in ``text``'s code spans."""
    paths, names, modules = set(), set(), set()
    tops = top_level()
    for span in spans(text):
        modules.update(re.findall(r"python3? -m ([\w.]+)", span))
        for token in span.split():
            token = token.strip(",;:()[]'\"")
            if token.split("/")[0] in tops and "/" in token:
                paths.add(token)
            elif FILE_NAME.match(token) and "/" not in token:
                names.add(token)
    return paths, names, modules


def written_by_the_harness() -> set[str]:
    """File names the harness writes (a run directory's files, the report's): string literals in harness/."""
    text = "\n".join(p.read_text() for p in (REPO_ROOT / "harness").rglob("*.py"))
    return set(re.findall(r"[\"']([\w.-]+\.(?:json|jsonl|md|log))[\"']", text))


def exists(path: str) -> bool:
    pattern = re.sub(r"<[^>]+>", "*", path).rstrip("/")
    return any(REPO_ROOT.glob(pattern)) if "*" in pattern else (REPO_ROOT / pattern).exists()


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_file_and_module_a_doc_names_exists(doc):
    paths, names, modules = mentions((REPO_ROOT / doc).read_text())
    files = {Path(p).name for p in tracked()}
    missing = sorted(p for p in paths if not exists(p) and p not in ELSEWHERE)
    missing += sorted(f"{n} (no tracked file has this name, and harness/ writes none)" for n in names
                      if n not in files and n not in written_by_the_harness())  # fmt: skip
    missing += sorted(f"python -m {m} (not importable)" for m in modules if importlib.util.find_spec(m) is None)
    assert not missing, f"{doc} names what the tree does not have: {missing}"


def test_the_check_sees_a_renamed_file(tmp_path):
    """A doc naming a file that was renamed fails (here: harness/reference.py, now a package)."""
    paths, names, modules = mentions("see `harness/reference.py`, `nosuch_module.py` and `python -m harness.nosuch`")
    assert paths == {"harness/reference.py"} and not exists("harness/reference.py")
    assert names == {"nosuch_module.py"} and modules == {"harness.nosuch"}
    assert importlib.util.find_spec("harness.nosuch") is None
    assert exists("harness/reference/") and exists("fixtures/goldens/<recipe>/trn2.json")

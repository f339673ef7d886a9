"""``python -m harness.checks.titan [--tier trn2]``: every torchtitan name and hook the suite relies on, checked.

The names are declared once in :data:`recipes.titan.NAMES` (module, purpose, who uses
it; hooks with the code that must call them). This resolves every one a tier needs
against the *installed* torchtitan, without a device and before any rank starts, and
lists each missing one with its purpose and the suite files that need it. It is the
nightly's first step (.github/workflows/nightly-trn2.yml) and part of the dry run
(``python -m harness run all --tier trn2 --dry-run``), so a fork based on another
upstream than the suite expects fails in one list, not in 64 ranks one name at a time.

A name declared ``required=False`` (the fork's own config 3 function, ``harness.declare.catalogue``'s ``Fork``) is
reported as *absent*, a finding, and does not fail the check.

Exit status: 0 every required name resolves, 1 at least one is missing.
"""

from __future__ import annotations

import argparse
import ast
import functools
import sys
from dataclasses import dataclass

from recipes import platform, titan
from recipes.tiers import REPO_ROOT

#: Where the suite's own code lives (searched for importers of each name).
SUITE_DIRS = ("recipes", "harness", "benchmarks", "tests", "fixtures")
#: Tags a tier never runs: the cpu shim's names are not the trn2 tier's business.
TIER_EXCLUDES = {"trn2": {"cpu"}, "cpu": set()}


@dataclass(frozen=True)
class Row:
    """One declared name on this machine: ``ok``, ``missing`` (required) or ``absent`` (a finding)."""

    entry: titan.TitanName
    status: str
    detail: str
    files: tuple[str, ...]

    def line(self) -> str:
        where = ", ".join(self.files) or "(no suite file found)"
        if self.status == "ok":
            return f"  ok       {self.entry.qualified}  [{where}]"
        label = "MISSING " if self.status == "missing" else "absent  "
        return f"  {label} {self.entry.qualified}: {self.detail}\n           needed by {where}"

    def to_dict(self) -> dict:
        return {
            "name": self.entry.name,
            "qualified": self.entry.qualified,
            "status": self.status,
            "required": self.entry.required,
            "detail": self.detail,
            "files": list(self.files),
        }


#: Harness files relying on a name without importing it from recipes.titan or wrapping it with
#: ``wrap_hook`` (both found below): the product names no harness file.
RELIED_ON_BY = {
    "Trainer": ("harness/rank/train.py",),
    "on_parse_error": ("harness/config/titan_cli.py",),
    "Trainer attributes": (
        "harness/rank/faults.py",
        "harness/rank/first_batch.py",
        "harness/rank/train.py",
    ),
}


def _hook_wrapped(node: ast.AST) -> str | None:
    """The hook name of a ``wrap_hook(owner, "Name", wrap)`` call, else None."""
    if (
        not isinstance(node, ast.Call)
        or len(node.args) < 2
        or not isinstance(node.args[1], ast.Constant)
    ):
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return node.args[1].value if called == "wrap_hook" else None


@functools.cache
def _importers() -> dict[str, tuple[str, ...]]:
    """Name -> suite files that import it from recipes.titan (``from recipes.titan import X`` or ``titan.X``)
    or wrap it (``titan.wrap_hook(owner, "X", ...)``)."""
    found: dict[str, set[str]] = {}
    for folder in SUITE_DIRS:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(REPO_ROOT))
            if rel == "recipes/titan.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module == "recipes.titan":
                    names = [a.name for a in node.names]
                elif (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "titan"
                ):
                    names = [node.attr]
                elif _hook_wrapped(node):
                    names = [_hook_wrapped(node)]
                for name in names:
                    found.setdefault(name, set()).add(rel)
    return {name: tuple(sorted(files)) for name, files in found.items()}


def users(entry: titan.TitanName) -> tuple[str, ...]:
    """The suite files that need ``entry``: its importers and wrappers, the product files it declares and
    the harness files of :data:`RELIED_ON_BY`."""
    return tuple(
        sorted({*_importers().get(entry.name, ()), *entry.files, *RELIED_ON_BY.get(entry.name, ())})
    )


def tier_tags(tier: str) -> set[str]:
    """Every ``used_by`` tag a night on ``tier`` can exercise (all recipes, overrides and benchmarks)."""
    tags = {tag for entry in titan.NAMES for tag in entry.used_by}
    return tags - TIER_EXCLUDES.get(tier, set())


def check(tier: str = "trn2") -> list[Row]:
    """Resolve every name ``tier`` needs; one row each, in declaration order."""
    rows = []
    for entry in titan.entries(tier_tags(tier)):
        try:
            titan.resolve(entry)
            status, detail = "ok", ""
        except titan.TitanNameError as e:
            status, detail = ("missing" if entry.required else "absent"), str(e)
        rows.append(Row(entry, status, detail, users(entry)))
    return rows


def summary(rows: list[Row], tier: str) -> str:
    """The report: a headline, then every missing and absent name with its files (``verbose``: every name)."""
    missing = [r for r in rows if r.status == "missing"]
    absent = [r for r in rows if r.status == "absent"]
    head = (
        f"torchtitan names check ({tier} tier, torchtitan {titan.installed_version()}): "
        f"{len(rows) - len(missing) - len(absent)} of {len(rows)} resolve"
        + (f", {len(missing)} MISSING" if missing else "")
        + (f", {len(absent)} absent (findings, not failures)" if absent else "")
    )
    return "\n".join([head, *(r.line() for r in missing + absent)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.checks.titan", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tier", default="trn2", choices=sorted(TIER_EXCLUDES))
    parser.add_argument(
        "--all", action="store_true", help="list every name, not only the missing and absent ones"
    )
    args = parser.parse_args(argv)
    if args.tier == "cpu":
        platform.install("cpu")  # as a cpu rank does: the shim before anything imports torchtitan
    rows = check(args.tier)
    print(summary(rows, args.tier))
    if args.all:
        print("\n".join(r.line() for r in rows if r.status == "ok"))
    return 1 if any(r.status == "missing" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

"""The plan of a bump rehearsal: the pins asked for and every path the rehearsal will create.

Decided before anything is resolved, installed or run, so that ``--dry-run`` can print it and
a rerun with the same pins on the same lock finds the same venv. It also holds what every later
step shares: how a rehearsal ends (the exit codes, :class:`BumpError`) and how paths are shown.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from harness.base.environment import normalize, pins
from recipes.errors import RecipeError
from recipes.tiers import REPO_ROOT

LOCK = REPO_ROOT / "requirements-lock.txt"
REQUIREMENTS_IN = REPO_ROOT / "requirements.in"
BUMP_REPORTS = REPO_ROOT / "report" / "bump"
BASELINE_VENV = REPO_ROOT / ".venv"
VENV_PREFIX = ".venv-bump-"

EXIT_OK, EXIT_PUBLISHED_BROKEN, EXIT_CANNOT_REHEARSE = 0, 1, 2


def to_stderr(line: str) -> None:
    """Where ``make bump`` and ``make bisect`` say a refusal: stderr, apart from their progress on stdout."""
    print(line, file=sys.stderr)


class BumpError(RecipeError):
    """The rehearsal could not run (a pin refused, no resolution, a failed install): one message."""


@dataclass(frozen=True)
class Pin:
    """One ``name==version`` the bump asks for (name normalised as pip does)."""

    name: str
    version: str

    @classmethod
    def parse(cls, text: str) -> "Pin":
        """``name==version`` read as pip reads a requirement; a range, a wildcard, extras or a marker is refused."""
        try:
            req = Requirement(text)
        except InvalidRequirement:  # no name, or a version PEP 440 cannot read
            req = None
        specs = list(req.specifier) if req else []
        exact = len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version
        if not exact or req.extras or req.marker:
            raise BumpError(
                f'{text!r} is not an exact pin: write PKGS="name==version ..." (e.g. transformers==5.23.0)'
            )
        return cls(normalize(req.name), specs[0].version)

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class Plan:
    """Everything a rehearsal will create, decided before anything is downloaded."""

    pins: tuple[Pin, ...]
    name: str
    venv: Path
    work: Path
    baseline: Path
    lock: Path = LOCK
    requirements_in: Path = REQUIREMENTS_IN

    @property
    def candidate_in(self) -> Path:
        return self.work / "requirements-candidate.in"

    @property
    def candidate_lock(self) -> Path:
        return self.work / "requirements-candidate.txt"

    @property
    def candidate_report(self) -> Path:
        return self.work / "candidate"

    @property
    def report_md(self) -> Path:
        return self.work.parent / f"{self.name}.md"

    @property
    def report_json(self) -> Path:
        return self.work.parent / f"{self.name}.json"

    def unchanged(self) -> bool:
        """Every pin is already the lock's: the candidate is the lock (no resolution, no download)."""
        locked = pins(self.lock)
        return all(locked.get(p.name) == p.version for p in self.pins)

    def lines(self) -> list[str]:
        return [
            f"bump {self.name}: {' '.join(map(str, self.pins))}",
            f"  candidate lock  {rel(self.candidate_lock)}"
            + ("  (= the lock: nothing to resolve)" if self.unchanged() else ""),
            f"  candidate venv  {rel(self.venv)}",
            f"  candidate run   {rel(self.candidate_report)}/tests.json",
            f"  baseline run    {rel(self.baseline)}/tests.json (on {rel(BASELINE_VENV)})",
            f"  bump report     {rel(self.report_md)}, {rel(self.report_json)}",
        ]


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def plan(specs: list[str], reports: Path = BUMP_REPORTS, lock: Path = LOCK) -> Plan:
    """The plan for ``specs`` (``name==version`` strings); the venv name hashes the lock and the pins."""
    if not specs:
        raise BumpError(
            'nothing to bump: make bump PKGS="transformers==5.23.0 [torch==2.15.0 ...]"'
        )
    parsed = sorted({Pin.parse(s) for s in specs}, key=lambda p: p.name)
    twice = sorted({p.name for p in parsed if sum(q.name == p.name for q in parsed) > 1})
    if twice:
        raise BumpError(f"{', '.join(twice)} asked for twice with different versions")
    locked = pins(lock)
    unknown = [p.name for p in parsed if p.name not in locked]
    if unknown:
        raise BumpError(
            f"{', '.join(unknown)} not in {lock.name}: a bump replaces pins the lock has"
        )
    name = "+".join(f"{p.name}-{p.version}" for p in parsed)
    digest = hashlib.sha256(
        (sha256(lock) + "\n" + "\n".join(map(str, parsed))).encode()
    ).hexdigest()[:12]
    return Plan(
        pins=tuple(parsed),
        name=name,
        venv=REPO_ROOT / f"{VENV_PREFIX}{digest}",
        work=reports / name,
        baseline=reports / "baseline",
        lock=lock,
    )

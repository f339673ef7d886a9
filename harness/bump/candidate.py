"""The candidate: a lock with the bumped pins, resolved by pip-tools, and a venv installed from it.

pip-compile starts from ``requirements-lock.txt``, so every other pin stays unless it has to
move, and what moved is listed. A pin this machine's pip refuses (a ``constraint`` file in
pip's config) is refused here by name, before pip-compile can only say "no stable configuration".
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet

from harness.base.environment import normalize
from harness.bump.plan import BumpError, Pin, Plan, rel

#: pip-compile as ``make lock`` runs it.
PIP_COMPILE_ARGS = (
    "--quiet",
    "--generate-hashes",
    "--allow-unsafe",
    "--strip-extras",
    "--no-emit-index-url",
    "--no-emit-find-links",
)
#: Retries of pip-compile, each also releasing the pins the previous one had to discard.
RESOLVE_ATTEMPTS = 3


def pinned_requirements_in(text: str, bump: tuple[Pin, ...]) -> str:
    """``requirements.in`` with each bumped package's line replaced by its pin (added if absent)."""
    wanted = {p.name: p for p in bump}
    out, seen = [], set()
    for line in text.splitlines():
        req = requirement(line)
        name = normalize(req.name) if req else None
        if name in wanted:
            comment = line[line.index("#") :] if "#" in line else "#"
            out.append(f"{wanted[name]}  {comment} (bump rehearsal)")
            seen.add(name)
        else:
            out.append(line)
    out += [f"{p}  # bump rehearsal: pinned by the bump" for p in bump if p.name not in seen]
    return "\n".join(out) + "\n"


def requirement(line: str) -> Requirement | None:
    """What a line of a requirements or constraints file asks for; None for a comment, an option or a blank."""
    try:
        return Requirement(line.split("#", 1)[0])
    except InvalidRequirement:
        return None


# --- what this machine's pip refuses ------------------------------------------------------------


@dataclass(frozen=True)
class Cap:
    """A requirement from a constraint file in pip's configuration (``torch<=2.14.1``)."""

    name: str
    specifier: str
    source: str


def pip_constraint_files(python: str = sys.executable) -> list[Path]:
    """The constraint files pip applies to every install (``pip config list`` and ``$PIP_CONSTRAINT``)."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True)
    found = re.findall(r"^[\w:.-]*constraint='([^']*)'", out.stdout, flags=re.M)
    found += os.environ.get("PIP_CONSTRAINT", "").split()
    return [Path(f) for f in dict.fromkeys(found) if f and Path(f).is_file()]


def read_caps(files: list[Path]) -> list[Cap]:
    caps = []
    for path in files:
        for line in path.read_text().splitlines():
            req = requirement(line)
            if req:
                caps.append(Cap(normalize(req.name), str(req.specifier), str(path)))
    return caps


def cap_refusals(bump: tuple[Pin, ...], caps: list[Cap]) -> list[str]:
    """One line per bumped pin a pip constraint refuses (pip-compile would only say "no stable configuration")."""
    return [
        f"{pin} is refused by this machine's pip constraint {cap.name}{cap.specifier} ({cap.source}); "
        f"lifting it (`rm -r {Path(cap.source).parent}`) is a machine-wide decision, and the build is several GB"
        for pin in bump
        for cap in caps
        if cap.name == pin.name
        and not SpecifierSet(cap.specifier).contains(pin.version, prereleases=True)
    ]


# --- resolving and installing -------------------------------------------------------------------


@dataclass(frozen=True)
class Move:
    """A package whose pin differs between the lock and the candidate lock (None: absent there)."""

    name: str
    old: str | None
    new: str | None
    asked: bool  # the bump pinned it; otherwise the resolver had to move it

    def line(self) -> str:
        why = "asked" if self.asked else "moved by the resolver"
        return f"{self.name} {self.old or '(none)'} → {self.new or '(removed)'} ({why})"


def moves(old: dict[str, str], new: dict[str, str], bump: tuple[Pin, ...] = ()) -> list[Move]:
    """Every pin that differs between two locks, asked-for ones first."""
    asked = {p.name for p in bump}
    found = [
        Move(name, old.get(name), new.get(name), name in asked)
        for name in sorted(set(old) | set(new))
        if old.get(name) != new.get(name)
    ]
    return sorted(found, key=lambda m: (not m.asked, m.name))


def discarded(pip_compile_output: str) -> list[str]:
    """Packages pip-compile had to release from the old lock ("Discarding name==v ... to proceed")."""
    return sorted(
        {normalize(m) for m in re.findall(r"Discarding ([A-Za-z0-9_.\-]+)==", pip_compile_output)}
    )


def resolve(plan: Plan, python: str = sys.executable, log=print) -> Path:
    """Write the candidate lock: the lock's pins kept where they fit, the bumped ones replaced."""
    plan.work.mkdir(parents=True, exist_ok=True)
    if plan.unchanged():
        shutil.copyfile(plan.lock, plan.candidate_lock)
        return plan.candidate_lock
    refused = cap_refusals(plan.pins, read_caps(pip_constraint_files(python)))
    if refused:
        raise BumpError("; ".join(refused))
    plan.candidate_in.write_text(
        pinned_requirements_in(plan.requirements_in.read_text(), plan.pins)
    )
    released = [p.name for p in plan.pins]
    for attempt in range(1, RESOLVE_ATTEMPTS + 1):
        shutil.copyfile(
            plan.lock, plan.candidate_lock
        )  # pip-compile keeps an existing output's pins
        upgrades = [str(p) for p in plan.pins] + [
            n for n in released if n not in {p.name for p in plan.pins}
        ]
        log(f"resolving (attempt {attempt}): pip-compile -P {' -P '.join(upgrades)}")
        command = [python, "-m", "piptools", "compile", *PIP_COMPILE_ARGS, "--verbose"]
        command += [arg for u in upgrades for arg in ("-P", u)]
        command += ["-o", str(plan.candidate_lock), str(plan.candidate_in)]
        out = subprocess.run(command, capture_output=True, text=True, cwd=plan.work)
        (plan.work / f"pip-compile-{attempt}.log").write_text(out.stdout + out.stderr)
        if out.returncode == 0:
            return plan.candidate_lock
        more = [n for n in discarded(out.stdout + out.stderr) if n not in released]
        if not more:
            break
        released += more
    tail = " | ".join(line for line in (out.stdout + out.stderr).strip().splitlines()[-3:])
    raise BumpError(
        f"pip-compile found no candidate lock for {' '.join(map(str, plan.pins))}: {tail} "
        f"(full log: {rel(plan.work)}/pip-compile-*.log)"
    )


def build_venv(plan: Plan, log=print) -> Path:
    """The candidate venv (its python), installed from the candidate lock with hashes; reused if current."""
    python = plan.venv / "bin" / "python"
    stamp = plan.venv / ".lock-installed"
    if stamp.exists() and stamp.read_text() == plan.candidate_lock.read_text():
        log(f"reusing {rel(plan.venv)} (installed from this candidate lock)")
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(plan.venv)], check=True)
    log(
        f"installing {rel(plan.candidate_lock)} into {rel(plan.venv)} (a CUDA torch build is several GB)"
    )
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    for command in (
        pip + ["--upgrade", "pip"],
        pip + ["--require-hashes", "--no-deps", "-r", str(plan.candidate_lock)],
    ):
        out = subprocess.run(command, capture_output=True, text=True)
        if out.returncode != 0:
            tail = " | ".join(out.stderr.strip().splitlines()[-3:])
            raise BumpError(f"installing the candidate lock into {rel(plan.venv)} failed: {tail}")
    shutil.copyfile(plan.candidate_lock, stamp)
    return python

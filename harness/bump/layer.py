"""A layered venv: a few packages installed over ``.venv``, whose every other wheel it reuses.

The layer is a venv without pip made by the base venv's own interpreter; one ``.pth`` line adds
the base's site-packages (and its ``.pth`` files) *after* the layer's, so a package installed in
the layer shadows the base's copy and everything else is the lock's, already installed. The
base's pip installs into it (``pip --python``), ``--no-deps``: one release of one package at a
time, on the lock. pip never touches the base ("Not uninstalling ... outside environment").
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from harness.base.environment import normalize
from harness.bump.plan import BumpError, rel

BASE_PTH = "_qwen3_base_layer.pth"
STATE = "layer.json"


def purelib(python: Path) -> str:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def installed(python: Path) -> dict[str, str]:
    """Every distribution ``python`` sees, name → version (the first on its path, as imports find it)."""
    code = (
        "import importlib.metadata as m, json\nseen = {}\nfor d in m.distributions():\n"
        "    seen.setdefault(d.metadata['Name'], d.version)\nprint(json.dumps(seen))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return {normalize(k): v for k, v in json.loads(out.stdout).items() if k}


class Layer:
    """``venv`` over ``base`` (a venv's python); :meth:`apply` makes its own packages exactly ``wanted``."""

    def __init__(self, venv: Path, base: Path, pip_args: tuple[str, ...] = ()):
        self.venv, self.base, self.pip_args = venv, base, tuple(pip_args)
        self.python = venv / "bin" / "python"

    @property
    def state_path(self) -> Path:
        return self.venv / STATE

    def state(self) -> dict[str, str]:
        return json.loads(self.state_path.read_text()) if self.state_path.exists() else {}

    def create(self) -> None:
        if self.python.exists() and self.state_path.exists():
            return
        subprocess.run([str(self.base), "-m", "venv", "--without-pip", str(self.venv)], check=True)
        base_site = purelib(self.base)
        (Path(purelib(self.python)) / BASE_PTH).write_text(
            f"import site; site.addsitedir({base_site!r})\n"
        )
        self.state_path.write_text("{}\n")

    def pip(self, *args: str) -> None:
        command = [str(self.base), "-m", "pip", "--python", str(self.python), *args]
        out = subprocess.run(command, capture_output=True, text=True)
        if out.returncode != 0:
            tail = " | ".join(out.stderr.strip().splitlines()[-2:])
            raise BumpError(f"`pip {' '.join(args)}` into {rel(self.venv)} failed: {tail}")

    def unmet(self) -> list[str]:
        """``pip check``'s lines about the layer's own packages: a requirement ``--no-deps`` left unmet."""
        out = subprocess.run(
            [
                str(self.base),
                "-m",
                "pip",
                "--python",
                str(self.python),
                "check",
                "--disable-pip-version-check",
            ],
            capture_output=True,
            text=True,
        )
        mine = set(self.state())
        return [
            line for line in out.stdout.splitlines() if normalize(line.split(" ", 1)[0]) in mine
        ]

    def apply(self, wanted: dict[str, str]) -> None:
        """The layer holds exactly ``wanted`` (name → version): others removed, the base's copy shows through."""
        self.create()
        have = self.state()
        gone = sorted(set(have) - set(wanted))
        if gone:
            self.pip("uninstall", "--yes", "--quiet", *gone)
        new = [f"{n}=={v}" for n, v in sorted(wanted.items()) if have.get(n) != v]
        if new:
            self.pip(
                "install",
                "--quiet",
                "--no-deps",
                "--disable-pip-version-check",
                *self.pip_args,
                *new,
            )
        self.state_path.write_text(json.dumps(dict(sorted(wanted.items())), indent=2) + "\n")

"""Every path an option names, looked at before anything resolves it: one line, never a traceback.

``Path.resolve()`` raises ``RuntimeError: Symlink loop`` on a loop, tyro turns ``--report-dir ""`` into
``Path(".")`` (the current directory), and a FIFO, socket or device in place of a directory is read
as a file or blocks. Each is refused here, naming the option, the path and what it is.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from harness.base.readable import SPECIAL_FILES
from harness.base.tyro_events import _spelling
from recipes.errors import RecipeError

#: The harness's own path options (``RunCommand``'s fields).
HARNESS_PATH_OPTIONS = (
    "--model-dir",
    "--dataset-dir",
    "--tokenizer-dir",
    "--export-dir",
    "--report-dir",
)


def given(argv: list[str], flags: tuple[str, ...]) -> list[tuple[str, str]]:
    """Each ``(flag, value)`` ``argv`` gives one of ``flags`` (``--f V`` or ``--f=V``), as typed."""
    wanted = {_spelling(f) for f in flags}
    found = []
    for i, token in enumerate(argv):
        if not token.startswith("--") or _spelling(token) not in wanted:
            continue
        name, eq, value = token.partition("=")
        if eq:
            found.append((name, value))
        elif i + 1 < len(argv):
            found.append((name, argv[i + 1]))
    return found


def what_is(path: Path) -> str | None:
    """What stands at ``path`` when no path option can take it, else None (a file, a directory, or nothing yet)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symlink loop"
        if e.errno == errno.ENOTDIR:
            return None  # a parent is a file: the directory checks name it
        return f"not readable ({e.strerror})"
    return next((kind for test, kind in SPECIAL_FILES if test(mode)), None)


def check_path(flag: str, value: str) -> None:
    """Refuse ``value`` for ``flag`` in one line when it is empty, a symlink loop, a FIFO, a socket or a device."""
    if not value.strip():
        raise RecipeError(
            f"{flag} is given an empty path {value!r}, which would mean the current directory "
            f"{Path.cwd()}; pass {flag} a directory path (or drop {flag} for its default)"
        )
    path = Path(value).expanduser()
    kind = what_is(path)
    if kind is None:
        try:
            path.resolve()
        except (RuntimeError, OSError):  # a loop os.stat did not meet (a dangling parent, ...)
            kind = "a symlink loop"
    if kind is not None:
        raise RecipeError(f"{flag} {value} is {kind}, not a directory; point {flag} at a directory")


def check_given_paths(argv: list[str], flags: tuple[str, ...] = HARNESS_PATH_OPTIONS) -> None:
    """Every path ``argv`` gives one of ``flags``, checked by :func:`check_path`."""
    for flag, value in given(argv, flags):
        check_path(flag, value)

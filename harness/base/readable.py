"""The one way a reader or tool opens a file it is given: what stands there, said in one line.

``python -m harness history``, ``python -m harness.night.ci`` and ``python -m benchmarks`` are given
paths by hand; a directory, a FIFO, an empty file, binary data or another tool's JSON is an
:class:`Unreadable` naming the path, what it is and the fix, which each tool prints on stderr
with exit 2, never a traceback.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

#: What may stand at a path that is neither a regular file nor a directory, by ``stat`` test.
SPECIAL_FILES = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)
_SPECIAL = ((stat.S_ISDIR, "a directory"), *SPECIAL_FILES)


class Unreadable(ValueError):
    """A file a reader cannot take; the message is the one line to print."""


def kind_of(path: Path) -> str | None:
    """What stands at ``path`` that is not a regular file ("a directory", ...); None for a regular file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "nothing (no such file)"
    except OSError as e:
        return f"unreadable ({e.strerror})"
    return next((kind for test, kind in _SPECIAL if test(mode)), None)


def text_of(path: Path, what: str, fix: str) -> str:
    """The UTF-8 text of the regular file ``path`` (``what`` it should be); else :class:`Unreadable`."""
    if not os.path.lexists(path):
        raise Unreadable(f"{path}: no such file; {fix}")
    kind = kind_of(path)
    if kind is not None:
        raise Unreadable(f"{path} is {kind}, not {what}; {fix}")
    data = Path(path).read_bytes()
    if not data.strip():
        raise Unreadable(f"{path} is empty, not {what}; {fix}")
    if b"\0" in data[:65536]:
        raise Unreadable(f"{path} holds binary data (NUL bytes), not {what}; {fix}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Unreadable(f"{path} is not UTF-8 text (byte {e.start}), not {what}; {fix}") from None


def json_object_of(path: Path, what: str, fix: str) -> dict:
    """The JSON object in ``path``; else :class:`Unreadable` (not JSON, or a list, number, ...)."""
    text = text_of(path, what, fix)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise Unreadable(
            f"{path} is not JSON ({e.msg}, line {e.lineno}), not {what}; {fix}"
        ) from None
    if not isinstance(data, dict):
        raise Unreadable(f"{path} holds a JSON {type(data).__name__}, not {what}; {fix}")
    return data

"""Workarounds say, in one line, when upstream no longer has the shape they rely on.

A workaround for an upstream defect (``recipes/hf_compat.py``, ``recipes/platform/cpu.py``)
reaches into upstream's internals: a signature, an attribute, a method. A version bump can
move any of them, and the workaround then fails from inside itself (``TypeError: ...
takes 1 positional argument but 2 were given``), which reads like a bug of this suite.
Each workaround first checks what it relies on with :func:`require`, and a missing piece
becomes one :class:`UpstreamShapeError` naming the package, its installed version, the
workaround and what it expected. ``harness.bump`` lists these messages as "workarounds
that broke" (it looks for :data:`MARKER`).
"""

from __future__ import annotations

import inspect
from importlib import metadata

from recipes.errors import RecipeError

#: The words every shape message carries, so a report can find them in any failure text.
MARKER = "no longer fits workaround"


class UpstreamShapeError(RecipeError):
    """An upstream package changed a name or signature a workaround relies on."""


def installed_version(package: str) -> str:
    """The version metadata reports for ``package`` ("not installed" if none)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def shape_message(package: str, workaround: str, expected: str) -> str:
    """The one line a broken workaround fails with."""
    return (
        f"{package} {installed_version(package)} {MARKER} {workaround}: it relies on {expected}, "
        f"which this {package} does not have; adapt the workaround to the new shape, or delete it "
        f"if its canary says upstream fixed the defect"
    )


def require(ok: bool, package: str, workaround: str, expected: str) -> None:
    """Raise the one-line :class:`UpstreamShapeError` unless ``ok``."""
    if not ok:
        raise UpstreamShapeError(shape_message(package, workaround, expected))


def missing_attributes(obj: object, *names: str) -> list[str]:
    """The names of ``names`` that ``obj`` does not have."""
    return [name for name in names if not hasattr(obj, name)]


def require_attributes(
    obj: object, names: tuple[str, ...], package: str, workaround: str, owner: str
) -> None:
    """Every name in ``names`` is an attribute of ``obj`` (``owner`` is how the message names obj)."""
    missing = missing_attributes(obj, *names)
    expected = ", ".join(f"{owner}.{name}" for name in names)
    require(not missing, package, workaround, f"{expected} (missing: {', '.join(missing)})")


def accepts(fn, *args, **kwargs) -> bool:
    """Whether ``fn(*args, **kwargs)`` binds to ``fn``'s signature (nothing is called)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: cannot tell, trust it
        return True
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        return False
    return True


def describe(fn) -> str:
    """``name(signature)`` of ``fn`` for a message, or its repr when it has none."""
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        return f"{name}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        return name

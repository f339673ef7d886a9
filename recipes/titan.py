"""Every torchtitan name the suite depends on, imported here and nowhere else.

Two torchtitans run the suite: upstream 0.3.0 (PyPI) on cpu, and on trn2 torchtitan-neuron
release-2.33, a fork installed with ``pip install -e .`` as the distribution ``torchtitan``
0.2.2+neuron.1 (Neuron docs: training/torchtitan/get-started/setup-torchtitan-neuron). Each
name is declared once in :data:`NAMES` with its module, why the suite needs it and who uses
it, so a torchtitan that lacks one is refused in one line before any rank starts: the
harness's checks refuse a run whose names are :func:`missing`, ``python -m harness.checks.titan``
lists them as the nightly's first step and in the dry run (every name, each missing one with its files).

Hooks too: attributes the harness replaces on a built trainer (``batch_generator``,
``train_step``, ``metrics_processor.logger``). A renamed hook fails no import, the
replacement is just never called, so each is declared with the code that must call it
(``read_by``) or the ``__init__`` that must assign it (``sets``), checked in the bytecode,
and replaced only through :func:`wrap_hook`, which checks it again on the rank.

And one name of tyro, torchtitan's CLI parser: its parse-error hook (``on_parse_error``).

Which upstream the fork is. In pytorch/torchtitan (git log -S on main, read up to
2026-08-21) the newest names here appeared 2026-06-05..07-20: ``CosSinRoPE`` 02d24f017,
``derive``/``override(exact=)`` adf340d3f (06-10), ``ChunkedLossWrapper`` 9530a874d (06-26),
``_yarn_inv_freq`` 51c197c86 (07-10), ``_configure_hf_attention`` af35cfb15 (07-20); two
vanished on 2026-08-19: ``torchtitan.components.checkpoint`` (2e92be1c4) and
``HuggingFaceTextDataLoader`` (1b04fc1c3). version.txt read 0.2.2 throughout, so
"0.2.2+neuron.1" does not date the fork's base; only the check against the installed fork
does. Open question (checked: the Neuron 2.33 release notes; the fork is not public here):
which upstream commit release-2.33 is based on.

Nothing is imported when this module is: each name imports its own module on first use
(PEP 562 ``__getattr__``: ``from recipes.titan import CosSinRoPE``), so ``recipes.platform``
can patch torchtitan first, and a recipe without kernels never imports a kernel's module.
"""

from __future__ import annotations

import contextlib
import dis
import importlib
import importlib.metadata
import inspect
from collections.abc import Iterable

from recipes.errors import RecipeError
from recipes.titan_names import EVERY_RUN, NAMES, TitanName


class TitanNameError(RecipeError):
    """The installed torchtitan lacks a name the suite depends on."""


BY_NAME: dict[str, TitanName] = {n.name: n for n in NAMES}


def installed_version(distribution: str = "torchtitan") -> str:
    """The installed distribution's version (``importlib.metadata``)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _missing(entry: TitanName, what: str) -> TitanNameError:
    package = "tyro" if entry.module.partition(".")[0] == "tyro" else "torchtitan"
    if not entry.required:
        return TitanNameError(
            f"{package} {installed_version(package)} has no {what}: {entry.purpose}"
        )
    return TitanNameError(
        f"torchtitan {installed_version()} has no {what}, which the suite needs for {entry.purpose}. "
        "Install the torchtitan the suite pins (cpu: requirements-lock.txt; trn2: torchtitan-neuron "
        "release-2.33), or adapt recipes/titan.py and its callers to this version"
    )


def _import(entry: TitanName):
    try:
        return importlib.import_module(entry.module)
    except ImportError as e:
        raise _missing(entry, f"{entry.qualified} (importing {entry.module} failed: {e})") from None


def _check_keywords(entry: TitanName, obj) -> None:
    target = obj
    for part in filter(None, entry.keywords_of.split(".")):
        target = getattr(target, part, None)
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        raise _missing(entry, f"inspectable signature for {entry.qualified}") from None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    absent = [k for k in entry.keywords if k not in params]
    if absent:
        callee = ".".join(filter(None, (entry.qualified, entry.keywords_of)))
        raise _missing(entry, f"keyword {absent[0]!r} in {callee}(...)")


def _walk(obj, path: str, entry: TitanName, shown: str):
    for part in path.split("."):
        if not hasattr(obj, part) and inspect.ismodule(obj):
            # A submodule is an attribute only once something imported it.
            with contextlib.suppress(ImportError):
                importlib.import_module(f"{obj.__name__}.{part}")
        if not hasattr(obj, part):
            raise _missing(entry, shown)
        obj = getattr(obj, part)
    return obj


def _instructions(function):
    """Every bytecode instruction of ``function`` (decorators unwrapped), nested functions included."""
    code = getattr(inspect.unwrap(function), "__code__", None)
    stack = [code] if code is not None else []
    while stack:
        code = stack.pop()
        yield from dis.get_instructions(code)
        stack += [c for c in code.co_consts if inspect.iscode(c)]


def _check_hook(entry: TitanName, module, obj) -> None:
    """``sets``: ``obj`` assigns each attribute; ``read_by``: that code reads the hook's last name part."""
    if entry.sets:
        assigned = {i.argval for i in _instructions(obj) if i.opname == "STORE_ATTR"}
        absent = [name for name in entry.sets if name not in assigned]
        if absent:
            raise _missing(entry, f"assignment self.{absent[0]} in {entry.qualified}")
    if entry.read_by:
        reader = _walk(module, entry.read_by, entry, f"{entry.module}.{entry.read_by}")
        attribute = entry.name.rsplit(".", 1)[-1]
        if attribute not in {
            i.argval for i in _instructions(reader) if i.opname in ("LOAD_ATTR", "LOAD_METHOD")
        }:
            raise _missing(
                entry,
                f"read of self.{attribute} in {entry.module}.{entry.read_by} (a hook it no longer calls)",
            )


def resolve(entry: TitanName):
    """The object ``entry`` names, or :class:`TitanNameError` saying what is missing and why it matters."""
    module = _import(entry)
    obj = _walk(module, entry.attr or entry.name, entry, entry.qualified)
    if entry.keywords:
        _check_keywords(entry, obj)
    if entry.sets or entry.read_by:
        _check_hook(entry, module, obj)
    return obj


def hook(owner, name: str, wrapped_by: str = ""):
    """The declared hook ``name`` (``"Trainer.batch_generator"``) as the built ``owner`` holds it.

    Checked as the names check checks it (present, still called or assigned by torchtitan),
    so a fork without it fails on the rank in one line naming the hook and the module
    that wraps it (``wrapped_by``), never an AttributeError or a wrapper never called (no step-1 record, so
    a reference loss silently absent).
    """
    entry = BY_NAME.get(name)
    if entry is None or not (entry.read_by or entry.sets) or "." not in name:
        raise AttributeError(
            f"{name!r} is no hook of recipes.titan.NAMES; declare it there with read_by= or sets="
        )
    attribute = name.rsplit(".", 1)[-1]
    try:
        resolve(entry)
        if not hasattr(owner, attribute):
            raise _missing(entry, f"{attribute} on the built {type(owner).__qualname__}")
    except TitanNameError as e:
        raise TitanNameError(
            f"{e}; the hook is wrapped by {wrapped_by}" if wrapped_by else str(e)
        ) from None
    return getattr(owner, attribute)


def wrap_hook(owner, name: str, wrap) -> None:
    """Replace the declared hook ``name`` on ``owner`` by ``wrap(original)`` (checked by :func:`hook`).

    A hook that is gone is refused naming ``wrap``'s module, the code that relies on it.
    """
    setattr(
        owner,
        name.rsplit(".", 1)[-1],
        wrap(hook(owner, name, getattr(wrap, "__module__", None) or "")),
    )


def entries(used_by: Iterable[str] = (EVERY_RUN,)) -> list[TitanName]:
    """The declared names one of ``used_by`` needs (required or not), in declaration order."""
    tags = set(used_by)
    return [entry for entry in NAMES if tags.intersection(entry.used_by)]


def missing(used_by: Iterable[str] = (EVERY_RUN,)) -> list[TitanNameError]:
    """Every required name one of ``used_by`` needs that the installed torchtitan lacks."""
    errors = []
    for entry in entries(used_by):
        if not entry.required:
            continue
        try:
            resolve(entry)
        except TitanNameError as e:
            errors.append(e)
    return errors


def optional(name: str):
    """A ``required=False`` name, or ``(None, why)`` when the installed packages lack it: ``(obj, "")``."""
    try:
        return resolve(BY_NAME[name]), ""
    except TitanNameError as e:
        return None, str(e)


def run_tags(recipe: str, overrides: Iterable[str] = (), tier: str = "") -> set[str]:
    """The ``used_by`` tags of one run: every run's, the tier's, the recipe's, and each ``--override``'s.

    Nothing is imported: a recipe's own kernels are declared in :data:`NAMES`
    (``used_by`` names the recipe), so a fork that breaks a kernel module's import
    is refused here, not by a traceback.
    """
    return {EVERY_RUN, recipe, tier, *(str(spec).partition("=")[0].strip() for spec in overrides)}


def __getattr__(name: str):
    entry = BY_NAME.get(name)
    if entry is None:
        raise AttributeError(
            f"module {__name__!r} has no attribute {name!r}; declare it in recipes.titan.NAMES"
        )
    value = resolve(entry)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(BY_NAME))

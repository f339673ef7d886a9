"""torchtitan's own CLI parser on top of a config the harness built (``--training.steps 3``).

torchtitan's ``ConfigManager.parse_args`` starts from ``--module M --config F``: it imports
``M``, calls the zero-argument ``F()`` and parses the remaining flags with tyro on top of
what ``F`` returned (torchtitan/config/manager.py). The harness hands it the built config
as this module's config function ``staged``, so the overrides go through torchtitan's
public entry, its tyro rules and its validation, and no private method is replaced.

A refused option becomes one :class:`PreflightError` line from the structured event tyro
hands a parse-error hook (``tyro._errors.on_parse_error``, tyro >= 1.0.14, declared in
``recipes.titan.NAMES``) just before it would print its error box and exit 2: which
option, which value, and the fix. Nothing tyro prints is read back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import sys

from harness.base.tyro_events import ParseRefused as _Refused
from harness.base.tyro_events import _spelling, describe
from harness.base.tyro_events import refuse as _refuse
from harness.checks.errors import PreflightError
from recipes import titan

_staged = None

#: How many of the closest spellings are tried on torchtitan's parser for "did you mean".
SUGGESTIONS_TRIED = 3
#: difflib ratio below which a spelling is no suggestion.
SUGGESTION_CUTOFF = 0.6
#: Why a refusal has no line of its own when tyro (< 1.0.14) offers no parse-error hook.
NO_HOOK = "this tyro has no tyro._errors.on_parse_error"


def staged():
    """The config ``apply_cli_overrides`` is parsing overrides onto; only torchtitan's ConfigManager calls this."""
    if _staged is None:
        raise RuntimeError(
            "harness.config.titan_cli.staged is called by apply_cli_overrides' ConfigManager only"
        )
    return _staged


def _parse(cli_overrides: list[str], on_parse_error):
    """torchtitan's ``ConfigManager.parse_args`` on the staged config; tyro's events raised as ``_Refused``."""
    from recipes.titan import ConfigManager  # noqa: PLC0415 -- heavy: recipes.titan imports torchtitan (torchtitan+torch 2.9 s); this module stays light

    with on_parse_error(_refuse) if on_parse_error else contextlib.nullcontext():
        return ConfigManager().parse_args(
            ["--module", __name__, "--config", "staged", *cli_overrides]
        )


def apply_cli_overrides(config, cli_overrides: list[str]):
    """``config`` with torchtitan's CLI overrides applied, as ``torchtitan.train`` would apply them.

    A refused option is one ``PreflightError`` line, so the launcher refuses it once,
    before any rank starts, instead of once per rank.
    """
    global _staged

    on_parse_error, _ = titan.optional("on_parse_error")
    cli_overrides = list(cli_overrides)
    printed = io.StringIO()
    _staged = config
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            parsed = _parse(cli_overrides, on_parse_error)
    except _Refused as refused:
        raise cli_override_error(refused.event, cli_overrides, config, on_parse_error) from None
    except SystemExit as e:
        if e.code in (0, None):  # --help: show it, as torchtitan.train would
            sys.stdout.write(printed.getvalue())
            raise
        sys.stderr.write(
            printed.getvalue()
        )  # no event reached the hook: tyro printed its own reason
        why = "tyro exited without a parse-error event" if on_parse_error else NO_HOOK
        raise PreflightError(_refusal(f"see tyro's message above ({why})", cli_overrides)) from None
    finally:
        _staged = None
    sys.stderr.write(printed.getvalue())
    return parsed


def cli_override_error(event, cli_overrides: list[str], config, on_parse_error) -> PreflightError:
    """One line for tyro's parse-error ``event`` on ``cli_overrides``: the option, the value and the fix.

    ``config`` is the staged config and ``on_parse_error`` tyro's hook: a suggested option
    is one torchtitan's parser takes on that config.
    """
    try:
        what = describe(
            event, cli_overrides, lambda flag: closest_option(config, flag, on_parse_error)
        )
    except (
        AttributeError,
        TypeError,
    ) as e:  # the event is tyro's private API: a new tyro may reshape it
        what = f"{type(event).__name__} (tyro's event could not be read: {e})"
    return PreflightError(_refusal(what, cli_overrides))


def _refusal(what: str, cli_overrides: list[str]) -> str:
    return (
        f"torchtitan option refused: {what}; fix or drop it (torchtitan options are --SECTION.FIELD VALUE "
        f"of the recipe's Trainer.Config; given: {' '.join(cli_overrides)})"
    )


def config_options(config, prefix: str = "--"):
    """``--SECTION.FIELD`` for every leaf of the config's dataclass tree (``--S.no_F`` too for booleans).

    A superset of what torchtitan's parser takes (tyro hides suppressed and callable
    fields): a suggestion is tried on the parser before it is shown (:func:`accepted`).
    """
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from config_options(value, f"{prefix}{field.name}.")
            continue
        yield f"{prefix}{field.name}"
        if isinstance(value, bool):
            section, _, name = f"{prefix}{field.name}".rpartition(".")
            yield f"{section}.no_{name}" if section else f"--no_{name[2:]}"


def accepted(option: str, on_parse_error) -> bool:
    """torchtitan's parser knows ``option``: given alone, tyro refuses anything but an unknown option."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            _parse([option], on_parse_error)
    except _Refused as refused:
        return "UnrecognizedArgs" not in {cls.__name__ for cls in type(refused.event).__mro__}
    except ValueError:  # parsed; torchtitan's own validation refused the resulting config
        return True
    return True


def closest_option(config, flag: str, on_parse_error) -> str | None:
    """The option torchtitan's parser takes that is spelled closest to ``flag``, or None."""
    wanted = _spelling(flag)
    options = sorted(set(config_options(config)))

    def score(option: str) -> float:
        same_field = option.rsplit(".", 1)[-1].lstrip("-") == wanted.rsplit(".", 1)[-1].lstrip("-")
        return max(difflib.SequenceMatcher(a=wanted, b=option).ratio(), 0.9 if same_field else 0.0)

    ranked = sorted(((score(o), o) for o in options), key=lambda pair: (-pair[0], pair[1]))
    tried = [o for s, o in ranked[:SUGGESTIONS_TRIED] if s >= SUGGESTION_CUTOFF]
    return next((o for o in tried if accepted(o, on_parse_error)), None)

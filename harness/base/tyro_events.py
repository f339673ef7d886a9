"""One line for a refusal of tyro's (the CLI parser of torchtitan and of ``python -m harness run``).

tyro hands a parse-error hook a structured event just before it prints its error box and exits 2
(``tyro._errors.on_parse_error``, tyro >= 1.0.14, declared in ``recipes.titan.NAMES``); ``describe``
says, from the event's class and fields, which option, which value and why. A leaf: both the
options stage (``harness.options.run_options``) and the config stage (``harness.config.titan_cli``) use it.
"""

from __future__ import annotations


class ParseRefused(Exception):
    """tyro's parse-error event, carried out of ``tyro.cli`` (not a ValueError: tyro catches those)."""

    def __init__(self, event):
        super().__init__(type(event).__name__)
        self.event = event


def refuse(event) -> None:
    """The parse-error hook: raise the event instead of letting tyro print its box."""
    raise ParseRefused(event)


def describe(event, cli_overrides: list[str], suggest) -> str:
    """What is wrong, from the event's class and fields (tyro/_errors.py), never from its rendering.

    The classes are told apart by name (``UnrecognizedArgs``, ``BadValue``, ...; subclasses
    too), so the harness imports nothing of tyro's but the declared hook.
    """
    kinds = {cls.__name__ for cls in type(event).__mro__}
    if "UnrecognizedArgs" in kinds:
        flags = [t.split("=", 1)[0] for t in event.tokens if t.startswith("--")]
        if not flags:
            return f"unexpected value {' '.join(event.tokens)} (no option before it takes it)"
        fix = suggest(flags[0])
        return f"unknown option {flags[0]}" + (f" (did you mean {fix}?)" if fix else "")
    if "BadValue" in kinds:
        arg = event.argument
        if event.offending_value is None:  # reason "too_few_values"
            return f"{arg.display_name()} is missing its value ({arg.lowered.metavar})"
        return f"{arg.display_name()} takes no value, got {event.offending_value!r}"
    if "InvalidChoice" in kinds:
        return f"{event.argument.display_name()} got {event.value!r}; choose one of {', '.join(event.choices)}"
    if "InstantiationFailure" in kinds:
        reason = " ".join(event.message.split("\n\n", 1)[0].split())
        if event.argument is None:
            return f"the config refused the options: {reason}"
        name = event.argument.display_name()
        value = given_value(cli_overrides, name)
        got = f", not {value!r}" if value is not None else ""
        return f"{name} takes {event.argument.lowered.metavar}{got} ({reason})"
    if "MissingArgs" in kinds:
        return "missing required option " + ", ".join(
            a.arg.display_name() for a in event.missing_arguments
        )
    return f"tyro's {type(event).__name__}"  # a kind of refusal added after tyro 1.0.17


def _spelling(flag: str) -> str:
    """tyro accepts ``_`` and ``-`` alike inside a flag name (``--lr-scheduler.decay-ratio``)."""
    name = flag.split("=", 1)[0]
    dashes = len(name) - len(name.lstrip("-"))
    return name[:dashes] + name[dashes:].replace("-", "_")


def given_value(cli_overrides: list[str], flag: str) -> str | None:
    """The value ``cli_overrides`` gives ``flag`` (``--f V`` or ``--f=V``), in the user's spelling."""
    for i, token in enumerate(cli_overrides):
        if _spelling(token) != _spelling(flag):
            continue
        if "=" in token:
            return token.split("=", 1)[1]
        return cli_overrides[i + 1] if i + 1 < len(cli_overrides) else None
    return None

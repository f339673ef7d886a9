"""torchtitan's own CLI parser on top of a config the harness built (``--training.steps 3``).

torchtitan's ``ConfigManager.parse_args`` starts from ``--module M --config F``: it imports
``M``, calls the zero-argument ``F()`` and parses the remaining flags with tyro on top of
what ``F`` returned (torchtitan/config/manager.py). The harness hands it the built config
as this module's config function ``staged``, so the overrides go through torchtitan's
public entry, its tyro rules and its validation, and no private method is replaced.
"""

from __future__ import annotations

import contextlib
import io
import sys

_staged = None


def staged():
    """The config ``apply_cli_overrides`` is parsing overrides onto; only torchtitan's ConfigManager calls this."""
    if _staged is None:
        raise RuntimeError("harness.config.titan_cli.staged is called by apply_cli_overrides' ConfigManager only")
    return _staged


def apply_cli_overrides(config, cli_overrides: list[str]):
    """``config`` with torchtitan's CLI overrides applied, as ``torchtitan.train`` would apply them.

    torchtitan's tyro parser prints an error box and exits 2 on a bad option; that
    becomes one ``PreflightError`` line naming the option, so the launcher refuses it
    once, before any rank starts, instead of once per rank.
    """
    global _staged
    from harness.checks import cli_override_error
    from recipes.titan import ConfigManager

    printed = io.StringIO()
    _staged = config
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            parsed = ConfigManager().parse_args(["--module", __name__, "--config", "staged", *cli_overrides])
    except SystemExit as e:
        if e.code in (0, None):  # --help: show it, as torchtitan.train would
            sys.stdout.write(printed.getvalue())
            raise
        raise cli_override_error(printed.getvalue(), list(cli_overrides)) from None
    finally:
        _staged = None
    sys.stderr.write(printed.getvalue())
    return parsed

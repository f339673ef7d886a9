"""The refusal every harness check raises, in a module of its own.

Any harness module can raise it (``harness.config.titan_cli`` on a refused torchtitan option)
without importing ``harness.checks`` and, through it, the rest of the harness.
"""

from __future__ import annotations

from recipes.errors import RecipeError


class PreflightError(RecipeError):
    """A run that cannot start; the message says what is wrong and how to fix it."""

"""The one base class of every refusal a user can fix: caught at the CLI, shown as one message."""


class RecipeError(ValueError):
    """Bad input or environment; the message names the value and the fix. Never a traceback."""

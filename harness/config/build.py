"""Stage 3, config: one run's ``Trainer.Config``, built by the same code in the launcher and on every rank.

The recipe's config function (``recipes/``), the run's deltas (``RunOptions``), the
``--override`` kernel specs, then torchtitan's own CLI parser on the overrides
(:mod:`harness.config.titan_cli`). Building refuses nothing but what torchtitan's parser
refuses; :func:`checked_config` is the launcher's path (every check before launch, from
:mod:`harness.checks.preflight`, around the build). A rank calls :func:`build_config` only: it
trusts the checks the launcher ran and recorded in ``run.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

from harness.checks.built_config import check_config
from harness.checks.preflight import check_config_paths, preflight
from harness.config.titan_cli import apply_cli_overrides
from harness.options.run_options import RunOptions, apply_run_options
from recipes.registry import get_recipe


def recipe_config(opts: RunOptions):
    """The recipe's ``Trainer.Config`` with the run's deltas for resolved ``opts``, before kernel and CLI overrides."""

    return apply_run_options(get_recipe(opts.recipe).config_fn()(opts.recipe_inputs()), opts)


def finish_config(config, opts: RunOptions, cli_overrides: list[str] = ()):
    """Apply ``--override`` specs, then torchtitan's CLI overrides (``--training.steps 3``) through its own parser."""
    if opts.overrides:
        from recipes.overrides import apply_override_specs  # noqa: PLC0415 -- heavy: recipes.overrides imports torchtitan (torchtitan+torch 2.9 s); this module stays light

        apply_override_specs(config, opts.overrides)

    return apply_cli_overrides(config, cli_overrides)


def build_config(opts: RunOptions, cli_overrides: list[str] = ()):
    """The ``Trainer.Config`` every rank of the run trains: recipe, run deltas, kernel overrides, CLI overrides."""
    return finish_config(recipe_config(opts), opts, cli_overrides)


def checked_config(opts: RunOptions, cli_overrides: list[str] = ()) -> tuple[RunOptions, object]:
    """Every refusal before launch, in one order; the resolved options and the config the ranks will build.

    The options and the files they name (:func:`harness.checks.preflight.preflight`), then the
    built config against its inputs and the tier (:func:`harness.checks.built_config.check_config`:
    weights, tokenizer and sizes, checkpoint tensors, compile backend, kernel shapes).
    Each refusal is one ``RecipeError`` line naming the value and the fix.
    """
    resolved = preflight(opts)
    with without_expected_warnings():
        config = build_config(resolved, cli_overrides)
        check_config_paths(
            resolved, config
        )  # the files torchtitan options (--hf_assets_path, --dump_folder) moved to
        check_config(resolved, config)
    return resolved, config


#: torchtitan warnings (its root logger) about what the launcher builds on purpose while it checks: a default
#: ``Trainer.Config``'s checkpoint settings before the recipe sets the load path, and the state-dict adapter of a
#: one-file checkpoint (``check_checkpoint_tensors``). Above a refusal they made its one line three.
EXPECTED_WARNINGS = (
    "initial_load_model_only=True has no effect without an initial_load_path",
    "model.safetensors.index.json not found at hf_assets_path",
)


class _Expected(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(EXPECTED_WARNINGS)


@contextlib.contextmanager
def without_expected_warnings():
    """The launcher's checks without :data:`EXPECTED_WARNINGS` (the ranks still log them in their own logs)."""
    root, expected = logging.getLogger(), _Expected()
    root.addFilter(expected)
    try:
        yield
    finally:
        root.removeFilter(expected)


def as_configured(opts: RunOptions, config) -> RunOptions:
    """``opts`` with the sizes the built config really holds (after ``--training.*`` CLI overrides).

    A golden is judged on steps, seq_len, batch and seed as they reach torchtitan,
    not as the launcher's own flags said them.
    """
    training = config.training
    return dataclasses.replace(
        opts,
        steps=training.steps,
        seq_len=training.seq_len,
        local_batch_size=training.local_batch_size,
        seed=config.debug.seed,
    )

"""torchtitan ``--module`` for the harness-overhead baseline.

    torchrun ... -m torchtitan.train --module benchmarks.titan_entry --config bench_config

torchtitan's ConfigManager imports ``--module`` and calls ``--config`` with no
arguments, so the run's resolved ``RunOptions`` arrive as JSON in
``$QWEN3_BENCH_RUN_OPTIONS``. The config is exactly ``harness.config.build.build_config``
of those options: the baseline differs from ``python -m harness run`` only in
the launcher and the rank entry, which is what the overhead benchmark measures.
"""

from __future__ import annotations

import os

from benchmarks.common import OPTIONS_ENV
from harness.options.run_options import RunOptions
from recipes import platform


def run_options() -> RunOptions:
    """The resolved options the benchmark parent handed to this rank."""
    try:
        return RunOptions.from_json(os.environ[OPTIONS_ENV])
    except KeyError:
        raise RuntimeError(
            f"benchmarks.titan_entry needs ${OPTIONS_ENV} (set by `python -m benchmarks overhead`)"
        ) from None


# torchtitan.train has already imported torchtitan; install() also patches imported modules.
platform.install(run_options().tier)


def bench_config():
    """The recipe's Trainer.Config, built by the same function ``harness.rank.train`` uses."""
    from harness.config.build import build_config  # noqa: PLC0415 -- heavy: harness.config.build imports torch (torch 2.9 s); this module stays light

    return build_config(run_options())

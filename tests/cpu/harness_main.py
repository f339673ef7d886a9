"""``python -m harness``'s ``main`` called in the test's own process, as a refusal test sees it.

The same code and checks as the command line, without a fresh interpreter importing torch
and torchtitan for every case. The cpu tier's ranks start "exec" for the call, so ``main``
prestarts no harness.launch.elastic from the xdist worker (that prestart, and its cancel on a
refusal, are tests/cpu/test_rank_start.py's claim and the real-command-line cases').
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import subprocess
from unittest import mock

from recipes.tiers import CPU, TIERS


def main_in_process(argv: list[str]) -> subprocess.CompletedProcess:
    """``main(argv)``: its exit code (the CLI parser's ``SystemExit`` included), stdout and stderr."""
    from harness.__main__ import main

    stdout, stderr = io.StringIO(), io.StringIO()
    exec_tier = mock.patch.dict(TIERS, cpu=dataclasses.replace(CPU, rank_start="exec"))
    with exec_tier, contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(argv)
        except SystemExit as e:  # the CLI parser's own refusals
            code = e.code
    return subprocess.CompletedProcess(argv, code, stdout.getvalue(), stderr.getvalue())

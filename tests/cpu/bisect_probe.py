"""The checks tests/cpu/test_bisect.py bisects: they need ``qwen3probe``, a made-up package that
test builds as wheels, installed in a layered venv. Not ``test_*.py``, so the suite never collects
this file; the bisection runs it by node id, through the root conftest's ``golden`` fixture and
report plugin, as it runs the suite's real checks.
"""

import os
from pathlib import Path

import pytest

#: The goldens file is written by test_bisect (QWEN3_GOLDENS_DIR), the value recorded on qwen3probe 1.0.
GOLDEN = ("qwen3probe", "cpu", "probe_value")


def test_probe_value(golden):
    """Judges qwen3probe.VALUE as the suite judges a loss: an exact golden."""
    import qwen3probe

    golden(*GOLDEN, qwen3probe.VALUE)


def test_probe_flaky():
    """Where qwen3probe.FLAKY is set, fails on every odd-numbered run (counted in $QWEN3PROBE_RUNS)."""
    import qwen3probe

    runs = Path(os.environ["QWEN3PROBE_RUNS"])
    with runs.open("a") as f:
        f.write(f"{qwen3probe.__version__}\n")
    n = len(runs.read_text().splitlines())
    if qwen3probe.FLAKY and n % 2:
        pytest.fail(f"run {n} of the probe with qwen3probe {qwen3probe.__version__}: odd runs fail")

"""The cpu tier runs exactly what requirements-lock.txt pins."""

from __future__ import annotations

import pytest

from recipes import lockcheck

pytestmark = pytest.mark.cpu


def test_installed_packages_match_the_lock(record_property):
    problems = lockcheck.drift(lockcheck.CPU_LOCK)
    record_property("lock_drift", problems)
    assert not problems, "installed packages drifted from requirements-lock.txt (run `make venv`):\n" + "\n".join(problems)


def test_drift_names_each_package(tmp_path):
    lock = tmp_path / "requirements-lock.txt"
    lock.write_text("torch==1.0.0 \\\n    --hash=sha256:00\nno-such-package-xyz==1.2\ntransformers==5.16.0\n")
    problems = lockcheck.drift(lock)
    assert any(p.startswith("torch: pinned 1.0.0") and "installed 2.14.0" in p for p in problems), problems
    assert "no-such-package-xyz: pinned 1.2 in requirements-lock.txt, not installed" in problems
    assert not any(p.startswith("transformers") for p in problems)

"""The cpu tier runs exactly what requirements-lock.txt pins."""

from __future__ import annotations

from pathlib import Path

from harness.base import environment

ROOT = Path(__file__).resolve().parents[2]


def test_installed_packages_match_the_lock(record_property):
    problems = environment.drift(environment.CPU_LOCK)
    record_property("lock_drift", problems)
    assert not problems, (
        "installed packages drifted from requirements-lock.txt (run `make venv`):\n"
        + "\n".join(problems)
    )


def test_drift_names_each_package(tmp_path):
    lock = tmp_path / "requirements-lock.txt"
    lock.write_text(
        "torch==1.0.0 \\\n    --hash=sha256:00\nno-such-package-xyz==1.2\ntransformers==5.16.0\n"
    )
    problems = environment.drift(lock)
    assert any(p.startswith("torch: pinned 1.0.0") and "installed 2.14.0" in p for p in problems), (
        problems
    )
    assert "no-such-package-xyz: pinned 1.2 in requirements-lock.txt, not installed" in problems
    assert not any(p.startswith("transformers") for p in problems)


def test_a_shadowing_copy_on_pythonpath_is_named(tmp_path):
    """Metadata still reports the locked transformers while Python imports another one: the check says so."""
    import subprocess
    import sys

    from recipes.tiers import REPO_ROOT

    fake = tmp_path / "shadow" / "transformers"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "9.9.9"\n')
    code = "from harness.base import environment\nprint('\\n'.join(environment.drift(environment.CPU_LOCK)))"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "shadow")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("transformers:")]
    assert len(lines) == 1, out.stdout
    assert str(fake / "__init__.py") in lines[0] and "9.9.9" in lines[0], lines[0]
    assert "PYTHONPATH" in lines[0]
    assert not any(line.startswith("torch:") for line in out.stdout.splitlines()), out.stdout


def test_both_tiers_pin_a_datasets_that_has_what_the_checks_import():
    """harness.checks.inputs imports ``datasets.load.LocalDatasetModuleFactory``, which 4.0.0 introduced
    (3.6.0 has only ``LocalDatasetModuleFactoryWithScript``/``WithoutScript``): ``<4.8`` alone admitted 3.x."""
    from datasets.load import LocalDatasetModuleFactory  # noqa: F401 -- the name the pin is for
    from packaging.requirements import Requirement

    for name in ("requirements.in", "requirements-neuron.txt"):
        lines = (ROOT / name).read_text().splitlines()
        (line,) = [ln for ln in lines if ln.split("#")[0].strip().startswith("datasets")]
        spec = Requirement(line.split("#")[0].strip()).specifier
        assert not spec.contains("3.6.0"), f"{name}: {line!r} admits datasets 3.x"
        assert spec.contains("4.0.0") and spec.contains("4.7.0"), f"{name}: {line!r}"

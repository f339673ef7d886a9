"""The trn2 install as the Neuron 2.33 docs describe it, checked without a chip or a download.

requirements-neuron.txt is parsed for real; scripts/neuron_venv.sh runs its OS and
Python checks and prints its plan (--check) against fake os-release files and fake
interpreters, so nothing is created or fetched.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.platform import neuron_versions
from recipes.platform.neuron_versions import Expected, NeuronRequirementsError
from recipes.tiers import REPO_ROOT


SCRIPT = REPO_ROOT / "scripts" / "neuron_venv.sh"
DLAMI_VENV = "/opt/aws_neuronx_venv_torch_neuronx_2_14_0"


def test_expected_versions_come_from_the_real_requirements_file():
    versions = {name: e.version for name, e in neuron_versions.expected().items()}
    assert versions == {
        "torch": "2.14.0",
        "torch-neuronx": "2.14.3.0.*",
        "transformers": "5.16.0",
        "neuronx-cc": "2.28.7631.0",
        "nki": "0.7.0",
        "torchtitan": "0.2.2+neuron.1",
    }
    pins = neuron_versions.pins()
    assert "nkilib" not in pins and "torchtitan-neuron" not in pins and "torchtitan" not in pins
    assert neuron_versions.index_urls() == [
        "https://pip.repos.neuron.amazonaws.com",
        "https://download.pytorch.org/whl/cpu",
    ]


@pytest.mark.parametrize("line", ["nkilib==2.33.0", "torchtitan-neuron==0.2.2+neuron.1"])
def test_a_pin_of_a_distribution_that_does_not_exist_is_refused(tmp_path, line):
    path = tmp_path / "requirements-neuron.txt"
    path.write_text(neuron_versions.REQUIREMENTS.read_text() + line + "\n")
    with pytest.raises(NeuronRequirementsError, match=rf"{path}: pins '{line.split('==')[0]}'.*Remove the line"):
        neuron_versions.expected(path)


def test_a_missing_pin_is_named(tmp_path):
    path = tmp_path / "requirements-neuron.txt"
    path.write_text("torch==2.14.0\nnki==0.7.0\n")
    with pytest.raises(NeuronRequirementsError, match=r"no 'name==version' pin for \['torch-neuronx', 'transformers', 'neuronx-cc'\]"):
        neuron_versions.expected(path)


@pytest.mark.parametrize(
    "pin, installed, ok",
    [
        ("2.14.0", "2.14.0+cpu", True),  # the PyTorch CPU index's build
        ("2.14.0", "2.14.1", False),
        ("2.14.3.0.*", "2.14.3.0.1234", True),
        ("2.14.3.0.*", "2.14.3.0", True),
        ("2.14.3.0.*", "2.14.3.01", False),
        ("2.14.3.0.*", "2.14.30.0", False),
        ("0.2.2+neuron.1", "0.2.2+neuron.1", True),
        ("0.2.2+neuron.1", "0.2.2", False),  # upstream torchtitan 0.2.2 is not the Neuron fork
    ],
)
def test_version_matching_follows_pep440_equality(pin, installed, ok):
    assert Expected("x", pin).matches(installed) is ok


# ---------------------------------------------------------------- scripts/neuron_venv.sh


def fake_python(directory: Path, version: str) -> Path:
    """An 'interpreter' that only reports its version: enough for the script's checks."""
    directory.mkdir(parents=True, exist_ok=True)
    exe = directory / "python"
    exe.write_text(f"#!/bin/sh\necho {version}\n")
    exe.chmod(0o755)
    return exe


def os_release(tmp_path: Path, version_id: str, distro: str = "ubuntu") -> Path:
    path = tmp_path / f"os-release-{distro}-{version_id}"
    path.write_text(f'NAME="{distro}"\nID={distro}\nVERSION_ID="{version_id}"\n')
    return path


def run_script(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("NEURON_VENV", "TORCHTITAN_NEURON_URL", "TORCHTITAN_NEURON_REF")}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**base, "VENV": str(tmp_path / "venv"), **env},
    )


def test_check_prints_the_documented_install_and_changes_nothing(tmp_path):
    python = fake_python(tmp_path / "py312", "3.12")
    out = run_script(tmp_path, "--check", OS_RELEASE=str(os_release(tmp_path, "26.04")), PYTHON=str(python))
    assert out.returncode == 0, out.stderr
    venv = tmp_path / "venv"
    plan = [line[2:] for line in out.stdout.splitlines() if line.startswith("+ ")]
    assert plan == [
        f"{python} -m venv {venv}",
        f"{venv}/bin/python -m pip install --upgrade pip",
        f"{venv}/bin/python -m pip install -r {REPO_ROOT}/requirements-neuron.txt",
        f"git clone --depth 1 --branch {neuron_versions.TORCHTITAN_NEURON_REF} "
        f"{neuron_versions.TORCHTITAN_NEURON_URL} {venv}/src/torchtitan-neuron",
        f"{venv}/bin/python -m pip install -r {venv}/src/torchtitan-neuron/requirements.txt "
        f"-c {REPO_ROOT}/requirements-neuron.txt",
        f"{venv}/bin/python -m pip install -e {venv}/src/torchtitan-neuron -c {REPO_ROOT}/requirements-neuron.txt",
    ]
    assert not venv.exists()


def test_repository_and_ref_are_overridable(tmp_path):
    out = run_script(
        tmp_path, "--check",
        OS_RELEASE=str(os_release(tmp_path, "26.04")), PYTHON=str(fake_python(tmp_path / "py", "3.13")),
        TORCHTITAN_NEURON_URL="https://example.invalid/fork.git", TORCHTITAN_NEURON_REF="my-branch",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "git clone --depth 1 --branch my-branch https://example.invalid/fork.git" in out.stdout


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.15"])
def test_a_python_outside_3_12_to_3_14_is_refused(tmp_path, version):
    python = fake_python(tmp_path / "old", version)
    out = run_script(tmp_path, "--check", OS_RELEASE=str(os_release(tmp_path, "26.04")), PYTHON=str(python))
    assert out.returncode == 1
    assert f"'{python}' is Python {version}" in out.stderr
    assert "supports Python 3.12, 3.13 and 3.14" in out.stderr and "PYTHON=python3.12" in out.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("version_id", ["22.04", "24.04"])
def test_older_ubuntu_without_neuron_venv_is_sent_to_the_dlami_venv(tmp_path, version_id):
    out = run_script(
        tmp_path, "--check",
        OS_RELEASE=str(os_release(tmp_path, version_id)), PYTHON=str(fake_python(tmp_path / "py", "3.12")),
    )  # fmt: skip
    assert out.returncode == 1
    assert f"this host is 'ubuntu {version_id}'" in out.stderr
    assert "Ubuntu 26.04 only" in out.stderr and f"NEURON_VENV={DLAMI_VENV} make neuron-venv" in out.stderr


def test_neuron_venv_reuses_a_prebuilt_venv_on_older_ubuntu(tmp_path):
    dlami = tmp_path / "dlami"
    fake_python(dlami / "bin", "3.12")
    out = run_script(tmp_path, "--check", OS_RELEASE=str(os_release(tmp_path, "24.04")), NEURON_VENV=str(dlami))
    assert out.returncode == 0, out.stderr
    venv = tmp_path / "venv"
    assert f"reusing the prebuilt venv NEURON_VENV={dlami} (Python 3.12)" in out.stdout
    plan = [line[2:] for line in out.stdout.splitlines() if line.startswith("+ ")]
    assert plan[0] == f"ln -sfn {dlami} {venv}"
    assert not any("-m venv" in step or "--upgrade pip" in step for step in plan)  # the DLAMI venv is not rebuilt
    assert f"{venv}/bin/python -m pip install -r {REPO_ROOT}/requirements-neuron.txt" in plan
    assert not venv.exists()


def test_neuron_venv_with_an_old_python_or_no_python_is_refused(tmp_path):
    old = tmp_path / "old"
    fake_python(old / "bin", "3.10")
    out = run_script(tmp_path, "--check", OS_RELEASE=str(os_release(tmp_path, "24.04")), NEURON_VENV=str(old))
    assert out.returncode == 1 and "is Python 3.10" in out.stderr
    out = run_script(tmp_path, "--check", NEURON_VENV=str(tmp_path / "nowhere"))
    assert out.returncode == 1 and f"NEURON_VENV={tmp_path / 'nowhere'} has no bin/python" in out.stderr


def test_unknown_argument_is_refused(tmp_path):
    out = run_script(tmp_path, "--dry")
    assert out.returncode == 2 and "unknown argument '--dry'" in out.stderr


def test_make_targets_use_the_script_and_the_neuron_venv():
    # As a user types it: not inside `make test`'s own make (MAKELEVEL/MAKEFLAGS would add
    # "make[1]: Entering directory" and pass the outer PYTEST_ARGS along).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "PYTEST_ARGS")}
    out = subprocess.run(
        ["make", "-n", "test-neuron"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "VENV=.venv-neuron scripts/neuron_venv.sh",
        ".venv-neuron/bin/python -m pytest -m neuron -p no:xdist ",
    ]


def test_a_rerun_keeps_the_existing_venv(tmp_path):
    fake_python(tmp_path / "venv" / "bin", "3.12")
    out = run_script(
        tmp_path, "--check",
        OS_RELEASE=str(os_release(tmp_path, "26.04")), PYTHON=str(fake_python(tmp_path / "py", "3.12")),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"keeping the existing venv {tmp_path / 'venv'}" in out.stdout
    assert not any(" -m venv " in line for line in out.stdout.splitlines())


# ---------------------------------------------------------------- "not installed" messages


def test_missing_package_messages_name_the_real_distributions():
    """recipes.platform.neuron takes its package hints from recipes/platform/neuron_versions.py, not a copy."""
    from recipes.platform import neuron

    pins = neuron_versions.pins()
    assert set(neuron.NEURON_PACKAGES) == set(neuron_versions.MODULES) == {"torch_neuronx", "nkilib"}
    assert neuron.NEURON_PACKAGES["torch_neuronx"].startswith(f"torch-neuronx=={pins['torch-neuronx']}: ")
    nkilib = neuron.NEURON_PACKAGES["nkilib"]
    assert f"NKI Library {neuron_versions.NKILIB_VERSION}" in nkilib
    assert f"bundled in neuronx-cc=={pins['neuronx-cc']}" in nkilib and "no distribution of its own" in nkilib
    assert "nkilib==" not in nkilib


# ---------------------------------------------------------------- README.md names only what exists

README = REPO_ROOT / "README.md"
#: The trn2 tier's switches, each of which README must document.
TRN2_ENV = {"QWEN3_4B_DIR", "QWEN3_DATASET_DIR", "QWEN3_REQUIRE_TRN2", "NEURON_VENV"}
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*(?![\w.-])")  # not torchtitan's --training.steps


def readme_commands(marker: str) -> list[str]:
    """The rest of every README line (backslash continuations joined) after ``marker``, to a backtick or #."""
    text = README.read_text().replace("\\\n", " ")
    return [re.split(r"[`#]", line.split(marker, 1)[1])[0] for line in text.splitlines() if marker in line]


def help_text(*argv: str) -> str:
    out = subprocess.run([sys.executable, *argv, "--help"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_every_make_target_in_the_readme_exists():
    named = set(re.findall(r"\bmake ([a-z][a-z0-9-]*)", README.read_text()))
    targets = set(re.findall(r"^([a-z][a-z0-9-]*)\s*:(?!=)", (REPO_ROOT / "Makefile").read_text(), re.M))
    assert {"neuron-venv", "test-neuron"} <= named
    assert named <= targets, f"README names make targets the Makefile lacks: {sorted(named - targets)}"


def test_every_environment_variable_in_the_readme_is_read_by_the_suite():
    """Each QWEN3_* / NEURON_* name in README is a string in recipes/, a conftest or tests/neuron/requires.py, or $NAME in scripts/."""
    named = set(re.findall(r"\b((?:QWEN3|NEURON)_[A-Z0-9_]+)\b", README.read_text()))
    assert TRN2_ENV <= named, f"README does not document {sorted(TRN2_ENV - named)}"
    python = [*(REPO_ROOT / "recipes").rglob("*.py"), REPO_ROOT / "conftest.py", REPO_ROOT / "tests/neuron/conftest.py",
              REPO_ROOT / "tests/neuron/requires.py"]  # fmt: skip
    python_text = "\n".join(path.read_text() for path in python)
    shell_text = "\n".join(path.read_text() for path in (REPO_ROOT / "scripts").glob("*.sh"))
    unread = sorted(
        name for name in named
        if not re.search(rf"[\"']{name}[\"']", python_text) and not re.search(rf"\$\{{?{name}\b", shell_text)
    )  # fmt: skip
    assert not unread, f"README names environment variables nothing reads: {unread}"


def test_readme_dlami_venv_is_the_one_the_script_and_nightly_use():
    import yaml

    assert set(re.findall(r"NEURON_VENV=(\S+)", README.read_text())) == {DLAMI_VENV}
    assert f"DLAMI_VENV={DLAMI_VENV}\n" in SCRIPT.read_text()
    nightly = yaml.safe_load((REPO_ROOT / ".github/workflows/nightly-trn2.yml").read_text())
    assert nightly["jobs"]["neuron"]["env"]["NEURON_VENV"] == DLAMI_VENV


def test_readme_command_lines_use_only_real_subcommands_and_flags():
    script = SCRIPT.read_text()
    for rest in readme_commands("scripts/neuron_venv.sh"):
        for flag in _FLAG.findall(rest):
            assert f"{flag})" in script, f"README: scripts/neuron_venv.sh {flag}: the script has no such option"
    ci_uses = readme_commands("harness.ci ")
    assert any(rest.startswith("require-claims") for rest in ci_uses)
    for rest in ci_uses:
        command = rest.split()[0]
        text = help_text("-m", "harness.ci", command)
        missing = [flag for flag in _FLAG.findall(rest) if flag not in text]
        assert not missing, f"README: harness.ci {command} {missing}: not options of that command"
    for marker, argv in (("python -m harness run", ("-m", "harness", "run")), ("-m harness.train", ("-m", "harness.train"))):
        uses = readme_commands(marker)
        assert uses, marker
        text = help_text(*argv)
        missing = sorted({flag for rest in uses for flag in _FLAG.findall(rest)} - set(_FLAG.findall(text)))
        assert not missing, f"README: `{marker}` with {missing}: not options of it"
    assert any("all --tier trn2 --dry-run" in rest for rest in readme_commands("python -m harness run"))

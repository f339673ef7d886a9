"""The trn2 install as the Neuron 2.33 docs describe it, checked without a chip or a download.

requirements-neuron.txt is parsed for real; scripts/neuron_venv.sh runs its OS and
Python checks and prints its plan (--check) against fake os-release files and fake
interpreters, so nothing is created or fetched.
"""

from __future__ import annotations

import json
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
    with pytest.raises(
        NeuronRequirementsError, match=rf"{path}: pins '{line.split('==')[0]}'.*Remove the line"
    ):
        neuron_versions.expected(path)


def test_a_missing_pin_is_named(tmp_path):
    path = tmp_path / "requirements-neuron.txt"
    path.write_text("torch==2.14.0\nnki==0.7.0\n")
    with pytest.raises(
        NeuronRequirementsError,
        match=r"no 'name==version' pin for \['torch-neuronx', 'transformers', 'neuronx-cc'\]",
    ):
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

#: What `git ls-remote --heads --tags` prints for the fake remote: release-2.33 is a branch.
BRANCH_SHA, TAG_SHA, PEELED_SHA = "1" * 40, "2" * 40, "3" * 40
REMOTE_REFS = {
    "refs/heads/main": "a" * 40,
    "refs/heads/release-2.32": "b" * 40,
    "refs/heads/release-2.33": BRANCH_SHA,
    "refs/tags/v0.2.2-neuron.1": TAG_SHA,
    "refs/tags/v0.2.2-neuron.1^{}": PEELED_SHA,
}

#: A `git` that only records how it was called and answers ls-remote: the script's commands are observed,
#: nothing is fetched. Any other git command is refused, so a plan step that would run one shows up.
FAKE_GIT = """#!/bin/sh
printf '%s\\n' "$*" >> "$FAKE_GIT_LOG"
case "$1" in
  ls-remote) [ -n "$FAKE_GIT_FAIL" ] && { echo "fatal: unable to access remote" >&2; exit 128; }
             cat "$FAKE_GIT_REFS" ;;
  *) echo "fake git: unexpected command: $*" >&2; exit 3 ;;
esac
"""


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


def fake_git(tmp_path: Path, refs: dict[str, str] = REMOTE_REFS) -> dict[str, str]:
    """PATH and files for the fake git; returns the environment entries to pass."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    git = bin_dir / "git"
    git.write_text(FAKE_GIT)
    git.chmod(0o755)
    refs_file = tmp_path / "remote-refs"
    refs_file.write_text("".join(f"{sha}\t{ref}\n" for ref, sha in refs.items()))
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_GIT_LOG": str(tmp_path / "git.log"),
        "FAKE_GIT_REFS": str(refs_file),
    }


def git_calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "git.log"
    return log.read_text().splitlines() if log.exists() else []


def run_script(
    tmp_path: Path, *args: str, refs: dict[str, str] = REMOTE_REFS, **env: str
) -> subprocess.CompletedProcess:
    base = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "NEURON_VENV",
            "TORCHTITAN_NEURON_URL",
            "TORCHTITAN_NEURON_REF",
            "REHEARSAL_PYTHON_FLOOR",
        )
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**base, "VENV": str(tmp_path / "venv"), **fake_git(tmp_path, refs), **env},
    )


def plan_of(out: subprocess.CompletedProcess) -> list[str]:
    return [line[2:] for line in out.stdout.splitlines() if line.startswith("+ ")]


def test_check_prints_the_documented_install_and_changes_nothing(tmp_path):
    python = fake_python(tmp_path / "py312", "3.12")
    out = run_script(
        tmp_path, "--check", OS_RELEASE=str(os_release(tmp_path, "26.04")), PYTHON=str(python)
    )
    assert out.returncode == 0, out.stderr
    venv = tmp_path / "venv"
    assert plan_of(out) == [
        f"git ls-remote --heads --tags {neuron_versions.TORCHTITAN_NEURON_URL}",
        f"{python} -m venv {venv}",
        f"{venv}/bin/python -m pip install --upgrade pip",
        f"{venv}/bin/python -m pip install -r {REPO_ROOT}/requirements-neuron.txt",
        f"git clone --depth 1 --branch {neuron_versions.TORCHTITAN_NEURON_REF} "
        f"{neuron_versions.TORCHTITAN_NEURON_URL} {venv}/src/torchtitan-neuron",
        f"{venv}/bin/python -m pip install -r {venv}/src/torchtitan-neuron/requirements.txt "
        f"-c {REPO_ROOT}/requirements-neuron.txt",
        f"{venv}/bin/python -m pip install -e {venv}/src/torchtitan-neuron -c {REPO_ROOT}/requirements-neuron.txt",
    ]
    assert (
        f"TorchTitan Neuron: branch release-2.33 at {BRANCH_SHA} ({neuron_versions.TORCHTITAN_NEURON_URL})"
        in out.stdout
    )
    assert (
        f"would record release-2.33 (branch) and the checked-out commit in {venv}/torchtitan-neuron.json"
        in out.stdout
    )
    assert git_calls(tmp_path) == [
        f"ls-remote --heads --tags {neuron_versions.TORCHTITAN_NEURON_URL}"
    ]
    assert not venv.exists()


def test_a_release_tag_is_found_and_named_by_its_commit(tmp_path):
    out = run_script(
        tmp_path,
        "--check",
        OS_RELEASE=str(os_release(tmp_path, "26.04")),
        PYTHON=str(fake_python(tmp_path / "py", "3.12")),
        TORCHTITAN_NEURON_REF="v0.2.2-neuron.1",
    )
    assert out.returncode == 0, out.stderr
    assert (
        f"TorchTitan Neuron: tag v0.2.2-neuron.1 at {PEELED_SHA}" in out.stdout
    )  # the commit, not the tag object
    assert "git clone --depth 1 --branch v0.2.2-neuron.1 " in out.stdout


def test_a_missing_release_ref_is_refused_naming_what_exists_and_nothing_falls_back(tmp_path):
    refs = {k: v for k, v in REMOTE_REFS.items() if "release-2.33" not in k}
    out = run_script(
        tmp_path,
        "--check",
        refs=refs,
        OS_RELEASE=str(os_release(tmp_path, "26.04")),
        PYTHON=str(fake_python(tmp_path / "py", "3.12")),
    )
    assert out.returncode == 1
    assert (
        f"{neuron_versions.TORCHTITAN_NEURON_URL} has no branch or tag 'release-2.33'" in out.stderr
    )
    assert "it has: branch main, branch release-2.32)" in out.stderr
    assert "Set TORCHTITAN_NEURON_REF to one that exists" in out.stderr
    assert not any(step.startswith(("git clone", "git -C")) for step in plan_of(out))
    assert git_calls(tmp_path) == [
        f"ls-remote --heads --tags {neuron_versions.TORCHTITAN_NEURON_URL}"
    ]


def test_a_ref_that_is_both_a_branch_and_a_tag_is_refused(tmp_path):
    out = run_script(
        tmp_path,
        "--check",
        refs={**REMOTE_REFS, "refs/tags/release-2.33": TAG_SHA},
        OS_RELEASE=str(os_release(tmp_path, "26.04")),
        PYTHON=str(fake_python(tmp_path / "py", "3.12")),
    )
    assert out.returncode == 1 and "has both a branch and a tag named 'release-2.33'" in out.stderr


def test_an_unreachable_remote_is_refused(tmp_path):
    out = run_script(
        tmp_path,
        "--check",
        FAKE_GIT_FAIL="1",
        OS_RELEASE=str(os_release(tmp_path, "26.04")),
        PYTHON=str(fake_python(tmp_path / "py", "3.12")),
    )
    assert (
        out.returncode == 1
        and "git ls-remote https://github.com/aws-neuron/torchtitan-neuron.git failed" in out.stderr
    )


def test_repository_and_ref_are_overridable(tmp_path):
    out = run_script(
        tmp_path,
        "--check",
        OS_RELEASE=str(os_release(tmp_path, "26.04")),
        PYTHON=str(fake_python(tmp_path / "py", "3.13")),
        TORCHTITAN_NEURON_URL="https://example.invalid/fork.git",
        TORCHTITAN_NEURON_REF="main",
    )
    assert out.returncode == 0, out.stderr
    assert git_calls(tmp_path) == ["ls-remote --heads --tags https://example.invalid/fork.git"]
    assert "git clone --depth 1 --branch main https://example.invalid/fork.git" in out.stdout


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.15"])
def test_a_python_outside_3_12_to_3_14_is_refused(tmp_path, version):
    python = fake_python(tmp_path / "old", version)
    out = run_script(
        tmp_path, "--check", OS_RELEASE=str(os_release(tmp_path, "26.04")), PYTHON=str(python)
    )
    assert out.returncode == 1
    assert f"'{python}' is Python {version}" in out.stderr
    assert "supports Python 3.12, 3.13 and 3.14" in out.stderr and "PYTHON=python3.12" in out.stderr
    assert not (tmp_path / "venv").exists()


def test_the_rehearsal_lowers_only_the_python_floor_by_name_and_says_so(tmp_path):
    """make rehearse-trn2 runs the install with the cpu venv's 3.11: that floor, and nothing else, moves."""
    release = str(os_release(tmp_path, "26.04"))
    out = run_script(
        tmp_path,
        "--check",
        OS_RELEASE=release,
        PYTHON=str(fake_python(tmp_path / "py311", "3.11")),
        REHEARSAL_PYTHON_FLOOR="3.11",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "rehearsal: Python floor 3.12 overridden to 3.11"
    for version in ("3.10", "3.15"):  # below the lowered floor, above the ceiling: still refused
        out = run_script(
            tmp_path,
            "--check",
            OS_RELEASE=release,
            PYTHON=str(fake_python(tmp_path / version, version)),
            REHEARSAL_PYTHON_FLOOR="3.11",
        )
        assert out.returncode == 1 and f"is Python {version}" in out.stderr
    out = run_script(
        tmp_path,
        "--check",
        OS_RELEASE=release,
        PYTHON=str(fake_python(tmp_path / "py", "3.12")),
        REHEARSAL_PYTHON_FLOOR="eleven",
    )
    assert (
        out.returncode == 1
        and "REHEARSAL_PYTHON_FLOOR='eleven' is not a Python 3.N version" in out.stderr
    )


@pytest.mark.parametrize("version_id", ["22.04", "24.04"])
def test_older_ubuntu_without_neuron_venv_is_sent_to_the_dlami_venv(tmp_path, version_id):
    out = run_script(
        tmp_path,
        "--check",
        OS_RELEASE=str(os_release(tmp_path, version_id)),
        PYTHON=str(fake_python(tmp_path / "py", "3.12")),
    )
    assert out.returncode == 1
    assert f"this host is 'ubuntu {version_id}'" in out.stderr
    assert (
        "Ubuntu 26.04 only" in out.stderr
        and f"NEURON_VENV={DLAMI_VENV} make neuron-venv" in out.stderr
    )


def test_neuron_venv_is_layered_on_never_installed_into(tmp_path):
    dlami = tmp_path / "dlami"
    fake_python(dlami / "bin", "3.12")
    (dlami / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
    out = run_script(
        tmp_path, "--check", OS_RELEASE=str(os_release(tmp_path, "24.04")), NEURON_VENV=str(dlami)
    )
    assert out.returncode == 0, out.stderr
    venv = tmp_path / "venv"
    assert (
        f"layering {venv} on the prebuilt venv NEURON_VENV={dlami} (Python 3.12); nothing is installed into it"
        in out.stdout
    )
    plan = plan_of(out)
    assert plan[1:3] == [
        f"{dlami}/bin/python -m venv --system-site-packages {venv}",
        f"echo \"import site; site.addsitedir('{dlami}/lib/python3.12/site-packages')\" > "
        f"{venv}/lib/python3.12/site-packages/_neuron_venv_base.pth",
    ]
    installs = [step for step in plan if " -m pip " in step]
    assert installs and all(step.startswith(f"{venv}/bin/python -m pip ") for step in installs)
    assert not any(str(dlami) in step for step in installs + plan[3:]), (
        "nothing runs pip in, or writes to, NEURON_VENV"
    )
    assert not any(step.startswith("ln ") for step in plan)
    assert not venv.exists()


def test_a_venv_that_links_to_the_shared_venv_is_refused(tmp_path):
    """An older neuron_venv.sh made .venv-neuron a link to NEURON_VENV and pip-installed into it."""
    dlami = tmp_path / "dlami"
    fake_python(dlami / "bin", "3.12")
    (tmp_path / "venv").symlink_to(dlami)
    out = run_script(
        tmp_path, "--check", OS_RELEASE=str(os_release(tmp_path, "24.04")), NEURON_VENV=str(dlami)
    )
    assert out.returncode == 1
    assert (
        f"{tmp_path / 'venv'} is a link to {dlami}" in out.stderr
        and f"rm {tmp_path / 'venv'}" in out.stderr
    )


@pytest.mark.slow
def test_the_layered_venv_sees_the_prebuilt_packages_first_its_own(tmp_path):
    """The layering step for real (no pip install): a venv made by the script's layer_venv imports the base's module,
    its own site-packages come first, and the base venv is left untouched. A plain --system-site-packages venv
    made from the base venv's python does not see the base venv's packages (why the .pth line exists)."""
    base = tmp_path / "base"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(base)], check=True, timeout=120
    )
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    base_site = base / "lib" / f"python{version}" / "site-packages"
    (base_site / "dlami_marker.py").write_text("WHERE = 'base'\n")
    before = sorted(p.name for p in base_site.iterdir())

    plain = tmp_path / "plain"
    subprocess.run(
        [
            str(base / "bin" / "python"),
            "-m",
            "venv",
            "--without-pip",
            "--system-site-packages",
            str(plain),
        ],
        check=True,
        timeout=120,
    )
    seen = subprocess.run(
        [str(plain / "bin" / "python"), "-c", "import dlami_marker"],
        capture_output=True,
        timeout=60,
    )
    assert seen.returncode != 0, (
        "a plain --system-site-packages venv sees the base interpreter's packages only"
    )

    venv = tmp_path / "venv"
    out = subprocess.run(
        ["bash", "-c", f'source "{SCRIPT}"; VENV="{venv}"; layer_venv "{base}" "{version}"'],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    probe = "import dlami_marker, sys, json; print(json.dumps([dlami_marker.WHERE, sys.path]))"
    where, path = json.loads(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )
    own_site = str(venv / "lib" / f"python{version}" / "site-packages")
    assert where == "base"
    assert path.index(own_site) < path.index(str(base_site))
    assert sorted(p.name for p in base_site.iterdir()) == before


def test_unknown_argument_is_refused(tmp_path):
    out = run_script(tmp_path, "--dry")
    assert out.returncode == 2 and "unknown argument '--dry'" in out.stderr


def test_make_targets_use_the_script_and_the_neuron_venv():
    # As a user types it: not inside `make test`'s own make (MAKELEVEL/MAKEFLAGS would add
    # "make[1]: Entering directory" and pass the outer PYTEST_ARGS along).
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "PYTEST_ARGS")
    }
    out = subprocess.run(
        ["make", "-n", "test-neuron"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "VENV=.venv-neuron scripts/neuron_venv.sh",
        ".venv-neuron/bin/python -m pytest -m neuron -p no:xdist ",
    ]


def test_a_rerun_keeps_the_existing_venv(tmp_path):
    fake_python(tmp_path / "venv" / "bin", "3.12")
    out = run_script(
        tmp_path,
        "--check",
        OS_RELEASE=str(os_release(tmp_path, "26.04")),
        PYTHON=str(fake_python(tmp_path / "py", "3.12")),
    )
    assert out.returncode == 0, out.stderr
    assert f"keeping the existing venv {tmp_path / 'venv'}" in out.stdout
    assert not any(" -m venv " in line for line in out.stdout.splitlines())


# ---------------------------------------------------------------- "not installed" messages


def test_missing_package_messages_name_the_real_distributions():
    """recipes.platform.neuron takes its package hints from recipes/platform/neuron_versions.py, not a copy."""
    from recipes.platform import neuron

    pins = neuron_versions.pins()
    assert (
        set(neuron.NEURON_PACKAGES) == set(neuron_versions.MODULES) == {"torch_neuronx", "nkilib"}
    )
    assert neuron.NEURON_PACKAGES["torch_neuronx"].startswith(
        f"torch-neuronx=={pins['torch-neuronx']}: "
    )
    nkilib = neuron.NEURON_PACKAGES["nkilib"]
    assert f"NKI Library {neuron_versions.NKILIB_VERSION}" in nkilib
    assert (
        f"bundled in neuronx-cc=={pins['neuronx-cc']}" in nkilib
        and "no distribution of its own" in nkilib
    )
    assert "nkilib==" not in nkilib


# ---------------------------------------------------------------- README.md names only what exists

README = REPO_ROOT / "README.md"
#: The trn2 tier's switches, each of which README must document.
TRN2_ENV = {"QWEN3_4B_DIR", "QWEN3_DATASET_DIR", "QWEN3_REQUIRE_TRN2", "NEURON_VENV"}
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*(?![\w.-])")  # not torchtitan's --training.steps


def readme_commands(marker: str) -> list[str]:
    """The rest of every README line (backslash continuations joined) after ``marker``, to a backtick or #."""
    text = README.read_text().replace("\\\n", " ")
    return [
        re.split(r"[`#]", line.split(marker, 1)[1])[0]
        for line in text.splitlines()
        if marker in line
    ]


def help_text(*argv: str) -> str:
    out = subprocess.run(
        [sys.executable, *argv, "--help"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_every_make_target_in_the_readme_exists():
    named = set(re.findall(r"\bmake ([a-z][a-z0-9-]*)", README.read_text()))
    targets = set(
        re.findall(r"^([a-z][a-z0-9-]*)\s*:(?!=)", (REPO_ROOT / "Makefile").read_text(), re.M)
    )
    assert {"neuron-venv", "test-neuron"} <= named
    assert named <= targets, (
        f"README names make targets the Makefile lacks: {sorted(named - targets)}"
    )


def test_every_environment_variable_in_the_readme_is_read_by_the_suite():
    """Each QWEN3_* / NEURON_* name in README is a string in recipes/, harness/, rehearsal/ (a stand-in switch),
    a conftest or tests/neuron/requires.py, or $NAME in scripts/."""
    named = set(re.findall(r"\b((?:QWEN3|NEURON)_[A-Z0-9_]+)\b", README.read_text()))
    assert TRN2_ENV <= named, f"README does not document {sorted(TRN2_ENV - named)}"
    python = [
        *(REPO_ROOT / "recipes").rglob("*.py"),
        *(REPO_ROOT / "harness").rglob("*.py"),
        *(REPO_ROOT / "rehearsal").rglob("*.py"),
        REPO_ROOT / "conftest.py",
        REPO_ROOT / "tests/neuron/conftest.py",
        REPO_ROOT / "tests/neuron/requires.py",
    ]
    python_text = "\n".join(path.read_text() for path in python)
    shell_text = "\n".join(path.read_text() for path in (REPO_ROOT / "scripts").glob("*.sh"))
    unread = sorted(
        name
        for name in named
        if not re.search(rf"[\"']{name}[\"']", python_text)
        and not re.search(rf"\$\{{?{name}\b", shell_text)
    )
    assert not unread, f"README names environment variables nothing reads: {unread}"


def test_readme_dlami_venv_is_the_one_the_script_and_nightly_use():
    import yaml

    assert set(re.findall(r"NEURON_VENV=(\S+)", README.read_text())) == {DLAMI_VENV}
    assert f"DLAMI_VENV={DLAMI_VENV}\n" in SCRIPT.read_text()
    nightly = yaml.safe_load((REPO_ROOT / ".github/workflows/nightly-trn2.yml").read_text())
    assert nightly["jobs"]["neuron"]["env"]["NEURON_VENV"] == DLAMI_VENV


@pytest.mark.slow
def test_readme_command_lines_use_only_real_subcommands_and_flags():
    script = SCRIPT.read_text()
    for rest in readme_commands("scripts/neuron_venv.sh"):
        for flag in _FLAG.findall(rest):
            assert f"{flag})" in script, (
                f"README: scripts/neuron_venv.sh {flag}: the script has no such option"
            )
    ci_uses = readme_commands("harness.night.ci ")
    assert any(rest.startswith("require-claims") for rest in ci_uses)
    for rest in ci_uses:
        command = rest.split()[0]
        text = help_text("-m", "harness.night.ci", command)
        missing = [flag for flag in _FLAG.findall(rest) if flag not in text]
        assert not missing, (
            f"README: harness.night.ci {command} {missing}: not options of that command"
        )
    for marker, argv in (
        ("python -m harness run", ("-m", "harness", "run")),
        ("-m harness.rank.train", ("-m", "harness.rank.train")),
    ):
        uses = readme_commands(marker)
        assert uses, marker
        text = help_text(*argv)
        missing = sorted(
            {flag for rest in uses for flag in _FLAG.findall(rest)} - set(_FLAG.findall(text))
        )
        assert not missing, f"README: `{marker}` with {missing}: not options of it"
    assert any(
        "all --tier trn2 --dry-run" in rest for rest in readme_commands("python -m harness run")
    )

"""The rehearsal's machine: what a trn2 runner would supply, in a scratch dir, and the tree it rehearses.

:data:`RUNNER` is the one table of what a real runner would supply: the ``${{ github.* }}`` values, the
absolute paths of the job's env and steps mapped into the scratch dir, and the machine's environment (HOME,
TMPDIR, caches and pip inside the scratch dir; pip offline from the stand-in wheelhouse; the fork from a local
git repository). :func:`prepare` builds it (the stand-in neuron venv, weights, the stand-ins' settings and
their fake device nodes); :func:`working_tree` and :func:`checkout` give the steps the source checkout's
working tree as it is. rehearsal/night.py runs the night on it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rehearsal import fork, wheels
from rehearsal import settings as seam
from rehearsal.workflow import (
    Context,
    JobRun,
)

SOURCE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class RunnerTable:
    """What the self-hosted trn2 runner supplies, with ``{scratch}``, ``{standins}``, ``{fork_url}`` filled in."""

    github: dict[str, str]
    #: Absolute path on the runner -> path relative to the scratch dir (its stand-in).
    paths: dict[str, str]
    #: The runner machine's environment for every step (before the job's own env).
    env: dict[str, str]
    #: rehearsal/settings.py RehearsalSettings fields (the stand-ins' seam): fake devices, ranks, sizes.
    settings: dict


RUNNER = RunnerTable(
    github={
        "workspace": "{scratch}/workspace",
        "run_number": "1",
        "run_id": "1000001",
        "token": "rehearsal-token-reaches-nothing",
        "repository": "rehearsal/qwen3-trn-repro",
    },
    paths={
        "/opt/models/Qwen3-4B-Instruct-2507": "opt/models/Qwen3-4B-Instruct-2507",  # standin_weights()
        "/opt/datasets/c4_test": "opt/datasets/c4_test",  # copy of fixtures/corpus
        "/opt/aws_neuronx_venv_torch_neuronx_2_14_0": "opt/aws_neuronx_venv_torch_neuronx_2_14_0",  # stand-in venv
        "/opt/neuron-cache/neff": "opt/neuron-cache/neff",
        "/opt/qwen3-trn-repro/trend.jsonl": "opt/qwen3-trn-repro/trend.jsonl",
        "/opt/qwen3-trn-repro/venv-neuron": "opt/qwen3-trn-repro/venv-neuron",  # the suite's trn2 venv, kept across nights
    },
    env={
        "PATH": "{standins}/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": "{scratch}/home",
        "TMPDIR": "{scratch}/tmp",
        "XDG_CACHE_HOME": "{scratch}/home/.cache",
        "PIP_CACHE_DIR": "{scratch}/home/.cache/pip",
        "RUNNER_TEMP": "{scratch}/runner-temp",
        "LANG": "C.UTF-8",
        "CI": "true",
        "GITHUB_ACTIONS": "true",
        "RUNNER_OS": "Linux",
        "GITHUB_RUN_ID": "1000001",
        "GITHUB_RUN_NUMBER": "1",
        "GITHUB_REPOSITORY": "rehearsal/qwen3-trn-repro",
        # pip offline: the stand-in wheelhouse, and the cpu venv's setuptools repacked (rehearsal/wheels.py:
        # Python 3.11's venv seeds setuptools 65.5, torch 2.14.0 needs >=77.0.3; a 3.12 venv seeds none).
        # The fork's editable install builds with that setuptools (no build isolation: no index to fill one).
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": "{standins}/wheelhouse {scratch}/wheelhouse-cpu",
        "PIP_NO_BUILD_ISOLATION": "0",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "TORCHTITAN_NEURON_URL": "{fork_url}",
        # The one check overridden, by name (scripts/neuron_venv.sh prints it when used).
        "REHEARSAL_PYTHON_FLOOR": "{python_floor}",
    },
    settings={
        "device_dir": "{scratch}/dev",
        "neuron_devices": 1,
        "cores_per_device": 2,
        "lnc": 2,
        "ranks": 2,
    },
)


class RehearsalError(RuntimeError):
    """The rehearsal cannot start or wrote outside its scratch dir."""


def fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


def check_standins(standins: Path) -> None:
    wheels = sorted((standins / "wheelhouse").glob("*.whl"))
    if not wheels or not os.access(standins / "bin" / "neuron-ls", os.X_OK):
        raise RehearsalError(
            f"rehearsal: --standins {standins} has no wheelhouse/*.whl or no executable bin/neuron-ls; "
            "build it with `python -m rehearsal.standins build --out DIR` (branch i34standins)"
        )


def run(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
    out = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RehearsalError(
            f"rehearsal: {' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()[-2000:]}"
        )


def cpu_site_packages() -> Path:
    """The source checkout's .venv site-packages (torch, torchtitan 0.3.0, transformers), resolved."""
    venv = (SOURCE / ".venv").resolve()
    found = sorted(venv.glob("lib/python3.*/site-packages"))
    if not found:
        raise RehearsalError(
            f"rehearsal: {SOURCE / '.venv'} has no lib/python3.*/site-packages; run `make venv` first"
        )
    return found[0]


def standin_neuron_venv(path: Path, standins: Path, env: dict[str, str]) -> None:
    """The DLAMI venv's stand-in: the cpu venv's packages (a .pth) plus the stand-in wheels, installed offline."""
    run([str(SOURCE / ".venv/bin/python"), "-m", "venv", "--system-site-packages", str(path)], env)
    site = next(path.glob("lib/python3.*/site-packages"))
    (site / "_rehearsal_cpu_venv.pth").write_text(
        f"import site; site.addsitedir({str(cpu_site_packages())!r})\n"
    )
    wheels = [str(w) for w in sorted((standins / "wheelhouse").glob("*.whl"))]
    run(
        [
            str(path / "bin/python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--find-links",
            str(standins / "wheelhouse"),
            *wheels,
        ],
        env,
    )


def standin_weights(dest: Path) -> None:
    """Qwen3-4B-Instruct-2507's stand-in: fixtures/qwen3-tiny, its config.json's RoPE theta set to the real
    model's (fixtures/qwen3-4b-instruct-2507/config.json: 5e6; the tiny model was trained at 1e6).

    Config 2's "4B" flavor builds theta 1e6 whatever the weights say; config.json's differing theta is
    the suspect the night's theta lanes measure, so the stand-in must differ where the real weights do.
    The weights themselves stay the tiny model's: every lane and its reference read the same config.json."""
    shutil.copytree(SOURCE / "fixtures/qwen3-tiny", dest)
    real = json.loads((SOURCE / "fixtures/qwen3-4b-instruct-2507/config.json").read_text())
    config = json.loads((dest / "config.json").read_text())
    config["rope_parameters"]["rope_theta"] = float(real["rope_theta"])
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def seam_env(scratch: Path, values: dict[str, str], switches: dict[str, str]) -> dict[str, str]:
    """RUNNER.settings written for rehearsal/settings.py, loaded back through it; the variables it exports."""
    path = scratch / "rehearsal-settings.json"
    data = {k: fill(v, values) if isinstance(v, str) else v for k, v in RUNNER.settings.items()}
    path.write_text(
        json.dumps({**data, "switches": {**seam.SWITCHES, **switches}}, indent=1) + "\n"
    )
    settings = seam.load(path)
    settings.device_nodes()  # the fake nodes exist from the start, as a host's devices do (the runtime opens them)
    return {seam.SETTINGS_ENV: str(path), **settings.env()}


def prepare(
    scratch: Path, standins: Path, python_floor: str, switches: dict[str, str]
) -> tuple[Context, dict]:
    """The scratch dir as a runner's machine would have it before the job; returns the table filled in."""
    fork_url = fork.build(scratch / "git/torchtitan-neuron", SOURCE / "fixtures")
    wheels.repack("setuptools", scratch / "wheelhouse-cpu")
    values = {
        "scratch": str(scratch),
        "standins": str(standins.resolve()),
        "fork_url": fork_url,
        "python_floor": python_floor,
    }
    env = {k: fill(v, values) for k, v in RUNNER.env.items()}
    env.update(seam_env(scratch, values, switches))
    if shutil.which("gh", path=env["PATH"]):
        raise RehearsalError(
            f"rehearsal: `gh` is on the rehearsal's PATH ({shutil.which('gh', path=env['PATH'])}); "
            "it would reach GitHub: remove it from PATH in rehearsal/night.py RUNNER"
        )
    for key in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "PIP_CACHE_DIR", "RUNNER_TEMP"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    paths = {real: scratch / rel for real, rel in RUNNER.paths.items()}
    standin_weights(paths["/opt/models/Qwen3-4B-Instruct-2507"])
    shutil.copytree(SOURCE / "fixtures/corpus", paths["/opt/datasets/c4_test"])
    paths["/opt/neuron-cache/neff"].mkdir(parents=True)
    paths["/opt/qwen3-trn-repro/trend.jsonl"].parent.mkdir(parents=True)
    standin_neuron_venv(paths["/opt/aws_neuronx_venv_torch_neuronx_2_14_0"], standins, env)
    github = {k: fill(v, values) for k, v in RUNNER.github.items()}
    return Context(github=github, paths=paths), env


@dataclass(frozen=True)
class Tree:
    """What a rehearsal checks out: the source checkout's working tree as it is, as one commit."""

    commit: str
    head: str
    #: Files the commit holds differently from HEAD (modified, staged, deleted, untracked): rehearsed uncommitted.
    uncommitted: tuple[str, ...]
    #: Of those, the untracked ones (not ignored), added on top of ``git stash create``'s commit.
    untracked: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        if self.commit == self.head:
            return [f"rehearsal: rehearses HEAD {self.head} (the working tree is clean)"]
        how = "git stash create" + (", plus its untracked files" if self.untracked else "")
        return [
            f"rehearsal: rehearses the working tree as commit {self.commit} ({how}, on HEAD {self.head}); "
            f"{len(self.uncommitted)} uncommitted file(s): {', '.join(self.uncommitted)}"
        ]


def working_tree(source: Path = SOURCE) -> Tree:
    """``git stash create`` in ``source``: a commit object of its tracked files as they are (HEAD when clean);
    untracked files that are not ignored (which it leaves out) are added in a commit on top of it, through a
    temporary index. Objects only: no ref, no stash entry, the working tree and its index untouched."""

    def git(*argv: str, env: dict[str, str] | None = None) -> str:
        out = subprocess.run(
            ["git", "-c", "user.name=rehearsal", "-c", "user.email=rehearsal@localhost"]
            + ["-C", str(source), *argv],
            capture_output=True,
            text=True,
            env=env,
        )
        if out.returncode:
            raise RehearsalError(
                f"rehearsal: git {' '.join(argv)} in {source} failed: {out.stderr.strip()}"
            )
        return out.stdout

    head = git("rev-parse", "HEAD").strip()
    commit = git("stash", "create", "rehearsal: the working tree").strip() or head
    untracked = git("ls-files", "-z", "--others", "--exclude-standard").split("\0")
    untracked = [u for u in untracked if u]
    if untracked:
        with tempfile.TemporaryDirectory(prefix="rehearsal-index-") as tmp:
            env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
            git("read-tree", commit, env=env)
            git("add", "--", *untracked, env=env)
            tree = git("write-tree", env=env).strip()
            commit = git(
                "commit-tree", tree, "-p", commit, "-m", "rehearsal: untracked files", env=env
            ).strip()
    changed = git("diff", "--name-only", head, commit).split() if commit != head else []
    return Tree(commit, head, tuple(changed), tuple(untracked))


def checkout(tree: Tree, source: Path = SOURCE):
    """actions/checkout of ``tree``: a clone of the source checkout, then its commit fetched by id (a stash
    commit is on no branch) and checked out detached."""

    def action(with_: dict, job: JobRun, out) -> int:
        for argv in (
            ["git", "clone", "--quiet", "--no-hardlinks", str(source), str(job.workspace)],
            ["git", "-C", str(job.workspace), "fetch", "--quiet", str(source), tree.commit],
            ["git", "-C", str(job.workspace), "checkout", "--quiet", "--detach", tree.commit],
        ):
            code = subprocess.run(
                argv, stdout=out, stderr=subprocess.STDOUT, env=job.base_env
            ).returncode
            if code:
                return code
        out.write(f"checked out {tree.commit} into {job.workspace}\n")
        out.writelines(line + "\n" for line in tree.lines())
        return 0

    return action

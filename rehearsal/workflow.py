"""A GitHub Actions job, run step by step on this machine as a runner would run it.

Only what the suite's workflows use, each part as GitHub documents it:

- ``run:`` steps without ``shell:`` run as ``bash -e {0}``; ``shell: bash`` runs
  ``bash --noprofile --norc -eo pipefail {0}`` (docs.github.com "Workflow syntax for GitHub
  Actions", ``jobs.<job_id>.steps[*].shell`` table: "unspecified ... bash -e {0}", "bash ...
  bash --noprofile --norc -eo pipefail {0}"; github/docs PR 18934 after actions/runner issue
  1955: pipefail "is not applied by default"). So an unnamed shell does not fail a pipeline
  whose first command fails, exactly as on the runner.
- ``$GITHUB_ENV``, ``$GITHUB_OUTPUT`` and ``$GITHUB_STEP_SUMMARY`` are files the runner reads
  after each step ("Workflow commands for GitHub Actions"): ``NAME=value`` lines or
  ``NAME<<DELIM`` blocks; GITHUB_ENV's become the environment of every later step (over the
  job's ``env:``), GITHUB_OUTPUT's become ``steps.<id>.outputs.<name>``.
- ``if:`` defaults to ``success()`` (a step after a failed one is skipped); ``always()`` and
  ``!cancelled()`` run after a failure ("Evaluate expressions in workflows and actions",
  status check functions); ``steps.<id>.outcome`` is a step's result before continue-on-error
  ("Contexts reference", steps context), and a condition without a status function gets
  ``success()`` added.
- ``timeout-minutes`` of the job: GitHub cancels the job when it passes ("Workflow syntax",
  ``jobs.<job_id>.timeout-minutes``); the running step is ended, ``cancelled()`` is true after it
  and only ``always()`` steps still run. :class:`JobRun` applies ``job_timeout_s`` (the rehearsal
  scales the job's minutes to its own plan: rehearsal/night.py).
- ``${{ ... }}`` expressions come from one table (:class:`Context`); an expression or an
  absolute path the table does not name is refused with its text (:class:`WorkflowError`).
"""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

#: ``shell:`` value (None: unspecified, after ``defaults.run.shell``) -> the command GitHub runs on Linux.
SHELLS = {
    None: ("bash", "-e"),
    "bash": ("bash", "--noprofile", "--norc", "-eo", "pipefail"),
    "sh": ("sh", "-e"),
}
_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
# An absolute path where a shell word or a value starts (not the tail of a relative path or "$VAR/x").
_ABS_PATH = re.compile(
    r"(?:(?<=^)|(?<=[\s\"'=<>:(|;,]))(/[A-Za-z0-9_.+@-]+(?:/[A-Za-z0-9_.+@-]*)*)", re.M
)
#: Absolute paths a step may name as they are: they write nothing a run keeps.
SYSTEM_PATHS = ("/dev/null", "/dev/stdout", "/dev/stderr")


class WorkflowError(ValueError):
    """The workflow names something the rehearsal's table does not supply."""


@dataclass
class Context:
    """Everything a ``${{ }}`` expression or an absolute path may resolve to, in one place."""

    github: dict[str, str]
    #: Absolute path on a real runner -> its stand-in; a path under a key maps under the value.
    paths: dict[str, Path]
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)

    def expression(self, expr: str, where: str) -> str:
        parts = expr.split(".")
        if len(parts) == 2 and parts[0] == "github":
            if parts[1] not in self.github:
                raise WorkflowError(
                    f"{where}: unknown expression '${{{{ {expr} }}}}': the rehearsal's table has "
                    f"github.{{{', '.join(sorted(self.github))}}}; add github.{parts[1]} to it"
                )
            return str(self.github[parts[1]])
        if len(parts) == 4 and parts[0] == "steps" and parts[2] == "outputs":
            step_outputs = self.outputs.get(parts[1], {})
            if parts[3] not in step_outputs:
                raise WorkflowError(
                    f"{where}: '${{{{ {expr} }}}}' has no value: step id '{parts[1]}' wrote "
                    f"{sorted(step_outputs) or 'no outputs'} to $GITHUB_OUTPUT (or did not run)"
                )
            return step_outputs[parts[3]]
        raise WorkflowError(
            f"{where}: unknown expression '${{{{ {expr} }}}}': the rehearsal supplies github.<name> "
            "and steps.<id>.outputs.<name> only; add it to rehearsal/workflow.py Context"
        )

    def map_path(self, path: str, where: str) -> str:
        if path in SYSTEM_PATHS:
            return path
        for real in sorted(self.paths, key=len, reverse=True):
            if path == real or path.startswith(real.rstrip("/") + "/"):
                return str(self.paths[real]) + path[len(real.rstrip("/")) :]
        raise WorkflowError(
            f"{where}: absolute path '{path}' is not in the rehearsal's path table "
            f"({', '.join(sorted(self.paths))}); map it to a directory inside the scratch dir"
        )

    def substitute(self, text: str, where: str) -> str:
        """Map absolute paths first (on the workflow's own text), then expand expressions."""
        text = _ABS_PATH.sub(lambda m: self.map_path(m.group(1), where), text)
        return _EXPR.sub(lambda m: self.expression(m.group(1), where), text)


def condition(
    expr: str | None,
    failed: bool,
    where: str,
    outcomes: dict[str, str] | None = None,
    cancelled: bool = False,
) -> bool:
    """Whether a step runs: ``&&`` of GitHub's status functions, optionally negated, and
    ``steps.<id>.outcome == 'success'`` (or ``!=``; ``outcome`` is the step's result before
    continue-on-error: success, failure or skipped), ``${{ }}`` optional."""
    text = (expr or "success()").strip()
    whole = re.fullmatch(r"\$\{\{\s*(.*?)\s*\}\}", text)
    text = whole.group(1) if whole else text
    terms = [t.strip() for t in text.split("&&")]
    if not any(
        t.lstrip("!").strip() in ("always()", "success()", "failure()", "cancelled()")
        for t in terms
    ):
        # GitHub adds success() to a condition that names no status function.
        terms = ["success()", *terms]
    return all(_term(t, failed, where, expr, outcomes or {}, cancelled) for t in terms)


def _term(
    text: str, failed: bool, where: str, expr, outcomes: dict[str, str], cancelled: bool
) -> bool:
    step = re.fullmatch(r"steps\.([A-Za-z_][A-Za-z0-9_-]*)\.outcome\s*(==|!=)\s*'(\w+)'", text)
    if step:
        got = outcomes.get(step.group(1), "")
        return (got == step.group(3)) == (step.group(2) == "==")
    negate = text.startswith("!")
    value = {
        "always()": True,
        "success()": not failed and not cancelled,
        "failure()": failed and not cancelled,
        "cancelled()": cancelled,
    }.get(text.lstrip("!").strip())
    if value is None:
        raise WorkflowError(
            f"{where}: unknown condition 'if: {expr}': the rehearsal knows always(), success(), "
            "failure(), cancelled(), their negation, steps.<id>.outcome == 'x' and && of these; "
            "add it to rehearsal/workflow.py condition"
        )
    return not value if negate else value


def parse_command_file(path: Path) -> dict[str, str]:
    """``NAME=value`` lines and ``NAME<<DELIM`` ... ``DELIM`` blocks (GITHUB_ENV, GITHUB_OUTPUT)."""
    values: dict[str, str] = {}
    lines = path.read_text().splitlines() if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            end = lines.index(delim, i + 1) if delim in lines[i + 1 :] else None
            if end is None:
                raise WorkflowError(f"{path}: '{line}' opens a block that no line '{delim}' closes")
            values[name] = "\n".join(lines[i + 1 : end])
            i = end + 1
            continue
        if line.strip():
            if "=" not in line:
                raise WorkflowError(f"{path}: line '{line}' is neither NAME=value nor NAME<<DELIM")
            name, value = line.split("=", 1)
            values[name] = value
        i += 1
    return values


@dataclass
class StepResult:
    index: int
    name: str
    exit_code: int | None  # None: skipped
    seconds: float
    log: Path | None = None
    note: str = ""


def step_name(step: dict) -> str:
    """The name GitHub shows: ``name``, else the action or the first line of ``run``."""
    return step.get("name") or step.get("uses") or step["run"].strip().splitlines()[0]


def load_job(workflow: Path, job: str | None = None) -> tuple[str, dict]:
    data = yaml.safe_load(workflow.read_text())
    jobs = data.get("jobs") or {}
    if job is None:
        if len(jobs) != 1:
            raise WorkflowError(f"{workflow}: has jobs {sorted(jobs)}; name the one to run")
        job = next(iter(jobs))
    if job not in jobs:
        raise WorkflowError(f"{workflow}: no job '{job}' (it has {sorted(jobs)})")
    return job, jobs[job]


def available_memory() -> int:
    """MemAvailable of /proc/meminfo, in bytes (a large number where there is no /proc)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


@dataclass
class JobRun:
    """One job of one workflow file, run in ``workspace`` with ``base_env`` as the runner's environment."""

    workflow: Path
    context: Context
    workspace: Path
    base_env: dict[str, str]
    #: ``uses:`` action name (before ``@``) -> function(step_with: dict, job_run) -> exit code.
    actions: dict = field(default_factory=dict)
    logs: Path | None = None
    echo: bool = False
    timeout_s: float | None = None
    #: A step is ended when the machine's available memory falls under this many bytes.
    min_available: int = 2 * 2**30
    available_memory: object = available_memory
    job: str | None = None
    #: The job's time limit (``timeout-minutes``, as the caller scaled it); None: none.
    job_timeout_s: float | None = None

    def __post_init__(self):
        self.job, self.spec = load_job(self.workflow, self.job)
        workflow_defaults = (yaml.safe_load(self.workflow.read_text()).get("defaults") or {}).get(
            "run"
        ) or {}
        job_defaults = (self.spec.get("defaults") or {}).get("run") or {}
        self.default_shell = job_defaults.get("shell", workflow_defaults.get("shell"))
        self.temp = Path(self.base_env["RUNNER_TEMP"])
        self.logs = self.logs or self.temp / "logs"
        self.summary = self.temp / "step_summary.md"
        self.env_from_steps: dict[str, str] = {}
        self.failed = False
        #: ``steps.<id>.outcome`` of each step with an id that ran or was skipped.
        self.outcomes: dict[str, str] = {}
        self.cancelled = False
        self.job_deadline: float | None = None
        self.artifacts: list[dict] = []

    def steps(self) -> list[dict]:
        return list(self.spec.get("steps") or [])

    def job_env(self) -> dict[str, str]:
        where = f"{self.workflow} jobs.{self.job}.env"
        return {
            k: self.context.substitute(str(v), f"{where}.{k}")
            for k, v in (self.spec.get("env") or {}).items()
        }

    def run(self, on_step=None) -> list[StepResult]:
        """Every step in order; ``on_step(result)`` after each."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self.summary.touch()
        job_env = self.job_env()
        if self.job_timeout_s:
            self.job_deadline = time.monotonic() + self.job_timeout_s
        results = []
        for index, step in enumerate(self.steps(), 1):
            result = self.run_step(index, step, job_env)
            results.append(result)
            if result.exit_code not in (None, 0) and not step.get("continue-on-error"):
                self.failed = True
            if on_step:
                on_step(result)
        return results

    def run_step(self, index: int, step: dict, job_env: dict[str, str]) -> StepResult:
        name = step_name(step)
        where = f"{self.workflow} step {index} '{name}'"
        if not condition(step.get("if"), self.failed, where, self.outcomes, self.cancelled):
            if step.get("id"):
                self.outcomes[step["id"]] = "skipped"
            return StepResult(
                index,
                name,
                None,
                0.0,
                note="skipped (if: " + str(step.get("if") or "success()") + ")",
            )
        step_env = {
            k: self.context.substitute(str(v), f"{where} env.{k}")
            for k, v in (step.get("env") or {}).items()
        }
        env_file, output_file = self.temp / f"env-{index}", self.temp / f"output-{index}"
        env_file.write_text("")
        output_file.write_text("")
        env = {
            **self.base_env,
            **job_env,
            **self.env_from_steps,
            **step_env,
            "GITHUB_ENV": str(env_file),
            "GITHUB_OUTPUT": str(output_file),
            "GITHUB_STEP_SUMMARY": str(self.summary),
            "GITHUB_WORKSPACE": str(self.workspace),
        }
        log = self.logs / f"{index:02d}.log"
        start = time.monotonic()
        if "uses" in step:
            action = step["uses"].split("@")[0]
            if action not in self.actions:
                raise WorkflowError(
                    f"{where}: uses '{step['uses']}', which the rehearsal does not stand in for "
                    f"(it has {sorted(self.actions)})"
                )
            with_ = {
                k: self.context.substitute(str(v), f"{where} with.{k}")
                for k, v in (step.get("with") or {}).items()
            }
            with open(log, "w") as out:
                code = self.actions[action](with_, self, out)
        else:
            shell = step.get("shell", self.default_shell)
            if shell not in SHELLS:
                raise WorkflowError(
                    f"{where}: shell '{shell}': the rehearsal runs {sorted(map(str, SHELLS))} only"
                )
            script = self.temp / f"step-{index}.sh"
            script.write_text(self.context.substitute(step["run"], where))
            cwd = self.workspace / step.get("working-directory", ".")
            code = self._execute([*SHELLS[shell], str(script)], cwd, env, log)
        seconds = time.monotonic() - start
        if step.get("id"):
            self.context.outputs[step["id"]] = parse_command_file(output_file)
            self.outcomes[step["id"]] = "success" if code == 0 else "failure"
        self.env_from_steps.update(parse_command_file(env_file))
        note = ""
        if (
            not self.cancelled
            and self.job_deadline is not None
            and time.monotonic() > self.job_deadline
        ):
            self.cancelled = True  # only always() steps run after this one
            note = f"the job's timeout ({self.job_timeout_s / 60:.1f} min) passed: job cancelled"
        return StepResult(index, name, code, seconds, log, note)

    def _execute(self, argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> int:
        """Run one step in its own session; a watchdog ends its whole process group on the step timeout or
        when the machine's available memory falls under ``min_available`` (a shared host must survive)."""
        with open(log, "w") as out:
            deadline = time.monotonic() + self.timeout_s if self.timeout_s else None
            # the job's timeout ends the running step too, unless the job is already cancelled
            job_deadline = None if self.cancelled else self.job_deadline
            why, proc = "", None
            try:
                with STARTING:  # a stop signal now waits until the step's process group is known
                    proc = subprocess.Popen(
                        argv,
                        cwd=cwd,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                while proc.poll() is None:
                    if deadline and time.monotonic() > deadline:
                        why = f"timed out after {self.timeout_s:.0f} s"
                    elif job_deadline and time.monotonic() > job_deadline:
                        why = f"the job's timeout-minutes ({self.job_timeout_s / 60:.1f} min, scaled) passed"
                    elif self.available_memory() < self.min_available:
                        why = (
                            f"the machine's available memory fell under {self.min_available / 2**30:.1f} GiB "
                            "(rehearsal/workflow.py JobRun.min_available)"
                        )
                    if why:
                        break
                    time.sleep(0.2)
            finally:  # a timeout, low memory, or the rehearsal itself stopped (SIGTERM, Ctrl-C): the step goes too
                if proc is not None and proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            if why:
                out.write(f"\nrehearsal: step ended by the rehearsal: {why}\n")
            if self.echo:
                print(log.read_text(errors="replace"), end="", flush=True)
            return proc.returncode


class Starting:
    """While a step's process starts, a stop signal waits: raised inside ``Popen``, it would leave the step's
    process running with no ``proc`` to end it (seen in a loaded CI: the step's child outlived the rehearsal).
    The rehearsal's handler (rehearsal/night.py ``stop_on_signals``) asks :meth:`stop`."""

    def __init__(self) -> None:
        self.active, self.pending = False, None

    def __enter__(self) -> None:
        self.active = True

    def __exit__(self, *exc) -> None:
        self.active = False
        if self.pending is not None and exc[0] is None:
            signum, self.pending = self.pending, None
            raise SystemExit(128 + signum)

    def stop(self, signum: int) -> None:
        """End the rehearsal with 128 + ``signum`` (through every ``finally``), or once the step has started."""
        if self.active:
            self.pending = signum
            return
        raise SystemExit(128 + signum)


STARTING = Starting()


def upload_artifact(with_: dict, job: JobRun, out) -> int:
    """actions/upload-artifact: every ``path`` line must match a file or directory in the workspace;
    none found is an error under ``if-no-files-found: error``, a warning otherwise (its default)."""
    found, missing = [], []
    for line in [p.strip() for p in with_.get("path", "").splitlines() if p.strip()]:
        matches = glob.glob(str(job.workspace / line), recursive=True)
        (found if matches else missing).extend(matches or [line])
    mode = with_.get("if-no-files-found", "warn")
    job.artifacts.append(
        {"name": with_.get("name", "artifact"), "paths": found, "missing": missing}
    )
    for path in missing:
        out.write(f"upload-artifact {with_.get('name')}: no file matches '{path}'\n")
    for path in found:
        out.write(f"upload-artifact {with_.get('name')}: {path}\n")
    return 1 if (not found and mode == "error") else 0

"""The docs cannot go stale unnoticed: every repository path, file name, module and dotted name they name exists.

Read from README.md, docs/*.md and the other READMEs, inside `code spans` and fenced blocks (the
architecture's picture). A path that starts at a top-level folder of the repository must match the tree
(``<recipe>`` and ``*`` match anything); a path inside a package (``checks/kernels.py``) must end some
tracked path; a bare file name must be some tracked file's name; ``python -m NAME`` must be an importable
module; a dotted name of the suite (``harness.judge.verdicts.compare``, or ``verdicts.compare`` for a module of
harness/ or recipes/) must import and resolve, so a renamed file, module or function fails here.

Commands too, in the docs and in the comments of the Makefile and the workflows: each ``python -m harness...``
answers ``--help`` with its subcommand and flags, each ``make TARGET`` is a Makefile target, and each documented
dry run passes as written. Statements that once drifted are held to what they describe: which CI job runs which
make target in which order (cpu.yml, .ci/run), "the one config.json reader", test-fast's measured share
(benchmarks/history.jsonl), README sections pointed to, and the architecture picture (the layers contract of
pyproject.toml and every module of harness/).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from recipes.tiers import REPO_ROOT

DOCS = [
    "README.md",
    *sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "docs").glob("*.md")),
    "rehearsal/README.md",
    "fixtures/README.md",
]
#: Folders a run writes (never tracked): a doc may name files in them that exist only after a run.
GENERATED = {"report", "runs", "outputs"}
#: Paths the docs name that are not this repository's, or not written yet, each with why.
ELSEWHERE = {
    "tests/assets/c4_test": "torchtitan's own test assets, in a TorchTitan (Neuron) checkout",
    "tests/assets/tokenizer": "torchtitan's own test assets, in a TorchTitan (Neuron) checkout",
    "fixtures/goldens/<recipe>/trn2-band.json": "written by `python -m harness.judge.band record` on a trn2 night",
}
FILE_NAME = re.compile(r"^[\w.-]+\.(py|md|yml|yaml|json|jsonl|sh|txt|toml|ini|j2)$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
#: Top-level packages of the suite: a dotted name starting with one must resolve.
PACKAGES = ("harness", "recipes", "benchmarks", "fixtures", "rehearsal")


def tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def top_level() -> set[str]:
    return {path.split("/")[0] for path in tracked() if "/" in path} - GENERATED


def spans(text: str) -> list[str]:
    """Inline code spans, and every line of a fenced block."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    inline = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", inline) + [
        line for block in fenced for line in block.splitlines()
    ]


@functools.cache
def submodules() -> frozenset[str]:
    """Every module and package name inside harness/ and recipes/ (``verdicts``, ``checks``, ``titan``, ...)."""
    return frozenset(short_names())


@functools.cache
def short_names() -> dict[str, tuple[str, ...]]:
    """Each module or package name inside harness/ and recipes/ -> the dotted modules of that name."""
    found: dict[str, set[str]] = {}
    for path in tracked():
        parts = path.removesuffix(".py").removesuffix("/__init__").split("/")
        if parts[0] in ("harness", "recipes") and path.endswith(".py") and len(parts) > 1:
            found.setdefault(parts[-1], set()).add(".".join(parts))
    return {name: tuple(sorted(mods)) for name, mods in found.items()}


def mentions(text: str) -> tuple[set[str], set[str], set[str], set[str], set[str]]:
    """(repository paths, package paths, bare file names, modules, dotted names) named in ``text``."""
    paths, inside, names, modules, dotted = set(), set(), set(), set(), set()
    tops = top_level()
    for span in spans(text):
        modules.update(re.findall(r"python3? -m ([\w.]+)", span))
        for token in span.split():
            token = token.strip(",;:()[]'\"").removesuffix("()")
            first = token.split("/")[0]
            if first in tops and "/" in token:
                paths.add(token)
            elif (
                "/" in token
                and FILE_NAME.match(token.rsplit("/", 1)[-1])
                and first
                and not first.startswith((".", "~"))
                and first not in GENERATED
            ):
                inside.add(token)
            elif FILE_NAME.match(token) and "/" not in token:
                names.add(token)
            elif DOTTED.match(token) and (
                token.split(".")[0] in PACKAGES or token.split(".")[0] in submodules()
            ):
                dotted.add(token)
    return paths, inside, names, modules, dotted


def written_by_the_harness() -> set[str]:
    """File names the harness writes (a run directory's files, the report's): string literals in harness/."""
    text = "\n".join(p.read_text() for p in (REPO_ROOT / "harness").rglob("*.py"))
    return set(re.findall(r"[\"']([\w.-]+\.(?:json|jsonl|md|log))[\"']", text))


def exists(path: str) -> bool:
    pattern = re.sub(r"<[^>]+>", "*", path).rstrip("/")
    return any(REPO_ROOT.glob(pattern)) if "*" in pattern else (REPO_ROOT / pattern).exists()


def ends_a_tracked_path(path: str) -> bool:
    return any(p.endswith("/" + path) for p in tracked())


def resolves(name: str) -> bool:
    """``name`` (``harness.judge.verdicts.compare``, or ``verdicts.compare`` inside harness/ or recipes/) imports and
    resolves: the longest importable module prefix, then attributes."""
    first = name.split(".")[0]
    rest = name[len(first) :]
    candidates = [name] if first in PACKAGES else [m + rest for m in short_names().get(first, ())]
    for candidate in candidates:
        parts = candidate.split(".")
        for i in range(len(parts), 0, -1):
            module = ".".join(parts[:i])
            try:
                spec = importlib.util.find_spec(module)
            except (ImportError, ValueError):
                spec = None
            if spec is None:
                continue
            obj = importlib.import_module(module)
            for attribute in parts[i:]:
                if not hasattr(obj, attribute):
                    break
                obj = getattr(obj, attribute)
            else:
                return True
            break
    return False


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_file_and_module_a_doc_names_exists(doc):
    paths, inside, names, modules, dotted = mentions((REPO_ROOT / doc).read_text())
    files = {Path(p).name for p in tracked()}
    missing = sorted(p for p in paths if not exists(p) and p not in ELSEWHERE)
    missing += sorted(
        f"{p} (no tracked path ends so)" for p in inside if not ends_a_tracked_path(p)
    )
    missing += sorted(f"{d} (does not resolve)" for d in dotted if not resolves(d))
    missing += sorted(
        f"{n} (no tracked file has this name, and harness/ writes none)"
        for n in names
        if n not in files and n not in written_by_the_harness()
    )
    missing += sorted(
        f"python -m {m} (not importable)" for m in modules if importlib.util.find_spec(m) is None
    )
    assert not missing, f"{doc} names what the tree does not have: {missing}"


def test_the_check_sees_a_renamed_file(tmp_path):
    """A doc naming a file that was renamed fails (here: harness/reference.py, now a package)."""
    paths, _, names, modules, _ = mentions(
        "see `harness/reference.py`, `nosuch_module.py` and `python -m harness.nosuch`"
    )
    assert paths == {"harness/reference.py"} and not exists("harness/reference.py")
    assert names == {"nosuch_module.py"} and modules == {"harness.nosuch"}
    assert importlib.util.find_spec("harness.nosuch") is None
    assert exists("harness/reference/") and exists("fixtures/goldens/<recipe>/trn2.json")


def test_the_check_sees_renamed_modules_functions_and_package_paths():
    """Round 3's renames, as a doc that missed them would name them: each is caught, and its new name passes."""
    text = """
```
  2 checks      harness/checks/
        │         config.py        the built config
```
`checks/config.py` holds `harness.checks.config.check_compile`; `harness.launch.elastic.rank_entry`,
`verdicts.nosuch`, `goldens.compare` and `harness.config.tree.config3_comparison`.
"""
    _, inside, names, _, dotted = mentions(text)
    assert inside == {"checks/config.py"} and not ends_a_tracked_path("checks/config.py")
    assert "config.py" in names and "config.py" not in {Path(p).name for p in tracked()}
    assert dotted == {
        "harness.checks.config.check_compile",
        "harness.launch.elastic.rank_entry",
        "verdicts.nosuch",
        "goldens.compare",
        "harness.config.tree.config3_comparison",
    }
    assert not any(resolves(d) for d in dotted)
    renamed = [
        "harness.checks.built_config.check_compile",
        "harness.launch.elastic.run_forked_rank",
        "verdicts.compare",
        "harness.night.config3_fork.config3_comparison",
        "recipes.tutorial.tutorial_settings",
    ]
    assert all(resolves(d) for d in renamed) and ends_a_tracked_path("checks/built_config.py")


# --- commands: every `python -m harness...` and `make TARGET` a doc names (issue 44 item 5) -------------------

#: Files whose comment lines name commands too (their commands are checked here, their paths are not).
COMMENTED = ["Makefile", ".github/workflows/cpu.yml", ".github/workflows/nightly-trn2.yml"]
HARNESS_COMMAND = re.compile(r"(?<![\w.-])python3? -m (harness[\w.]*)([^`]*)")
MAKE_COMMAND = re.compile(r"(?<![\w.$-])make\s+(.*)")
TARGET = re.compile(r"[a-z][\w-]*")
FLAG = re.compile(r"--[a-z][a-z0-9-]*")
#: What a doc's command is run with: no trn2 inputs (the dry run's sizes come from fixtures/), as a user would.
TRN2_UNSET = (
    "QWEN3_4B_DIR",
    "QWEN3_DATASET_DIR",
    "NEURON_LOGICAL_NC_CONFIG",
    "NEURON_RT_VISIBLE_CORES",
)


@dataclasses.dataclass(frozen=True)
class Command:
    """One documented ``python -m MODULE [SUB] ...``: its first positional word and its harness flags."""

    module: str
    args: tuple[str, ...]

    @property
    def sub(self) -> str | None:
        first = self.args[0] if self.args else ""
        return first if TARGET.fullmatch(first) else None

    @property
    def flags(self) -> set[str]:
        """``--kebab-case`` flags; torchtitan's (``--training.steps``, ``--dump_folder``) are its parser's."""
        return {a.split("=")[0] for a in self.args if FLAG.fullmatch(a.split("=")[0])}


def comments(text: str) -> str:
    """The comment lines of a Makefile or a workflow, ``#`` dropped."""
    lines = [line.strip() for line in text.splitlines()]
    return "\n".join(line[1:] for line in lines if line.startswith("#"))


def command_texts() -> dict[str, str]:
    """Each doc's text, and each commented file's comments."""
    texts = {doc: (REPO_ROOT / doc).read_text() for doc in DOCS}
    texts.update({name: comments((REPO_ROOT / name).read_text()) for name in COMMENTED})
    return texts


def command_spans(text: str) -> list[str]:
    """Code spans and fenced lines, each without its shell comment."""
    return [re.split(r"\s#", span)[0] for span in spans(text)]


def commands(text: str) -> set[Command]:
    found = set()
    for span in command_spans(text):
        for module, rest in HARNESS_COMMAND.findall(span):
            args = tuple(a.strip("[]|,;") for a in rest.split())
            found.add(Command(module, tuple(a for a in args if a)))
    return found


def make_targets(text: str) -> list[str]:
    """The targets ``make`` is asked for in ``text`` (assignments skipped), in order."""
    targets = []
    for line in text.splitlines():
        for rest in MAKE_COMMAND.findall(line):
            for word in rest.split():
                if "=" in word or word.endswith('"'):
                    continue
                target = word.rstrip(",;:.)'")
                if not TARGET.fullmatch(target):
                    break
                targets.append(target)
                if target != word:
                    break
    return targets


def documented_targets(text: str) -> set[str]:
    return {t for span in command_spans(text) for t in make_targets(span)}


@functools.cache
def makefile_targets() -> frozenset[str]:
    text = (REPO_ROOT / "Makefile").read_text()
    rules = re.findall(r"^([\w.-][\w. -]*?)\s*:(?!=)", text, flags=re.M)
    return frozenset(name for rule in rules for name in rule.split() if not name.startswith("."))


def run_help(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *argv, "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def subcommands(help_text: str) -> set[str] | None:
    """The ``{a,b,c}`` choices of a usage line, or None when it has none."""
    choices = re.search(r"\{([\w,-]+)\}", help_text)
    return set(choices.group(1).split(",")) if choices else None


@pytest.fixture(scope="module")
def helps() -> dict[tuple[str, ...], subprocess.CompletedProcess]:
    """``python -m MODULE --help`` once per documented module, and ``MODULE SUB --help`` once per documented
    subcommand whose flags a doc names."""
    documented = {c for text in command_texts().values() for c in commands(text)}
    found = {(m,): run_help(m) for m in sorted({c.module for c in documented})}
    for c in sorted(documented, key=str):
        choices = subcommands(found[(c.module,)].stdout)
        if c.flags and choices and c.sub in choices and (c.module, c.sub) not in found:
            found[(c.module, c.sub)] = run_help(c.module, c.sub)
    return found


def command_problems(command: Command, helps: dict) -> list[str]:
    top = helps[(command.module,)]
    if importlib.util.find_spec(command.module) is None:
        return [f"python -m {command.module}: not importable"]
    if top.returncode != 0:
        return [f"python -m {command.module} --help exits {top.returncode}: {top.stderr[-300:]}"]
    choices = subcommands(top.stdout)
    if command.sub and choices is not None and command.sub not in choices:
        return [f"python -m {command.module} {command.sub}: not one of {sorted(choices)}"]
    if command.sub and choices is None and not re.search(rf"\b{command.sub}\b", top.stdout):
        return [f"python -m {command.module} {command.sub}: its --help never names {command.sub!r}"]
    own = helps.get((command.module, command.sub), top)
    if own.returncode != 0:
        return [f"python -m {command.module} {command.sub} --help exits {own.returncode}"]
    return [
        f"python -m {command.module} {command.sub or ''} {flag}: not in its --help"
        for flag in sorted(command.flags)
        if flag not in own.stdout
    ]


@pytest.mark.xdist_group("docs-commands")
@pytest.mark.parametrize("doc", [*DOCS, *COMMENTED])
def test_every_documented_harness_command_answers_help_with_its_subcommand_and_flags(doc, helps):
    text = command_texts()[doc]
    problems = [p for c in sorted(commands(text), key=str) for p in command_problems(c, helps)]
    assert not problems, f"{doc} names commands the harness does not take: {problems}"


@pytest.mark.parametrize("doc", [*DOCS, *COMMENTED])
def test_every_documented_make_target_is_a_makefile_target(doc):
    unknown = sorted(documented_targets(command_texts()[doc]) - makefile_targets())
    assert not unknown, f"{doc} names make targets the Makefile does not have: {unknown}"


def test_the_command_checks_see_a_renamed_module_subcommand_flag_and_target():
    """Seen to fail: each name below was once right or is one letter off, and the checks catch it."""
    text = """
```
python -m harness.nightly_watch            # the module before round 4
python -m harness.night.ci require-claim report/tests.json
python -m harness run all --tier trn2 --dry-rnu
make rehearse    # the target is rehearse-trn2
```
"""
    documented = commands(text)
    assert {c.module for c in documented} == {
        "harness.nightly_watch",
        "harness.night.ci",
        "harness",
    }
    assert documented_targets(text) == {"rehearse"} and "rehearse" not in makefile_targets()
    assert "rehearse-trn2" in makefile_targets() and "lint" in makefile_targets()
    helps = {
        ("harness.nightly_watch",): subprocess.CompletedProcess([], 1, "", "No module"),
        ("harness.night.ci",): subprocess.CompletedProcess([], 0, "usage: {require-claims,x}", ""),
        ("harness",): subprocess.CompletedProcess([], 0, "usage: {list,run,history}", ""),
        ("harness", "run"): subprocess.CompletedProcess([], 0, "--tier --dry-run", ""),
    }
    problems = {c.module: command_problems(c, helps) for c in documented}
    assert problems["harness.nightly_watch"] == ["python -m harness.nightly_watch: not importable"]
    assert "not one of" in problems["harness.night.ci"][0]
    assert problems["harness"] == ["python -m harness run --dry-rnu: not in its --help"]


@pytest.mark.slow
@pytest.mark.xdist_group("docs-commands")
def test_every_documented_dry_run_passes_as_written(tmp_path):
    """A documented ``python -m harness run ... --dry-run`` is run as written (report to a scratch dir): the trn2
    dry run without ``--allow-mismatch rope_theta`` exits 2, so a doc giving it so fails here."""
    runs = sorted(
        {
            c.args
            for text in command_texts().values()
            for c in commands(text)
            if c.module == "harness" and c.sub == "run" and "--dry-run" in c.args
        }
    )
    assert runs, "no doc gives the trn2 dry run"
    env = {k: v for k, v in os.environ.items() if k not in TRN2_UNSET}
    for i, args in enumerate(runs):
        proc = subprocess.run(
            [sys.executable, "-m", "harness", *args, "--report-dir", str(tmp_path / str(i))],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        refused = [line for line in proc.stdout.splitlines() if "would be refused" in line]
        assert proc.returncode == 0, (" ".join(args), refused or proc.stderr[-500:])


# --- statements that once drifted (issue 44), held to what they describe -------------------------------------

#: Where CI runs make targets, by the names a doc calls each.
RUNNERS = {"cpu workflow": ("cpu workflow", "cpu.yml"), ".ci/run": (".ci/run",)}


def ci_jobs() -> dict[str, dict[str, list[str]]]:
    """Each CI runner -> each of its jobs -> the make targets it runs, in order."""
    workflow = yaml.safe_load((REPO_ROOT / ".github/workflows/cpu.yml").read_text())
    jobs = {
        name: make_targets("\n".join(step.get("run", "") for step in job["steps"]))
        for name, job in workflow["jobs"].items()
    }
    return {
        "cpu workflow": jobs,
        ".ci/run": {"run": make_targets((REPO_ROOT / ".ci/run").read_text())},
    }


def ci_claims(text: str) -> list[tuple[str, str, str, str]]:
    """(runner, claim, target, other) a doc states: ("before", A, T): a job runs A before T; ("own job", A, J):
    job J runs A and not make test. A clause's subject is the make target it names, else the rehearsal when its
    paragraph is about it."""
    found = []
    for paragraph in text.split("\n\n"):
        flat = " ".join(paragraph.split())
        topic = "rehearse-trn2" if "rehears" in flat.lower() else ""
        for clause in re.split(r"(?<=[.;])\s+", flat):
            runners = [r for r, names in RUNNERS.items() if any(n in clause for n in names)]
            named = re.findall(r"`make ([\w-]+)`", clause)
            for target in re.findall(r"before `make ([\w-]+)`", clause):
                subject = next((n for n in named if n != target), topic)
                found += [(r, "before", subject, target) for r in runners]
            for job in re.findall(r"job of its own \(`([\w-]+)`\)", clause):
                subject = next((n for n in named if n != "test"), topic)
                found += [(r, "own job", subject, job) for r in runners]
    return found


def ci_claim_holds(claim: tuple[str, str, str, str], jobs: dict[str, dict[str, list[str]]]) -> bool:
    runner, kind, subject, other = claim
    if kind == "own job":
        return subject in jobs[runner].get(other, []) and "test" not in jobs[runner][other]
    return any(
        subject in targets and other in targets and targets.index(subject) < targets.index(other)
        for targets in jobs[runner].values()
    )


@pytest.mark.parametrize("doc", DOCS)
def test_what_a_doc_says_ci_runs_in_which_order_is_what_the_yaml_runs(doc):
    jobs = ci_jobs()
    wrong = [c for c in ci_claims((REPO_ROOT / doc).read_text()) if not ci_claim_holds(c, jobs)]
    assert not wrong, (
        f"{doc}: (runner, claim, subject, target) not so in cpu.yml / .ci/run: {wrong}"
    )


def test_the_ci_order_check_sees_the_rehearsal_said_to_run_before_make_test_in_cpu_yml():
    """Issue 44's stale sentence: cpu.yml runs the rehearsal as its own job, not before make test."""
    stale = (
        "Before a chip is touched, `make rehearse-trn2` rehearses the night. It runs twice. `.ci/run` and "
        "the cpu workflow run it before `make test`."
    )
    claims = ci_claims(stale)
    assert claims == [
        ("cpu workflow", "before", "rehearse-trn2", "test"),
        (".ci/run", "before", "rehearse-trn2", "test"),
    ]
    assert [ci_claim_holds(c, ci_jobs()) for c in claims] == [False, True]
    assert ci_claims((REPO_ROOT / "README.md").read_text()), (
        "README no longer says where CI rehearses"
    )


def config_json_readers() -> set[str]:
    """Functions of harness/ and recipes/ that parse ``<dir> / "config.json"``: a ``json.load(s)`` in the
    function, or in a function of its module that it calls."""
    found = set()
    for path in sorted(
        [*(REPO_ROOT / "harness").rglob("*.py"), *(REPO_ROOT / "recipes").rglob("*.py")]
    ):
        tree = ast.parse(path.read_text())
        functions = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}

        def called(function: ast.FunctionDef) -> set[str]:
            calls = [n.func for n in ast.walk(function) if isinstance(n, ast.Call)]
            return {c.attr if isinstance(c, ast.Attribute) else getattr(c, "id", "") for c in calls}

        parses = {name for name, f in functions.items() if called(f) & {"load", "loads"}}
        for name, function in functions.items():
            joins = [
                n
                for n in ast.walk(function)
                if isinstance(n, ast.BinOp) and getattr(n.right, "value", None) == "config.json"
            ]
            if joins and (name in parses or called(function) & parses):
                module = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
                found.add(f"{module}.{name}")
    return found


def one_reader_problems(text: str, readers: set[str]) -> list[str]:
    if re.search(r"\bone config\.json reader", text) and len(readers) != 1:
        return [f"calls one config.json reader the one; there are {sorted(readers)}"]
    return []


def test_a_doc_calls_a_config_json_reader_the_one_only_when_it_is():
    """README once called recipes/specs.py the one reader beside harness.checks.inputs' own."""
    readers = config_json_readers()
    assert readers, "no function of harness/ or recipes/ parses config.json: the search is broken"
    for doc in DOCS:
        assert one_reader_problems((REPO_ROOT / doc).read_text(), readers) == [], doc
    stale = "model dims and the one config.json reader"
    assert one_reader_problems(stale, {"recipes.specs.read_hf_config", "harness.checks.inputs.x"})
    assert one_reader_problems(stale, {"recipes.specs.read_hf_config"}) == []


def fast_share_measured() -> dict[str, list[float]]:
    """Each date -> the ``make test-fast`` / ``make test`` wall ratios benchmarks/history.jsonl measured then."""
    found: dict[str, list[float]] = {}
    for line in (REPO_ROOT / "benchmarks/history.jsonl").read_text().splitlines():
        record = json.loads(line)
        for goal in record.get("goals", []):
            if goal.get("name") == "make test-fast vs make test" and goal.get("measured"):
                found.setdefault(record["date"][:10], []).append(goal["measured"])
    return found


def fast_share_problems(text: str) -> list[str]:
    """Each "measured" in a sentence on test-fast's share of make test's wall is a figure history.jsonl has."""
    measured, problems = fast_share_measured(), []
    flat = " ".join(text.split())
    for sentence in re.split(r"(?<=\.)\s+(?=[A-Z`])", flat):
        if "`make test-fast`" not in sentence or "`make test`'s wall" not in sentence:
            continue
        for at in re.finditer(r"measured(?: ([\d.]+) on (\d{4}-\d\d-\d\d))?", sentence):
            value, date = at.groups()
            if value is None:
                problems.append(f"'measured' without a figure and date: {sentence[:120]}")
            elif not any(round(m, len(value) - 2) == float(value) for m in measured.get(date, [])):
                problems.append(f"measured {value} on {date} is not in benchmarks/history.jsonl")
    return problems


def test_test_fasts_measured_share_is_a_measurement():
    assert fast_share_problems((REPO_ROOT / "README.md").read_text()) == []
    assert fast_share_problems(
        "`make test-fast` runs every cpu test (about 1/6 of `make test`'s wall, measured)."
    ) == [
        "'measured' without a figure and date: `make test-fast` runs every cpu test (about 1/6 of `make "
        "test`'s wall, measured)."
    ]
    assert fast_share_problems(
        "`make test-fast` is 0.2 of `make test`'s wall, measured 0.2 on 2026-12-05."
    )


def readme_pointers(text: str) -> set[str]:
    return set(re.findall(r'README "([^"]+)"', text))


def readme_headings() -> set[str]:
    text = (REPO_ROOT / "README.md").read_text()
    return {h.strip() for h in re.findall(r"^#{1,4} (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("doc", [*DOCS, *COMMENTED])
def test_every_readme_section_a_file_points_to_exists(doc):
    """The Makefile once pointed to README "Tests", a section README did not have."""
    missing = sorted(readme_pointers(command_texts()[doc]) - readme_headings())
    assert not missing, f"{doc} points to README sections that do not exist: {missing}"
    assert readme_pointers('What it leaves: README "Testing".') - readme_headings() == {"Testing"}


def architecture_picture() -> dict[str, set[str]]:
    """docs/ARCHITECTURE.md's picture: each folder of harness/ in it, top to bottom -> the file names listed."""
    text = (REPO_ROOT / "docs/ARCHITECTURE.md").read_text()
    picture = re.search(r"^```\n(.*?)^```", text, flags=re.S | re.M).group(1)
    folders: dict[str, set[str]] = {}
    folder = None
    for line in picture.splitlines():
        start = re.match(r"^ (\w+)/\s", line)
        if start:
            folder = start.group(1)
            folders[folder] = set()
        if folder:
            folders[folder] |= set(re.findall(r"[\w.]+\.(?:py|j2)\b", line))
    return folders


def test_the_architecture_picture_is_the_contract_and_the_tree():
    """Every folder of harness/ in the contract's order (top to bottom), each with every module it holds."""
    layers = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in layers["contracts"] if c["type"] == "layers")["layers"]
    picture = architecture_picture()
    assert [f"harness.{f}" for f in picture] == contract
    tree: dict[str, set[str]] = {}
    for path in tracked():
        parts = path.split("/")
        if parts[0] == "harness" and len(parts) == 3 and parts[2] != "__init__.py":
            tree.setdefault(parts[1], set()).add(parts[2])
    assert picture == tree

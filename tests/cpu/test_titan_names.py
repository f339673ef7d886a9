"""recipes.titan: every torchtitan name in one module, and one line when the installed torchtitan lacks one.

The refusal tests hide a name from the real torchtitan (delete or replace it) and check
``python -m harness run``'s refusal: one line naming the name, the installed version and
why the suite needs it, exit 2, and no rank started. ``main`` runs in this process (the
name hidden by monkeypatch, the cpu tier's ranks "exec" so nothing is prestarted); one
case, "a public function", also runs in a fresh interpreter (a wrapper hides the name
before ``main`` starts, the tier as it ships) to show the command line refuses the same way.
The ``harness.checks.titan`` cases stay fresh interpreters: what a fork breaks there shows
in the imports of modules this process has already imported.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest
from harness_main import main_in_process

from recipes import titan
from recipes.tiers import REPO_ROOT

VERSION = importlib.metadata.version("torchtitan")
ALL_TAGS = {tag for entry in titan.NAMES for tag in entry.used_by}


@pytest.mark.slow
def test_the_pinned_torchtitan_has_every_declared_name():
    """A canary for the cpu pin: a lock bump that drops a name fails here, naming it.

    In a fresh interpreter, in a rank's order (the cpu platform first, before anything
    imports torchtitan): in this process other tests have already imported submodules
    (``torchtitan.tools.utils``) that a fresh rank has not.
    """
    code = (
        "from recipes import platform, titan\n"
        "platform.install('cpu')\n"
        "tags = {tag for entry in titan.NAMES for tag in entry.used_by}\n"
        "print('\\n'.join(str(e) for e in titan.missing(tags)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", out.stdout
    assert [str(e) for e in titan.missing(ALL_TAGS)] == []


def test_only_recipes_titan_imports_torchtitan():
    """No module of the product or the benchmarks imports torchtitan except recipes/titan.py."""
    offenders = []
    for path in sorted(
        [*(REPO_ROOT / "recipes").rglob("*.py"), *(REPO_ROOT / "benchmarks").rglob("*.py")]
    ):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", "") == "import_module"
                and node.args
            ):
                arg = node.args[0]
                names = (
                    [arg.value]
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                    else []
                )
            if any(n == "torchtitan" or n.startswith("torchtitan.") for n in names):
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert [o for o in offenders if not o.startswith("recipes/titan.py:")] == []


def test_a_missing_attribute_is_named_with_version_and_purpose():
    entry = titan.TitanName(
        "_no_such_name", "torchtitan.models.common.rope", "a test of the refusal"
    )
    with pytest.raises(titan.TitanNameError) as e:
        titan.resolve(entry)
    message = str(e.value)
    assert message.startswith(
        f"torchtitan {VERSION} has no torchtitan.models.common.rope._no_such_name, which the suite needs for "
        "a test of the refusal."
    )
    assert "\n" not in message


def test_a_missing_module_and_a_missing_keyword_are_named():
    with pytest.raises(
        titan.TitanNameError, match=r"has no torchtitan\.no_such_module\.x \(importing"
    ):
        titan.resolve(titan.TitanName("x", "torchtitan.no_such_module", "p"))
    entry = titan.TitanName(
        "CheckpointManager",
        "torchtitan.components.checkpoint",
        "p",
        keywords=("enable", "no_such_field"),
        keywords_of="Config",
    )
    with pytest.raises(
        titan.TitanNameError,
        match=r"no keyword 'no_such_field' in .*CheckpointManager\.Config\(\.\.\.\)",
    ):
        titan.resolve(entry)


def test_an_undeclared_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="declare it in recipes.titan.NAMES"):
        titan.no_such_name  # noqa: B018


def test_run_tags_follow_recipe_tier_and_overrides():
    assert titan.run_tags("native_qwen3", (), "cpu") == {titan.EVERY_RUN, "native_qwen3", "cpu"}
    checked = {
        e.name for e in titan.NAMES if titan.run_tags("nki_moe", (), "trn2") & set(e.used_by)
    }
    assert {"GroupedExperts", "override", "qwen3_30b_a3b", "_yarn_inv_freq"} <= checked
    assert not {"qwen3_32b", "transformers_modeling_backend_full", "device_utils"} & checked
    assert "rope_hf" in titan.run_tags("native_qwen3", ["rope_hf=layers.1.attention.rope"], "cpu")


@pytest.mark.slow
def test_a_recipe_imports_only_the_kernel_modules_it_uses():
    """native_qwen3 imports no kernel module; with --override rope_hf, only rope's (never grouped_experts')."""
    code = textwrap.dedent(
        """
        import sys
        from harness.options.run_options import RunOptions
        from harness.config.build import build_config
        kernels = lambda: sorted(m for m in sys.modules if m.startswith("recipes.kernels."))
        build_config(RunOptions(recipe="native_qwen3", tier="cpu", init="random").resolved())
        print(kernels())
        build_config(RunOptions(recipe="native_qwen3", tier="cpu", init="random", overrides=["rope_hf"]).resolved())
        print(kernels())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    # kernel_op is rope's custom-op helper (no torchtitan name, no kernel of its own)
    assert out.stdout.strip().splitlines()[-2:] == [
        "[]",
        "['recipes.kernels.kernel_op', 'recipes.kernels.rope']",
    ]


# --- the refusal of `python -m harness run`, with a name hidden from the real torchtitan -------------


def _no_exact_keyword(*, target, fqns=None, description=""):
    return None


#: case: (module, attribute, its stand-in or None to delete it, run args, the missing name, why the suite needs it)
HIDE = {
    "a public function": (
        "torchtitan.models.qwen3.config_registry",
        "qwen3_32b",
        None,
        ["native_qwen3"],
        "torchtitan.models.qwen3.config_registry.qwen3_32b",
        "tutorial config 2 starts from qwen3_32b()",
    ),
    "a private helper of a kernel": (
        "torchtitan.models.common.rope",
        "_maybe_check_max_pos",
        None,
        ["native_qwen3", "--override", "rope_hf"],
        "torchtitan.models.common.rope._maybe_check_max_pos",
        "rope_hf refuses positions beyond max_seq_len",
    ),
    "a keyword the suite passes": (
        "torchtitan.config",
        "override",
        _no_exact_keyword,
        ["nki_moe"],
        "keyword 'exact' in torchtitan.config.override(...)",
        "registering the rope_hf / grouped_experts overrides",
    ),
}
RUN = ("--tier", "cpu", "--init", "random")


def assert_names_refusal(case: str, proc: subprocess.CompletedProcess, report_dir) -> None:
    _, _, _, _, missing, purpose = HIDE[case]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [
        line
        for line in proc.stderr.splitlines()
        if line.startswith("python -m harness run: error:")
    ]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(
        f"python -m harness run: error: torchtitan {VERSION} has no {missing}"
    )
    assert f"which the suite needs for {purpose}" in errors[0]
    assert "Traceback" not in proc.stderr
    assert "process(es), run dir" not in proc.stdout
    assert not (report_dir / "runs").exists(), "no rank may start"


@pytest.mark.parametrize("case", sorted(HIDE))
def test_run_refuses_in_one_line_before_any_rank(case, tmp_path, monkeypatch):
    """``main`` in this process, the name hidden from the torchtitan it has imported."""
    module, attribute, stand_in, args, _, _ = HIDE[case]
    if stand_in is None:
        monkeypatch.delattr(importlib.import_module(module), attribute)
    else:
        monkeypatch.setattr(importlib.import_module(module), attribute, stand_in)
    report_dir = tmp_path / "report"
    out = main_in_process(
        ["run", *args, *RUN, "--report-dir", str(report_dir)]
    )  # nothing prestarted in process
    assert_names_refusal(case, out, report_dir)


#: Test code run before ``main`` in the fresh interpreter: after the CLI prestarts harness.launch.elastic, it waits
#: until the test's watch has seen that process (the file ``$QWEN3_TEST_SEEN`` appears) before the checks refuse,
#: so "none left" is believed only of a process the watch saw alive, on a machine of any speed.
WAIT_UNTIL_SEEN = """
import os, time
import harness.launch.lifecycle as launch_mod
original = launch_mod.prestart
def prestart(opts):
    started = original(opts)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.environ["QWEN3_TEST_SEEN"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return started
launch_mod.prestart = prestart
"""


@pytest.mark.slow
def test_the_command_line_refuses_a_hidden_name_like_main_in_process(tmp_path):
    """A fresh interpreter whose torchtitan lacks the name before ``main`` imports anything, the tier as it ships
    (its harness.launch.elastic prestarted, and none of the run's processes left after the refusal)."""
    from run_watch import RunWatch, describe

    case = "a public function"
    module, attribute, _, args, _, _ = HIDE[case]
    report_dir = tmp_path / "report"
    seen = tmp_path / "seen"
    wrapper = (
        f"import {module} as m; del m.{attribute}\n{WAIT_UNTIL_SEEN}"
        "import sys\nfrom harness.__main__ import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "QWEN3_TEST_SEEN": str(seen)}
    with RunWatch(report_dir) as watch:
        proc = subprocess.Popen(
            [sys.executable, "-c", wrapper, "run", *args, *RUN, "--report-dir", str(report_dir)],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            watch.wait_for(
                120, torchrun=1
            )  # the prestarted harness.launch.elastic, alive while the checks wait
        finally:
            seen.touch()
            out, err = proc.communicate(timeout=300)
    left = watch.kill_left()
    assert_names_refusal(
        case, subprocess.CompletedProcess(proc.args, proc.returncode, out, err), report_dir
    )
    assert left == [], f"a refused run left {describe(left)} ({watch.summary()})"


# --- python -m harness.checks.titan: the nightly's first step and part of the dry run (issue 24 point 4) ----


def titan_check(hide: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m harness.checks.titan`` after ``hide`` has changed the real torchtitan in that process."""
    wrapper = (
        f"{hide}\nimport sys\nfrom harness.checks.titan import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", wrapper, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


@pytest.mark.slow
def test_the_names_check_passes_on_the_pinned_torchtitan_and_reports_the_forks_config3_absent():
    out = titan_check("", "--tier", "cpu")
    assert out.returncode == 0, out.stdout + out.stderr
    declared = len([e for e in titan.NAMES if set(e.used_by) - {"trn2"}])
    assert (
        f"torchtitan names check (cpu tier, torchtitan {VERSION}): {declared - 1} of {declared} resolve"
        in out.stdout
    )
    assert "1 absent (findings, not failures)" in out.stdout
    assert (
        "absent   torchtitan_neuron.models.qwen3.config_registry.qwen3_nki_moe_config" in out.stdout
    )
    assert "MISSING" not in out.stdout


@pytest.mark.slow
def test_the_names_check_names_a_name_upstream_removed_with_the_file_that_needs_it():
    """HuggingFaceTextDataLoader left upstream main on 2026-08-19 (pytorch/torchtitan 1b04fc1c3): a fork based
    after that lacks it, and the check lists it with its purpose and recipes/tutorial.py, then exits 1."""
    hide = "import torchtitan.hf_datasets.text_datasets as m; del m.HuggingFaceTextDataLoader"
    out = titan_check(hide, "--tier", "trn2")
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    (line,) = [
        x for x in lines if x.lstrip().startswith("MISSING  torchtitan.hf_datasets.text_datasets.")
    ]
    assert (
        "has no torchtitan.hf_datasets.text_datasets.HuggingFaceTextDataLoader, which the suite needs for "
        'reading the local {"text": ...} corpus' in line
    )
    assert lines[lines.index(line) + 1].strip() == "needed by recipes/tutorial.py"
    # The modules that import it from there fail with it, each named (torchtitan.trainer among them).
    assert any(x.lstrip().startswith("MISSING  torchtitan.trainer.Trainer:") for x in lines)


@pytest.mark.slow
def test_the_names_check_names_a_hook_the_trainer_no_longer_calls():
    """A fork whose Trainer.train fetches batches another way would leave harness/rank/first_batch.py's wrapper uncalled
    (no step-1 record, no reference): a named failure, not a silent None."""
    hide = (
        "import torchtitan.trainer as m\n"
        "def train(self):\n    return self.step_all(self.dataloader)\n"
        "m.Trainer.train = train"
    )
    out = titan_check(hide)
    assert out.returncode == 1, out.stdout + out.stderr
    assert (
        "read of self.batch_generator in torchtitan.trainer.Trainer.train (a hook it no longer calls)"
        in out.stdout
    )
    assert "read of self.train_step in torchtitan.trainer.Trainer.train" in out.stdout
    assert (
        "needed by harness/rank/first_batch.py" in out.stdout
        and "needed by harness/rank/faults.py" in out.stdout
    )


@pytest.mark.slow
def test_a_logger_the_metrics_processor_no_longer_sets_is_named():
    hide = (
        "import torchtitan.components.metrics as m\n"
        "init = m.MetricsProcessor.__init__\n"
        "def __init__(self, *a, **k):\n    init(self, *a, **k)\n"
        "m.MetricsProcessor.__init__ = __init__"
    )
    out = titan_check(hide)
    assert out.returncode == 1, out.stdout + out.stderr
    assert (
        "assignment self.logger in torchtitan.components.metrics.MetricsProcessor.logger"
        in out.stdout
    )


@pytest.mark.slow
def test_a_tyro_without_parse_error_hooks_is_a_finding_not_a_failure():
    """tyro < 1.0.14 has no tyro._errors.on_parse_error: refused options keep tyro's own message (harness.config.titan_cli)."""
    out = titan_check("import tyro._errors as m; del m.on_parse_error", "--tier", "trn2")
    assert out.returncode == 0, out.stdout + out.stderr
    tyro_version = importlib.metadata.version("tyro")
    assert (
        f"absent   tyro._errors.on_parse_error: tyro {tyro_version} has no tyro._errors.on_parse_error: "
        in out.stdout
    )
    assert "needed by harness/config/titan_cli.py" in out.stdout


def test_every_required_name_has_a_suite_file_that_needs_it():
    """A declaration nothing uses is stale: the check could only ever refuse a fork for it."""
    from harness.checks import titan as check

    unused = [e.qualified for e in titan.NAMES if e.required and not check.users(e)]
    assert unused == []


# --- hooks are replaced only through recipes.titan.wrap_hook, which checks them on the rank (issue 26) ---------


def test_a_hook_the_built_object_lacks_is_named_with_the_module_that_wraps_it():
    with pytest.raises(titan.TitanNameError) as e:
        titan.hook(object(), "Trainer.batch_generator", wrapped_by="harness.rank.first_batch")
    assert str(e.value).startswith(
        f"torchtitan {VERSION} has no batch_generator on the built object, which the suite "
        "needs for recording step 1's batches for the host reference"
    )
    assert str(e.value).endswith("; the hook is wrapped by harness.rank.first_batch")
    with pytest.raises(AttributeError, match="'Trainer' is no hook of recipes.titan.NAMES"):
        titan.hook(object(), "Trainer")


#: A torchtitan whose Trainer lacks a hook, or no longer calls it: what the rank must say.
RANK_HIDE = {
    "removed": (
        "del m.Trainer.batch_generator",
        f"torchtitan {VERSION} has no torchtitan.trainer.Trainer.batch_generator, which the suite needs for "
        "recording step 1's batches for the host reference",
    ),
    # Before wrap_hook this rank ended 0 with no step-1 record: the reference loss silently None.
    "no longer called": (
        "m.Trainer.train = lambda self: None",
        f"torchtitan {VERSION} has no read of self.batch_generator in torchtitan.trainer.Trainer.train "
        "(a hook it no longer calls)",
    ),
}


@pytest.mark.parametrize("case", sorted(RANK_HIDE))
@pytest.mark.slow
def test_a_rank_whose_trainer_lacks_a_hook_refuses_naming_it(case, tmp_path):
    """The launcher's names check is passed (run.json written first), then the hook goes: the rank itself refuses."""
    hide, expected = RANK_HIDE[case]
    run_dir = tmp_path / "run"
    code = textwrap.dedent(
        f"""
        import sys
        from harness.launch.lifecycle import write_run_file
        from harness.options.run_options import RunOptions
        from harness.checks.preflight import preflight
        opts = preflight(RunOptions(recipe="native_qwen3", tier="cpu", init="hf", steps=1, export=False))
        write_run_file(RunOptions(**{{**vars(opts), "run_dir": {str(run_dir)!r}}}).resolved())
        import torchtitan.trainer as m
        {hide}
        from harness.rank.train import main
        sys.exit(main(["--run-dir", {str(run_dir)!r}]))
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    errors = [
        line for line in proc.stderr.splitlines() if line.startswith("harness.rank.train: error:")
    ]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith(f"harness.rank.train: error: {expected}"), errors[0]
    assert errors[0].endswith("; the hook is wrapped by harness.rank.first_batch"), errors[0]
    assert "Traceback" not in proc.stderr
    assert not (run_dir / "first_batch").exists(), "no step may run"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

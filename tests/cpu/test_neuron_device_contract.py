"""The pytest process never opens a NeuronCore: every device touch of tests/neuron runs in a child.

A process that opens the device without ``NEURON_RT_VISIBLE_CORES`` holds every core
until it exits, so a one-core test run in-process would starve every 64-rank launch
after it (tests/neuron/neuron_cores.py). Checked here without a chip: statically, every
device touch in tests/neuron lies inside a ``@neuron_core_body`` function and no body is
called directly; dynamically, ``on_neuron_cores`` runs a body in a child that names its
cores, returns its JSON, fails loudly and leaves no process behind.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from recipes.tiers import REPO_ROOT

NEURON_TESTS = REPO_ROOT / "tests" / "neuron"
CONTRACT_FILE = NEURON_TESTS / "neuron_cores.py"
BODY_DECORATOR = "neuron_core_body"
#: Calls whose string argument names a device, e.g. torch.device("neuron"), x.to("neuron").
DEVICE_CALLS = {"device", "to"}
NEURON_DEVICE = re.compile(r"^neuron(:\d+)?$")
#: Names whose call opens or registers the device: the contract's own accessor, the trn2 platform.
DEVICE_FUNCTIONS = {"neuron_device", "install"}


def _name(node: ast.AST) -> str:
    """``a.b.c`` → ``c``; ``c`` → ``c``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _is_body(fn: ast.AST) -> bool:
    return isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        _name(d.func if isinstance(d, ast.Call) else d) == BODY_DECORATOR for d in fn.decorator_list
    )


def device_touch(node: ast.AST) -> str | None:
    """What ``node`` does to the device, or None: imports torch_neuronx, names the neuron device, opens it."""
    if isinstance(node, ast.Import) and any(
        a.name.split(".")[0] == "torch_neuronx" for a in node.names
    ):
        return "imports torch_neuronx"
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch_neuronx":
        return "imports torch_neuronx"
    if not isinstance(node, ast.Call):
        return None
    called = _name(node.func)
    if called in DEVICE_FUNCTIONS:
        return f"calls {called}()"
    named = [a for a in node.args if called in DEVICE_CALLS] + [
        k.value for k in node.keywords if k.arg == "device"
    ]
    if any(
        isinstance(a, ast.Constant) and isinstance(a.value, str) and NEURON_DEVICE.match(a.value)
        for a in named
    ):
        return f"names the neuron device in {called}(...)"
    return None


def contract_violations(path: Path) -> list[str]:
    """Every device touch outside a ``@neuron_core_body`` and every direct call of a body, in one module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    bodies = {fn.name for fn in ast.walk(tree) if _is_body(fn)}
    found = []

    def visit(node: ast.AST, inside_body: bool) -> None:
        inside_body = inside_body or _is_body(node)
        touch = device_touch(node)
        if touch and not inside_body:
            found.append(f"{path.name}:{node.lineno}: {touch} outside a @{BODY_DECORATOR} function")
        if isinstance(node, ast.Call) and _name(node.func) in bodies:
            found.append(
                f"{path.name}:{node.lineno}: calls the body {_name(node.func)}() directly; "
                f"use on_neuron_cores({_name(node.func)})"
            )
        for child in ast.iter_child_nodes(node):
            visit(child, inside_body)

    visit(tree, False)
    return found


def test_no_neuron_test_touches_the_device_in_the_pytest_process():
    modules = sorted(p for p in NEURON_TESTS.glob("*.py") if p != CONTRACT_FILE)
    assert any(p.name == "test_rope_kernel_neuron.py" for p in modules)
    violations = [v for path in modules for v in contract_violations(path)]
    assert not violations, (
        "tests/neuron touches a NeuronCore in the pytest process, which then holds every core until it "
        "exits; run it through tests/neuron/neuron_cores.py on_neuron_cores:\n"
        + "\n".join(violations)
    )


def test_the_kernel_tests_measure_through_the_contract():
    """The one-core kernel tests are the ones that touch a core: each runs a body in a child."""
    for name in ("test_rope_kernel_neuron.py", "test_nki_moe_neuron.py"):
        tree = ast.parse((NEURON_TESTS / name).read_text())
        bodies = [fn.name for fn in ast.walk(tree) if _is_body(fn)]
        launched = {
            _name(node.args[0])
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and _name(node.func) == "on_neuron_cores" and node.args
        }
        assert bodies and set(bodies) == launched, (name, bodies, launched)


@pytest.mark.parametrize(
    "source, touch",
    [
        ("import torch_neuronx\n", "imports torch_neuronx"),
        ("from torch_neuronx.nki_hop import wrap_nki\n", "imports torch_neuronx"),
        ("import torch\nd = torch.device('neuron')\n", "names the neuron device in device(...)"),
        ("def f(x):\n    return x.to('neuron:0')\n", "names the neuron device in to(...)"),
        (
            "import torch\nt = torch.zeros(2, device='neuron')\n",
            "names the neuron device in zeros(...)",
        ),
        ("from neuron_cores import neuron_device\nd = neuron_device()\n", "calls neuron_device()"),
        ("from recipes.platform import neuron\nneuron.install()\n", "calls install()"),
    ],
)
def test_the_checker_sees_each_kind_of_device_touch(tmp_path, source, touch):
    path = tmp_path / "test_x.py"
    path.write_text(source)
    assert [v.split(": ", 1)[1] for v in contract_violations(path)] == [
        f"{touch} outside a @{BODY_DECORATOR} function"
    ]
    path.write_text(
        "from neuron_cores import neuron_core_body\n@neuron_core_body\ndef body():\n"
        + textwrap.indent(source, "    ")
    )
    assert contract_violations(path) == []


def test_the_checker_refuses_a_body_called_directly(tmp_path):
    path = tmp_path / "test_x.py"
    path.write_text(
        textwrap.dedent("""
        from neuron_cores import neuron_core_body, on_neuron_cores
        @neuron_core_body
        def body():
            return 1
        def test_ok():
            on_neuron_cores(body)
        def test_bad():
            body()
    """)
    )
    assert contract_violations(path) == [
        "test_x.py:9: calls the body body() directly; use on_neuron_cores(body)"
    ]


# ---------------------------------------------------------------- on_neuron_cores, run for real on cpu


BODIES = """
import os, subprocess, sys, time
from neuron_cores import neuron_core_body, neuron_device


@neuron_core_body
def report(tag):
    return {"tag": tag, "cores": os.environ["NEURON_RT_VISIBLE_CORES"], "pid": os.getpid(),
            "torch_neuronx_loaded": "torch_neuronx" in sys.modules}


@neuron_core_body
def fails():
    raise ValueError("the kernel refused the shape")


@neuron_core_body
def hangs(pid_file):
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(pid_file, "w") as f:
        f.write(f"{os.getpid()} {helper.pid}")
    time.sleep(600)


@neuron_core_body
def asks_for_the_device():
    return str(neuron_device())
"""


@pytest.fixture
def contract(monkeypatch):
    """tests/neuron/neuron_cores.py as the neuron tests import it (tests/neuron on sys.path)."""
    monkeypatch.syspath_prepend(str(NEURON_TESTS))
    return importlib.import_module("neuron_cores")


@pytest.fixture
def bodies(tmp_path, contract):
    path = tmp_path / "bodies_for_test.py"
    path.write_text(BODIES)
    spec = importlib.util.spec_from_file_location("bodies_for_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "parent, cores, child",
    [(None, 1, "0"), ("16-31", 1, "16"), ("16-31", 4, "16-19"), ("5", 1, "5")],
)
def test_a_body_runs_in_a_child_that_names_its_cores(
    contract, bodies, monkeypatch, parent, cores, child
):
    if parent is None:
        monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    else:
        monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", parent)
    result = contract.on_neuron_cores(bodies.report, "x", cores=cores, timeout_s=120)
    assert result == {
        "tag": "x",
        "cores": child,
        "pid": result["pid"],
        "torch_neuronx_loaded": False,
    }
    assert result["pid"] != os.getpid()
    assert os.environ.get("NEURON_RT_VISIBLE_CORES") == parent, (
        "the pytest process's own value is untouched"
    )


def test_a_slice_too_small_for_the_body_is_refused(contract, bodies, monkeypatch):
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "3")
    with pytest.raises(ValueError, match="allots 1 core"):
        contract.on_neuron_cores(bodies.report, "x", cores=2)


def test_a_body_or_the_device_refuses_to_run_in_the_pytest_process(contract, bodies):
    with pytest.raises(contract.NeuronCoreContractError, match=r"on_neuron_cores\(report\)"):
        bodies.report("x")
    with pytest.raises(contract.NeuronCoreContractError, match="never open the device"):
        contract.neuron_device()
    with pytest.raises(TypeError, match="not a @neuron_core_body"):
        contract.on_neuron_cores(lambda: 1)


def test_a_failing_body_fails_the_test_with_the_childs_traceback(contract, bodies):
    with pytest.raises(
        pytest.fail.Exception,
        match=r"(?s)fails on NeuronCores 0 failed.*ValueError: the kernel refused",
    ):
        contract.on_neuron_cores(bodies.fails, timeout_s=120)


@pytest.mark.slow
def test_the_device_is_opened_in_the_child_only(contract, bodies):
    """On cpu the child cannot install the trn2 platform: the failure is the child's, the parent stays clean."""
    with pytest.raises(pytest.fail.Exception, match="asks_for_the_device on NeuronCores 0 failed"):
        contract.on_neuron_cores(bodies.asks_for_the_device, timeout_s=120)
    assert "torch_neuronx" not in sys.modules


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose (its parent was killed; init reaps it)
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


@pytest.mark.slow
def test_a_timeout_kills_the_child_and_what_it_started(contract, bodies, tmp_path):
    pid_file = tmp_path / "pids"
    with pytest.raises(pytest.fail.Exception, match="did not finish in 5 s"):
        contract.on_neuron_cores(bodies.hangs, str(pid_file), timeout_s=5)
    child, helper = map(int, pid_file.read_text().split())
    deadline = time.monotonic() + 10
    while (_alive(child) or _alive(helper)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child) and not _alive(helper)


def test_open_neuron_devices_reads_the_fd_table(contract, tmp_path):
    fds = tmp_path / "fd"
    fds.mkdir()
    for fd, target in {
        "3": "/dev/neuron0",
        "4": "/dev/null",
        "5": "/dev/neuron12",
        "6": "/dev/neuron0",
    }.items():
        (fds / fd).symlink_to(target)
    assert contract.open_neuron_devices(fds) == ["/dev/neuron0", "/dev/neuron12"]
    assert contract.open_neuron_devices() == [], "this (cpu) process holds no Neuron device"


def test_a_rehearsal_s_fake_device_node_counts_as_a_device(tmp_path):
    """The stand-in runtime opens the rehearsal's fake nodes (files, not under /dev): named, they count.
    Seen failing with ``nodes`` ignored (only the /dev/neuron prefix matched)."""
    from harness.base.device_files import open_device_files

    node = tmp_path / "dev" / "neuron0"
    node.parent.mkdir()
    node.touch()
    fds = tmp_path / "fd"
    fds.mkdir()
    (fds / "3").symlink_to(node)
    (fds / "4").symlink_to(tmp_path / "dev" / "other")
    assert open_device_files(fds) == []
    assert open_device_files(fds, [str(node)]) == [str(node)]


def test_a_test_after_which_the_pytest_process_holds_the_device_fails(contract):
    with pytest.raises(
        pytest.fail.Exception,
        match=r"after tests/neuron/test_x.py::t the pytest process holds /dev/neuron3",
    ):
        contract.fail_if_device_held("tests/neuron/test_x.py::t", ["/dev/neuron3"])
    contract.fail_if_device_held("tests/neuron/test_x.py::t", [])
    contract.fail_if_device_held("tests/neuron/test_x.py::t")  # this cpu process holds none
    conftest = ast.parse((NEURON_TESTS / "conftest.py").read_text())
    teardown = [
        fn
        for fn in ast.walk(conftest)
        if isinstance(fn, ast.FunctionDef) and fn.name == "pytest_runtest_teardown"
    ]
    assert teardown and any(
        isinstance(n, ast.Call) and _name(n.func) == "fail_if_device_held"
        for n in ast.walk(teardown[0])
    ), (
        "tests/neuron/conftest.py must check, after every neuron test, that the pytest process holds no device"
    )


def _autoloading_backend(root: Path, record: Path) -> dict[str, str]:
    """A package that torch autoloads through the ``torch.backends`` entry point (as torch_neuronx
    registers itself) and that appends its process id to ``record`` when imported."""
    (root / "autoload_probe.py").write_text(
        "import os\n"
        f"with open({str(record)!r}, 'a') as f:\n"
        "    f.write(f'{os.getpid()}\\n')\n"
        "def _autoload():\n"
        "    pass\n"
    )
    info = root / "autoload_probe-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: autoload-probe\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nprobe = autoload_probe:_autoload\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO_ROOT)])}


def test_the_pytest_process_does_not_autoload_a_device_backend(tmp_path):
    """With a backend that autoloads on ``import torch`` (as torch_neuronx does on the runner), the night's
    pytest process imports torch and every neuron test module without loading it; a plain
    ``import torch`` in a child, with the runner's setting, still loads it (so the probe can fail)."""
    record = tmp_path / "imported-by.txt"
    (tmp_path / "site").mkdir()
    env = _autoloading_backend(tmp_path / "site", record)
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "neuron", "-p", "no:xdist", "--collect-only", "-q"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (
        "tests collected" in done.stdout
        and "import torch" in (REPO_ROOT / "tests/neuron/test_rope_kernel_neuron.py").read_text()
    )
    assert not record.exists(), f"the pytest process autoloaded the backend: {record.read_text()}"
    child = subprocess.run(
        [sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert record.read_text().strip(), (
        "the probe backend did not autoload in a plain child: the test proves nothing"
    )


@pytest.fixture(scope="session")
def environment_seen_by_a_session_fixture() -> dict[str, str | None]:
    """What a session-scoped fixture (as a shared run is) sees when pytest sets it up."""
    from recipes.platform.neuron import HIDE_DEVICES_ENV

    return {HIDE_DEVICES_ENV: os.environ.get(HIDE_DEVICES_ENV)}


def test_the_host_neuron_is_hidden_before_any_session_fixture(
    environment_seen_by_a_session_fixture,
):
    """A shared run (a session fixture) launched on a trn2 host must already see no Neuron device."""
    from recipes.platform.neuron import HIDE_DEVICES_ENV

    assert environment_seen_by_a_session_fixture == {HIDE_DEVICES_ENV: "1"}


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_body_and_what_it_started_end_when_pytest_dies(bodies, tmp_path, signum):
    """A cancelled night or a step's timeout kills pytest: its body child must not keep running (and holding its
    NeuronCores) in a session of its own. Seen failing: the rehearsal's runner ended the pytest step and
    ``neuron_cores.py ... checked_lane_options`` was still running afterwards."""
    pid_file = tmp_path / "pids"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import importlib.util, sys
        sys.path[:0] = [{str(NEURON_TESTS)!r}, {str(REPO_ROOT)!r}]
        from neuron_cores import on_neuron_cores
        spec = importlib.util.spec_from_file_location("bodies_for_test", {bodies.__file__!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        on_neuron_cores(module.hangs, {str(pid_file)!r}, timeout_s=600)
    """),
        ],
        cwd=REPO_ROOT,
    )
    deadline = time.monotonic() + 60
    while not pid_file.exists() or len(pid_file.read_text().split()) < 2:
        assert time.monotonic() < deadline and parent.poll() is None, "the body never started"
        time.sleep(0.1)
    child, helper = map(int, pid_file.read_text().split())
    parent.send_signal(signum)
    parent.wait(timeout=30)
    deadline = time.monotonic() + 10
    while (_alive(child) or _alive(helper)) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [pid for pid in (child, helper) if _alive(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"{alive} outlived pytest"


def test_every_neuron_launch_takes_its_rank_count_from_the_tier():
    """A launch in tests/neuron names its ranks through the trn2 tier (``TRN2.nproc``), never as a number: the
    rehearsal's seam shrinks the tier to 2 ranks, and a literal escapes it. Seen failing: the rehearsal's
    ``torchtitan.train`` launch of config 2 started 64 ranks on a 2-core host and used up its memory."""
    literal = []
    for path in sorted(NEURON_TESTS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and _name(node.func) in (
                "run_titan_train",
                "titan_train_command",
            ):
                nproc = (
                    node.args[2]
                    if len(node.args) > 2
                    else next((k.value for k in node.keywords if k.arg == "nproc"), None)
                )
                if isinstance(nproc, ast.Constant):
                    literal.append(
                        f"{path.name}:{node.lineno}: {_name(node.func)}(..., {nproc.value}, ...)"
                    )
    assert not literal, "pass the tier's rank count (recipes.tiers.TRN2.nproc):\n" + "\n".join(
        literal
    )

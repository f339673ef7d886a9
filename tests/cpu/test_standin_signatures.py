"""Every name the suite calls in torch_neuronx / nki / nkilib exists in the rehearsal's stand-ins, and each call binds.

The stand-ins (rehearsal/standins/) copy the real packages' names and signatures so the trn2
tier's code runs in the rehearsal; a stand-in that drifts from the suite's calls would make the
rehearsal answer for a package that does not exist. This test reads the suite's uses from its
source (the AST of recipes/ and tests/neuron/: imports from those packages, calls of the imported
names, attributes read from them, and each launch of a ``wrap_nki`` kernel) and binds every call
to the stand-in's ``inspect.signature``. The stand-ins are imported only in a child interpreter
whose sys.path names their source directories: never in this process, never on the cpu tier's path.
"""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from recipes.platform import nkilib_source
from recipes.tiers import REPO_ROOT

STANDINS = REPO_ROOT / "rehearsal" / "standins"
SOURCE_DIRS = [STANDINS / name for name in ("torch-neuronx", "neuronx-cc", "nki")]
PACKAGES = ("torch_neuronx", "nki", "nkilib")
SUITE_FILES = sorted(
    [REPO_ROOT / "recipes" / "titan.py", *(REPO_ROOT / "recipes" / "platform").glob("neuron*.py")]
    + [
        *(REPO_ROOT / "recipes" / "kernels").glob("*.py"),
        *(REPO_ROOT / "tests" / "neuron").glob("*.py"),
    ]
)
#: Where the suite launches an nkilib kernel it wrapped with ``wrap_nki``: the kernel is a variable
#: there, so the function that holds the ``kernel[grid](...)`` call is named here; the test refuses a
#: wrapped nkilib kernel that has no entry.
LAUNCH_SITES = {
    "nkilib.core.embeddings.rope_hf.rope_hf": ("recipes/kernels/rope.py", "_rope_nki"),
    "nkilib.experimental.moe.bwd.blockwise_mm_backward.blockwise_mm_bwd": (
        "recipes/kernels/grouped_experts.py",
        "launch_blockwise_mm_bwd",
    ),
}


@dataclass
class Call:
    """One call of a stand-in name: positional count (None: a ``*args`` of unknown length) and keywords."""

    target: str
    where: str
    positional: int | None
    keywords: list[str] = field(default_factory=list)


def _is_package(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def _imports(tree: ast.AST) -> dict[str, str]:
    """Local name -> qualified stand-in name, from imports and ``importlib.import_module("...").name``."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and _is_package(node.module):
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _is_package(alias.name):
                    names[alias.asname or alias.name.split(".")[0]] = (
                        alias.asname and alias.name or alias.name.split(".")[0]
                    )
        elif (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Attribute)
            and isinstance(node.value.value, ast.Call)
            and getattr(node.value.value.func, "attr", None) == "import_module"
            and node.value.value.args
            and isinstance(node.value.value.args[0], ast.Constant)
            and _is_package(str(node.value.value.args[0].value))
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = f"{node.value.value.args[0].value}.{node.value.attr}"
    return names


def _qualified(node: ast.AST, names: dict[str, str]) -> str | None:
    """``Name`` or ``Name.attr...`` resolved through the imports, or None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in names:
        return ".".join([names[node.id], *reversed(parts)])
    return None


def _call_shape(call: ast.Call, target: str, where: str, scope: ast.AST | None = None) -> Call:
    """Positional count and keywords; ``*x``/``**x`` resolved through ``x = f(a, b, ...)``/``x = {...}`` in ``scope``."""
    assigned = {}
    for node in ast.walk(scope) if scope is not None else ():
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            assigned[node.targets[0].id] = node.value
    positional, keywords = 0, []
    for arg in call.args:
        if isinstance(arg, ast.Starred):
            value = assigned.get(getattr(arg.value, "id", None))
            if isinstance(value, ast.Call) and not any(
                isinstance(a, ast.Starred) for a in value.args
            ):
                positional += len(value.args)  # e.g. tensors = _contiguous(a, b, c)
            else:
                return Call(target, where, None, keywords)
        else:
            positional += 1
    for kw in call.keywords:
        if kw.arg is not None:
            keywords.append(kw.arg)
            continue
        value = assigned.get(getattr(kw.value, "id", None))
        if not isinstance(value, ast.Dict) or not all(
            isinstance(k, ast.Constant) for k in value.keys
        ):
            raise AssertionError(
                f"{where}: **{ast.unparse(kw.value)} is not a dict literal this test can read"
            )
        keywords.extend(k.value for k in value.keys)
    return Call(target, where, positional, keywords)


def suite_uses() -> tuple[list[Call], set[str], set[str]]:
    """(calls, attributes read, kernels passed to wrap_nki) of the stand-in packages, over SUITE_FILES."""
    calls, attributes, wrapped = [], set(), set()
    for path in SUITE_FILES:
        tree = ast.parse(path.read_text(), filename=str(path))
        names = _imports(tree)
        rel = path.relative_to(REPO_ROOT)
        attributes.update(names.values())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                target = _qualified(node.func, names)
                if target is not None:
                    calls.append(_call_shape(node, target, f"{rel}:{node.lineno}"))
                    if target.endswith("nki_hop.wrap_nki") and node.args:
                        kernel = _qualified(node.args[0], names)
                        if kernel and kernel.startswith("nkilib."):
                            wrapped.add(kernel)
            elif isinstance(node, ast.Attribute) and not isinstance(
                getattr(node, "ctx", None), ast.Store
            ):
                qualified = _qualified(node, names)
                if qualified:
                    attributes.add(qualified)
    for kernel, (rel, function) in LAUNCH_SITES.items():
        calls.append(launch_call(kernel, rel, function))
    return calls, attributes, wrapped


def launch_call(kernel: str, rel: str, function: str) -> Call:
    """The one ``kernel[grid](...)`` call inside ``function`` of ``rel``."""
    tree = ast.parse((REPO_ROOT / rel).read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    launches = [
        n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript)
    ]
    assert len(launches) == 1, (
        f"{rel}:{function} should launch one kernel[grid](...), found {len(launches)}"
    )
    return _call_shape(launches[0], kernel, f"{rel}:{launches[0].lineno} ({function})", scope=fn)


#: Run in the child: import each stand-in name and describe its signature (JSON on stdout).
_DESCRIBE = r"""
import importlib, inspect, json, sys
out = {}
for name in json.loads(sys.argv[1]):
    module, obj = None, None
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError as e:
            obj = e
        break
    if obj is None or isinstance(obj, AttributeError):
        out[name] = {"missing": str(obj) if obj is not None else "no such module"}
        continue
    entry = {"file": getattr(inspect.getmodule(obj), "__file__", None)}
    if callable(obj):
        try:
            sig = inspect.signature(obj)
            entry["params"] = [[p.name, p.kind.name, p.default is not p.empty] for p in sig.parameters.values()]
        except (TypeError, ValueError):
            pass
    out[name] = entry
print(json.dumps(out))
"""


def describe_standins(names: set[str]) -> dict[str, dict]:
    """Each name's signature as the stand-ins define it, read in a child with their sources on sys.path."""
    path = ":".join(str(d) for d in SOURCE_DIRS)
    code = f"import sys; sys.path[:0] = {path.split(':')!r}\n" + _DESCRIBE
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(sorted(names))],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=STANDINS,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def signature_of(params: list) -> inspect.Signature:
    return inspect.Signature(
        [
            inspect.Parameter(
                n, getattr(inspect.Parameter, k), default=None if d else inspect.Parameter.empty
            )
            for n, k, d in params
        ]
    )


def bind_error(call: Call, described: dict) -> str | None:
    """Why ``call`` does not bind to the stand-in's signature, or None."""
    if "missing" in described:
        return f"{call.where}: {call.target} is missing from the stand-ins ({described['missing']})"
    if "params" not in described:
        return None
    sig = signature_of(described["params"])
    try:
        if call.positional is None:
            sig.bind_partial(**dict.fromkeys(call.keywords))
        else:
            sig.bind(*range(call.positional), **dict.fromkeys(call.keywords))
    except TypeError as e:
        return f"{call.where}: {call.target}{sig} does not take the suite's call ({e})"
    return None


@pytest.fixture(scope="module")
def uses_and_standins():
    calls, attributes, wrapped = suite_uses()
    names = (
        {c.target for c in calls}
        | attributes
        | set(nkilib_source.KERNEL_MODULES)
        | {"torch_neuronx"}
    )
    return calls, attributes, wrapped, describe_standins(names)


def test_the_suite_uses_what_this_test_reads():
    """The reader finds the uses the suite is known to make (a reader that finds nothing would pass anything)."""
    calls, attributes, wrapped = suite_uses()
    targets = {c.target for c in calls}
    assert {
        "nkilib.core.moe.moe_cte.moe_cte",
        "nkilib.core.moe.moe_cte.MoECTESpec",
        "nki.jit",
        "torch_neuronx.nki_hop.nki_op",
        "torch_neuronx.nki_hop.wrap_nki",
    } <= targets, targets
    assert "nkilib.core.utils.common_types.ExpertAffinityScaleMode.POST_SCALE" in attributes
    assert wrapped == set(LAUNCH_SITES), (
        f"nkilib kernels the suite wraps with wrap_nki: {sorted(wrapped)}; LAUNCH_SITES names "
        f"{sorted(LAUNCH_SITES)}: add the function that launches each"
    )


@pytest.mark.slow  # the stand-ins are read in a child that imports torch (about 5 s)
def test_every_name_exists_in_the_standins(uses_and_standins):
    _, attributes, _, described = uses_and_standins
    missing = [
        f"{n}: {described[n]['missing']}"
        for n in sorted(attributes | set(nkilib_source.KERNEL_MODULES))
        if "missing" in described[n]
    ]
    assert not missing, "names the suite uses that the stand-ins lack:\n" + "\n".join(missing)


@pytest.mark.slow  # the stand-ins are read in a child that imports torch (about 5 s)
def test_every_call_binds_to_the_standin_signature(uses_and_standins):
    calls, _, _, described = uses_and_standins
    errors = [e for call in calls if (e := bind_error(call, described[call.target]))]
    assert not errors, "\n".join(errors)


@pytest.mark.slow  # the stand-ins are read in a child that imports torch (about 5 s)
def test_standins_are_loaded_from_their_sources_only(uses_and_standins):
    """The child imported the sources under rehearsal/standins, not an installed package; this process none."""
    *_, described = uses_and_standins
    files = {d["file"] for d in described.values() if d.get("file")}
    assert files and all(f.startswith(str(STANDINS)) for f in files), sorted(files)
    assert not {"torch_neuronx", "nki", "nkilib"} & set(sys.modules)


def test_a_renamed_parameter_is_caught():
    """The binding check itself: rope_hf with ``backward`` renamed does not take the suite's launch."""
    call = launch_call(
        "nkilib.core.embeddings.rope_hf.rope_hf",
        *LAUNCH_SITES["nkilib.core.embeddings.rope_hf.rope_hf"],
    )
    params = [
        [n, "POSITIONAL_OR_KEYWORD", d]
        for n, d in [
            ("q", 0),
            ("k", 0),
            ("q_out", 0),
            ("k_out", 0),
            ("cos", 1),
            ("sin", 1),
            ("rope_cache", 1),
            ("bwd", 1),
        ]
    ]
    assert "backward" in (bind_error(call, {"params": params}) or "")
    params[-1][0] = "backward"
    assert bind_error(call, {"params": params}) is None

"""A resolved ``Trainer.Config`` as JSON that names the class of every node, and the differences of two.

torchtitan's ``Trainer.Config.to_dict`` keeps each node's fields but not which class it
configures, so a resolved config cannot show that attention is SDPA, RoPE the
gather-free one or the experts NKI's. :func:`config_tree` keeps both: every config
node becomes ``{"_class": "<module>.<Class>.Config", <fields>...}``; functions and
classes in the tree (a ``ModelSpec``'s ``parallelize_fn``, ``state_dict_adapter``) are
named by their qualified name. :func:`differences` lists, field by field, where two
such trees disagree (``harness.night.config3_fork``: config 3 from the fork's function vs the suite's twin).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from pathlib import Path

CLASS_KEY = "_class"


def qualified(obj) -> str:
    """``module.QualName`` of a class, function or the type of a dataclass instance."""
    target = (
        obj
        if isinstance(obj, type) or callable(obj) and not dataclasses.is_dataclass(obj)
        else type(obj)
    )
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"


def config_tree(node):
    """``node`` (a config dataclass, list, dict or leaf) as JSON-able data with every dataclass's class named."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        tree = {CLASS_KEY: qualified(node)}
        for f in dataclasses.fields(node):
            tree[f.name] = config_tree(getattr(node, f.name, None))
        return tree
    if isinstance(node, (list, tuple)):
        return [config_tree(item) for item in node]
    if isinstance(node, dict):
        return {str(k): config_tree(v) for k, v in node.items()}
    if isinstance(node, enum.Enum):
        return node.value if isinstance(node.value, (str, int, float, bool)) else node.name
    if isinstance(node, Path):
        return str(node)
    if isinstance(node, float) and not math.isfinite(node):
        return repr(node)
    if node is None or isinstance(node, (str, int, float, bool)):
        return node
    if isinstance(node, type) or callable(node):
        return qualified(node)
    return repr(node)


def classes(tree, path: str = "") -> dict[str, str]:
    """``{dotted path: class}`` of every config node of a :func:`config_tree`."""
    found = {}
    if isinstance(tree, dict):
        if CLASS_KEY in tree:
            found[path or "."] = tree[CLASS_KEY]
        for key, value in tree.items():
            if key != CLASS_KEY:
                found.update(classes(value, f"{path}.{key}" if path else key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            found.update(classes(value, f"{path}.{i}"))
    return found


def differences(a, b, path: str = "") -> list[dict]:
    """Every leaf (or class) where tree ``a`` and tree ``b`` disagree: ``{"path", "a", "b"}``, in tree order."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in [*a, *(k for k in b if k not in a)]:
            sub = f"{path}.{key}" if path else key
            if key not in a or key not in b:
                out.append({"path": sub, "a": a.get(key, "<absent>"), "b": b.get(key, "<absent>")})
            else:
                out += differences(a[key], b[key], sub)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [{"path": f"{path} (length)", "a": len(a), "b": len(b)}]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}.{i}")]
    return [] if a == b else [{"path": path, "a": a, "b": b}]


def collapse_layers(diffs: list[dict]) -> list[dict]:
    """Differences that repeat in every layer, shown once as ``layers.*`` with the layers they occur in."""

    grouped: dict[tuple, dict] = {}
    for d in diffs:
        match = re.search(r"\.layers\.(\d+)\.", d["path"])
        key = (re.sub(r"\.layers\.\d+\.", ".layers.*.", d["path"]), repr(d["a"]), repr(d["b"]))
        entry = grouped.setdefault(key, {**d, "path": key[0], "layers": []})
        if match:
            entry["layers"].append(int(match.group(1)))
    return [{k: v for k, v in d.items() if k != "layers" or v} for d in grouped.values()]

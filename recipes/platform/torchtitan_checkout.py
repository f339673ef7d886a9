"""Which TorchTitan Neuron this interpreter runs: the ref and commit scripts/neuron_venv.sh installed.

TorchTitan Neuron is installed from a git checkout (``pip install -e``), and the Neuron setup
page clones whatever the default branch is (aws-neuron/aws-neuron-sdk
training/torchtitan/get-started/setup-torchtitan-neuron.rst), so a version number does not
say which code a night ran. ``scripts/neuron_venv.sh`` asks the remote for the release ref
(``git ls-remote``), checks it out and writes ``<venv>/torchtitan-neuron.json``: url, ref,
whether it is a branch or a tag, the commit ls-remote named and the commit checked out.
:func:`checkout_info` reads that record back and re-reads the checkout's ``HEAD`` now, so a
checkout moved by hand after the install shows; it also says whether ``import torchtitan``
resolves inside that checkout. Runs put it in their provenance, the report in its versions
and the dry run in its output.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from recipes.platform.neuron_versions import TORCHTITAN_NEURON_REF, TORCHTITAN_NEURON_URL

#: Written by scripts/neuron_venv.sh beside the venv's own files (same name there).
RECORD_NAME = "torchtitan-neuron.json"
#: Another record to read instead of ``<sys.prefix>/torchtitan-neuron.json`` (a venv kept elsewhere).
RECORD_ENV = "TORCHTITAN_NEURON_RECORD"


def record_path() -> Path:
    return Path(os.environ.get(RECORD_ENV) or Path(sys.prefix) / RECORD_NAME)


def git_head(checkout: Path) -> str | None:
    """``git rev-parse HEAD`` of ``checkout``, or None when it is not a git checkout (or git is absent)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def torchtitan_origin() -> str | None:
    """Where ``import torchtitan`` would load from (found, not imported)."""
    spec = importlib.util.find_spec("torchtitan")
    return str(Path(spec.origin).resolve()) if spec is not None and spec.origin else None


def checkout_info() -> dict:
    """The install record with the checkout's HEAD now; ``installed`` False (and what is expected) without one."""
    path = record_path()
    origin = torchtitan_origin()
    if not path.is_file():
        return {
            "installed": False,
            "record": str(path),
            "expected": {"url": TORCHTITAN_NEURON_URL, "ref": TORCHTITAN_NEURON_REF},
            "torchtitan": origin,
            "note": "no TorchTitan Neuron install record here: scripts/neuron_venv.sh (make neuron-venv) writes it",
        }
    record = json.loads(path.read_text())
    checkout = Path(record["checkout"])
    head = git_head(checkout)
    return {
        "installed": True,
        **record,
        "record": str(path),
        "head": head,
        "moved": head != record["commit"],
        "torchtitan": origin,
        "torchtitan_from_checkout": origin is not None
        and Path(origin).is_relative_to(checkout.resolve()),
    }


def describe(info: dict) -> str:
    """One line: ``release-2.33 (branch) @ <commit>`` and what is off, or why there is none."""
    if not info["installed"]:
        expected = info["expected"]
        return f"not installed here (expected {expected['ref']} of {expected['url']}; {info['record']} is absent)"
    line = f"{info['ref']} ({info['ref_kind']}) @ {info['commit']}"
    if info["moved"]:
        line += f"; the checkout's HEAD is now {info['head'] or 'unreadable'}"
    if not info["torchtitan_from_checkout"]:
        line += f"; but `import torchtitan` loads {info['torchtitan']}, outside {info['checkout']}"
    return line

"""Where ``nkilib`` and the kernels the suite calls really come from, after nkilib's own import.

neuronx-cc ships the NKI Library as the ``nkilib`` package (the "bundled nkilib",
validated with that compiler). Importing it is not the end of the story: the bundled
``nkilib/__init__.py`` looks for a standalone nki-library (the ``nki_library``
distribution, which installs the package ``nkilib_src``) and, when one is importable,
replaces itself in ``sys.modules`` by ``nkilib_src.nkilib`` and aliases every
``nkilib_src.nkilib.*`` module as ``nkilib.*``; ``NKILIB_FORCE_BUNDLED_LIBRARY=1`` keeps the
bundled copy (aws-neuron/nki-library src/nkilib_src/nkilib/__init__.py,
``_try_setup_src_nkilib``; README.md, "bundled nkilib"). So ``find_spec("nkilib")``,
which runs none of that, names the bundled directory even when a standalone copy
will be the one imported.

:func:`resolve` imports ``nkilib`` and each kernel module and reports the module object
each name really gave, its file and the installed distribution that owns the file.
Import swaps ``sys.modules`` for good, so it runs in a fresh interpreter
(``python -m recipes.platform.nkilib_source``, :func:`resolve_in_child`), with the
environment a run would have.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from recipes.platform.neuron_versions import NKILIB_PROVIDER, normalize
from recipes.tiers import REPO_ROOT

#: The nkilib modules recipes/kernels imports (rope_hf, moe_cte, blockwise_mm_bwd, and moe_cte's enums).
KERNEL_MODULES = (
    "nkilib.core.embeddings.rope_hf",
    "nkilib.core.moe.moe_cte",
    "nkilib.core.utils.common_types",
    "nkilib.experimental.moe.bwd.blockwise_mm_backward",
)
#: nki-library's switch back to the bundled copy (aws-neuron/nki-library README.md).
FORCE_BUNDLED_ENV = "NKILIB_FORCE_BUNDLED_LIBRARY"
_TOP_LEVEL = ("nkilib", "nkilib_src")


def file_owners() -> dict[Path, str]:
    """Installed files under ``nkilib/`` or ``nkilib_src/`` → the (normalized) distribution that installed them."""
    owners = {}
    for dist in metadata.distributions():
        for f in dist.files or ():
            if f.parts and f.parts[0] in _TOP_LEVEL and f.suffix == ".py":
                owners[Path(dist.locate_file(f)).resolve()] = normalize(dist.metadata["Name"])
    return owners


def resolve(modules: tuple[str, ...] = KERNEL_MODULES) -> dict:
    """Import ``nkilib`` and ``modules`` here; what each name gave, from which file, owned by which distribution."""
    resolved = {}
    for name in ("nkilib", *modules):
        module = importlib.import_module(name)
        resolved[name] = {"module": module.__name__, "file": str(Path(module.__file__).resolve())}
    owners = file_owners()
    for where in resolved.values():
        where["distribution"] = owners.get(Path(where["file"]))
    return {
        "resolved": resolved,
        "nkilib_src_imported": "nkilib_src" in sys.modules,
        FORCE_BUNDLED_ENV: os.environ.get(FORCE_BUNDLED_ENV),
    }


def resolve_in_child(env: dict[str, str] | None = None) -> dict:
    """:func:`resolve` in a fresh interpreter with ``env`` (default: this process's), as a run would import it."""
    out = subprocess.run(
        [sys.executable, "-m", "recipes.platform.nkilib_source"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"importing nkilib failed (exit {out.returncode}):\n{out.stderr[-4000:]}"
        )
    return json.loads(out.stdout.splitlines()[-1])


def not_bundled(resolution: dict) -> list[str]:
    """One sentence per name that did not resolve to neuronx-cc's own nkilib."""
    problems = []
    for name, where in resolution["resolved"].items():
        if where["module"] != name:
            problems.append(
                f"`import {name}` gave the module {where['module']} ({where['file']}): a standalone "
                "nki-library replaced the bundled nkilib when it was imported"
            )
        elif where["distribution"] != NKILIB_PROVIDER:
            problems.append(
                f"{name} is {where['file']}, installed by {where['distribution'] or 'no distribution'}, "
                f"not by {NKILIB_PROVIDER}"
            )
    return problems


if __name__ == "__main__":
    print(json.dumps(resolve()))

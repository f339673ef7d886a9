"""The trn2 tier's expected versions, in one place: requirements-neuron.txt plus what pip cannot pin.

Every version is named by the distribution pip really installs. Two components of
Neuron 2.33 have no pin of their own in requirements-neuron.txt:

- the NKI Library ships inside ``neuronx-cc`` as the ``nkilib`` namespace (the
  "bundled nkilib", aws-neuron/aws-neuron-sdk nki/library/quickstart-nkl.rst), so
  it is checked through the neuronx-cc version and through which distribution
  provides ``nkilib``;
- TorchTitan Neuron is installed from git with ``pip install -e .``
  (training/torchtitan/get-started/setup-torchtitan-neuron.rst) and installs the
  distribution ``torchtitan`` at 0.2.2+neuron.1
  (release-notes/components/torchtitan-neuron.rst, Neuron 2.33.0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from recipes.tiers import REPO_ROOT

REQUIREMENTS = REPO_ROOT / "requirements-neuron.txt"

#: TorchTitan Neuron: scripts/neuron_venv.sh clones this (TORCHTITAN_NEURON_URL / _REF override it).
TORCHTITAN_NEURON_URL = "https://github.com/aws-neuron/torchtitan-neuron.git"
TORCHTITAN_NEURON_REF = "release-2.33"
TORCHTITAN_DISTRIBUTION = "torchtitan"
TORCHTITAN_VERSION = "0.2.2+neuron.1"

#: NKI Library 2.33.0 is the copy bundled in this neuronx-cc (Neuron 2.33.0 component release notes).
NKILIB_VERSION = "2.33.0"
NKILIB_PROVIDER = "neuronx-cc"

#: Distributions that hold pinned versions; each must be pinned in requirements-neuron.txt.
PINNED = ("torch", "torch-neuronx", "transformers", "neuronx-cc", "nki")

#: Modules the trn2 tier imports: the distribution that provides each, and what the suite uses it for.
#: Loading ``torch_neuronx`` registers Trainium as the PrivateUse1 backend named ``neuron``
#: (aws-neuron/aws-neuron-sdk torch/reference/api/torch-neuron-module.rst); ``nkilib`` is the
#: NKI Library bundled in neuronx-cc (nki/library/quickstart-nkl.rst), from which recipes/kernels/ imports
#: ``nkilib.core.embeddings.rope_hf``, ``nkilib.core.moe.moe_cte`` and
#: ``nkilib.experimental.moe.bwd.blockwise_mm_backward`` (aws-neuron/nki-library).
MODULES = {
    "torch_neuronx": (
        "torch-neuronx",
        "TorchNeuron, the 'neuron' device and process-group backend",
    ),
    "nkilib": (
        NKILIB_PROVIDER,
        f"NKI Library {NKILIB_VERSION} kernels rope_hf, moe_cte and blockwise_mm_bwd",
    ),
}

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)\s*==\s*([^\s;#\\]+)")
_INDEX = re.compile(r"^--(?:extra-)?index-url[ =]\s*(\S+)")


class NeuronRequirementsError(ValueError):
    """requirements-neuron.txt lacks a pin or pins something that does not exist."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Expected:
    """One distribution the trn2 tier needs, at one version (``2.14.3.0.*`` is a prefix pin)."""

    distribution: str
    version: str
    why: str = ""

    def matches(self, installed: str) -> bool:
        """PEP 440 ``==``: a local label (``+cpu``) is ignored unless the pin names one."""
        if self.version.endswith(".*"):
            prefix = self.version[:-2]
            release = installed.split("+")[0]
            return release == prefix or release.startswith(prefix + ".")
        return installed == self.version or (
            "+" not in self.version and installed.split("+")[0] == self.version
        )


def pins(path: Path = REQUIREMENTS) -> dict[str, str]:
    """``name==version`` lines of a requirements file, by normalized distribution name."""
    found = {}
    for line in path.read_text().splitlines():
        match = _PIN.match(line.strip())
        if match:
            found[normalize(match.group(1))] = match.group(2)
    return found


def index_urls(path: Path = REQUIREMENTS) -> list[str]:
    """The ``--index-url`` / ``--extra-index-url`` options of a requirements file."""
    return [
        m.group(1) for line in path.read_text().splitlines() if (m := _INDEX.match(line.strip()))
    ]


def expected(path: Path = REQUIREMENTS) -> dict[str, Expected]:
    """Every distribution and version the trn2 tier must run with, keyed by distribution."""
    found = pins(path)
    if "nkilib" in found or "torchtitan-neuron" in found:
        bad = "nkilib" if "nkilib" in found else "torchtitan-neuron"
        raise NeuronRequirementsError(
            f"{path}: pins {bad!r}, which is not the distribution pip installs; nkilib ships inside "
            f"neuronx-cc and TorchTitan Neuron installs as 'torchtitan' from git. Remove the line."
        )
    missing = [name for name in PINNED if name not in found]
    if missing:
        raise NeuronRequirementsError(
            f"{path}: no 'name==version' pin for {missing}; add one per distribution"
        )
    versions = {name: Expected(name, found[name], "requirements-neuron.txt") for name in PINNED}
    versions[TORCHTITAN_DISTRIBUTION] = Expected(
        TORCHTITAN_DISTRIBUTION,
        TORCHTITAN_VERSION,
        f"TorchTitan Neuron {TORCHTITAN_NEURON_REF} from git",
    )
    return versions


def module_hint(module: str, path: Path = REQUIREMENTS) -> str:
    """Which pinned distribution provides ``module`` and what for, e.g. for a "not installed" message.

    ``torch-neuronx==2.14.3.0.*: TorchNeuron, ...``; nkilib has no distribution of its own, so
    its hint names the neuronx-cc pin that bundles it.
    """
    distribution, why = MODULES[module]
    pin = f"{distribution}=={pins(path).get(distribution, '?')}"
    if module == "nkilib":
        return f"{why}, bundled in {pin}: no distribution of its own"
    return f"{pin}: {why}"

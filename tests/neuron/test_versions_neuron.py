"""The trn2 tier runs Neuron 2.33 as recipes/platform/neuron_versions.py expects it: one failure per drift.

A drift fails here and nowhere else: the nightly runs every neuron test regardless,
so a version bump shows which published numbers it moved.
"""

from __future__ import annotations

import importlib.util
from importlib import metadata
from pathlib import Path

import pytest

from recipes.platform import neuron_versions
from recipes.platform.neuron_versions import normalize
from requires import requires_neuron_device, requires_torch_neuronx

pytestmark = [requires_neuron_device, requires_torch_neuronx]

EXPECTED = neuron_versions.expected()


@pytest.mark.parametrize("want", list(EXPECTED.values()), ids=list(EXPECTED))
def test_installed_distribution_is_the_expected_version(want, record_property):
    try:
        have = metadata.version(want.distribution)
    except metadata.PackageNotFoundError:
        pytest.fail(f"distribution {want.distribution!r} is not installed; expected {want.version} "
                    f"({want.why}): run `make neuron-venv`", pytrace=False)  # fmt: skip
    record_property(f"versions.{want.distribution}", have)
    assert want.matches(have), (
        f"{want.distribution}: installed {have}, expected {want.version} ({want.why}); "
        "rerun `scripts/neuron_venv.sh --force` or update recipes/platform/neuron_versions.py / requirements-neuron.txt"
    )


def nkilib_providers() -> dict[str, Path]:
    """Distributions whose files include the top-level ``nkilib`` package, and where it lies."""
    found = {}
    for dist in metadata.distributions():
        if any(f.parts and f.parts[0] == "nkilib" for f in dist.files or ()):
            found[normalize(dist.metadata["Name"])] = Path(dist.locate_file("nkilib")).resolve()
    return found


def test_nkilib_is_the_copy_bundled_in_neuronx_cc(record_property):
    """NKI Library 2.33.0 is the ``nkilib`` inside neuronx-cc 2.28.7631.0 (its version is checked above).

    aws-neuron/aws-neuron-sdk nki/library/quickstart-nkl.rst: the compiler ships a bundled
    copy under the ``nkilib`` namespace; a standalone ``nki-library`` install replaces it.
    """
    spec = importlib.util.find_spec("nkilib")
    assert spec is not None, "`import nkilib` finds nothing: neuronx-cc should provide it; run `make neuron-venv`"
    loaded_from = [Path(p).resolve() for p in (spec.submodule_search_locations or [Path(spec.origin).parent])]
    providers = nkilib_providers()
    active = sorted(name for name, where in providers.items() if where in loaded_from)
    record_property("versions.nkilib.loaded_from", [str(p) for p in loaded_from])
    record_property("versions.nkilib.providers", sorted(providers))
    assert active == [neuron_versions.NKILIB_PROVIDER], (
        f"`import nkilib` loads {[str(p) for p in loaded_from]}, provided by {active or 'no installed distribution'}; "
        f"expected the NKI Library {neuron_versions.NKILIB_VERSION} bundled in {neuron_versions.NKILIB_PROVIDER} "
        "(uninstall a standalone nki-library, or update recipes/platform/neuron_versions.py when that is intended)"
    )

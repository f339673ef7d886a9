"""The trn2 tier runs Neuron 2.33 as recipes/platform/neuron_versions.py expects it: one failure per drift.

A drift fails here and nowhere else: the nightly runs every neuron test regardless,
so a version bump shows which published numbers it moved.
"""

from __future__ import annotations

from importlib import metadata

import pytest
from requires import requires_neuron_device, requires_torch_neuronx

from recipes.platform import neuron_versions, nkilib_source

pytestmark = [requires_neuron_device, requires_torch_neuronx]

EXPECTED = neuron_versions.expected()


@pytest.mark.parametrize("want", list(EXPECTED.values()), ids=list(EXPECTED))
def test_installed_distribution_is_the_expected_version(want, record_property):
    try:
        have = metadata.version(want.distribution)
    except metadata.PackageNotFoundError:
        pytest.fail(
            f"distribution {want.distribution!r} is not installed; expected {want.version} "
            f"({want.why}): run `make neuron-venv`",
            pytrace=False,
        )
    record_property(f"versions.{want.distribution}", have)
    assert want.matches(have), (
        f"{want.distribution}: installed {have}, expected {want.version} ({want.why}); "
        "rerun `scripts/neuron_venv.sh --force` or update recipes/platform/neuron_versions.py / requirements-neuron.txt"
    )


def test_nkilib_and_its_kernels_are_the_copy_bundled_in_neuronx_cc(record_property):
    """NKI Library 2.33.0 is the ``nkilib`` inside neuronx-cc 2.28.7631.0 (its version is checked above).

    Judged after ``import nkilib`` has run, in a fresh interpreter with this environment:
    the bundled nkilib replaces itself by a standalone nki-library's ``nkilib_src.nkilib``
    when one is installed (aws-neuron/nki-library src/nkilib_src/nkilib/__init__.py), so
    where the package *would* load from says nothing (recipes/platform/nkilib_source.py).
    """
    resolution = nkilib_source.resolve_in_child()
    record_property("versions.nkilib.resolved", resolution)
    problems = nkilib_source.not_bundled(resolution)
    assert not problems, (
        "; ".join(problems)
        + f". Expected the NKI Library {neuron_versions.NKILIB_VERSION} bundled in "
        f"{neuron_versions.NKILIB_PROVIDER}: `pip uninstall nki-library` (or set NKILIB_FORCE_BUNDLED_LIBRARY=1), "
        "or update recipes/platform/neuron_versions.py when another copy is intended"
    )

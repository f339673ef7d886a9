"""The suite installs the tutorial's versions: its pins agree with harness.declare.published.PINS."""

from __future__ import annotations

import pytest

from harness.base.environment import CPU_LOCK
from harness.declare import published
from recipes.platform.neuron_versions import REQUIREMENTS


def test_the_lock_and_the_neuron_requirements_pin_the_tutorials_versions(record_property):
    problems = published.pin_differences()
    record_property("pin_differences", problems)
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize(
    "pin, release, names",
    [
        ("2.14.3.0.*", "2.14.3", True),
        ("2.14.0", "2.14.0", True),
        ("2.14.0+cpu", "2.14.0", True),
        ("2.14.30.0.*", "2.14.3", False),
        ("2.14.1", "2.14.0", False),
        ("2.14", "2.14.0", False),
    ],
)
def test_a_pin_names_the_published_release_or_a_finer_one(pin, release, names):
    assert published.names_release(pin, release) is names


def test_a_pin_that_leaves_the_tutorials_is_named_with_its_file(tmp_path):
    lock = tmp_path / "requirements-lock.txt"
    lock.write_text(CPU_LOCK.read_text().replace("transformers==5.16.0", "transformers==5.23.0"))
    neuron = tmp_path / "requirements-neuron.txt"
    neuron.write_text(
        REQUIREMENTS.read_text().replace("torch-neuronx==2.14.3.0.*", "torch-neuronx==2.14.2.0.*")
    )
    problems = published.pin_differences(lock, neuron)
    assert [p.split(",")[0] for p in problems] == [
        "requirements-lock.txt: transformers is pinned 5.23.0",
        "requirements-neuron.txt: torch-neuronx is pinned 2.14.2.0.*",
    ], problems

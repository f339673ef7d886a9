"""The trn2 tier runs what requirements-neuron.txt pins (the tutorial's versions)."""

from __future__ import annotations

import pytest

from recipes import lockcheck
from recipes.platform.neuron import neuron_status

pytestmark = pytest.mark.neuron

STATUS = neuron_status(("torch_neuronx", "nkilib"))


@pytest.mark.skipif(not STATUS.ready, reason=STATUS.reason())
def test_installed_packages_match_requirements_neuron(record_property):
    problems = lockcheck.drift(lockcheck.NEURON_REQUIREMENTS)
    record_property("neuron_drift", problems)
    assert not problems, "installed packages drifted from requirements-neuron.txt:\n" + "\n".join(problems)

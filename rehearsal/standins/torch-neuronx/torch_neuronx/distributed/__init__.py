"""The ``neuron`` process-group backend (stand-in): registered on import, as the public copy does."""

from .backend import ProcessGroupNeuron, register_neuron_backend  # noqa: F401

register_neuron_backend()

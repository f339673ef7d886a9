"""Stand-ins for the Neuron packages, built into wheels for a rehearsal venv (never imported from here).

Each subdirectory with a hyphen (``torch-neuronx``, ``neuronx-cc``, ``nki``) is the source of one
distribution at the version requirements-neuron.txt pins; the hyphens keep them from being
importable as packages from a checkout. ``neuron_ls.py`` is the stand-in ``neuron-ls`` tool.
``python -m rehearsal.standins build --out DIR`` (:mod:`rehearsal.standins.build`) writes the wheels
to ``DIR/wheelhouse`` and the tool to ``DIR/bin/neuron-ls``.
"""

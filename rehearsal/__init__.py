"""The trn2 night rehearsed on cpu: stand-ins for the Neuron packages and the settings they read.

Nothing here is imported by the cpu or the trn2 tier. ``rehearsal/settings.py`` is the one
seam recipes/platform/neuron.py consults, and only when ``QWEN3_REHEARSAL_SETTINGS`` is set;
the stand-in packages under ``rehearsal/standins/`` become importable only as wheels installed
into a rehearsal venv (``python -m rehearsal.standins build --out DIR``).
"""

"""Benchmarks of the suite itself: figures, not timed tests.

``python -m benchmarks [suite|overhead|recipes|all] [--tier cpu|trn2] [--out FILE]``
prints a table per benchmark and writes one JSON file (versions, machine, date,
figures, goals and whether each was met) to ``report/bench/`` by default. A
missed goal is a figure to read, not a failure: the command still exits 0.
"""

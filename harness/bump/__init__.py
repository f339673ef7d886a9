"""Rehearse a version bump: what a new torch / transformers / torchtitan would break or fix.

``python -m harness.bump transformers==5.23.0 [torch==2.15.0 ...]`` (``make bump PKGS=...``)

1. **resolve**: ``requirements.in`` with those pins replaced, compiled by pip-tools against
   ``requirements-lock.txt`` (every other pin stays unless it has to move), into a candidate
   lock; what moved is listed. A pin this machine's pip refuses (a ``constraint`` file in
   pip's config, e.g. the torch cap in ``/etc/xdg/pip``) is reported, not worked around.
2. **venv**: ``.venv-bump-<hash>`` from the candidate lock (hashes required, as ``make venv``),
   reused while its candidate lock is unchanged.
3. **run**: the cpu tier (``pytest -m cpu -n auto``) in that venv, and a baseline on the lock
   (``.venv``; reused while lock, code and tests are unchanged and it is recent), each with
   its own ``--report-dir`` under ``report/bump/`` (so ``report/tests.json`` is left alone)
   and a JUnit file for the failure messages.
4. **compare**: ``report/bump/<name>.md`` and ``.json``: one table (each test's verdict on the
   lock and on the candidate), then each canary that flipped, each golden that moved, each
   workaround that broke (``recipes.upstream_shape`` messages).

Exit status: 0; 1 when the candidate breaks a published-number check (a ``published`` or
``proxy`` golden that fails or is no longer measured); 2 when the rehearsal could not run.

The package is one module a step, each importing only modules listed before it: ``plan`` (the
pins, every path, the exit codes), ``candidate`` (steps 1 and 2), ``tier`` and ``results``
(step 3: a run, and reading it back), ``comparison`` and ``report`` (step 4), ``layer`` and
``bisect`` (``python -m harness.bump --bisect``, ``make bisect``: when a bump breaks a check,
the package and the release that move it, each point installed over ``.venv`` in a layered
venv), and ``__main__`` (the command that takes them in order).
"""

"""Which tier folders a ``-m`` expression can select tests from (the root conftest skips the others)."""

from __future__ import annotations

import itertools
import re

from _pytest.mark.expression import Expression


def selectable_tiers(markexpr: str, tiers: tuple[str, ...] = ("cpu", "neuron")) -> set[str]:
    """The tiers whose tests ``-m markexpr`` can select (both when there is no expression).

    A tier's test carries its own tier marker and never the other's; every other marker
    (``slow``, ``requires``, ...) may be on or off, so each assignment of them is tried.
    ``-m neuron`` selects no cpu test and ``-m "cpu and not slow"`` no neuron test.
    """
    if not markexpr.strip():
        return set(tiers)

    expression = Expression.compile(markexpr)
    others = sorted(set(re.findall(r"[A-Za-z_][\w.]*", markexpr)) - {"and", "or", "not", *tiers})
    found = set()
    for tier in tiers:
        for on in itertools.product((False, True), repeat=len(others)):
            marks = {tier, *(name for name, flag in zip(others, on) if flag)}
            if expression.evaluate(lambda name, **kwargs: name in marks):
                found.add(tier)
                break
    return found

"""Tutorial config 3 as the fork's own function builds it, against the suite's twin: a finding of the night.

Not a config the suite runs (that is ``harness.config.build``): the nightly's first step and a trn2 test
show where the fork's function and the suite's twin differ, node by node (``harness.config.tree``),
or that the fork's function is absent here. Which recipe has a fork, and the function's name, is
its catalogue entry's ``fork`` (``harness.declare.catalogue``).
"""

from __future__ import annotations

import importlib

from harness.config.tree import collapse_layers, config_tree, differences
from harness.declare import catalogue
from recipes.registry import get_recipe
from recipes.titan import BY_NAME
from recipes.tutorial import tutorial_settings


def config3_comparison(inputs) -> dict:
    """Tutorial config 3 from the fork's own function vs the suite's twin, both at ``inputs``' launch
    and at the published sizes (a rehearsal shrinks the launches, not the fork's function).

    ``{"fork": qualified name or "absent", "finding": why absent, "source": what a run builds,
    "differences": [{"path", "fork", "twin"}...]}``; the differences repeat per layer only once
    (``layers.*``, with the layers). The fork's function absent is a finding, not a skip.
    """

    entry = catalogue.forked()
    module = importlib.import_module(get_recipe(entry.recipe).module)
    source = module.config_source(inputs.tier)
    fork, why = module.fork_config()
    if fork is None:
        return {"fork": "absent", "finding": why, "source": source, "differences": []}
    twin = tutorial_settings(module.twin_config(inputs.tier, as_published=True), inputs)
    fork = tutorial_settings(fork, inputs)
    found = collapse_layers(differences(config_tree(fork), config_tree(twin)))
    return {
        "fork": BY_NAME[entry.fork.name].qualified,
        "finding": f"{len(found)} difference(s) between the fork's config 3 and the suite's twin",
        "source": source,
        "differences": [
            {
                "path": d["path"],
                "fork": d["a"],
                "twin": d["b"],
                **({"layers": d["layers"]} if "layers" in d else {}),
            }
            for d in found
        ],
    }

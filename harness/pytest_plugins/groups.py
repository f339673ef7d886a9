"""A pytest plugin: ``--dist loadgroup`` keeps each ``xdist_group`` on one worker again (pytest 9.2, xdist 3.8).

The suite's groups (the real-width proxies, a module's one dry run or launch) exist so that
one worker runs them in turn; see :class:`XdistGroupIds` for why they stopped doing that.
"""

from __future__ import annotations

import os

import pytest
from _pytest.nodeid import NodeId

PLUGIN_NAME = "xdist-group-ids"


class XdistGroupIds:
    """``--dist loadgroup`` as xdist documents it, on pytest 9.2: tests of one ``xdist_group`` share a worker.

    xdist 3.8 tells its scheduler a test's group by appending ``@group`` to ``item._nodeid``, which
    pytest 9.2's structured node ids no longer read (pytest-dev/pytest-xdist issue 1386, open, and
    PR 1388): every group was silently spread over the workers, so the real-width proxies ran side
    by side and one worker idled on their memory lock. After xdist's own hook, on a worker, this
    writes the same suffix into the id pytest reads; where xdist's suffix took, it does nothing.
    """

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        if not getattr(config.option, "loadgroup", False):
            return

        for item in items:
            groups = {
                str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                for m in item.iter_markers("xdist_group")
            }
            if groups and item.nodeid.rfind("@") <= item.nodeid.rfind("]"):
                item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(sorted(groups))}")


#: The marker as pytest-xdist declares it (xdist/plugin.py ``pytest_configure``, entry point "xdist"), for runs without xdist.
XDIST_GROUP_MARKER = "xdist_group: specify group for tests should run in same session (pytest-xdist's; inert without it)"


def register(config) -> None:
    """Declare ``xdist_group`` when xdist is not loaded; register the plugin in an xdist worker.

    Without xdist (``-p no:xdist``, the night's own command) nobody declares the marker, and
    ``--strict-markers`` turns each use into a collection error: the first night collected
    30 of 610 tests and ran none. Declared here, a group is simply inert there.
    """
    if not config.pluginmanager.has_plugin("xdist"):  # its entry point name; blocked by -p no:xdist
        config.addinivalue_line("markers", XDIST_GROUP_MARKER)
    if os.environ.get("PYTEST_XDIST_WORKER") and not config.pluginmanager.has_plugin(PLUGIN_NAME):
        config.pluginmanager.register(XdistGroupIds(), PLUGIN_NAME)

"""A pytest plugin (``-p night_order_probe``) that prints each collected test with its ``launch`` marks, in order.

tests/cpu/test_night_collection.py loads it into the night's own collection to see the order the night runs in.
"""

import json

PREFIX = "night-order: "


def pytest_collection_finish(session):
    for item in session.items:
        launches = [name for mark in item.iter_markers("launch") for name in mark.args]
        waits = item.get_closest_marker("host_reference") is not None
        print(
            PREFIX + json.dumps({"id": item.nodeid, "launches": launches, "host_reference": waits})
        )

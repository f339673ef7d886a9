"""The Neuron device files a process holds open, read from its fd table (``/proc/<pid>/fd``).

Two readers share this: the guard after each trn2 test (tests/neuron/neuron_cores.py ``fail_if_device_held``:
the pytest process must hold no device) and the night's preflight (harness/night/device_random.py
``--held-guard``: a child holding core 0 must show one, else that guard is blind).

Why an open ``/dev/neuron<N>`` is read as held NeuronCores. The driver's side is public
(aws-neuron/aws-neuron-driver ``neuron_cdev.c``, the aws-neuronx-dkms 2.24.7.0 sources): a process reserves
cores with an ioctl on an open device file (``NEURON_IOCTL_CRWL_NC_RANGE_MARK``, ``ncdev_crwl_nc_range_mark``
"attempt to acquire a number of consecutive cores", recorded against the caller's pid in ``neuron_crwl.c``),
and the file's flush frees them when the process closes it (``ncdev_misc_flush``: "Clear all NCs used by the
closing process"; ``ncdev_flush`` frees the process's per-core state at its last close of the device). So
cores outlive the process's descriptors only through paths the runtime does not document. The runtime's
side (libnrt: which descriptor it keeps, and that it keeps it while it holds cores) is not public; the
night's preflight checks it on the installed release before the first 64-rank launch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

#: Where a trn2 host has its Neuron devices (recipes/platform/neuron.py ``device_nodes`` globs ``neuron[0-9]*``).
DEVICE_PREFIX = "/dev/neuron"


def open_device_files(fd_dir: Path = Path("/proc/self/fd"), nodes: Iterable[str] = ()) -> list[str]:
    """The files under ``/dev/neuron*``, or among ``nodes`` (a rehearsal's fake device nodes), that the process
    whose fd table is ``fd_dir`` holds open; sorted, each once."""
    known = {os.path.realpath(node) for node in nodes}
    held = set()
    for fd in fd_dir.iterdir() if fd_dir.is_dir() else ():
        try:
            target = os.readlink(fd)
        except OSError:  # closed between the listing and the read (the listing's own descriptor)
            continue
        if target.startswith(DEVICE_PREFIX) or target in known:
            held.add(target)
    return sorted(held)

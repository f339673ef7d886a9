"""Imported first by harness.launch.elastic's forkserver: it dies with harness.launch.elastic, even mid-import.

The forkserver (multiprocessing's, started by harness.launch.elastic) imports torch and
torchtitan for ~10 s before it looks at the pipe that tells it its parent is gone;
a launcher killed meanwhile would leave it running until then. Linux's parent-death
signal ends it at once instead. Processes forked from it (the ranks) do not inherit
the setting (prctl(2)); they set their own (harness.rank.train).
"""

import os
import signal

from harness.launch.child import die_with_parent

#: harness.launch.elastic's pid, in the forkserver's environment only (taken out here, so no rank inherits it).
PARENT_ENV = "QWEN3_ELASTIC_PID"

_parent = os.environ.pop(PARENT_ENV, None)
if _parent is not None:
    die_with_parent(signal.SIGKILL, parent=int(_parent))

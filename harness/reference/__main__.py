"""``python -m harness.reference.diagnosis RUN_DIR | cost``."""

import sys

from harness.reference.diagnosis import main

sys.exit(main())

"""``python -m harness.reference RUN_DIR | cost``."""

import sys

from harness.reference import main

sys.exit(main())

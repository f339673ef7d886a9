"""``python -m harness.bump``: the command line of the version-bump rehearsal."""

import sys

from harness.bump import main

if __name__ == "__main__":
    sys.exit(main())

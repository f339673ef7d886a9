"""``python -m rehearsal.standins build --out DIR``: see :mod:`rehearsal.standins.build`."""

import sys

from rehearsal.standins.build import main

sys.exit(main(sys.argv[1:]))

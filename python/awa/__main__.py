"""``python -m awa``: the ``awa`` command line (see ``awa --help``)."""

import sys

from ._cli import main

sys.exit(main())

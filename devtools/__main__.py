"""The command line, ``python -m devtools ensure|exec|stop ...``: see :mod:`devtools.services`."""

import sys

from devtools.services import main

sys.exit(main())

"""The command line, ``python -m devtools ensure|exec|stop|remove|hint ...`` (see
:mod:`devtools.services`) and ``python -m devtools split ...`` (``make run-split``, see
:mod:`devtools.split`)."""

import sys

if sys.argv[1:2] == ["split"]:
    from devtools.split import main as split

    sys.exit(split(sys.argv[2:]))

from devtools.services import main

sys.exit(main())

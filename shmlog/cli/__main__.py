"""``python -m shmlog.cli``: the ``shmlog`` command (as ``python -m shmlog``)."""

import sys

from . import main

sys.exit(main())

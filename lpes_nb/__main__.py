"""``python -m lpes_nb <command>``: the ``lpes`` command without an install (lpes_nb.cli)."""

import sys

from .cli import main

sys.exit(main())

"""`python -m offline.projection ...`: the command (offline/projection/cli.py)."""

import sys

from offline.projection.cli import main

sys.exit(main())

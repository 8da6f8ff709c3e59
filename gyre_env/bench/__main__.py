"""``python -m gyre_env.bench ...``: the same as ``gyre bench ...``."""

import sys

from gyre_env.bench.cli import main

sys.exit(main())

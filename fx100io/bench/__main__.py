"""python -m fx100io.bench ... (same as `fx100io bench ...`)."""

import sys

from . import main

sys.exit(main())

"""python -m fx100io <command> ..."""

import sys

from fx100io.cli import main

sys.exit(main())

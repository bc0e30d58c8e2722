"""Imported first by the benchmark scripts here: run them from a built checkout
without installing.  Where this checkout's fx100io has its C extension built,
it goes first on sys.path and on PYTHONPATH (so the processes a script starts,
such as `python3 -m fx100io target`, use it too); an unbuilt checkout leaves an
installed fx100io in charge."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if any(f.startswith("_core.") and f.endswith(".so") for f in os.listdir(os.path.join(REPO, "fx100io"))):
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if REPO not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [REPO, *paths] if p)

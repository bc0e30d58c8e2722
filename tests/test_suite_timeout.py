"""A hung test fails the run within the per-test limit, naming the test and
dumping every thread's stack, instead of stalling CI until its own limit."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_a_hung_test_ends_the_run_with_its_stack() -> None:
    probe = "tests/data/hanging_test_probe.py"
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-o", "faulthandler_timeout=5", "-o", "python_files=hanging_test_probe.py", probe],
        cwd=REPO, capture_output=True, text=True, timeout=90)
    took = time.monotonic() - t0
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert took < 60, f"the hung probe took {took:.0f} s to end the run"
    assert "hanging_test_probe.py::test_sleeps_past_the_limit has run for" in out, out
    assert "Timeout (0:00:05)!" in out, out
    # the dump shows where it hung: the probe's sleeping line
    assert 'hanging_test_probe.py", line 9 in test_sleeps_past_the_limit' in out, out

"""Build the C test programs under tests/c for the Python tests that drive
them against live targets."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from support import REPO

CDIR = REPO / "tests" / "c"


def build_c(name: str, sanitize: bool) -> str:
    """`make -C tests/c all` (plain, or ASan+UBSan); the path of binary name.
    Skips the test where make or gcc is missing."""
    if shutil.which("make") is None or shutil.which("gcc") is None:
        pytest.skip("make/gcc not installed")
    cmd = ["make", "-s", "-C", str(CDIR), "all"] + (["SANITIZE=1"] if sanitize else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return str(CDIR / ("build/sanitize" if sanitize else "build") / name)

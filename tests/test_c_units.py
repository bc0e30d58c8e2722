"""The C unit tests (allocator, index encoding, CRC32C) run from the one
test command, normal and under ASan/UBSan."""

import shutil
import subprocess

import pytest
from support import REPO


@pytest.mark.parametrize("sanitize", [False, True], ids=["plain", "asan-ubsan"])
def test_c_unit_tests(sanitize):
    if shutil.which("make") is None or shutil.which("gcc") is None:
        pytest.skip("make/gcc not installed")
    cmd = ["make", "-s", "-C", str(REPO / "tests" / "c"), "test"]
    if sanitize:
        cmd.append("SANITIZE=1")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]

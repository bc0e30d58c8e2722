"""Every fuzzer's corpus (seeds and the regression inputs of crashes found
so far) runs once through its harness in the normal suite, built with gcc
and ASan+UBSan (make -C tests/fuzz replay): a parser change that brings
back an old crash fails here without any fuzzing time."""

import shutil
import subprocess

import pytest
from support import REPO


def test_fuzz_corpora_replay():
    if shutil.which("make") is None or shutil.which("gcc") is None:
        pytest.skip("make/gcc not installed")
    p = subprocess.run(["make", "-s", "-C", str(REPO / "tests" / "fuzz"), "replay"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "no crash" in p.stdout

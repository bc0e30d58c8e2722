"""`fx100io demo` (the README's main command): it formats its file on every run, so it
must never format one that holds someone else's data."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from fx100io.pool import aligned_array
from fx100io.store import ChunkStore


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fx100io", "demo", "--size", "256M",
                           "--chunk", "4M", "--count", "4", "--batch", "2", *args],
                          capture_output=True, text=True, timeout=300)


def test_demo_runs_and_reruns_on_its_own_store(tmp_path):
    path = str(tmp_path / "demo.img")
    for _ in range(2):
        p = demo("--path", path)
        assert p.returncode == 0, p.stderr
        assert "4 chunks after reopen, CRC-checked and compared" in p.stdout
    with ChunkStore(path) as st:
        assert len(st.keys()) == 4


def test_demo_leaves_another_store_alone(tmp_path):
    path = str(tmp_path / "kv.img")
    data = aligned_array(4096)
    data[:] = np.arange(4096) % 251
    with ChunkStore(path, create=True, size=256 << 20) as st:
        st.batch_put_blocking([b"users-chunk"], [data])
    p = demo("--path", path)
    assert p.returncode == 2
    assert "holds a store with 1 chunks that are not the demo's" in p.stderr
    assert "--force" in p.stderr
    back = aligned_array(4096)
    with ChunkStore(path) as st:
        assert st.keys() == [b"users-chunk"]
        assert st.batch_get_blocking([b"users-chunk"], [back]) == [True]
    assert np.array_equal(back, data)
    p = demo("--path", path, "--force")
    assert p.returncode == 0, p.stderr
    with ChunkStore(path) as st:
        assert b"users-chunk" not in st.keys()


def test_demo_leaves_a_file_that_is_no_store_alone(tmp_path):
    path = tmp_path / "notes.bin"
    payload = bytes(range(256)) * 4096
    path.write_bytes(payload)
    p = demo("--path", str(path))
    assert p.returncode == 2
    assert "not a store the demo made" in p.stderr
    assert path.read_bytes() == payload


def test_demo_says_what_is_wrong_with_its_arguments(tmp_path):
    for args, why in ((["--size", "bogus"], "cannot read 'bogus' as a size"),
                      (["--count", "0"], "must be at least 1"),
                      (["--chunk", "1G"], "do not fit")):
        p = demo("--path", str(tmp_path / "x.img"), *args)
        assert p.returncode == 2 and why in p.stderr, (args, p.stderr)
        assert "Traceback" not in p.stderr

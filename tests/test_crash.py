"""Crash consistency: a writer is SIGKILLed at random moments, 20 times.

After every kill the store is reopened: every chunk whose put returned reads
back exact, and no key ever returns bytes other than its own.  Chunk content
is a function of the key, so the checker needs no other record of it.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time

import numpy as np
from conftest import REPO, chunk_bytes

import fx100io

WRITER = r"""
import sys, os
sys.path.insert(0, "tests")
import fx100io
from conftest import chunk_bytes
path, run, acks, maxsize = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
st = fx100io.ChunkStore(path)
ack = open(acks, "a", buffering=1)
i = 0
while True:
    # sizes from tiny to a few MiB; some keys repeat across runs (overwrites)
    keys = [f"r{run}-{i}-{j}" if (i + j) % 3 else f"shared-{(i + j) % 7}" for j in range(3)]
    sizes = [((i * 7919 + j * 104729) % maxsize) + 1 for j in range(3)]
    bufs = [chunk_bytes(f"{k}/{n}", n) for k, n in zip(keys, sizes)]
    st.batch_put_blocking([f"{k}/{n}" for k, n in zip(keys, sizes)], bufs)
    for k, n in zip(keys, sizes):
        ack.write(f"{k}/{n}\n")
    i += 1
"""


def test_sigkill_twenty_times(tmp_path):
    path = str(tmp_path / "crash.img")
    acks = str(tmp_path / "acks.txt")
    # Small chunks (< 64 KiB) in 2 GiB: no eviction (checked below), so nothing
    # acknowledged may disappear; 4 MiB index halves fill every ~1000 puts, so
    # kills also land inside compactions.
    fx100io.ChunkStore(path, create=True, size=2 << 30, index_size=4 << 20).close()
    rng = random.Random(1234)
    total_acked = 0
    for run in range(20):
        p = subprocess.Popen([sys.executable, "-c", WRITER, path, str(run), acks, str(64 << 10)],
                             cwd=str(REPO), stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.3, 1.2))
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert p.returncode == -signal.SIGKILL, p.stderr.read().decode()[-2000:]
        with open(acks) as f:
            acked = [ln.strip() for ln in f if ln.strip()]
        total_acked = len(acked)
        # keys end in their size: the test's premise (no capacity eviction) holds
        stored = sum(int(k.rsplit("/", 1)[1]) + 4096 for k in set(acked))
        assert stored < (2 << 30) - (16 << 20), "premise broken: the writer filled the store"
        with fx100io.ChunkStore(path) as st:
            keys = {k.decode() for k in st.keys()}
            lost = [k for k in acked if k not in keys]
            assert not lost, f"run {run}: acknowledged chunks lost: {lost[:5]}"
            for key in keys:
                n = st.chunk_size(key)
                out = np.empty(n, np.uint8)
                assert st.batch_get_blocking([key], [out]) == [True], key
                assert np.array_equal(out, chunk_bytes(key, n)), f"wrong bytes for {key}"
    assert total_acked > 20  # the writer made real progress between kills


def test_sigkill_with_eviction_never_returns_wrong_bytes(tmp_path):
    """Under capacity pressure chunks are evicted; after kills, whatever is
    found must still be exactly right."""
    path = str(tmp_path / "crash2.img")
    acks = str(tmp_path / "acks2.txt")
    fx100io.ChunkStore(path, create=True, size=64 << 20, index_size=64 << 10).close()
    rng = random.Random(99)
    for run in range(5):
        p = subprocess.Popen([sys.executable, "-c", WRITER, path, str(run), acks, str(3 << 20)],
                             cwd=str(REPO))
        time.sleep(rng.uniform(0.3, 1.0))
        p.send_signal(signal.SIGKILL)
        p.wait()
        with fx100io.ChunkStore(path) as st:
            assert st.stats()["capacity"] < 64 << 20
            for key in st.keys():
                n = st.chunk_size(key)
                out = np.empty(n, np.uint8)
                assert st.batch_get_blocking([key], [out]) == [True], key
                assert np.array_equal(out, chunk_bytes(key.decode(), n)), key


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
from support import REPO, chunk_bytes

import fx100io

WRITER = r"""
import sys, os
sys.path.insert(0, "tests")
import fx100io
from support import chunk_bytes
path, run, acks, maxsize = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
st = fx100io.ChunkStore(path)
ack = open(acks, "a", buffering=1)
print("ready", flush=True)
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


def wait_ready(p: subprocess.Popen) -> None:
    """The kill's random moment counts from the writer's first put, not from its start:
    on a loaded machine Python's start-up alone can outlast the sleep."""
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line == b"ready\n", (line, p.stderr.read().decode()[-2000:] if p.stderr else "")


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
                             cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_ready(p)
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


EVICT_WRITER = r"""
import sys
sys.path.insert(0, "tests")
import fx100io
from support import chunk_bytes
path, run, log, maxsize = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
st = fx100io.ChunkStore(path, capacity=2 << 20)  # under pressure within a few puts
print("ready", flush=True)
out = open(log, "a")
present = {k.decode() for k in st.keys()}
evictions = 0
i = 0
while True:
    # shared keys are overwritten with a new version (and size) each time
    keys = [f"r{run}-{i}-{j}" if (i + j) % 3 else f"shared-{(i + j) % 7}" for j in range(3)]
    sizes = [((i * 7919 + j * 104729 + run * 31) % maxsize) + 1 for j in range(3)]
    version = f"{run}.{i}"
    out.write(f"T {version} " + " ".join(f"{k}/{n}" for k, n in zip(keys, sizes)) + "\n")
    out.flush()
    st.batch_put_blocking(keys, [chunk_bytes(f"{k}@{version}", n) for k, n in zip(keys, sizes)])
    present.update(keys)
    done = [f"A {k}" for k in keys]
    if st.stats()["evictions"] != evictions:
        evictions = st.stats()["evictions"]
        gone = sorted(k for k in present if not st.contains(k))
        present.difference_update(gone)
        done += [f"E {k}" for k in gone]
    out.write("\n".join(done) + "\nC\n")  # C: this put's report is complete
    out.flush()
    i += 1
"""


def _blocks(n: int) -> int:
    return (n + 4095) // 4096 * 4096


def test_sigkill_with_eviction_keeps_what_the_writer_was_told(tmp_path):
    """Under capacity pressure a writer is killed at random moments.  The
    writer logs each put before it starts (T) and, once it returned, the
    keys it acknowledged (A) and the keys that the put's evictions removed
    (E).  After each kill: every acknowledged key that was not evicted reads
    back exactly its latest version; an evicted key stays absent; nothing
    else is in the store; a key of the put cut short holds its old or its
    new version.  The only other misses allowed are what the put cut short
    may have evicted before the kill: at most the space it needed plus one
    chunk per chunk it was putting."""
    path = str(tmp_path / "crash2.img")
    log = str(tmp_path / "log2.txt")
    fx100io.ChunkStore(path, create=True, size=64 << 20, index_size=64 << 10).close()
    rng = random.Random(99)
    expect: dict[str, tuple[str, int]] = {}  # key -> (version, size) it must hold
    pos = 0
    total_evicted = acked_puts = 0
    maxsize = 512 << 10
    for run in range(8):
        p = subprocess.Popen([sys.executable, "-c", EVICT_WRITER, path, str(run), log,
                              str(maxsize)], cwd=str(REPO), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        wait_ready(p)
        time.sleep(rng.uniform(0.6, 1.5))
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert p.returncode == -signal.SIGKILL, p.stderr.read().decode()[-2000:]
        with open(log) as f:
            f.seek(pos)
            text = f.read()
        pos += len(text.encode())
        lines = text.split("\n")
        if not text.endswith("\n"):
            lines = lines[:-1]  # cut by the kill
        inflight: dict[str, tuple[str, int]] = {}
        done: list[str] = []
        for ln in lines:
            if ln.startswith("T "):
                _, version, *pairs = ln.split()
                inflight = {k: (version, int(n)) for k, n in (pr.rsplit("/", 1) for pr in pairs)}
                done = []
            elif ln == "C":  # the put returned and its report is complete
                acked_puts += 1
                for d in done:
                    kind, key = d.split()
                    if kind == "A":
                        expect[key] = inflight[key]
                    else:
                        expect.pop(key, None)
                        total_evicted += 1
                inflight, done = {}, []
            elif ln:
                done.append(ln)
        with fx100io.ChunkStore(path) as st:
            stored = {k.decode() for k in st.keys()}
            extra = stored - set(expect) - set(inflight)
            assert not extra, f"run {run}: keys neither acknowledged nor being put: {sorted(extra)[:5]}"
            unexplained = 0
            for key in sorted(set(expect) | set(inflight)):
                ok = [v for v in (expect.get(key), inflight.get(key)) if v is not None]
                n = st.chunk_size(key)
                if n is None:
                    if key not in inflight:
                        unexplained += _blocks(expect[key][1])
                    expect.pop(key, None)
                    continue
                out = np.empty(n, np.uint8)
                assert st.batch_get_blocking([key], [out]) == [True], key
                got = [v for v in ok if v[1] == n and np.array_equal(out, chunk_bytes(f"{key}@{v[0]}", n))]
                assert got, f"run {run}: {key} holds neither its acknowledged nor its new version"
                expect[key] = got[0]
            # each chunk's allocation evicts until it fits, overshooting by
            # at most the last victim it took
            allowance = sum(_blocks(n) + _blocks(maxsize) for _v, n in inflight.values())
            assert unexplained <= (allowance if inflight else 0), (
                f"run {run}: {unexplained} bytes of acknowledged chunks missing without an "
                "eviction that explains them")
    assert total_evicted > 0, "premise broken: nothing was evicted"
    assert acked_puts > 20, "premise broken: the writer made little progress"

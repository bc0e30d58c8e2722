"""ChunkStore on real files and loop devices: round trips, persistence,
eviction, striping, compaction, its on-device format.  What every store
does (keys, overwrite, delete, bad inputs, corruption, blocking twins) is
in tests/store/test_store_conformance.py."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from support import chunk_bytes, run_python

import fx100io
from fx100io import errors

SIZES = [1, 4095, 4096, 4097, 1 << 20, (14 << 20) + 123, 64 << 20]


def fill(keys, sizes):
    return [chunk_bytes(k, n) for k, n in zip(keys, sizes)]


@pytest.mark.parametrize("engine", ["io_uring", "psync"])
def test_round_trip_and_reopen_in_new_process(tmp_file, engine):
    keys = [f"chunk-{n}" for n in SIZES]
    with fx100io.ChunkStore(str(tmp_file), create=True, size=256 << 20, engine=engine) as st:
        st.batch_put_blocking(keys, fill(keys, SIZES))
        outs = [np.zeros(n, dtype=np.uint8) for n in SIZES]
        assert st.batch_get_blocking(keys, outs) == [True] * len(keys)
        for o, k, n in zip(outs, keys, SIZES):
            assert np.array_equal(o, chunk_bytes(k, n))
    code = f"""
import fx100io, numpy as np, sys
sys.path.insert(0, "tests")
from support import chunk_bytes
st = fx100io.ChunkStore({str(tmp_file)!r}, engine={engine!r})
sizes = {SIZES!r}
keys = [f"chunk-{{n}}" for n in sizes]
pool = fx100io.BufferPool(sum(sizes) + len(sizes) * 8192)
outs = [pool.alloc(n) for n in sizes]
assert st.batch_get_blocking(keys, outs) == [True] * len(keys)
for o, k, n in zip(outs, keys, sizes):
    assert np.array_equal(o, chunk_bytes(k, n)), k
assert st.chunk_size(keys[-1]) == sizes[-1]
print(st.stats()["chunks"])
"""
    assert run_python(code).stdout.strip() == str(len(SIZES))


def test_many_concurrent_batches_one_loop(tmp_file):
    size = 256 << 10

    async def go(st):
        async def one(t):
            keys = [f"t{t}-{i}" for i in range(4)]
            await st.batch_put(keys, fill(keys, [size] * 4))
            outs = [np.empty(size, np.uint8) for _ in keys]
            hits = await st.batch_get(keys, outs)
            return hits == [True] * 4 and all(
                np.array_equal(o, chunk_bytes(k, size)) for o, k in zip(outs, keys))
        return await asyncio.gather(*(one(t) for t in range(32)))

    async def main():
        async with fx100io.ChunkStore(str(tmp_file), create=True, size=128 << 20) as st:
            return await go(st)

    results = asyncio.run(main())
    assert results == [True] * 32


def test_loop_device_store(loop_device):
    keys = [f"L{i}" for i in range(6)]
    sizes = [(3 << 20) + i * 1000 for i in range(6)]
    with fx100io.ChunkStore(loop_device, create=True) as st:
        assert st.stats()["devices"][0]["direct"]
        st.batch_put_blocking(keys, fill(keys, sizes))
    with fx100io.ChunkStore(loop_device) as st:
        outs = [np.empty(n, np.uint8) for n in sizes]
        assert st.batch_get_blocking(keys, outs) == [True] * 6
        assert all(np.array_equal(o, chunk_bytes(k, n)) for o, k, n in zip(outs, keys, sizes))


def test_lru_eviction_under_capacity(tmp_file):
    size = 1 << 20
    with fx100io.ChunkStore(str(tmp_file), create=True, size=64 << 20,
                            capacity=3 * size) as st:
        st.batch_put_blocking(["e0", "e1", "e2"], fill(["e0", "e1", "e2"], [size] * 3))
        # touch e0 so e1 is the least recently used
        assert st.batch_get_blocking(["e0"], [np.empty(size, np.uint8)]) == [True]
        st.batch_put_blocking(["e3"], fill(["e3"], [size]))
        assert not st.contains("e1")
        assert all(st.contains(k) for k in ("e0", "e2", "e3"))
        assert st.stats()["evictions"] == 1
    with fx100io.ChunkStore(str(tmp_file)) as st:
        assert sorted(st.keys()) == [b"e0", b"e2", b"e3"]
        outs = [np.empty(size, np.uint8) for _ in range(3)]
        assert st.batch_get_blocking(["e0", "e2", "e3"], outs) == [True] * 3
        assert np.array_equal(outs[2], chunk_bytes("e3", size))


def test_striped_over_three_devices(tmp_path):
    uris = [f"file://{tmp_path}/s{i}.img" for i in range(3)]
    keys = [f"k{i}" for i in range(30)]
    sizes = [100_000 + 7 * i for i in range(30)]
    with fx100io.ChunkStore(uris, create=True, size=32 << 20) as st:
        st.batch_put_blocking(keys, fill(keys, sizes))
        per_dev = [d["chunks"] for d in st.stats()["devices"]]
        assert sum(per_dev) == 30 and min(per_dev) > 0
    # any order of the same devices works; a missing one is refused
    with fx100io.ChunkStore(list(reversed(uris))) as st:
        outs = [np.empty(n, np.uint8) for n in sizes]
        assert st.batch_get_blocking(keys, outs) == [True] * 30
        assert all(np.array_equal(o, chunk_bytes(k, n)) for o, k, n in zip(outs, keys, sizes))
    with pytest.raises(errors.NotAStoreError, match="3 devices"):
        fx100io.ChunkStore(uris[:2])


def test_index_compaction_keeps_everything(tmp_file):
    with fx100io.ChunkStore(str(tmp_file), create=True, size=64 << 20,
                            index_size=64 << 10) as st:
        for r in range(40):  # one segment block per put: forces compactions
            st.batch_put_blocking([f"c{r % 12}"], [chunk_bytes(f"v{r}", 5000)])
        s = st.stats()
        assert s["compactions"] >= 2 and s["chunks"] == 12
    with fx100io.ChunkStore(str(tmp_file)) as st:
        for i in range(12):
            last = max(r for r in range(40) if r % 12 == i)
            out = np.empty(5000, np.uint8)
            assert st.batch_get_blocking([f"c{i}"], [out]) == [True]
            assert np.array_equal(out, chunk_bytes(f"v{last}", 5000))


def test_index_full_is_a_clear_error(tmp_file):
    with fx100io.ChunkStore(str(tmp_file), create=True, size=64 << 20,
                            index_size=16 << 10) as st:
        with pytest.raises(errors.DeviceFullError, match="index"):
            for i in range(200):
                st.batch_put_blocking([f"{i:0>900}"], [b"z"])
        n = st.stats()["chunks"]
        assert n > 0
    with fx100io.ChunkStore(str(tmp_file)) as st:
        assert st.stats()["chunks"] == n


def test_a_chunk_over_the_capacity_is_refused_and_corrupts_nothing(tmp_file):
    # (the bad inputs every store refuses: tests/store/test_store_conformance.py)
    st = fx100io.ChunkStore(str(tmp_file), create=True, size=16 << 20, capacity=4 << 20)
    st.batch_put_blocking(["keep"], [b"K" * 10000])
    with pytest.raises(errors.DeviceFullError):
        st.batch_put_blocking(["huge"], [np.zeros(5 << 20, np.uint8)])
    out = bytearray(10000)
    assert st.batch_get_blocking(["keep"], [out]) == [True] and out == b"K" * 10000
    assert sorted(st.keys()) == [b"keep"]
    st.close()


def test_a_stripe_with_a_stranger_never_hints_create(tmp_path):
    """A stripe of which one device is not the store's (a wrong or swapped path) is
    refused without the create=True hint that would erase the member that is."""
    a, b = str(tmp_path / "a.img"), str(tmp_path / "b.img")
    with fx100io.ChunkStore([a, b], create=True, size=64 << 20) as st:
        st.batch_put_blocking([b"k"], [bytes(4096)])
    stranger = tmp_path / "c.img"
    stranger.write_bytes(b"\x5a" * (64 << 20))
    with pytest.raises(errors.NotAStoreError) as ei:
        fx100io.ChunkStore([a, str(stranger)])
    msg = str(ei.value)
    assert "c.img" in msg and "a.img" in msg and "would erase" in msg
    assert "pass create=True" not in msg
    assert stranger.read_bytes()[:4096] == b"\x5a" * 4096
    with fx100io.ChunkStore([a, b]) as st:
        assert st.keys() == [b"k"]
    with pytest.raises(errors.NotAStoreError, match="create=True to format"):
        fx100io.ChunkStore([str(stranger)])  # alone: nothing else to lose, the hint stays


def test_open_errors(tmp_path):
    with pytest.raises(errors.DeviceNotFoundError):
        fx100io.ChunkStore(str(tmp_path / "absent.img"))
    junk = tmp_path / "junk.img"
    junk.write_bytes(b"not a store" * 1000)
    with pytest.raises(errors.NotAStoreError, match="create=True"):
        fx100io.ChunkStore(str(junk))
    assert junk.read_bytes() == b"not a store" * 1000  # untouched
    with pytest.raises(errors.InvalidArgumentError, match="too small"):
        fx100io.ChunkStore(str(tmp_path / "tiny.img"), create=True, size=64 << 10)
    with pytest.raises(errors.InvalidArgumentError):
        fx100io.ChunkStore([], create=True, size=1 << 20)


def test_second_store_on_same_device_is_refused(tmp_file):
    with fx100io.ChunkStore(str(tmp_file), create=True, size=16 << 20) as st:
        st.batch_put_blocking(["x"], [b"1234"])
        with pytest.raises(errors.DeviceBusyError):
            fx100io.ChunkStore(str(tmp_file))
        p = run_python(f"import fx100io; fx100io.ChunkStore({str(tmp_file)!r})", check=False)
        assert p.returncode != 0 and "in use by another ChunkStore" in p.stderr
    with fx100io.ChunkStore(str(tmp_file)) as st:  # free again once closed
        assert st.contains("x")


def test_stale_del_does_not_remove_a_newer_put(tmp_file):
    """An eviction racing a put of the same key can log DEL after the newer
    PUT; the DEL names the version it removes, so replay keeps the new one."""
    from fx100io import _core
    with fx100io.ChunkStore(str(tmp_file), create=True, size=16 << 20) as st:
        st.batch_put_blocking(["k"], [b"old" * 2000])
        old = st._entries[b"k"]
        st.batch_put_blocking(["k"], [b"new" * 3000])
        m = st._members[0]
        m.log.commit([(_core.REC_DEL, b"k", 0, old.off, old.length, 0)],  # the late DEL
                     lambda: st._live(m))
    with fx100io.ChunkStore(str(tmp_file)) as st:
        out = bytearray(9000)
        assert st.batch_get_blocking(["k"], [out]) == [True] and out == b"new" * 3000


def test_leftover_segment_after_tail_is_not_chained(tmp_file):
    """A torn multi-segment commit can leave an intact segment of the same
    generation after the tail; reopening erases it, so a later commit that
    ends just before it cannot make replay chain into it."""
    from fx100io import _core
    from fx100io.store.local import layout
    with fx100io.ChunkStore(str(tmp_file), create=True, size=16 << 20) as st:
        st.batch_put_blocking(["a"], [b"A" * 100])
        m = st._members[0]
        # forge the leftover: the segment that would follow the next commit
        ghost = _core.encode_segment(m.log.generation, m.log.seq + 2,
                                     [(_core.REC_PUT, b"ghost", 0, m.sb.data_off, 4096, 0)])
        m.log.write_at(m.log.half, m.log.tail + layout.BLOCK, ghost)
    with fx100io.ChunkStore(str(tmp_file)) as st:
        st.batch_put_blocking(["b"], [b"B" * 100])  # lands right before the leftover
    with fx100io.ChunkStore(str(tmp_file)) as st:
        assert sorted(st.keys()) == [b"a", b"b"]


def _value(key: str, rnd: int) -> bytes:
    return f"{key}@{rnd}".encode().ljust(24, b".")


@pytest.mark.parametrize("nkeys", [2500, 3100, 3700, 4300])
def test_multi_segment_commit_survives_the_compaction_it_triggers(tmp_file, nkeys):
    """A commit larger than one segment whose later segment triggers a
    compaction: its earlier segments must reach the new index half, or a
    reopen serves the previous version of those keys.  A few one-block
    commits first shift where the rounds fall in the log, and the store is
    reopened after each of three compactions, so a later group triggers at
    least one of them for every key count here."""
    keys = [f"key-{i:05d}" for i in range(nkeys)]
    path = str(tmp_file)
    fx100io.ChunkStore(path, create=True, size=64 << 20, index_size=1 << 20).close()
    pad = [f"pad-{i}" for i in range(9)]
    with fx100io.ChunkStore(path) as st:
        for k in pad:
            st.batch_put_blocking([k], [_value(k, 0)])
    rnd, seen = 0, 0
    while seen < 3:
        assert rnd < 200, "the index never compacted"
        with fx100io.ChunkStore(path) as st:
            while True:
                rnd += 1
                before = st.stats()["compactions"]
                st.batch_put_blocking(keys, [_value(k, rnd) for k in keys])
                if st.stats()["compactions"] > before:
                    seen += 1
                    break
        with fx100io.ChunkStore(path) as st:
            outs = [bytearray(24) for _ in keys + pad]
            assert st.batch_get_blocking(keys + pad, outs) == [True] * (nkeys + len(pad))
            stale = [k for k, o in zip(keys, outs) if bytes(o) != _value(k, rnd)]
            assert not stale, (f"after compaction {seen}: {len(stale)} of {nkeys} keys read "
                               f"an older value, e.g. {stale[:3]}")
            assert [bytes(o) for o in outs[nkeys:]] == [_value(k, 0) for k in pad]


def test_commit_larger_than_the_index_is_refused_whole(tmp_file):
    """A batch whose records cannot fit in an index half even right after a
    compaction fails with DeviceFullError and leaves no trace: the chunks
    stored before are intact, none of the batch is visible (now or after a
    reopen), and its space is given back."""
    path = str(tmp_file)
    with fx100io.ChunkStore(path, create=True, size=64 << 20, index_size=64 << 10) as st:
        old = [f"old-{i}" for i in range(20)]
        st.batch_put_blocking(old, [_value(k, 1) for k in old])
        used = st.stats()["bytes_used"]
        big = [f"big-{i:05d}" for i in range(1500)] + old[:5]  # ~72 KiB of records
        with pytest.raises(errors.DeviceFullError, match="index"):
            st.batch_put_blocking(big, [_value(k, 2) for k in big])
        assert st.stats()["bytes_used"] == used
        assert sorted(st.keys()) == sorted(k.encode() for k in old)
        st.batch_put_blocking(["after"], [_value("after", 3)])  # still usable
    with fx100io.ChunkStore(path) as st:
        keys = old + ["after"]
        outs = [bytearray(24) for _ in keys]
        assert st.batch_get_blocking(keys, outs) == [True] * len(keys)
        assert [bytes(o) for o in outs] == [_value(k, 1) for k in old] + [_value("after", 3)]
        assert not st.contains("big-00000")


class _LockedCounters(dict):
    """Counters that refuse a change made without the store's lock."""

    def __init__(self, st, counters):
        super().__init__(counters)
        self.st = st
        self.unlocked: list[str] = []

    def __setitem__(self, key, value):
        if not self.st._mu._is_owned():
            self.unlocked.append(key)
        super().__setitem__(key, value)


def test_stats_counters_change_under_the_lock(tmp_file):
    """Every counter update holds the store's lock (a += from two threads
    without it can lose updates), and the counts add up with four threads
    putting, reading, deleting and hitting a corrupt chunk at once."""
    path = str(tmp_file)
    with fx100io.ChunkStore(path, create=True, size=64 << 20, capacity=40 << 20) as st:
        st.batch_put_blocking(["bad"], [b"B" * 8192])
        off = st._entries[b"bad"].off
    with open(path, "r+b") as f:
        f.seek(off + 100)
        f.write(b"X")
    st = fx100io.ChunkStore(path, capacity=40 << 20)
    st._counters = _LockedCounters(st, st._counters)
    errs = []

    def worker(t):
        try:
            for i in range(25):
                k = f"t{t}-{i}"
                st.batch_put_blocking([k], [b"v" * 4096])
                assert st.batch_get_blocking([k], [bytearray(4096)]) == [True]
                assert st.delete_blocking(k) is True
        except Exception as e:  # pragma: no cover - reported below
            errs.append(e)

    ths = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in ths:
        th.start()
    assert st.batch_get_blocking(["bad"], [bytearray(8192)]) == [False]
    for th in ths:
        th.join()
    s = st.stats()
    st.close()
    assert errs == []
    assert st._counters.unlocked == []
    assert (s["puts"], s["gets"], s["hits"], s["deletes"], s["corruptions"]) == (100, 101, 100, 100, 1)


def test_truncated_store_file_is_refused(tmp_file):
    path = str(tmp_file)
    with fx100io.ChunkStore(path, create=True, size=128 << 20) as st:
        st.batch_put_blocking(["a", "b"], [b"A" * 70000, b"B" * 70000])
    for size in (64 << 20, (128 << 20) - 4096):
        with open(path, "r+b") as f:
            f.truncate(size)
        with pytest.raises(errors.NotAStoreError, match="truncated file or shrunk device") as ei:
            fx100io.ChunkStore(path)
        if size == 64 << 20:
            assert "the device is 64 MiB but the store was formatted for 128 MiB" in str(ei.value)
    with open(path, "r+b") as f:  # grown back (or a grown device): fine
        f.truncate(256 << 20)
    with fx100io.ChunkStore(path) as st:
        out = bytearray(70000)
        assert st.batch_get_blocking(["a"], [out]) == [True] and out == b"A" * 70000


@pytest.mark.parametrize("field,value,why", [
    ("block_size", 3000, "power of two"),
    ("data_off", 12345 * 4096, "data area starts"),
    ("index_half", 4096, "index half"),
    ("data_size", 1 << 40, "past the end"),
    ("dev_index", 3, "device 3 of a store of 1"),
])
def test_superblock_geometry_is_checked(tmp_file, field, value, why):
    """A superblock with a valid checksum whose layout is impossible is
    refused with a clear error before anything is replayed."""
    import dataclasses

    from fx100io.store.local import layout
    path = str(tmp_file)
    fx100io.ChunkStore(path, create=True, size=32 << 20).close()
    with open(path, "r+b") as f:
        sb = layout.Superblock.decode(f.read(layout.BLOCK), path)
        f.seek(0)
        f.write(dataclasses.replace(sb, **{field: value}).encode())
    with pytest.raises(errors.NotAStoreError, match=why):
        fx100io.ChunkStore(path)


def test_failed_del_commit_keeps_the_chunks(tmp_file, monkeypatch):
    """When the DEL records of an eviction or a delete cannot be written,
    the operation fails and the chunks stay as they were: still listed and
    readable, now and after a reopen (their records are still in the log)."""
    from fx100io.store.local.index_log import REC_DEL, IndexLog
    real = IndexLog._commit_locked

    def no_dels(self, recs, live, apply=None):
        if all(r[0] == REC_DEL for r in recs):
            raise errors.DeviceIOError(5, "injected: index write failed")
        return real(self, recs, live, apply)

    path = str(tmp_file)
    with fx100io.ChunkStore(path, create=True, size=32 << 20, capacity=3 * 8192) as st:
        keys = ["a", "b", "c"]
        st.batch_put_blocking(keys, [_value(k, 1) * 300 for k in keys])  # 2 blocks each
        monkeypatch.setattr(IndexLog, "_commit_locked", no_dels)
        with pytest.raises(errors.DeviceIOError, match="injected"):
            st.batch_put_blocking(["d"], [_value("d", 1) * 300])  # must evict "a"
        with pytest.raises(errors.DeviceIOError, match="injected"):
            st.delete_blocking("b")
        monkeypatch.setattr(IndexLog, "_commit_locked", real)
        assert sorted(st.keys()) == [b"a", b"b", b"c"]
        outs = [bytearray(7200) for _ in keys]
        assert st.batch_get_blocking(keys, outs) == [True] * 3
        assert [bytes(o) for o in outs] == [_value(k, 1) * 300 for k in keys]
        assert st.stats()["bytes_used"] == 3 * 8192
        st.batch_put_blocking(["d"], [_value("d", 2) * 300])  # works again, evicting one
        assert len(st.keys()) == 3 and st.contains("d")
        kept = sorted(st.keys())
    with fx100io.ChunkStore(path) as st:
        assert sorted(st.keys()) == kept


def test_a_put_that_fails_in_a_compaction_left_in_doubt_keeps_its_extents(tmp_file, monkeypatch):
    """A put triggers a compaction whose header lands but whose flush fails:
    the put raises and the index is in doubt (later puts are refused).  A
    reopen takes the new half, which holds the failed put's records, so its
    extents must not have been handed to later puts in the meantime: after
    the reopen the key reads back exactly what that put wrote (before: a
    later put's data overwrote it and the reopen found a CRC mismatch)."""
    import fx100io.store.local.index_log as index_log
    st = fx100io.ChunkStore(str(tmp_file), create=True, size=128 << 20, index_size=1 << 20)
    keys = [f"k{i:04}" for i in range(2000)]
    m = st._members[0]
    log, dev = m.log, m.dev
    while log.sb.index_half - log.tail > 200_000:  # fill the log close to its end
        st.batch_put_blocking(keys, [b"o"] * len(keys))
    real_write, real_flush = log.write_at, dev.flush_blocking
    header = {"written": False}

    def write_at(half, pos, data):
        real_write(half, pos, data)
        if pos == 0:
            header["written"] = True

    def flush():
        if header["written"]:
            header["written"] = False
            raise errors.Fx100ioError(5, "injected flush failure after the header")
        real_flush()
    monkeypatch.setattr(log, "write_at", write_at)
    monkeypatch.setattr(dev, "flush_blocking", flush)
    new = chunk_bytes("the-put-in-doubt", 20000)
    # Enough records that the commit does not fit after the tail: it is
    # folded into a compaction, which fails after its header.
    big = [f"n{i:04}" for i in range(6000)]
    with pytest.raises(errors.Fx100ioError, match="injected"):
        st.batch_put_blocking(["doubt"] + big, [new] + [b"n"] * len(big))
    monkeypatch.undo()
    assert index_log.IndexLog.in_doubt.fget(log)
    with pytest.raises(errors.DeviceIOError, match="in doubt"):
        st.batch_put_blocking(["later"], [chunk_bytes("later", 20000)])
    st.close()
    with fx100io.ChunkStore(str(tmp_file)) as st:
        out = bytearray(20000)
        assert st.batch_get_blocking(["doubt"], [out]) == [True]
        assert out == new.tobytes()
        assert not st.contains("later")
        got = [bytearray(1) for _ in keys[:50]]
        assert st.batch_get_blocking(keys[:50], got) == [True] * 50
        assert all(g == b"o" for g in got)

"""SharedChunkStore against a real redis-server, with several host
processes on the same namespaces (files, a loop device, an NVMe/TCP target
of our own on loopback)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from support.shared_host import check_value, make_value
from support.shared_hosts import Host
from support.shared_redis import RedisServer, serve

from fx100io import errors
from fx100io.store.shared import IndexLostError, IndexUnavailableError, SharedChunkStore

MiB = 1 << 20


@pytest.fixture
def redis_server(tmp_path: Path):
    yield from serve(tmp_path)


def paths(tmp_path: Path, n: int = 2) -> list[str]:
    return [str(tmp_path / f"ns{i}.img") for i in range(n)]


@contextlib.contextmanager
def hosts(n: int, uris: list[str], index: str, **opts):
    hs = []
    try:
        for _ in range(n):
            hs.append(Host(uris, index, **opts))
        yield hs
    finally:
        for h in hs:
            h.close()


def fmt(uris: list[str], index: str, size: int = 64 * MiB, **opts) -> None:
    SharedChunkStore(uris, index, create=True, size=size, **opts).close()


# ------------------------------------------------------------ one process
def test_api_in_one_process(tmp_path, redis_server):
    uris = paths(tmp_path)
    st = SharedChunkStore(uris, redis_server.url, create=True, size=64 * MiB)
    vals = {k: make_value(k, "v1", n) for k, n in
            (("a", 5000), ("b", MiB), ("c", 1), ("d", 4096), ("e", 3 * MiB + 7))}
    st.batch_put_blocking(list(vals), list(vals.values()))
    bufs = [np.zeros(4 * MiB, np.uint8) for _ in vals]
    assert st.batch_get_blocking(list(vals), bufs) == [True] * 5
    for (k, v), b in zip(vals.items(), bufs):
        assert np.array_equal(b[:len(v)], v)
        assert st.chunk_size(k) == len(v)
    assert st.batch_exists_blocking(["a", "b", "zz", "c"]) == 2
    assert st.contains("e") and not st.contains("zz")
    assert sorted(st.keys()) == [b"a", b"b", b"c", b"d", b"e"]
    # overwrite: the new value, and the old extent goes back
    used = st.stats()["bytes_used"]
    st.batch_put_blocking(["b"], [make_value("b", "v2", MiB)])
    assert st.stats()["bytes_used"] == used
    buf = np.zeros(2 * MiB, np.uint8)
    assert st.batch_get_blocking(["b"], [buf]) == [True] and check_value("b", buf) == "v2"
    with pytest.raises(errors.BufferTooSmallError):
        st.batch_get_blocking(["b"], [np.zeros(100, np.uint8)])
    assert st.stats()["pins"] == 0  # the failed get let its pins go
    assert st.delete_blocking("b") and not st.delete_blocking("b")
    assert st.batch_get_blocking(["b"], [buf]) == [False]
    st.batch_put_blocking(["empty"], [b""])
    assert st.batch_get_blocking(["empty"], [bytearray(1)]) == [True]
    s = st.stats()
    assert s["chunks"] == 5 and s["leases"] == 0 and s["pins"] == 0 and s["limbo"] == 0
    st.close()
    with pytest.raises(errors.StoreClosedError):
        st.batch_get_blocking(["a"], [buf])

    async def main() -> None:  # the async API, and a second opener of the pool
        async with SharedChunkStore(uris, redis_server.url) as st2:
            out = np.zeros(MiB, np.uint8)
            assert await st2.batch_get(["a"], [out]) == [True]
            assert check_value("a", out) == "v1"
            await st2.batch_put(["f"], [make_value("f", "x", 10000)])
            assert await st2.batch_exists(["f", "a"]) == 2
            assert await st2.delete("f")
    asyncio.run(main())
    with SharedChunkStore(uris, redis_server.url) as st3:
        # the async gets' pins were dropped after they returned, and before aclose did
        assert st3.stats()["pins"] == 0


def test_chunkstore_refuses_a_shared_namespace_and_back(tmp_path, redis_server):
    import fx100io
    uris = paths(tmp_path, 1)
    fmt(uris, redis_server.url)
    with pytest.raises(errors.NotAStoreError):
        fx100io.ChunkStore(uris)
    other = str(tmp_path / "plain.img")
    fx100io.ChunkStore([other], create=True, size=16 * MiB).close()
    with pytest.raises(errors.NotAStoreError):
        SharedChunkStore([other], redis_server.url)


# ------------------------------------------------------------ host processes
def test_three_hosts_read_what_the_others_wrote(tmp_path, redis_server):
    uris = paths(tmp_path)
    fmt(uris, redis_server.url)
    with hosts(3, uris, redis_server.url) as hs:
        for i, h in enumerate(hs):
            assert h(op="put", keys=[f"h{i}-{j}" for j in range(5)], tag=f"t{i}",
                     size=300000 + i)["ok"]
        for h in hs:
            for j in range(len(hs)):
                keys = [f"h{j}-{n}" for n in range(5)]
                assert h(op="get", keys=keys)["found"] == [f"t{j}"] * 5
                assert h(op="exists", keys=keys + ["nope"])["n"] == 5
        assert hs[0](op="delete", key="h1-0")["ok"]
        assert hs[2](op="get", keys=["h1-0", "h1-1"])["found"] == [None, "t1"]


def test_concurrent_puts_of_one_key(tmp_path, redis_server):
    uris = paths(tmp_path, 1)
    fmt(uris, redis_server.url, size=128 * MiB)
    with hosts(3, uris, redis_server.url) as hs:
        for rnd in range(8):
            for i, h in enumerate(hs):  # all three at once
                h.send(op="put", keys=["same", f"own{i}"], tag=f"r{rnd}h{i}", size=MiB + rnd)
            for h in hs:
                assert h.read().get("ok")
            seen = {h(op="get", keys=["same"])["found"][0] for h in hs}
            assert len(seen) == 1 and seen <= {f"r{rnd}h{i}" for i in range(3)}
        st = hs[0](op="stats")["stats"]
        # one extent per key left: the losers' and the superseded ones are free
        assert st["chunks"] == 4 and st["leases"] == 0 and st["limbo"] == 0
        assert st["bytes_used"] == 4 * (4096 + (MiB + 7 + 4095) // 4096 * 4096)


def test_host_killed_mid_put_leaves_nothing_and_its_space_returns(tmp_path, redis_server):
    uris = paths(tmp_path, 1)
    fmt(uris, redis_server.url, size=64 * MiB)
    big = 2 * MiB - 100
    with hosts(1, uris, redis_server.url, lease_s=1.0) as (reader,):
        victim = Host(uris, redis_server.url, lease_s=1.0)
        try:
            victim.send(op="put_loop", keys=[f"v{i}" for i in range(6)], tag="x", size=big,
                        batch=3)
            acked: dict[str, str] = {}
            trying = None
            deadline = time.time() + 30
            while time.time() < deadline:
                m = victim.read()
                if "acked" in m:
                    acked.update(dict.fromkeys(m["keys"], m["tag"]))
                    if m["acked"] >= 3:
                        continue
                if "trying" in m:
                    trying = m
                    if m["trying"] >= 4:
                        time.sleep(0.002 * (m["trying"] % 7))  # somewhere inside the put
                        break
            victim.kill()
        finally:
            victim.kill()
        assert trying is not None
        got = reader(op="get", keys=[f"v{i}" for i in range(6)])["found"]
        for k, tag in zip([f"v{i}" for i in range(6)], got):
            allowed = {acked.get(k)} | ({trying["tag"]} if k in trying["keys"] else set())
            assert tag in allowed, (k, tag, allowed)
        time.sleep(1.3)  # the dead host's lease expires
        s = reader(op="stats")["stats"]
        assert s["leases"] == 0
        live = s["chunks"]
        assert s["bytes_used"] == live * (4096 + (big + 4095) // 4096 * 4096)


def test_redis_unreachable_fails_fast_without_blocking_the_loop(tmp_path):
    srv = RedisServer(tmp_path / "redis")
    srv.start()
    uris = paths(tmp_path, 1)
    st = SharedChunkStore(uris, srv.url, create=True, size=32 * MiB, timeout=0.5,
                          retry_after=0.5)
    buf = np.zeros(MiB, np.uint8)

    async def outage(pause: float) -> list[float]:
        """Every call fails fast while the loop keeps running."""
        ticks: list[float] = []
        stop = False

        async def ticker() -> None:
            while not stop:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.005)
        t = asyncio.create_task(ticker())
        await asyncio.sleep(0.02)
        t0 = time.monotonic()
        assert await st.batch_get(["kept", "x"], [buf, buf]) == [False, False]
        assert time.monotonic() - t0 < 0.5 + pause + 0.2
        t1 = time.monotonic()
        with pytest.raises(IndexUnavailableError):  # at once: not retried yet
            await st.batch_put(["new"], [make_value("new", "1", 5000)])
        assert await st.batch_exists(["kept"]) == 0
        with pytest.raises(ConnectionError):  # the builtin class too
            await st.delete("kept")
        assert time.monotonic() - t1 < 0.2  # no network wait (0.5 s) in any of the three
        await asyncio.sleep(0.6)  # retry_after: the next call tries again
        t2 = time.monotonic()
        with pytest.raises(IndexUnavailableError):
            await st.batch_put(["new"], [make_value("new", "1", 5000)])
        assert time.monotonic() - t2 < 0.5 + pause + 0.2
        await asyncio.sleep(0.02)
        stop = True
        await t
        return ticks

    try:
        async def first() -> None:
            await st.batch_put(["kept"], [make_value("kept", "1", 70000)])
        asyncio.run(first())
        # 1. Redis hangs (stopped): calls time out after the socket timeout
        os.kill(srv.proc.pid, signal.SIGSTOP)
        try:
            gaps = np.diff(asyncio.run(outage(0.3)))
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)
        # a blocked loop would stall for the socket timeout (0.5 s); this
        # machine's load alone stays under 0.25 s
        assert gaps.max() < 0.25, f"the event loop was blocked for {gaps.max():.3f} s"
        # 2. Redis is gone (connection refused): calls fail at once
        srv.stop(signal.SIGKILL)
        gaps = np.diff(asyncio.run(outage(0.0)))
        assert gaps.max() < 0.25, f"the event loop was blocked for {gaps.max():.3f} s"
        assert st.stats()["index_state"] == "unavailable"
        srv.start()  # the same port and directory: the AOF brings the index back
        time.sleep(0.6)  # retry_after
        assert st.batch_get_blocking(["kept"], [buf]) == [True]
        assert check_value("kept", buf) == "1"
        st.batch_put_blocking(["new"], [make_value("new", "2", 5000)])
    finally:
        st.close()
        srv.stop(signal.SIGKILL)


def test_index_lost_is_said_and_rebuild_brings_it_back(tmp_path, redis_server):
    from fx100io.store.shared.rebuild import rebuild
    uris = paths(tmp_path)
    st = SharedChunkStore(uris, redis_server.url, create=True, size=64 * MiB)
    keys = [f"r{i}" for i in range(12)]
    st.batch_put_blocking(keys, [make_value(k, "old", 50000 + i) for i, k in enumerate(keys)])
    st.batch_put_blocking(keys[:4], [make_value(k, "new", 90000) for k in keys[:4]])
    assert st.delete_blocking(keys[11])
    redis_server.client().flushall()
    buf = np.zeros(MiB, np.uint8)
    assert st.batch_get_blocking(keys[:1], [buf]) == [False]
    with pytest.raises(IndexLostError):
        st.batch_put_blocking(["x"], [b"x"])
    report = rebuild(uris, redis_server.url)
    # a deleted chunk stays deleted (its header was erased); a newer
    # version always wins
    assert report["chunks"] == 11
    for i, k in enumerate(keys[:11]):
        assert st.batch_get_blocking([k], [buf]) == [True]
        assert check_value(k, buf) == ("new" if i < 4 else "old")
    assert st.batch_get_blocking([keys[11]], [buf]) == [False]
    s = st.stats()
    used = s["bytes_used"]
    st.batch_put_blocking(["after"], [make_value("after", "1", 4096)])
    assert st.stats()["bytes_used"] == used + 8192
    st.close()


def test_eviction_keeps_the_pool_under_capacity(tmp_path, redis_server):
    uris = paths(tmp_path, 1)
    cap = 10 * (4096 + 256 * 1024)
    st = SharedChunkStore(uris, redis_server.url, create=True, size=32 * MiB, capacity=cap)
    buf = np.zeros(MiB, np.uint8)
    for i in range(30):
        st.batch_put_blocking([f"e{i}"], [make_value(f"e{i}", "1", 256 * 1024)])
        if i >= 5:  # keep e0 hot: LRU spares it
            assert st.batch_get_blocking(["e0"], [buf]) == [True]
    s = st.stats()
    assert s["bytes_used"] <= cap and s["chunks"] == 10 and s["evictions"] == 20
    assert st.contains("e0") and st.contains("e29") and not st.contains("e1")
    with pytest.raises(errors.DeviceFullError):
        st.batch_put_blocking(["huge"], [np.zeros(cap, np.uint8)])
    st.close()


def test_a_pinned_extent_is_not_reused_until_its_reader_lets_go(tmp_path, redis_server):
    """The reader-lease rule itself: an extent retired while a reader holds
    a pin goes to limbo, and back to the free list with the last pin."""
    uris = paths(tmp_path, 1)
    cap = 2 * (4096 + 65536)
    st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB, capacity=cap)
    idx = st._index
    st.batch_put_blocking(["p"], [make_value("p", "1", 65536)])

    async def go() -> None:
        (hit,) = await idx.get_begin("reader", 60000, [b"p"])
        assert hit is not None
        assert await st.delete("p")
        s = st.stats()
        assert s["limbo"] == 1 and s["bytes_used"] == 4096 + 65536
        # the pool has room for one more chunk only, and never gets the pinned extent
        await st.batch_put(["q"], [make_value("q", "1", 65536)])
        q = parse(redis_server, "q")
        assert q[1] != hit.off
        await idx.get_end([hit.pin])
        s = st.stats()
        assert s["limbo"] == 0 and s["pins"] == 0
        await st.batch_put(["r"], [make_value("r", "1", 65536)])
        assert parse(redis_server, "r")[1] == hit.off
    asyncio.run(go())
    st.close()


def parse(srv: RedisServer, key: str) -> list[int]:
    return [int(x) for x in srv.client().hget("fx100io:{pool}:idx", key).split()]


def test_expired_leases_and_pins_are_reclaimed(tmp_path, redis_server):
    uris = paths(tmp_path, 1)
    st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)
    idx = st._index

    async def go() -> None:
        # a host that allocated and died, and a reader that died holding a pin
        ((off, _ver),), _evicted = await idx.alloc(300, [(0, 8192)])
        await st.batch_put(["gone"], [make_value("gone", "1", 4096)])
        (hit,) = await idx.get_begin("dead-reader", 300, [b"gone"])
        assert await st.delete("gone")
        s = st.stats()
        assert s["leases"] == 1 and s["pins"] == 1 and s["limbo"] == 1
        assert s["bytes_used"] == 8192 + 8192
        await asyncio.sleep(0.4)
        s = st.stats()
        assert (s["leases"], s["pins"], s["limbo"], s["bytes_used"]) == (0, 0, 0, 0)
        assert s["reclaimed_leases"] == 1 and s["expired_pins"] == 1
        assert s["devices"][0]["free_extents"] == 1  # coalesced back into one
        await idx.get_end([hit.pin])  # a late reader: nothing happens twice
        assert st.stats()["bytes_used"] == 0
    asyncio.run(go())
    st.close()


def test_readers_racing_eviction_never_see_wrong_bytes(tmp_path, redis_server):
    uris = paths(tmp_path, 1)
    size = 200000
    cap = 6 * fmt_ext(size)
    fmt(uris, redis_server.url, size=32 * MiB, capacity=cap)
    keys = [f"ev{i}" for i in range(16)]
    with hosts(3, uris, redis_server.url, pin_s=5.0) as (w, r1, r2):
        w.send(op="put_loop", keys=keys, tag="w", size=size, batch=2, count=150)
        r1.send(op="get_loop", keys=keys, size=size, seconds=6)
        r2.send(op="get_loop", keys=keys[::-1], size=size, seconds=6)
        outs = [r1.read(120), r2.read(120)]
        for o in outs:
            assert "wrong" not in o, o
            assert o["hits"] > 0
        while True:
            m = w.read(120)
            assert "failed" not in m, m
            if m.get("done"):
                break
        s = w(op="stats")["stats"]
        assert s["evictions"] > 0 and s["bytes_used"] <= cap and s["limbo"] == 0


def fmt_ext(n: int) -> int:
    return 4096 + (n + 4095) // 4096 * 4096


def test_redis_restarted_mid_load(tmp_path):
    srv = RedisServer(tmp_path / "redis")
    srv.start()
    uris = paths(tmp_path)
    fmt(uris, srv.url, size=128 * MiB)
    keys = [f"rs{i}" for i in range(10)]
    try:
        with hosts(2, uris, srv.url, retry_after=0.2) as (w, r):
            w.send(op="put_loop", keys=keys, tag="w", size=150000, batch=2, count=120)
            r.send(op="get_loop", keys=keys, size=150000, seconds=5)
            acked: dict[str, str] = {}
            failed = 0
            n = 0
            restarted = False
            while True:
                m = w.read(120)
                assert "err" not in m or "failed" in m, m
                if "acked" in m:
                    acked.update(dict.fromkeys(m["keys"], m["tag"]))
                    n += 1
                    if n == 20 and not restarted:
                        srv.stop(signal.SIGKILL)  # mid-load, as a crash
                        time.sleep(0.5)
                        srv.start()
                        restarted = True
                failed += "failed" in m
                if m.get("done"):
                    break
            o = r.read(120)
            assert "wrong" not in o, o  # misses or right bytes, through the restart
            got = r(op="get", keys=keys)["found"]
            # every acknowledged put survived the crash (appendfsync always):
            # each key holds its last acknowledged value, or a later one
            # whose put failed in the crash (published, its reply lost)
            for k, tag in zip(keys, got):
                assert tag is not None and int(tag.split("-")[1]) >= int(acked[k].split("-")[1])
            assert restarted
    finally:
        srv.stop(signal.SIGKILL)


def test_three_hosts_over_nvme_tcp(tmp_path, redis_server):
    from support.target_process import serve as serve_target
    nqn = "nqn.2026-12.io.fx100:shared"
    backing = []
    for i in range(2):
        p = tmp_path / f"t{i}.img"
        with open(p, "wb") as f:
            f.truncate(64 * MiB)
        backing.append(str(p))
    with serve_target(backing, nqn, block_size=4096) as (host, port, _proc):
        uris = [f"nvme+tcp://{host}:{port}/{nqn}?ns={i + 1}" for i in range(2)]
        fmt(uris, redis_server.url)
        with hosts(3, uris, redis_server.url) as hs:
            for i, h in enumerate(hs):
                assert h(op="put", keys=[f"n{i}-{j}" for j in range(4)], tag=f"t{i}",
                         size=MiB + 1000 * i + 3)["ok"]
            for h in hs:
                for j in range(3):
                    assert h(op="get", keys=[f"n{j}-{n}" for n in range(4)])["found"] == \
                        [f"t{j}"] * 4
    # the same pool seen through the files the target served
    st = SharedChunkStore(backing, redis_server.url)
    buf = np.zeros(2 * MiB, np.uint8)
    assert st.batch_get_blocking(["n2-3"], [buf]) == [True] and check_value("n2-3", buf) == "t2"
    st.close()


def test_loop_devices_and_the_rebuild_command(tmp_path, redis_server):
    from support import _make_loop, run_python
    devs = []
    try:
        for i in range(2):
            devs.append(_make_loop(tmp_path / f"l{i}.img", 64 * MiB, 4096))
        fmt(devs, redis_server.url)
        with hosts(2, devs, redis_server.url) as (a, b):
            assert a(op="put", keys=["la", "lb"], tag="1", size=MiB + 5)["ok"]
            assert b(op="get", keys=["la", "lb"])["found"] == ["1", "1"]
            redis_server.client().flushall()
            assert b(op="get", keys=["la"])["found"] == [None]
            p = run_python("import sys; from fx100io.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "shared-rebuild", "--index",
                           redis_server.url, *devs)
            assert '"chunks": 2' in p.stdout
            assert b(op="get", keys=["la", "lb"])["found"] == ["1", "1"]
    finally:
        import subprocess
        for d in devs:
            subprocess.run(["losetup", "-d", d], check=False)


def test_a_put_whose_lease_was_reclaimed_publishes_nothing(tmp_path, redis_server):
    uris = paths(tmp_path, 1)
    st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)
    idx = st._index

    async def go() -> None:
        ((off, ver),), _evicted = await idx.alloc(1, [(0, 8192)])
        await asyncio.sleep(0.02)
        assert st.stats()["reclaimed_leases"] == 1  # the host was presumed dead
        ((other, _v),), _evicted = await idx.alloc(30000, [(0, 8192)])
        assert other == off  # and its extent went to another put
        assert await idx.publish(1000, [(0, off, 8192, ver, b"late", 10, 0)]) == ([-1], [])
    asyncio.run(go())
    assert not st.contains("late")
    st.close()

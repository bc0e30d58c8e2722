"""SharedChunkStore: what a slow writer may not do to another host's
extent, and the index URL's password kept out of every message."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.shared_host import check_value, make_value
from support.shared_redis import RedisServer, serve

from fx100io import OP_WRITE, errors
from fx100io.store.shared import IndexUnavailableError, SharedChunkStore
from fx100io.store.shared import format as fmt

MiB = 1 << 20


@pytest.fixture
def redis_server(tmp_path: Path):
    yield from serve(tmp_path)


class SlowWrites:
    """A namespace's device whose writes land at once but are reported
    done only `delay` seconds later: a put that stalls after its data went
    out (a slow device, a paused host)."""

    def __init__(self, dev: Any, delay: float):
        self._dev = dev
        self.delay = delay

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dev, name)

    def start(self, parts: list, **kw: Any) -> list:
        real = self._dev.start(parts, **kw)
        if not any(op & OP_WRITE for op, *_x in parts):
            return real

        async def late(f: Any) -> Any:
            c = await f
            await asyncio.sleep(self.delay)
            return c
        return [asyncio.ensure_future(late(f)) for f in real]


def slow(st: SharedChunkStore, delay: float) -> None:
    for ns in st._ns:
        ns.dev = SlowWrites(ns.dev, delay)


def entry(srv: RedisServer, key: str) -> list[int]:
    return [int(x) for x in srv.client().hget("fx100io:{pool}:idx", key).split()]


def header_at(path: str, off: int) -> fmt.ExtentHeader | None:
    with open(path, "rb") as f:
        f.seek(off)
        return fmt.ExtentHeader.decode(f.read(fmt.BLOCK))


def test_a_slow_put_keeps_its_lease_and_its_extent(tmp_path, redis_server):
    """A put slower than lease_s renews its lease while it writes: its
    extent is never reclaimed and handed to another host under it."""
    uris = [str(tmp_path / "ns.img")]
    a = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB, lease_s=0.3)
    b = SharedChunkStore(uris, redis_server.url)
    slow(a, 1.0)
    va, vb = make_value("a", "A", 200000), make_value("b", "B", 200000)

    async def go() -> None:
        put_a = asyncio.create_task(a.batch_put(["a"], [va]))
        await asyncio.sleep(0.6)  # twice a's lease: expired, had nobody renewed it
        await b.batch_put(["b"], [vb])  # b's allocation reclaims expired leases
        await put_a  # published: its lease held
        assert entry(redis_server, "a")[1] != entry(redis_server, "b")[1]
        for st in (a, b):
            for k, tag in (("a", "A"), ("b", "B")):
                buf = np.zeros(MiB, np.uint8)
                assert await st.batch_get([k], [buf]) == [True]
                assert check_value(k, buf) == tag
    try:
        asyncio.run(go())
        s = b.stats()
        assert s["reclaimed_leases"] == 0 and s["leases"] == 0
    finally:
        a.close()
        b.close()


def test_a_put_whose_lease_is_gone_writes_nothing_more(tmp_path, redis_server):
    """Once its lease was reclaimed (its host was presumed dead) and the
    extent went to another put, the first put must not write there again:
    no header over the other chunk's, and it publishes nothing."""
    uris = [str(tmp_path / "ns.img")]
    a = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB, lease_s=0.3)
    b = SharedChunkStore(uris, redis_server.url)
    slow(a, 1.0)
    va, vb = make_value("a", "A", 200000), make_value("b", "B", 200000)

    async def go() -> None:
        put_a = asyncio.create_task(a.batch_put(["a"], [va]))
        leases: list[str] = []
        for _ in range(500):  # until a's allocation is there
            await asyncio.sleep(0.01)
            leases = [m.decode()
                      for m in redis_server.client().zrange("fx100io:{pool}:lease", 0, -1)]
            if leases:
                break
        assert len(leases) == 1
        assert await b._index.abort(leases) == 1  # as a reclaim would
        await b.batch_put(["b"], [vb])  # first fit: a's extent
        off_b = entry(redis_server, "b")[1]
        assert off_b == int(leases[0].split(":")[1])
        with pytest.raises(errors.FxTimeoutError):
            await put_a
        await asyncio.sleep(0.1)
        h = header_at(uris[0], off_b)
        assert h is not None and h.key == b"b"  # b's header, not a's
        buf = np.zeros(MiB, np.uint8)
        assert await b.batch_get(["b"], [buf]) == [True] and check_value("b", buf) == "B"
        assert await b.batch_get(["a"], [buf]) == [False]
    try:
        asyncio.run(go())
        s = b.stats()
        assert s["leases"] == 0 and s["chunks"] == 1
    finally:
        a.close()
        b.close()


# ------------------------------------------------------------ secrets
SECRET = "s3cr3t-Pa55"


def test_the_index_password_never_shows(tmp_path, caplog):
    srv = RedisServer(tmp_path / "redis")
    srv.start()
    srv.client().config_set("requirepass", SECRET)
    url = f"redis://:{SECRET}@127.0.0.1:{srv.port}/0"
    uris = [str(tmp_path / "ns.img")]
    seen: list[str] = []
    caplog.set_level(logging.DEBUG)
    try:
        st = SharedChunkStore(uris, url, create=True, size=16 * MiB, retry_after=0.1)
        st.batch_put_blocking(["k"], [b"x" * 5000])
        assert st.batch_get_blocking(["k"], [bytearray(5000)]) == [True]
        seen += [repr(st), str(st), str(st.stats())]
        assert ":***@127.0.0.1" in repr(st)
        # a user and a password; a wrong password (Redis refuses it)
        for bad in (f"redis://default:{SECRET}x@127.0.0.1:{srv.port}/0",
                    f"redis://{SECRET}x@127.0.0.1:{srv.port}/0",
                    f"redis://127.0.0.1:{srv.port}/0?password={SECRET}x"):
            other = SharedChunkStore(uris, bad, retry_after=0.1)
            seen += [repr(other), str(other.stats())]
            with pytest.raises(IndexUnavailableError) as ei:
                other.batch_put_blocking(["k2"], [b"y"])
            seen += [str(ei.value), repr(ei.value), str(ei.value.target),
                     str(ei.value.__cause__)]
            other.close()
        with pytest.raises(errors.InvalidArgumentError) as ei2:
            SharedChunkStore(uris, f"http://:{SECRET}@127.0.0.1/0")
        seen.append(str(ei2.value))
        srv.stop(signal.SIGKILL)  # down: every call says where, without the password
        import time
        time.sleep(0.15)
        with pytest.raises(IndexUnavailableError) as ei:
            st.batch_put_blocking(["k3"], [b"z"])
        seen += [str(ei.value), repr(ei.value), str(st.stats())]
        st.close()
    finally:
        srv.stop(signal.SIGKILL)
    seen.append(caplog.text)
    for text in seen:
        assert SECRET not in text, text


def test_the_lmcache_plugin_log_line_hides_the_password():
    from support.lmcache import PLUGIN, plugin_extra

    from fx100io.contrib._lmcache_config import PluginConfigError, parse_options
    extra = plugin_extra("file:///tmp/x.img", shared_index=f"redis://u:{SECRET}@h:6379/0")
    opts = parse_options([PLUGIN], extra, "FX100ioBackend")
    assert opts.shared_index == f"redis://u:{SECRET}@h:6379/0"  # the store gets it
    line = opts.describe()
    assert SECRET not in line and "shared_index=redis://u:***@h:6379/0" in line
    assert SECRET not in repr(opts) and SECRET not in str(opts)
    extra = plugin_extra("file:///tmp/x.img", shared_index=f"http://:{SECRET}@h/0")
    with pytest.raises(PluginConfigError) as ei:
        parse_options([PLUGIN], extra, "FX100ioBackend")
    assert SECRET not in str(ei.value)


# ------------------------------------------------------------ async twins
def test_async_twins_answer_and_never_block_the_loop(tmp_path):
    import os
    import time
    srv = RedisServer(tmp_path / "redis")
    srv.start()
    uris = [str(tmp_path / "ns.img")]
    st = SharedChunkStore(uris, srv.url, create=True, size=16 * MiB, timeout=0.5,
                          retry_after=0.05)

    async def answers() -> None:
        await st.batch_put(["k", "e"], [b"x" * 5000, b""])
        assert await st.acontains("k") and not await st.acontains("zz")
        assert await st.achunk_size("k") == 5000 and await st.achunk_size("zz") is None
        assert await st.achunk_sizes(["e", "zz", "k"]) == [0, None, 5000]
        assert sorted(await st.akeys()) == [b"e", b"k"]
        s = await st.astats()
        assert s["chunks"] == 2 and s["index_state"] == "ok"
        assert s == {**st.stats(), "bytes_read": s["bytes_read"]}

    async def hung() -> list[float]:
        ticks: list[float] = []
        stop = False

        async def ticker() -> None:
            while not stop:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)
        t = asyncio.create_task(ticker())
        await asyncio.sleep(0.02)
        for call in (lambda: st.acontains("k"), lambda: st.achunk_size("k"),
                     lambda: st.achunk_sizes(["k"])):
            assert await call() in (False, None, [None])
            await asyncio.sleep(0.06)  # past retry_after: the next one asks Redis again
        assert await st.akeys() == []  # as contains() is False
        await asyncio.sleep(0.06)
        assert (await st.astats())["index_state"] == "unavailable"
        stop = True
        await t
        return ticks

    try:
        asyncio.run(answers())
        os.kill(srv.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            ticks = asyncio.run(hung())
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)
        assert time.monotonic() - t0 > 5 * 0.5  # each call waited out the socket timeout
        gaps = np.diff(ticks)
        assert gaps.max() < 0.15, f"the event loop was blocked for {gaps.max():.3f} s"
    finally:
        st.close()
        srv.stop(signal.SIGKILL)


# ------------------------------------------------------------ deletes
def test_a_delete_erases_the_header_and_a_dead_deleters_hold_expires(tmp_path, redis_server):
    uris = [str(tmp_path / "ns.img")]
    st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)
    st.batch_put_blocking(["d", "e"], [make_value("d", "1", 70000), make_value("e", "1", 70000)])
    off_d, off_e = entry(redis_server, "d")[1], entry(redis_server, "e")[1]
    assert header_at(uris[0], off_d).key == b"d"
    assert st.delete_blocking("d")
    assert header_at(uris[0], off_d) is None  # erased before the extent was freed
    assert st.stats()["bytes_used"] == 4096 + fmt.align_up(70000)

    async def dies_while_deleting() -> None:
        # a deleter that took the extent out of the index and died before
        # erasing its header: the hold expires and the extent comes back
        assert await st._index.delete(b"e", 200) == (0, off_e, 4096 + fmt.align_up(70000))
        assert st.stats()["bytes_used"] == 4096 + fmt.align_up(70000)
        await asyncio.sleep(0.3)
        assert st.stats()["bytes_used"] == 0
    asyncio.run(dies_while_deleting())
    assert not st.contains("e") and header_at(uris[0], off_e).key == b"e"
    st.close()

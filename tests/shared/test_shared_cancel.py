"""A shared put or delete cancelled once Redis took a chunk out of the index
(its PUBLISH, DELETE or eviction was sent) still erases that chunk's
header before the cancel propagates, so a rebuild of the index never
brings back an older value, a deleted chunk or an evicted one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import chunk_bytes
from support.shared_redis import serve

from fx100io.store.shared import SharedChunkStore
from fx100io.store.shared import format as fmt
from fx100io.store.shared.rebuild import rebuild

MiB = 1 << 20
N = 200_000


@pytest.fixture
def redis_server(tmp_path: Path):
    yield from serve(tmp_path)


def extent_of(srv: Any, key: str) -> tuple[int, int]:
    d, off = srv.client().hget("fx100io:{pool}:idx", key).split()[:2]
    return int(d), int(off)


def header_at(uri: str, off: int) -> fmt.ExtentHeader | None:
    with open(uri, "rb") as f:
        f.seek(off)
        return fmt.ExtentHeader.decode(f.read(fmt.BLOCK))


def cancel_after(st: SharedChunkStore, script: str,
                 victim: Callable[[], asyncio.Future | None]) -> Callable[[], None]:
    """Make the index call `script` cancel the task victim() once Redis ran
    it, as if the cancel came while its reply was on the way; returns the undo."""
    orig = getattr(st._index, script)

    async def wrapped(*a: Any, **kw: Any) -> Any:
        res = await orig(*a, **kw)
        t = victim()
        if t is not None:
            t.cancel()
        await asyncio.sleep(0)  # where a cancelled caller leaves
        return res

    setattr(st._index, script, wrapped)
    return lambda: setattr(st._index, script, orig)


async def run_cancelled(st: SharedChunkStore, script: str,
                        call: Callable[[], Awaitable[Any]]) -> None:
    task: asyncio.Future | None = None
    undo = cancel_after(st, script, lambda: task)
    try:
        task = asyncio.ensure_future(call())
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        undo()


def rebuilt_keys(uris: list[str], srv: Any) -> dict[str, bytes]:
    srv.client().flushall()
    rebuild(uris, srv.url)
    out = {}
    with SharedChunkStore(uris, srv.url) as st:
        for k in st.keys():
            buf = np.zeros(N, np.uint8)
            assert st.batch_get_blocking([k], [buf]) == [True]
            out[k.decode()] = buf.tobytes()
    return out


def test_a_put_cancelled_after_its_publish_erases_the_superseded_header(tmp_path,
                                                                       redis_server):
    uris = [str(tmp_path / "a.img")]
    v1, v2 = chunk_bytes("v1", N), chunk_bytes("v2", N)

    async def main() -> None:
        st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)
        await st.batch_put(["k"], [v1])
        _d, old = extent_of(redis_server, "k")
        assert header_at(uris[0], old) is not None
        await run_cancelled(st, "publish", lambda: st.batch_put(["k"], [v2]))
        # published before the cancel: the new value is there ...
        buf = np.zeros(N, np.uint8)
        assert await st.batch_get(["k"], [buf]) == [True] and np.array_equal(buf, v2)
        # ... and the old value's header is gone by the time the put returned
        assert header_at(uris[0], old) is None, "the superseded value's header is still there"
        assert await st.delete("k")
        await st.aclose()
    asyncio.run(main())
    assert rebuilt_keys(uris, redis_server) == {}, "a rebuild brought back the older value"


def test_a_delete_cancelled_after_redis_dropped_the_key_erases_its_header(tmp_path,
                                                                         redis_server):
    uris = [str(tmp_path / "a.img")]
    v1 = chunk_bytes("v1", N)

    async def main() -> None:
        st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)
        await st.batch_put(["k", "keep"], [v1, v1])
        _d, off = extent_of(redis_server, "k")
        await run_cancelled(st, "delete", lambda: st.delete("k"))
        assert not await st.acontains("k")
        assert header_at(uris[0], off) is None, "the deleted chunk's header is still there"
        await st.aclose()
    asyncio.run(main())
    assert list(rebuilt_keys(uris, redis_server)) == ["keep"]


def test_a_put_cancelled_after_it_evicted_erases_the_evicted_headers(tmp_path, redis_server):
    uris = [str(tmp_path / "a.img")]
    ext = fmt.extent_len(N)
    v = {k: chunk_bytes(k, N) for k in ("a", "b", "c")}

    async def main() -> None:
        st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB,
                              capacity=2 * ext)
        await st.batch_put(["a", "b"], [v["a"], v["b"]])
        _d, off_a = extent_of(redis_server, "a")
        # "c" evicts "a" (least recently used); cancelled once the eviction ran
        await run_cancelled(st, "alloc", lambda: st.batch_put(["c"], [v["c"]]))
        assert not await st.acontains("a")
        assert header_at(uris[0], off_a) is None, "the evicted chunk's header is still there"
        await st.aclose()
    asyncio.run(main())
    assert "a" not in rebuilt_keys(uris, redis_server), "a rebuild brought back an evicted chunk"


class HeldDev:
    """A namespace's device whose I/O completions are held back until
    release(): the I/O itself runs, only its caller hears of it later, as
    with a slow device."""

    def __init__(self, dev: Any):
        self._dev = dev
        self.held: list[tuple[asyncio.Future, asyncio.Future]] = []
        self.released = False
        self.started = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dev, name)

    def start(self, parts: Any, **kw: Any) -> list[asyncio.Future]:
        loop = asyncio.get_running_loop()
        out = []
        for f in self._dev.start(parts, **kw):
            o = loop.create_future()

            def done(f: asyncio.Future, o: asyncio.Future = o) -> None:
                if self.released:
                    o.set_result(f.result())
                else:
                    self.held.append((f, o))
            f.add_done_callback(done)
            out.append(o)
        self.started.set()
        return out

    def release(self) -> None:
        self.released = True
        for f, o in self.held:
            o.set_result(f.result())
        self.held.clear()


def test_a_put_cancelled_twice_while_it_writes_gives_its_extents_back(tmp_path,
                                                                     redis_server):
    """The second cancel comes while the put's cleanup waits for its writes
    in flight: the cleanup still waits for them and gives the extents back
    (no lease left, nothing used), and the pool's whole space is free for
    the next put."""
    uris = [str(tmp_path / "a.img")]
    big = chunk_bytes("big", 4 * MiB)

    async def main() -> None:
        st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)
        held = st._ns[0].dev = HeldDev(st._ns[0].dev)  # type: ignore[assignment]
        for i in range(3):
            held.released = False
            held.started.clear()
            task = asyncio.ensure_future(st.batch_put([f"k{i}"], [big]))
            await held.started.wait()
            task.cancel()
            for _ in range(3):
                await asyncio.sleep(0)
            task.cancel()  # while the cleanup waits for the writes
            asyncio.get_running_loop().call_later(0.2, held.release)
            with pytest.raises(asyncio.CancelledError):
                await task
            assert held.released, "the put returned before its writes landed"
        s = await st.astats()
        assert (s["leases"], s["bytes_used"], s["chunks"]) == (0, 0, 0), s
        st._ns[0].dev = held._dev
        # three chunks of 4 MiB fit in the pool's ~16 MiB as before
        keys = ["a", "b", "c"]
        await st.batch_put(keys, [big] * 3)
        for k in keys:
            buf = np.zeros(big.nbytes, np.uint8)
            assert await st.batch_get([k], [buf]) == [True] and np.array_equal(buf, big)
        await st.aclose()
    asyncio.run(main())


def test_a_put_cancelled_while_it_erases_evicted_headers_erases_them_first(tmp_path,
                                                                          redis_server):
    """A put that evicted chunks erases their headers in a task of its own
    and waits for it at its end; cancelled there, it still waits the erase
    out (headers blank and flushed) before the cancel propagates."""
    uris = [str(tmp_path / "a.img")]
    ext = fmt.extent_len(N)
    v = {k: chunk_bytes(k, N) for k in ("a", "b", "c")}

    async def main() -> None:
        st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB,
                              capacity=2 * ext)
        await st.batch_put(["a", "b"], [v["a"], v["b"]])
        _d, off_a = extent_of(redis_server, "a")
        gate = asyncio.Event()
        erasing = asyncio.Event()
        real_erase = st._erase

        async def erase(tombs: list[tuple[int, int, int]]) -> None:
            if any(off == off_a for _d, off, _e in tombs):
                erasing.set()
                await gate.wait()  # the erase is slow
            await real_erase(tombs)
        st._erase = erase  # type: ignore[method-assign]
        task = asyncio.ensure_future(st.batch_put(["c"], [v["c"]]))
        await erasing.wait()
        while not await st.acontains("c"):  # published: the put waits for its eraser
            await asyncio.sleep(0.01)
        task.cancel()
        asyncio.get_running_loop().call_later(0.2, gate.set)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert gate.is_set(), "the put returned before its eraser ended"
        assert header_at(uris[0], off_a) is None, "the evicted chunk's header is still there"
        st._erase = real_erase  # type: ignore[method-assign]
        await st.aclose()
    asyncio.run(main())
    assert "a" not in rebuilt_keys(uris, redis_server), "a rebuild brought back an evicted chunk"

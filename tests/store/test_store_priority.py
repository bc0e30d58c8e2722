"""The ordering rules of priority classes, through each store's own API
(docs/architecture.md, "Priority and write admission"), one suite over
ChunkStore and SharedChunkStore.  Nothing here depends on timing: the
device is opened with a queue depth of 1, so the queue issues one piece
at a time and only when a completion is reaped; a gate holds the reaping
while the requests of a test reach the C queue in the order the test
wants, and what the tests check is the order in which calls complete and
how many calls of one kind finished before another: a load queued behind stores overtakes
them; stores still finish while loads keep coming; a small batch of loads
is not stuck behind a huge one; a prefetch (background) goes after a load.
The scheduler's own rules, piece by piece, are checked in C
(tests/c/test_reqs_prio.c)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import chunk_bytes
from support.shared_redis import serve

import fx100io
from fx100io import errors
from fx100io.priority import Priority

KiB, MiB = 1 << 10, 1 << 20
#: small pieces: a chunk is many of them, so the order is visible
OPTS = dict(queue_depth=1, max_io=64 * KiB)
WAIT = 60  # seconds: a bound on every wait here, never reached when it works


@pytest.fixture
def redis_server(tmp_path: Path):
    yield from serve(tmp_path)


@pytest.fixture(params=["local", "shared"])
def store(request, tmp_path):
    path = str(tmp_path / "store.img")
    if request.param == "local":
        st = fx100io.ChunkStore([path], create=True, size=256 * MiB, **OPTS)
    else:
        from fx100io.store.shared import SharedChunkStore
        url = request.getfixturevalue("redis_server").url
        st = SharedChunkStore([path], url, create=True, size=256 * MiB, **OPTS)
    yield st
    st.close()


def devices(st: Any) -> list[Any]:
    return [m.dev for m in st._members] if hasattr(st, "_members") else [ns.dev for ns in st._ns]


class Gate:
    """Holds the completions of a store's device on this thread: nothing is
    reaped, so with a queue depth of 1 the queue issues nothing more while
    requests pile up in C behind the one piece in flight.  Leaving it lets
    the queue go on, in the order its scheduler picks."""

    def __init__(self, st: Any):
        self.drv = devices(st)[0]._driver(True)

    def __enter__(self) -> Gate:
        d = self.drv
        d.detach()
        d._attach = lambda loop: None  # type: ignore[method-assign]
        d._reap = lambda: None  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        d = self.drv
        del d._attach, d._reap
        d._attach(asyncio.get_running_loop())
        d._reap()

    async def in_c(self, n: int) -> None:
        """Wait (by event-loop turns, bounded) until at least n requests
        are in the C queue."""
        for _ in range(100000):
            if self.drv.queue.pending >= n:
                return
            await asyncio.sleep(0)
        raise AssertionError("the requests never reached the queue")


async def test_a_load_overtakes_queued_stores(store):
    """Four puts of 4 MiB (256 pieces) are in the queue when a get of
    256 KiB comes: the get finishes first, when the stores have written at
    most two pieces, and every chunk is right."""
    await store.batch_put(["hit"], [chunk_bytes("hit", 256 * KiB)])
    order: list[str] = []
    data = {f"s{i}": chunk_bytes(f"s{i}", 4 * MiB) for i in range(4)}

    async def put(k: str) -> None:
        await store.batch_put([k], [data[k]])
        order.append(k)

    out = np.zeros(256 * KiB, dtype=np.uint8)

    moved: list[int] = []

    async def get() -> None:
        assert await store.batch_get(["hit"], [out]) == [True]
        order.append("load")
        moved.append(gate.drv.queue.stats()["bytes"] - before)

    with Gate(store) as gate:
        before = gate.drv.queue.stats()["bytes"]
        puts = [asyncio.ensure_future(put(k)) for k in data]
        await gate.in_c(4)
        load = asyncio.ensure_future(get())
        await gate.in_c(5)
    await asyncio.wait_for(asyncio.gather(load, *puts), WAIT)
    assert order[0] == "load", order
    # (a put returns after its flush, which queues behind the writes of the
    # others: what shows the load went first is how little the stores had
    # written when it finished: the piece in flight when it came, and at
    # most one on the stores' share of its 4 pieces)
    assert moved[0] <= 256 * KiB + 2 * 64 * KiB, moved
    assert np.array_equal(out, chunk_bytes("hit", 256 * KiB))
    for k, want in data.items():
        got = np.zeros(4 * MiB, dtype=np.uint8)
        assert await store.batch_get([k], [got]) == [True]
        assert np.array_equal(got, want)


async def test_stores_finish_while_loads_keep_coming(store):
    """Two gets always outstanding, a new one as soon as one ends: the two
    puts still finish, after a bounded number of gets (a store gets one
    piece in fx100io.priority.SHARE at least), counted, not timed."""
    await store.batch_put(["hit"], [chunk_bytes("hit", 256 * KiB)])
    data = {f"s{i}": chunk_bytes(f"s{i}", MiB) for i in range(2)}  # 32 pieces
    puts = [asyncio.ensure_future(store.batch_put([k], [v])) for k, v in data.items()]
    loads_done = 0
    bufs = [np.zeros(256 * KiB, dtype=np.uint8) for _ in range(2)]

    async def loads(buf: np.ndarray) -> None:
        nonlocal loads_done
        while not all(p.done() for p in puts) and loads_done < 5000:
            assert await store.batch_get(["hit"], [buf]) == [True]
            loads_done += 1

    await asyncio.wait_for(asyncio.gather(*(loads(b) for b in bufs)), WAIT)
    await asyncio.wait_for(asyncio.gather(*puts), WAIT)  # raises if a put failed
    # 32 store pieces, each behind at most SHARE - 1 load pieces (4 per get),
    # plus what the puts' flushes and index commits wait for
    assert loads_done < 32 * fx100io.priority.SHARE // 4 + 200, loads_done
    for k, want in data.items():
        got = np.zeros(MiB, dtype=np.uint8)
        assert await store.batch_get([k], [got]) == [True]
        assert np.array_equal(got, want)


async def test_a_small_batch_is_not_stuck_behind_a_huge_one(store):
    """A get of 8 chunks of 1 MiB (128 pieces) is in the queue when a get
    of one 64 KiB chunk comes: the small one finishes first (the streams
    take turns piece by piece)."""
    keys = [f"big{i}" for i in range(8)]
    await store.batch_put(keys + ["small"], [chunk_bytes(k, MiB) for k in keys]
                          + [chunk_bytes("small", 64 * KiB)])
    order: list[str] = []
    big = [np.zeros(MiB, dtype=np.uint8) for _ in keys]

    async def get_big() -> None:
        assert await store.batch_get(keys, big) == [True] * 8
        order.append("big")

    small = np.zeros(64 * KiB, dtype=np.uint8)

    async def get_small() -> None:
        assert await store.batch_get(["small"], [small]) == [True]
        order.append("small")

    with Gate(store) as gate:
        task = asyncio.ensure_future(get_big())
        await gate.in_c(8)
        task2 = asyncio.ensure_future(get_small())
        await gate.in_c(9)
    await asyncio.wait_for(asyncio.gather(task, task2), WAIT)
    assert order == ["small", "big"]
    assert np.array_equal(small, chunk_bytes("small", 64 * KiB))
    for k, b in zip(keys, big):
        assert np.array_equal(b, chunk_bytes(k, MiB))


async def test_a_prefetch_goes_after_a_load(store):
    """A background get (a prefetch) of 2 MiB is in the queue when a load
    of the same size comes: the load finishes first."""
    await store.batch_put(["a", "b"], [chunk_bytes("a", 2 * MiB), chunk_bytes("b", 2 * MiB)])
    order: list[str] = []
    pre = np.zeros(2 * MiB, dtype=np.uint8)

    async def prefetch() -> None:
        assert await store.batch_get(["a"], [pre], priority="background") == [True]
        order.append("prefetch")

    out = np.zeros(2 * MiB, dtype=np.uint8)

    async def load() -> None:
        assert await store.batch_get(["b"], [out], priority=Priority.LOAD) == [True]
        order.append("load")

    with Gate(store) as gate:
        task = asyncio.ensure_future(prefetch())
        await gate.in_c(1)
        task2 = asyncio.ensure_future(load())
        await gate.in_c(2)
    await asyncio.wait_for(asyncio.gather(task, task2), WAIT)
    assert order == ["load", "prefetch"]
    assert np.array_equal(pre, chunk_bytes("a", 2 * MiB))
    assert np.array_equal(out, chunk_bytes("b", 2 * MiB))


def test_priority_argument(store):
    """Names, the enum and its values are taken; anything else is refused
    before any I/O, by the async calls and their blocking twins alike."""
    buf = chunk_bytes("k", 8 * KiB)
    for p in ("store", "STORE", Priority.BACKGROUND, 1):
        store.batch_put_blocking(["k"], [buf], priority=p)
    out = np.zeros(8 * KiB, dtype=np.uint8)
    for p in ("load", "background", Priority.LOAD, 2, None):
        assert store.batch_get_blocking(["k"], [out], priority=p) == [True]
    for bad in ("urgent", 3, -1, True, 1.0):
        with pytest.raises(errors.InvalidArgumentError):
            store.batch_get_blocking(["k"], [out], priority=bad)
        with pytest.raises(errors.InvalidArgumentError):
            store.batch_put_blocking(["k"], [buf], priority=bad)
    assert np.array_equal(out, buf)


@pytest.mark.parametrize("kind", ["local", "shared"])
async def test_a_cancelled_prefetch_behind_loads_leaves_the_buffer_alone(kind, tmp_path, request):
    """A background get waits behind loads that keep coming; cancelled at
    any moment, it returns only once none of its reads can land any more
    (tests/support/cancel_harness.py), on both stores."""
    from support.cancel_harness import check_cancellation

    from fx100io.pool import aligned_array

    chunk, piece = 16 * MiB, 128 * KiB
    path = str(tmp_path / f"{kind}.img")
    opts = dict(create=True, size=64 * MiB, max_io=piece, queue_depth=4)
    if kind == "local":
        st = fx100io.ChunkStore([path], **opts)
    else:
        from fx100io.store.shared import SharedChunkStore
        st = SharedChunkStore([path], request.getfixturevalue("redis_server").url, **opts)
    try:
        data = chunk_bytes("cancel", chunk)
        await st.batch_put(["k", "hot"], [data, chunk_bytes("hot", MiB)])
        stop = False

        async def loads() -> int:
            n, out = 0, np.zeros(MiB, dtype=np.uint8)
            while not stop:
                assert await st.batch_get(["hot"], [out]) == [True]
                n += 1
            return n

        busy = [asyncio.ensure_future(loads()) for _ in range(2)]
        buf = aligned_array(chunk)
        trials = await check_cancellation(
            lambda: st.batch_get(["k"], [buf], priority="background"), buf, data, piece=piece)
        stop = True
        assert sum(await asyncio.wait_for(asyncio.gather(*busy), WAIT)) > 0
        assert trials[0].moment == "before" and trials[0].cancelled
    finally:
        await st.aclose()

"""The contract every chunk store keeps (fx100io.store.core.api.ChunkStoreAPI),
checked by the same tests over each store: ChunkStore on a file, and
SharedChunkStore on a file with a real redis-server for its index.

What only one store does (the local index log, LRU and striping; the
shared pool's leases, pins, hosts and Redis outages) stays in that store's
own test files."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import chunk_bytes
from support.cancel_harness import check_cancellation
from support.shared_redis import serve

import fx100io
from fx100io import errors
from fx100io.pool import aligned_array
from fx100io.store.core.api import ChunkStoreAPI

MiB = 1 << 20
SIZES = [1, 4095, 4096, 4097, MiB, 3 * MiB + 7]


@pytest.fixture
def redis_server(tmp_path: Path):
    yield from serve(tmp_path)


class Kind:
    """How a test makes, reopens and damages one kind of store."""

    def __init__(self, name: str, path: Path, request: Any):
        self.name = name
        self.path = str(path)
        self.index = request.getfixturevalue("redis_server").url if name == "shared" else None

    def create(self, size: int = 64 * MiB, **opts: Any) -> Any:
        return self.open(create=True, size=size, **opts)

    def open(self, **opts: Any) -> Any:
        if self.index is None:
            return fx100io.ChunkStore([self.path], **opts)
        from fx100io.store.shared import SharedChunkStore
        return SharedChunkStore([self.path], self.index, **opts)

    def data_offset(self, st: Any, key: str) -> int:
        """Where the chunk under key starts on the device."""
        if self.index is None:
            return int(st._entries[key.encode()].off)
        import redis
        raw = redis.Redis.from_url(self.index).hget("fx100io:{pool}:idx", key).split()
        return int(raw[1]) + 4096  # past the extent's header block

    def flip(self, st: Any, key: str, at: int) -> None:
        """Flip one byte of the chunk under key, on the device."""
        off = self.data_offset(st, key) + at
        with open(self.path, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0x40]))
            os.fsync(f.fileno())


@pytest.fixture(params=["local", "shared"])
def kind(request, tmp_path) -> Kind:
    return Kind(request.param, tmp_path / "store.img", request)


def fill(keys: list[str], sizes: list[int]) -> list[np.ndarray]:
    return [chunk_bytes(k, n) for k, n in zip(keys, sizes)]


def test_every_store_offers_the_api(kind):
    with kind.create() as st:
        assert isinstance(st, ChunkStoreAPI)


def test_put_get_bytes_equal_and_reopen(kind):
    keys = [f"chunk-{n}" for n in SIZES]
    with kind.create() as st:
        st.batch_put_blocking(keys, fill(keys, SIZES))
        outs = [np.zeros(n, np.uint8) for n in SIZES]
        assert st.batch_get_blocking(keys, outs) == [True] * len(keys)
        for o, k, n in zip(outs, keys, SIZES):
            assert np.array_equal(o, chunk_bytes(k, n)), k
            assert st.chunk_size(k) == n
        assert sorted(st.keys()) == sorted(k.encode() for k in keys)
    assert st.closed
    with kind.open() as st:  # closed and opened again: every chunk is found
        outs = [np.zeros(n, np.uint8) for n in SIZES]
        assert st.batch_get_blocking(keys, outs) == [True] * len(keys)
        for o, k, n in zip(outs, keys, SIZES):
            assert np.array_equal(o, chunk_bytes(k, n)), k


def test_bytes_and_str_keys_and_zero_length(kind):
    with kind.create(16 * MiB) as st:
        st.batch_put_blocking([b"\x00\xffbin", "utf8-é", "empty"],
                              [b"abc", bytearray(b"defg"), b""])
        out = [bytearray(3), bytearray(4), bytearray(0)]
        assert st.batch_get_blocking([b"\x00\xffbin", "utf8-é".encode(), "empty"],
                                     out) == [True] * 3
        assert out[:2] == [b"abc", b"defg"]
        assert st.contains("empty") and not st.contains("missing")
        assert st.chunk_size("empty") == 0 and st.chunk_size("missing") is None


def test_batch_exists_counts_the_prefix(kind):
    with kind.create(16 * MiB) as st:
        st.batch_put_blocking(["p0", "p1", "p3"], [b"x"] * 3)
        assert st.batch_exists_blocking(["p0", "p1", "p2", "p3"]) == 2
        assert st.batch_exists_blocking(["p9", "p0"]) == 0
        assert asyncio.run(st.batch_exists([])) == 0


def test_overwrite_delete_and_missing_keys_survive_reopen(kind):
    with kind.create(32 * MiB) as st:
        st.batch_put_blocking(["a", "b"], [b"1" * 5000, b"2" * 5000])
        st.batch_put_blocking(["a"], [b"3" * 7000])
        assert st.delete_blocking("b") is True
        assert st.delete_blocking("b") is False
        assert st.delete_blocking("never") is False
        out = bytearray(7000)
        assert st.batch_get_blocking(["never", "a"], [bytearray(10), out]) == [False, True]
        assert out == b"3" * 7000
    with kind.open() as st:
        out = bytearray(7000)
        assert st.batch_get_blocking(["a", "b"], [out, bytearray(5000)]) == [True, False]
        assert out == b"3" * 7000
        assert st.keys() == [b"a"]


def test_bad_inputs_raise_and_corrupt_nothing(kind):
    st = kind.create(16 * MiB)
    st.batch_put_blocking(["keep"], [b"K" * 10000])
    with pytest.raises(errors.BufferTooSmallError):
        st.batch_get_blocking(["keep"], [bytearray(9999)])
    with pytest.raises(errors.ReadOnlyBufferError):
        st.batch_get_blocking(["keep"], [b"\0" * 10000])
    with pytest.raises(errors.KeyTooLongError):
        st.batch_put_blocking(["x" * 1025], [b"1"])
    with pytest.raises(errors.KeyTooLongError):
        st.batch_put_blocking([""], [b"1"])
    with pytest.raises(errors.InvalidArgumentError):
        st.batch_put_blocking([123], [b"1"])
    with pytest.raises(errors.InvalidArgumentError):
        st.batch_put_blocking(["a", "b"], [b"1"])
    with pytest.raises(errors.InvalidArgumentError):
        st.batch_put_blocking(["a"], [object()])
    out = bytearray(10000)
    assert st.batch_get_blocking(["keep"], [out]) == [True] and out == b"K" * 10000
    assert sorted(st.keys()) == [b"keep"]
    st.close()
    with pytest.raises(errors.StoreClosedError):
        st.batch_get_blocking(["keep"], [out])
    with pytest.raises(errors.StoreClosedError):
        st.contains("keep")


def test_a_flipped_byte_is_a_miss_and_the_chunk_is_dropped(kind):
    n = 70000
    with kind.create(32 * MiB) as st:
        st.batch_put_blocking(["good", "bad"], fill(["good", "bad"], [n, n]))
        kind.flip(st, "bad", 12345)
        outs = [np.zeros(n, np.uint8), np.zeros(n, np.uint8)]
        assert st.batch_get_blocking(["good", "bad"], outs) == [True, False]
        assert np.array_equal(outs[0], chunk_bytes("good", n))
        assert st.stats()["corruptions"] == 1
        assert not st.contains("bad")  # dropped, never served
    with kind.open() as st:
        assert not st.contains("bad") and st.contains("good")


def test_blocking_twins_from_four_threads(kind):
    size = MiB
    st = kind.create(128 * MiB)
    bad: list[Any] = []

    def worker(t: int) -> None:
        try:
            for r in range(4):
                keys = [f"w{t}-{r}-{i}" for i in range(3)]
                st.batch_put_blocking(keys, fill(keys, [size] * 3))
                outs = [np.empty(size, np.uint8) for _ in keys]
                if st.batch_get_blocking(keys, outs) != [True] * 3:
                    bad.append(("miss", t, r))
                bad.extend(("bytes", k) for o, k in zip(outs, keys)
                           if not np.array_equal(o, chunk_bytes(k, size)))
                if st.batch_exists_blocking(keys) != 3 or not st.delete_blocking(keys[0]):
                    bad.append(("exists/delete", t, r))
        except Exception as e:  # noqa: BLE001 - reported by the assert below
            bad.append(e)

    ths = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    st.close()
    assert bad == []
    with kind.open() as st2:
        assert len(st2.keys()) == 4 * 4 * 2


def test_a_blocking_twin_inside_an_event_loop_is_refused(kind):
    async def go(st: Any) -> None:
        for call in (lambda: st.batch_exists_blocking(["x"]),
                     lambda: st.batch_get_blocking(["x"], [bytearray(1)]),
                     lambda: st.batch_put_blocking(["x"], [b"1"]),
                     lambda: st.delete_blocking("x")):
            with pytest.raises(errors.BlockingCallInLoopError):
                call()

    with kind.create(16 * MiB) as st:
        asyncio.run(go(st))
        assert not st.contains("x")  # the refused put did not run


async def test_async_api_and_async_context_manager(kind):
    async with kind.create(32 * MiB) as st:
        keys = ["a", "b"]
        await st.batch_put(keys, fill(keys, [5000, 9000]))
        outs = [np.zeros(5000, np.uint8), np.zeros(9000, np.uint8)]
        assert await st.batch_get(keys, outs) == [True, True]
        assert np.array_equal(outs[1], chunk_bytes("b", 9000))
        assert await st.batch_exists(["a", "b", "c"]) == 2
        assert await st.delete("a") and not await st.delete("a")
    assert st.closed
    with pytest.raises(errors.StoreClosedError):
        await st.batch_get(["b"], [outs[1]])


# Cancelled at any moment, a get leaves the caller's buffer alone once it
# returned (tests/cancel_harness.py); small pieces, few in flight: many
# moments at which a cancel falls between pieces.
CANCEL_CHUNK = 64 * MiB
PIECE = 128 << 10


async def test_no_byte_lands_after_a_cancelled_get_returned(kind):
    data = chunk_bytes("cancel", CANCEL_CHUNK)
    st = kind.create(CANCEL_CHUNK * 2 + 32 * MiB, max_io=PIECE, queue_depth=4)
    try:
        await st.batch_put(["k"], [data])
        buf = aligned_array(CANCEL_CHUNK)
        read: Callable[[], Any] = lambda: st.batch_get(["k"], [buf])  # noqa: E731
        trials = await check_cancellation(read, buf, data, piece=PIECE)
        # a cancel before the call took its first step ends it with CancelledError
        assert trials[0].moment == "before" and trials[0].cancelled
    finally:
        await st.aclose()

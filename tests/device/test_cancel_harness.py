"""Every async read into a caller's buffer, cancelled at any moment, leaves
the buffer alone once the call returned (tests/support/cancel_harness.py): the
ChunkStore, the SharedChunkStore, Device.read_into on a file and on a
block device (the kernel NVMe-oF path is Device on a /dev/nvmeXnY: a loop
device stands for it)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import chunk_bytes
from support.cancel_harness import check_cancellation
from support.shared_redis import serve

import fx100io
from fx100io.pool import aligned_array

MiB = 1 << 20
CHUNK = 64 * MiB
PIECE = 128 << 10
# small pieces, few in flight: many moments at which a cancel falls between pieces
DEV_OPTS = dict(max_io=PIECE, queue_depth=4)

Reader = tuple[Callable[[], Awaitable[Any]], np.ndarray, np.ndarray]


@pytest.fixture
def redis_server(tmp_path: Path):
    yield from serve(tmp_path)


@contextlib.asynccontextmanager
async def chunkstore_reader(tmp_path: Path, request: Any) -> AsyncIterator[Reader]:
    data = chunk_bytes("cancel", CHUNK)
    st = fx100io.ChunkStore([str(tmp_path / "cs.img")], create=True, size=CHUNK * 2 + 32 * MiB,
                            **DEV_OPTS)
    try:
        await st.batch_put(["k"], [data])
        buf = aligned_array(CHUNK)
        yield (lambda: st.batch_get(["k"], [buf])), buf, data
    finally:
        await st.aclose()


@contextlib.asynccontextmanager
async def shared_reader(tmp_path: Path, request: Any) -> AsyncIterator[Reader]:
    from fx100io.shared import SharedChunkStore
    srv = request.getfixturevalue("redis_server")
    data = chunk_bytes("cancel", CHUNK)
    st = SharedChunkStore([str(tmp_path / "sh.img")], srv.url, create=True,
                          size=CHUNK * 2 + 32 * MiB, **DEV_OPTS)
    try:
        await st.batch_put(["k"], [data])
        buf = aligned_array(CHUNK)
        yield (lambda: st.batch_get(["k"], [buf])), buf, data
    finally:
        await st.aclose()


@contextlib.asynccontextmanager
async def _device_reader(uri: str, create: bool) -> AsyncIterator[Reader]:
    data = chunk_bytes("cancel", CHUNK)
    dev = fx100io.open_device(uri, create=create, size=CHUNK if create else None, **DEV_OPTS)
    try:
        src = aligned_array(CHUNK)
        src[:] = data
        assert await dev.write_from(0, src) == CHUNK
        await dev.flush()
        buf = aligned_array(CHUNK)
        yield (lambda: dev.read_into(0, buf)), buf, data
    finally:
        dev.close()


@contextlib.asynccontextmanager
async def device_file_reader(tmp_path: Path, request: Any) -> AsyncIterator[Reader]:
    async with _device_reader(str(tmp_path / "dev.img"), True) as r:
        yield r


@contextlib.asynccontextmanager
async def device_block_reader(tmp_path: Path, request: Any) -> AsyncIterator[Reader]:
    async with _device_reader(request.getfixturevalue("loop_device"), False) as r:
        yield r


READERS = [
    pytest.param(chunkstore_reader, id="ChunkStore.batch_get"),
    pytest.param(shared_reader, id="SharedChunkStore.batch_get"),
    pytest.param(device_file_reader, id="Device.read_into-file"),
    pytest.param(device_block_reader, id="Device.read_into-block"),
]


@pytest.mark.parametrize("make_reader", READERS)
async def test_no_byte_lands_after_a_cancelled_read_returned(tmp_path, request, make_reader):
    async with make_reader(tmp_path, request) as (read, buf, data):
        trials = await check_cancellation(read, buf, data, piece=PIECE)
        # a cancel before the call took its first step ends it with CancelledError
        assert trials[0].moment == "before" and trials[0].cancelled

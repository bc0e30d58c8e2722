"""Every async read into a caller's buffer, cancelled at any moment, leaves
the buffer alone once the call returned (tests/support/cancel_harness.py):
Device.read_into on a file and on a block device (the kernel NVMe-oF path
is Device on a /dev/nvmeXnY: a loop device stands for it).  Each store's
batch_get is checked the same way in tests/store/test_store_conformance.py."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import chunk_bytes
from support.cancel_harness import check_cancellation

import fx100io
from fx100io.pool import aligned_array

MiB = 1 << 20
CHUNK = 64 * MiB
PIECE = 128 << 10
# small pieces, few in flight: many moments at which a cancel falls between pieces
DEV_OPTS = dict(max_io=PIECE, queue_depth=4)

Reader = tuple[Callable[[], Awaitable[Any]], np.ndarray, np.ndarray]


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
    pytest.param(device_file_reader, id="Device.read_into-file"),
    pytest.param(device_block_reader, id="Device.read_into-block"),
]


@pytest.mark.parametrize("make_reader", READERS)
async def test_no_byte_lands_after_a_cancelled_read_returned(tmp_path, request, make_reader):
    async with make_reader(tmp_path, request) as (read, buf, data):
        trials = await check_cancellation(read, buf, data, piece=PIECE)
        # a cancel before the call took its first step ends it with CancelledError
        assert trials[0].moment == "before" and trials[0].cancelled

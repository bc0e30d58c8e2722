"""A ChunkStore put cancelled while its writes are in flight -- once, or
again while it waits them out -- gives its space back once they landed:
the store still takes as many chunks as it was sized for, and those read
back byte-exact.  (Reads cancelled at any moment: tests/device/test_cancel_harness.py.)"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from support import chunk_bytes

import fx100io

MiB = 1 << 20
CHUNK = 32 * MiB


@pytest.mark.parametrize("cancels", [1, 2, 4])
async def test_a_cancelled_put_gives_its_space_back(tmp_path, cancels) -> None:
    st = fx100io.ChunkStore([str(tmp_path / "st.img")], create=True, size=CHUNK * 3 + 32 * MiB,
                            max_io=128 << 10, queue_depth=4)
    try:
        free = st._members[0].alloc.free_bytes
        junk = np.ones(CHUNK, np.uint8)
        for i in range(3):
            t = asyncio.ensure_future(st.batch_put([f"cancelled{i}"], [junk]))
            for _ in range(3):
                await asyncio.sleep(0)
            for _ in range(cancels):
                t.cancel()
                await asyncio.sleep(0)
            with pytest.raises(asyncio.CancelledError):
                await t
            assert not st.contains(f"cancelled{i}")
        assert st._members[0].alloc.free_bytes == free
        want = {f"k{i}": chunk_bytes(f"k{i}", CHUNK) for i in range(3)}
        await st.batch_put(list(want), list(want.values()))
        for k, v in want.items():
            buf = np.zeros(CHUNK, np.uint8)
            assert await st.batch_get([k], [buf]) == [True]
            assert np.array_equal(buf, v), k
    finally:
        await st.aclose()

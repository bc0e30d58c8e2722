"""Device calls carry a priority class (fx100io.Priority) to the queue:
every call takes priority=, the queue counts pieces per class, a queued
load read goes before queued writes on a real file, and bad values are
refused before any I/O.  The scheduler's rules themselves are checked in C
(tests/c/test_reqs_prio.c) and through the stores
(tests/store/test_store_priority.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import fx100io
from fx100io import errors
from fx100io.pool import aligned_array

KiB, MiB = 1 << 10, 1 << 20


def test_each_call_counts_in_its_class(tmp_path):
    with fx100io.open_device(str(tmp_path / "d.img"), create=True, size=16 * MiB,
                             max_io=64 * KiB) as dev:
        buf = aligned_array(256 * KiB)
        buf[:] = 7
        dev.write_from_blocking(0, buf)  # a store: 4 pieces
        dev.write_from_blocking(MiB, buf, priority="background")
        dev.read_into_blocking(0, buf)  # a load
        dev.read_into_blocking(0, buf, priority=fx100io.Priority.STORE)
        dev.submit_blocking([(fx100io.OP_READ, 0, buf)], priority="background")
        dev.flush_blocking(priority="background")
        s = dev.queue_stats()
        assert (s["pieces_load"], s["pieces_store"], s["pieces_background"]) == (4, 8, 9)
        assert np.all(buf == 7)


async def test_a_load_goes_before_queued_writes(tmp_path):
    """Depth 1: 32 write pieces are queued when a read of one piece comes;
    the read finishes while most writes are still queued (counted by the
    queue's bytes, not by time)."""
    dev = fx100io.open_device(str(tmp_path / "d.img"), create=True, size=16 * MiB,
                              max_io=64 * KiB, queue_depth=1)
    try:
        src = aligned_array(2 * MiB)
        src[:] = 3
        dev.write_from_blocking(8 * MiB, src[:64 * KiB])
        drv = dev._driver(True)
        before = drv.queue.stats()["bytes"]
        writes = dev.start([(fx100io.OP_WRITE, 0, src)])
        await asyncio.sleep(0)  # the writes reach C, one piece in flight
        dst = aligned_array(64 * KiB)
        assert await asyncio.wait_for(dev.read_into(8 * MiB, dst), 30) == 64 * KiB
        moved = drv.queue.stats()["bytes"] - before
        # the read, the write piece it found in flight, and maybe one more
        assert moved <= 64 * KiB + 3 * 64 * KiB, moved
        assert (await asyncio.wait_for(writes[0], 30))[0] == 2 * MiB
        assert np.all(dst == 3)
    finally:
        dev.close()


def test_bad_priorities_and_options_are_refused(tmp_path):
    with fx100io.open_device(str(tmp_path / "d.img"), create=True, size=MiB) as dev:
        buf = aligned_array(4 * KiB)
        for bad in ("now", 3, -1, True, 0.5):
            with pytest.raises(errors.InvalidArgumentError):
                dev.read_into_blocking(0, buf, priority=bad)
        with pytest.raises(errors.InvalidArgumentError):
            dev.submit_blocking([(fx100io.OP_READ | 1 << 16, 0, buf)])  # no class in op
        assert dev.queue_stats()["ios"] == 0
    for bad in (0, -2, "4"):
        with pytest.raises(errors.InvalidArgumentError):
            fx100io.open_device(str(tmp_path / "e.img"), create=True, size=MiB, write_depth=bad)

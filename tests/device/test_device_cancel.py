"""Device's cancel path over NVMe/TCP, beyond the harness's bytes
(tests/device/test_cancel_harness.py): a cancelled read whose event loop is closed
before its request came back does not cost the next loop on the thread its
completions, and a queue handed out by raw_queue() stays the caller's."""

from __future__ import annotations

import asyncio
import time

import pytest
from support.target_process import serve

import fx100io

NQN = "nqn.2026-12.io.fx100:devcancel"


@pytest.fixture
def slow_target(tmp_path):
    img = tmp_path / "t.img"
    with open(img, "wb") as f:
        f.truncate(16 << 20)
    with serve([str(img)], NQN, "--fault-delay-ms", "300") as (host, port, _proc):
        yield f"nvme+tcp://{host}:{port}/{NQN}?queues=1"


def test_a_cancelled_read_on_a_closed_loop_loses_no_later_completion(slow_target) -> None:
    dev = fx100io.open_device(slow_target)
    try:
        loop1 = asyncio.new_event_loop()

        async def cancel_one() -> asyncio.Task:
            t = asyncio.create_task(dev.read_into(0, bytearray(4096)))
            # this loop's queue is made off the loop first (a connect)
            deadline = time.monotonic() + 10
            while dev._loop_ready() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # handed to C
            t.cancel()
            await asyncio.sleep(0)  # now waiting for its request to come back
            return t
        t = loop1.run_until_complete(cancel_one())
        assert not t.done()
        loop1.close()  # closed with that read still waiting

        async def four_reads() -> list:
            ts = [asyncio.create_task(dev.read_into(4096 * (i + 1), bytearray(4096)))
                  for i in range(4)]
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            time.sleep(1.0)  # every completion, the withdrawn one's too, is reaped at once
            return await asyncio.wait_for(asyncio.gather(*ts), 10)
        assert asyncio.run(four_reads()) == [4096] * 4
    finally:
        dev.close()


def test_an_async_call_keeps_the_queue_raw_queue_handed_out(slow_target) -> None:
    dev = fx100io.open_device(slow_target)
    try:
        raw = dev.raw_queue()

        async def one_read() -> int:
            return await dev.read_into(0, bytearray(4096))
        assert asyncio.run(one_read()) == 4096
        assert dev.raw_queue() is raw
    finally:
        dev.close()

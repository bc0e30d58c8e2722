"""NVMe/TCP with queues >= 2 splits a queue's connections by class (the
first carries load reads while one waits, the others stores): a preference,
never a reason to wait or fail.  With one connection of two cut (through a
loopback proxy that then refuses its reconnects), loads and stores go on over
the live one: a store is not failed with ETIMEDOUT behind a dead store
connection, and a load is not failed because the load connection is down
while the other is merely busy with writes."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from support.cut_proxy import cut_proxy
from support.target_process import serve

import fx100io

NQN = "nqn.2026-12.io.fx100:split"
RS = 1 << 20            # one load
NL = 24                 # loaders: enough that load reads are queued behind conn 0
WS = 4 << 20            # one store
MAX_IO = 128 << 10      # pieces, so a request makes several commands


@pytest.fixture
def image(tmp_path):
    p = tmp_path / "ns.img"
    with open(p, "wb") as f:
        f.truncate(64 << 20)
    return str(p)


def _pattern(i: int, n: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.uint32) * 2654435761 + i) >> 11).astype(np.uint8)


async def _run(dev, pool, proxy, cut_index: int, writers: int, write_rounds: int):
    """Fill the load region, cut a connection, then stream loads while
    writers store; returns (load failures, store failures)."""
    loads = []
    for i in range(4):
        b = pool.alloc(RS)
        b[:] = _pattern(i, RS)
        assert await asyncio.wait_for(dev.write_from(i * RS, b), 20) == RS
        loads.append(bytes(b))
    # the loop thread's queue has made its two I/O connections by now; the
    # last two the proxy accepted are its connections 0 and 1, in order
    proxy.cut(cut_index)
    await asyncio.sleep(0.3)
    stop = asyncio.Event()
    load_fail: list[str] = []
    store_fail: list[str] = []
    wrong: list[int] = []

    async def loader(i: int) -> None:
        bb = pool.alloc(RS)
        while not stop.is_set():
            try:
                await asyncio.wait_for(dev.read_into((i % 4) * RS, bb), 30)
            except Exception as e:  # noqa: BLE001 (counted and asserted below)
                load_fail.append(type(e).__name__)
                await asyncio.sleep(0.05)
                continue
            if bytes(bb) != loads[i % 4]:
                wrong.append(i)

    async def writer(w: int) -> None:
        # back to back writes (checked once at the end), so the store
        # connection always has one in flight
        src = pool.alloc(WS)
        off = (16 << 20) + w * WS
        for r in range(write_rounds):
            src[:] = _pattern(100 + w * 1000 + r, WS)
            try:
                assert await asyncio.wait_for(dev.write_from(off, src), 30) == WS
            except Exception as e:  # noqa: BLE001 (counted and asserted below)
                store_fail.append(f"{type(e).__name__}: {e}")
                return  # one failure says it; more would only take longer
        dst = pool.alloc(WS)
        assert await asyncio.wait_for(dev.read_into(off, dst), 30) == WS
        assert bytes(dst) == bytes(src)

    tasks = [asyncio.create_task(loader(i)) for i in range(NL)]
    await asyncio.sleep(0.2)
    await asyncio.wait_for(asyncio.gather(*(writer(w) for w in range(writers))), 120)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert not wrong
    return load_fail, store_fail


@pytest.mark.parametrize("cut_index", [-1, -2], ids=["store-conn-cut", "load-conn-cut"])
def test_one_connection_cut_leaves_loads_and_stores_on_the_other(image, cut_index):
    with serve([image], NQN) as (host, port, _p), cut_proxy(port) as proxy:
        # io_timeout_ms bounds a store waiting for the dead connection (it
        # failed with ETIMEDOUT); max_reconnects=2 with a short back-off makes
        # the load connection's outage final soon (a load then failed at once)
        uri = (f"nvme+tcp://127.0.0.1:{proxy.port}/{NQN}?queues=2&io_timeout_ms=3000"
               f"&reconnect_ms=50&max_reconnects=2")
        dev = fx100io.open_device(uri, max_io=MAX_IO)
        try:
            pool = fx100io.BufferPool((NL + 16) * RS + 8 * WS)

            async def main():
                lf, sf = await asyncio.wait_for(
                    _run(dev, pool, proxy, cut_index, writers=4, write_rounds=24), 150)
                return lf, sf, dev.queue_stats()

            load_fail, store_fail, stats = asyncio.run(main())
        finally:
            dev.close()
    assert store_fail == []
    assert load_fail == []
    assert stats["conn_errors"] >= 1
    # the live connection carried what the split would have sent to the cut one
    assert stats["conn_fallbacks"] > 0

"""An event loop never connects (docs/architecture.md rule 14; issue 27).

A loop's first request on an NVMe/TCP device, or on one path of a multipath
device, needs a queue of that thread's own: a TCP connect, ICReq and Fabrics
Connect.  It is made by a thread of its own (its ring disabled, then enabled
on the loop's thread: FX_QUEUE_DEFER_ENABLE) while the loop goes on.  Here
the connect hangs for real: the target process is SIGSTOPped after the
device opened, so the kernel still accepts the TCP connection but nobody
answers ICReq.  A ticker on the loop shows the loop kept running; requests
waiting for the queue are cancelled, and the device works once the target
runs again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import time

import pytest
from support import chunk_bytes
from support.target_process import serve

import fx100io
from fx100io.multipath import LIVE, MultipathDevice

NQN = "nqn.2026-12.io.fx100:loop-connect"
BS = 4096
SIZE = 4 << 20
CONNECT_MS = 3000  # how long the hung connect lasts before it fails
TICK_S = 0.01
MAX_GAP_S = 0.5  # the loop blocked in a connect would show CONNECT_MS here


@pytest.fixture
def backing(tmp_path):
    p = tmp_path / "ns.img"
    with open(p, "wb") as f:
        f.write(chunk_bytes("loop-connect", SIZE).tobytes())
    return str(p)


@contextlib.contextmanager
def stopped(proc):  # noqa: ANN001
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGCONT)


class Ticker:
    """Counts the loop's turns; gap is the longest time between two."""

    def __init__(self) -> None:
        self.gap = 0.0
        self.task: asyncio.Task | None = None

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            self.gap = max(self.gap, now - last)
            last = now

    def __enter__(self) -> Ticker:
        self.task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()


def expected(off: int, n: int) -> bytes:
    return chunk_bytes("loop-connect", SIZE)[off:off + n].tobytes()


def uri(*ports: int) -> str:
    hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
    return (f"nvme+tcp://{hosts}/{NQN}?connect_timeout_ms={CONNECT_MS}&io_timeout_ms=20000"
            "&kato_ms=20000&reconnect_ms=100")


def test_device_queue_is_made_off_the_loop(backing):
    with serve([backing], NQN) as (_, port, proc):
        dev = fx100io.open_device(uri(port))  # its queue here is this thread's C-wait one
        try:
            async def main() -> None:
                buf = bytearray(BS)
                with Ticker() as t:
                    with stopped(proc):
                        read = asyncio.ensure_future(dev.read_into(0, buf))
                        await asyncio.sleep(0.5)
                        assert not read.done(), "the read had no queue to run on yet"
                        read.cancel()  # cancelled while it waits for its queue
                        with pytest.raises(asyncio.CancelledError):
                            await asyncio.wait_for(read, 5)
                        # a second waiter, and start()'s futures, wait for the same queue
                        second = asyncio.ensure_future(dev.read_into(BS, buf))
                        (started,) = dev.start([(fx100io.device.OP_READ, 2 * BS,
                                                 bytearray(BS))])
                        await asyncio.sleep(0.2)
                        assert not second.done() and not started.done()
                        assert t.gap < MAX_GAP_S, f"the loop stood still {t.gap:.2f} s"
                    # the target runs again: the queue is made (or made again,
                    # if the first connect ran out) and both requests complete
                    assert await asyncio.wait_for(second, 3 * CONNECT_MS / 1000) == BS
                    assert bytes(buf) == expected(BS, BS)
                    res = await asyncio.wait_for(started, 3 * CONNECT_MS / 1000)
                    assert res[0] == BS and res[1] == 0
                    out = bytearray(BS)
                    assert await asyncio.wait_for(dev.read_into(0, out), 10) == BS
                    assert bytes(out) == expected(0, BS)
                    assert t.gap < MAX_GAP_S, f"the loop stood still {t.gap:.2f} s"

            asyncio.run(main())
        finally:
            dev.close()


def test_a_loop_closed_while_its_queue_is_made_leaves_the_next_loop_working(backing):
    """asyncio.run twice on one thread: the first loop ends while its
    queue's connect hangs; the second loop's requests make their own."""
    with serve([backing], NQN) as (_, port, proc):
        dev = fx100io.open_device(uri(port))
        try:
            async def first() -> None:
                read = asyncio.ensure_future(dev.read_into(0, bytearray(BS)))
                await asyncio.sleep(0.3)
                assert not read.done()
                read.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await read

            with stopped(proc):
                asyncio.run(first())

            async def second() -> bytes:
                buf = bytearray(BS)
                assert await asyncio.wait_for(dev.read_into(0, buf), 3 * CONNECT_MS / 1000) == BS
                return bytes(buf)

            assert asyncio.run(second()) == expected(0, BS)
        finally:
            dev.close()


def test_device_closed_while_its_queue_is_made(backing):
    """close() from the loop while the queue's connect hangs: the waiting
    request fails with DeviceClosedError, and the C device is freed only
    once the making thread is out of it (no use after free)."""
    with serve([backing], NQN) as (_, port, proc):
        dev = fx100io.open_device(uri(port))
        try:
            async def main() -> None:
                with Ticker() as t, stopped(proc):
                    read = asyncio.ensure_future(dev.read_into(0, bytearray(BS)))
                    await asyncio.sleep(0.3)
                    assert not read.done()
                    dev.close()
                    with pytest.raises(fx100io.errors.DeviceClosedError):
                        await asyncio.wait_for(read, 3 * CONNECT_MS / 1000)
                with pytest.raises(fx100io.errors.DeviceClosedError):
                    await dev.read_into(0, bytearray(BS))
                assert t.gap < MAX_GAP_S + 2.5  # close() itself waits for a stopped target

            asyncio.run(main())
        finally:
            dev.close()


def test_multipath_loop_never_waits_for_a_path_connect(backing):
    with serve([backing], NQN) as (_, pa, _proc_a), serve([backing], NQN) as (_, pb, proc_b):
        dev = fx100io.open_device(uri(pa, pb))
        assert isinstance(dev, MultipathDevice)
        try:
            async def main() -> None:
                with Ticker() as t:
                    with stopped(proc_b):
                        # requests that would go to b: its queue is being made
                        # (hung); they run on a, whose queue is ready, instead
                        bufs = [bytearray(BS) for _ in range(16)]
                        t0 = time.monotonic()
                        got = await asyncio.wait_for(asyncio.gather(
                            *(dev.read_into(k * BS, b) for k, b in enumerate(bufs))), 10)
                        assert got == [BS] * 16
                        for k, b in enumerate(bufs):
                            assert bytes(b) == expected(k * BS, BS)
                        assert time.monotonic() - t0 < CONNECT_MS / 1000, \
                            "requests waited for the hung path's connect"
                        # a waiter for b's queue itself, cancelled
                        pb_path = dev._paths[1]
                        assert pb_path.dev is not None
                        wait = asyncio.ensure_future(dev._loop_driver(pb_path, pb_path.dev))
                        await asyncio.sleep(0.2)
                        assert not wait.done()
                        wait.cancel()
                        with pytest.raises(asyncio.CancelledError):
                            await asyncio.wait_for(wait, 5)
                        assert t.gap < MAX_GAP_S, f"the loop stood still {t.gap:.2f} s"
                    # b runs again: it carries requests again, bytes right
                    deadline = time.monotonic() + 20
                    while True:
                        buf = bytearray(BS)
                        assert await asyncio.wait_for(dev.read_into(BS, buf), 10) == BS
                        assert bytes(buf) == expected(BS, BS)
                        st = dev.path_stats()
                        if st[1]["state"] == LIVE and st[1]["commands"] > 0:
                            break
                        assert time.monotonic() < deadline, f"path b never came back: {st}"
                        await asyncio.sleep(0.05)
                    assert all(s["inflight"] == 0 for s in dev.path_stats())
                    assert t.gap < MAX_GAP_S, f"the loop stood still {t.gap:.2f} s"

            asyncio.run(main())
        finally:
            dev.close()


def test_a_queue_made_on_one_thread_runs_on_another_and_keeps_its_device(tmp_path):
    """The C side of it on a file: a queue made with defer_enable on a thread
    runs requests on the thread that enables it (its ring's single issuer),
    not before; and closing the device while the queue lives frees the C
    device only once the queue is gone (it was never any Device's)."""
    import threading

    import numpy as np

    from fx100io import _core

    img = tmp_path / "f.img"
    img.write_bytes(expected(0, 64 << 10))
    dev = fx100io.open_device(str(img), direct=False)
    made: list = []
    t = threading.Thread(target=lambda: made.append(_core.Queue(dev._dev, 8, 1 << 20, 64, True,
                                                                defer_enable=True)))
    t.start()
    t.join(10)
    (q,) = made
    buf = np.zeros(BS, dtype=np.uint8)
    addr = _core.buffer_address(buf, True)[0]
    with pytest.raises(OSError) as e:  # not enabled yet: refused, not held forever
        q.submit([(_core.OP_READ, addr, BS, BS, 6)])
    assert e.value.errno == errno.EBADFD
    q.enable()
    assert q.submit([(_core.OP_READ, addr, BS, BS, 7)]) == 1
    q.wait(1, 5000)
    assert [(tag, res) for tag, res, *_ in q.reap()] == [(7, BS)]
    assert buf.tobytes() == expected(BS, BS)
    q.enable()  # again: nothing to do
    dev.close()
    assert dev._dev.size == 64 << 10  # still open: the queue holds it
    q.close()
    with pytest.raises(fx100io.errors.DeviceClosedError):
        dev._dev.size  # noqa: B018 - freed with its last queue


"""A lost NVMe/TCP connection never freezes the event loop (docs/architecture.md rule 14).

A 10 ms ticker coroutine runs on the loop while reads go through a target
frozen with SIGSTOP (its socket still accepts TCP, so a connect attempt waits
for ICResp until connect_timeout_ms) and a target killed and restarted on the
same port.  The loop must never stall for more than 50 ms: the reconnect runs
on the queue's connector thread without the GIL.  The tests also hold the
policy for requests while disconnected (URI options reconnect_ms,
max_reconnects, io_timeout_ms) and check the bytes read after recovery.

The stall measure is robust on a loaded machine: each gap between ticks, less
the 10 ms asked for, less the time the loop thread waited for a CPU
(run_delay of /proc/thread-self/schedstat), is what the loop was *blocked*.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from support import chunk_bytes
from support.target_process import serve, wait_port_free

import fx100io
from fx100io import errors

NQN = "nqn.2026-11.io.fx100:reconnect"
STALL_LIMIT_S = 0.050
PERIOD_S = 0.010
BS = 64 << 10


@pytest.fixture
def backing(tmp_path):
    p = tmp_path / "ns1.img"
    data = chunk_bytes("reconnect", 4 * BS)
    with open(p, "wb") as f:
        f.write(data.tobytes())
        f.truncate(16 << 20)
    return str(p), data


def dev_uri(host: str, port: int, **q: object) -> str:
    query = "&".join(f"{k}={v}" for k, v in q.items())
    return f"nvme+tcp://{host}:{port}/{NQN}" + (f"?{query}" if query else "")


def freeze(proc) -> None:
    """SIGSTOP the target and wait until every thread of it has stopped (a
    thread running at the kill may still answer a request otherwise)."""
    os.kill(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while True:
        states = []
        for t in os.listdir(f"/proc/{proc.pid}/task"):
            with contextlib.suppress(OSError):
                with open(f"/proc/{proc.pid}/task/{t}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        if states and all(s in "tT" for s in states):
            return
        assert time.monotonic() < deadline, states
        time.sleep(0.002)


def _run_delay_s() -> float | None:
    """Seconds this thread has waited on a run queue (None: not available)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class Ticker:
    """Ticks every 10 ms on the running loop; keeps the worst blocked time
    per phase (gap beyond the period, less run-queue wait)."""

    def __init__(self) -> None:
        self.worst: dict[str, float] = {}
        self.raw: dict[str, float] = {}
        self.ticks = 0
        self._phase = "start"
        self._task: asyncio.Task | None = None
        self._last = self._last_rd = 0.0
        self._gap_phase = self._phase

    def phase(self, name: str) -> None:
        self._phase = name

    def _observe(self) -> None:
        now, rd = time.monotonic(), _run_delay_s()
        late = now - self._last - PERIOD_S
        waited = rd - self._last_rd if rd is not None and self._last_rd is not None else 0.0
        p = self._gap_phase if self._gap_phase == self._phase else \
            f"{self._gap_phase} -> {self._phase}"
        self.raw[p] = max(self.raw.get(p, 0.0), late)
        self.worst[p] = max(self.worst.get(p, 0.0), late - waited)
        self._last, self._last_rd, self._gap_phase = now, rd, self._phase

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(PERIOD_S)
            self._observe()
            self.ticks += 1

    def start(self) -> None:
        self._last, self._last_rd, self._gap_phase = time.monotonic(), _run_delay_s(), self._phase
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        assert self._task is not None
        self._observe()  # a gap still open now counts too
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def check(self) -> None:
        assert self.ticks > 20
        stalls = {p: round(w * 1000, 1) for p, w in self.worst.items() if w > STALL_LIMIT_S}
        assert not stalls, (f"event loop blocked (ms, by phase): {stalls}; raw gaps (ms): "
                            f"{ {p: round(w * 1000, 1) for p, w in self.raw.items()} }")


async def _reads_time_out(dev, n: int = 3) -> float:
    """n reads in a row each fail with FxTimeoutError after about
    io_timeout_ms (1 s here); returns when the last one started."""
    for _ in range(n):
        t0 = time.monotonic()
        with pytest.raises(errors.FxTimeoutError):
            await _read(dev)
        took = time.monotonic() - t0
        assert 0.8 < took < 2.5, took
    return t0


async def _read(dev, off: int = 0) -> np.ndarray:
    out = np.zeros(BS, np.uint8)
    assert await dev.read_into(off, out) == BS
    return out


async def _read_until_ok(dev, data, off: int, seconds: float) -> float:
    """Read until the device is back (requests may fail while it is not);
    the bytes must be right.  Returns how long it took."""
    t0 = time.monotonic()
    while True:
        try:
            out = await _read(dev, off)
        except (errors.FxConnectionError, errors.FxTimeoutError):
            if time.monotonic() - t0 > seconds:
                raise
            await asyncio.sleep(0.05)
            continue
        assert np.array_equal(out, data[off:off + BS])
        return time.monotonic() - t0


def test_frozen_target_does_not_stall_the_loop(backing):
    """io_timeout_ms=1000, connect_timeout_ms=3000: reads fail with a
    timeout after about io_timeout_ms while the reconnect waits for ICResp in
    the background; once the target runs again, reads return its bytes."""
    path, data = backing
    with serve([path], NQN) as (host, port, proc):
        dev = fx100io.open_device(dev_uri(host, port, io_timeout_ms=1000,
                                          connect_timeout_ms=3000, kato_ms=60000))

        async def main() -> None:
            tk = Ticker()
            tk.start()
            try:
                tk.phase("healthy")
                assert np.array_equal(await _read(dev, BS), data[BS:2 * BS])
                freeze(proc)
                tk.phase("in-flight read times out")
                t0 = time.monotonic()
                with pytest.raises(errors.FxTimeoutError):
                    await _read(dev)
                assert time.monotonic() - t0 < 2.5
                tk.phase("reads while reconnecting")
                # the connect attempt waits 3 s for ICResp; a request
                # waits io_timeout_ms at most, then fails
                t0 = await _reads_time_out(dev)
                tk.phase("concurrent reads while reconnecting")
                res = await asyncio.gather(*(_read(dev, i * BS) for i in range(4)),
                                           return_exceptions=True)
                assert all(isinstance(r, errors.FxTimeoutError) for r in res), res
                os.kill(proc.pid, signal.SIGCONT)
                tk.phase("recovery")
                await _read_until_ok(dev, data, 2 * BS, 20)
                tk.phase("after recovery")
                for i in range(4):
                    assert np.array_equal(await _read(dev, i * BS), data[i * BS:(i + 1) * BS])
                assert dev.queue_stats()["reconnects"] >= 1
            finally:
                os.kill(proc.pid, signal.SIGCONT)
                await tk.stop()
                tk.check()

        try:
            asyncio.run(main())
        finally:
            dev.close()


@contextlib.contextmanager
def black_hole(port: int) -> Iterator[None]:
    """Hold the port with a listener whose accept queue is full: SYNs go
    unanswered and a connect waits its timeout out, as with a target host
    that is down or rebooting."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(0)
    filler = socket.create_connection(("127.0.0.1", port))  # fills the queue
    try:
        with socket.socket() as probe:
            probe.settimeout(0.3)
            with pytest.raises(OSError):
                probe.connect(("127.0.0.1", port))
        yield
    finally:
        filler.close()
        ls.close()


def test_killed_and_restarted_target_does_not_stall_the_loop(backing):
    """The target is killed (refused connects: requests fail with a
    connection error after max_reconnects attempts), its host then stops
    answering SYNs (each attempt waits connect_timeout_ms: requests fail with
    a timeout after io_timeout_ms), then it is restarted on the same port (a
    new controller: full re-open in the background) and serves the same
    bytes.  The loop never stalls."""
    path, data = backing
    cm = serve([path], NQN)
    host, port, proc = cm.__enter__()
    dev = fx100io.open_device(dev_uri(host, port, io_timeout_ms=1000, connect_timeout_ms=3000,
                                      reconnect_ms=100, max_reconnects=3))

    async def main() -> None:
        nonlocal cm
        tk = Ticker()
        tk.start()
        try:
            tk.phase("healthy")
            assert np.array_equal(await _read(dev), data[:BS])
            tk.phase("kill")
            await asyncio.to_thread(lambda: (proc.kill(), proc.wait()))
            with pytest.raises((errors.FxConnectionError, errors.FxTimeoutError)):
                await _read(dev)
            tk.phase("reads while refused")
            for _ in range(3):
                t0 = time.monotonic()
                with pytest.raises(errors.FxConnectionError) as ei:
                    await _read(dev)
                assert ei.value.errno == errno.ECONNREFUSED
                assert time.monotonic() - t0 < 2.0
            await asyncio.to_thread(cm.__exit__, None, None, None)
            await asyncio.to_thread(wait_port_free, port)
            tk.phase("reads while SYNs go unanswered")
            hole = black_hole(port)
            await asyncio.to_thread(hole.__enter__)  # its probe blocks
            try:
                await _reads_time_out(dev)
            finally:
                hole.__exit__(None, None, None)
            tk.phase("restart")
            await asyncio.to_thread(wait_port_free, port)
            cm = serve([path], NQN, port=port)
            await asyncio.to_thread(cm.__enter__)
            tk.phase("recovery")
            await _read_until_ok(dev, data, BS, 20)
            tk.phase("after recovery")
            for i in range(4):
                assert np.array_equal(await _read(dev, i * BS), data[i * BS:(i + 1) * BS])
            assert dev.queue_stats()["reconnects"] >= 1
        finally:
            await tk.stop()
            tk.check()

    try:
        asyncio.run(main())
    finally:
        dev.close()
        cm.__exit__(None, None, None)


def test_max_reconnects_zero_fails_at_once_and_still_recovers(backing):
    path, data = backing
    cm = serve([path], NQN)
    host, port, proc = cm.__enter__()
    try:
        with fx100io.open_device(dev_uri(host, port, io_timeout_ms=3000,
                                         max_reconnects=0)) as dev:
            out = np.zeros(BS, np.uint8)
            dev.read_into_blocking(0, out)
            proc.kill()
            proc.wait()
            with pytest.raises((errors.FxConnectionError, errors.FxTimeoutError)):
                dev.read_into_blocking(0, out)
            for _ in range(3):
                t0 = time.monotonic()
                with pytest.raises(errors.FxConnectionError):
                    dev.read_into_blocking(0, out)
                assert time.monotonic() - t0 < 0.5  # no waiting for an attempt
            cm.__exit__(None, None, None)
            wait_port_free(port)
            cm = serve([path], NQN, port=port)
            cm.__enter__()
            deadline = time.monotonic() + 20
            while True:
                try:
                    dev.read_into_blocking(BS, out)
                    break
                except errors.FxConnectionError:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            assert np.array_equal(out, data[BS:2 * BS])
    finally:
        cm.__exit__(None, None, None)


def test_reconnect_ms_spaces_the_attempts(backing):
    """A request waits through max_reconnects refused attempts spaced
    reconnect_ms apart, then fails with the connect error."""
    path, _ = backing
    with serve([path], NQN) as (host, port, proc):
        with fx100io.open_device(dev_uri(host, port, io_timeout_ms=10000, reconnect_ms=400,
                                         max_reconnects=3)) as dev:
            out = np.zeros(BS, np.uint8)
            dev.read_into_blocking(0, out)
            proc.kill()
            proc.wait()
            with pytest.raises((errors.FxConnectionError, errors.FxTimeoutError)):
                dev.read_into_blocking(0, out)
            time.sleep(0.5)  # past any back-off the failure above set
            t0 = time.monotonic()
            with pytest.raises(errors.FxConnectionError) as ei:
                dev.read_into_blocking(0, out)
            took = time.monotonic() - t0
            assert ei.value.errno == errno.ECONNREFUSED
            # attempts at 0, 0.4 and 0.8 s: not before the second back-off
            assert 0.7 < took < 4.0, took


def test_io_timeout_bounds_the_wait_for_a_connection(backing):
    """A frozen target with a long connect timeout: a request waiting for the
    reconnect fails with TimeoutError after io_timeout_ms, not after the
    connect timeout, and the blocking twin waits without holding the GIL."""
    path, data = backing
    with serve([path], NQN) as (host, port, proc):
        with fx100io.open_device(dev_uri(host, port, io_timeout_ms=600,
                                         connect_timeout_ms=10000, kato_ms=60000)) as dev:
            out = np.zeros(BS, np.uint8)
            dev.read_into_blocking(0, out)
            freeze(proc)
            try:
                with pytest.raises(errors.FxTimeoutError):
                    dev.read_into_blocking(0, out)
                ticks = [0]
                stop = threading.Event()

                def count() -> None:
                    while not stop.wait(0.005):
                        ticks[0] += 1

                th = threading.Thread(target=count)
                th.start()
                t0 = time.monotonic()
                try:
                    with pytest.raises(errors.FxTimeoutError):
                        dev.read_into_blocking(0, out)
                    took = time.monotonic() - t0
                finally:
                    stop.set()
                    th.join()
                assert 0.45 < took < 3.0, took
                assert ticks[0] > 20  # another Python thread ran meanwhile
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            deadline = time.monotonic() + 20
            while True:
                try:
                    dev.read_into_blocking(0, out)
                    break
                except (errors.FxConnectionError, errors.FxTimeoutError):
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            assert np.array_equal(out, data[:BS])


def test_close_while_reconnecting_to_a_frozen_target_is_prompt(backing):
    """connect_timeout_ms=10000 and a reconnect in progress: closing the
    device cancels the attempt instead of waiting for it."""
    path, _ = backing
    with serve([path], NQN) as (host, port, proc):
        dev = fx100io.open_device(dev_uri(host, port, io_timeout_ms=500,
                                          connect_timeout_ms=10000, kato_ms=60000))
        try:
            async def main() -> None:
                tk = Ticker()
                tk.start()
                try:
                    await _read(dev)
                    freeze(proc)
                    tk.phase("timeout")
                    with pytest.raises(errors.FxTimeoutError):
                        await _read(dev)
                    tk.phase("waiting for the reconnect")
                    with pytest.raises(errors.FxTimeoutError):
                        await _read(dev)  # its connect attempt goes on
                finally:
                    await tk.stop()
                    tk.check()

            asyncio.run(main())
            t0 = time.monotonic()
            dev.close()
            # the controller's own shutdown waits up to 2 s for a frozen
            # target; the 10 s connect attempt must not add to that
            assert time.monotonic() - t0 < 4.0
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            dev.close()


def test_close_fails_requests_waiting_for_a_reconnect(backing):
    """Requests that wait for a connection when the device is closed (here
    io_timeout_ms is long and the target frozen) fail with
    DeviceClosedError instead of leaving their callers awaiting forever."""
    path, _ = backing
    with serve([path], NQN) as (host, port, proc):
        dev = fx100io.open_device(dev_uri(host, port, io_timeout_ms=800,
                                          connect_timeout_ms=10000, kato_ms=60000))
        try:
            async def main() -> None:
                await _read(dev)
                freeze(proc)
                with pytest.raises(errors.FxTimeoutError):
                    await _read(dev)
                # io_timeout_ms bounds only a wait that starts now: make the
                # waiting requests outlive it by closing before it ends
                tasks = [asyncio.ensure_future(_read(dev, i * BS)) for i in range(3)]
                await asyncio.sleep(0.3)
                assert not any(t.done() for t in tasks)
                dev.close()  # on the loop's thread, as `async with` does
                res = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
                assert all(isinstance(r, errors.DeviceClosedError) for r in res), res

            asyncio.run(main())
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            dev.close()


def test_uri_options_are_checked():
    from fx100io import fabric_uri
    opts = fabric_uri.parse("nvme+tcp://127.0.0.1:4420/nqn.x?reconnect_ms=50&max_reconnects=0")
    assert opts["reconnect_ms"] == "50" and opts["max_reconnects"] == "0"
    for bad in ("reconnect_ms=-1", "max_reconnects=x", "reconnect_ms="):
        with pytest.raises(errors.InvalidArgumentError):
            fabric_uri.parse(f"nvme+tcp://127.0.0.1:4420/nqn.x?{bad}")


CLOSE_UNDER_A_BLOCKED_READER = r"""
import os, signal, sys, threading, time
import numpy as np
sys.path[:0] = ["tests", "tests/fabric"]
from support.target_process import serve
from test_reconnect import NQN, dev_uri, freeze
import fx100io
from fx100io import errors
img, io_timeout_ms = sys.argv[1], int(sys.argv[2])
with serve([img], NQN) as (host, port, proc):
    dev = fx100io.open_device(dev_uri(host, port, io_timeout_ms=io_timeout_ms,
                                      connect_timeout_ms=10000, kato_ms=60000))
    res = {}
    def reader():
        out = np.zeros(65536, np.uint8)
        dev.read_into_blocking(0, out)
        freeze(proc)
        for attempt in ("first", "second"):
            try:
                dev.read_into_blocking(0, out)
                res[attempt] = "ok"
            except Exception as e:
                res[attempt] = type(e).__name__
    th = threading.Thread(target=reader, daemon=True)
    th.start()
    time.sleep(1.0)
    assert th.is_alive()
    t0 = time.monotonic()
    dev.close()
    took = time.monotonic() - t0
    th.join(10)
    os.kill(proc.pid, signal.SIGCONT)
    assert not th.is_alive(), "the reader still waits after close"
    assert took < 5, took
    assert res["second"] == "DeviceClosedError", res
    assert res["first"] in ("DeviceClosedError", "FxTimeoutError"), res
print("ok", res)
"""


@pytest.mark.parametrize("io_timeout_ms", [20000, 500], ids=["in-flight", "waiting-reconnect"])
def test_close_from_another_thread_under_a_blocked_reader(tmp_path, io_timeout_ms):
    """Device.close() from one thread while another waits in a blocking
    read (a command in flight to a frozen target, or a request waiting for
    the reconnect): the queue is not destroyed under the waiter (before:
    a segfault); the waiter gets DeviceClosedError and close returns within
    the controller's shutdown bound.  In a child, so a crash is a failure,
    not the end of the suite."""
    from support import run_python
    img = tmp_path / "ns.img"
    with open(img, "wb") as f:
        f.truncate(16 << 20)
    p = run_python(CLOSE_UNDER_A_BLOCKED_READER, str(img), str(io_timeout_ms), check=False,
                   timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("ok"), (p.returncode, p.stdout,
                                                             p.stderr[-3000:])

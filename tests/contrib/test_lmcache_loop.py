"""The LMCache plugin never stalls LMCache's event loop while its store opens or closes.

Opening may format a device or replay up to 128 MiB of index log; closing waits for
the index commits still queued (and a compaction they may start). Every coroutine of
LMCache's StorageManager runs on that loop, so a ticker coroutine on it measures the
stall: with the open and the close made slow on purpose (a second each), the ticker's
longest gap must stay far below that second. Errors still come back where they did:
a failed open raises from the constructor, and a failed close is logged.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from support.lmcache import LogCapture, make_config, make_metadata

import fx100io.contrib.lmcache as plugin_mod
from fx100io.contrib.lmcache import FX100ioBackend, PluginStartError

SLOW_S = 1.0
# far under SLOW_S, far over a scheduling hiccup of a loaded test machine
MAX_GAP_S = 0.4


class Ticker:
    """A loop in a thread of its own (as LMCache's StorageManager runs it) and a
    coroutine on it that notes the longest time between two of its wake-ups."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.max_gap = 0.0
        self._stopping = threading.Event()
        self._task = asyncio.run_coroutine_threadsafe(self._tick(), self.loop)

    async def _tick(self) -> None:
        last = time.monotonic()
        while not self._stopping.is_set():
            await asyncio.sleep(0.005)
            now = time.monotonic()
            self.max_gap = max(self.max_gap, now - last)
            last = now

    def reset(self) -> None:
        time.sleep(0.05)
        self.max_gap = 0.0

    def stop(self) -> None:
        self._stopping.set()
        self._task.result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def ticker():
    t = Ticker()
    yield t
    t.stop()


def _plugin(device: str, loop: asyncio.AbstractEventLoop) -> FX100ioBackend:
    # No LocalCPUBackend: the plugin opens its store all the same (a scheduler's view).
    return FX100ioBackend(config=make_config(device), metadata=make_metadata(), loop=loop)


def test_a_slow_open_leaves_the_loop_running(tmp_path, ticker, monkeypatch):
    real = plugin_mod.open_store

    def slow_open(*args: Any, **kwargs: Any) -> Any:
        time.sleep(SLOW_S)  # a format, or a long index replay
        return real(*args, **kwargs)

    monkeypatch.setattr(plugin_mod, "open_store", slow_open)
    ticker.reset()
    t0 = time.monotonic()
    backend = _plugin(f"file://{tmp_path}/kv.img", ticker.loop)
    try:
        assert time.monotonic() - t0 >= SLOW_S  # the constructor did wait for it
        assert ticker.max_gap < MAX_GAP_S, f"the loop stalled {ticker.max_gap:.2f}s"
        assert not backend._store.closed
    finally:
        backend.close()


def test_a_slow_close_leaves_the_loop_running(tmp_path, ticker):
    backend = _plugin(f"file://{tmp_path}/kv.img", ticker.loop)
    store = backend._store
    real = store._close_logs

    def slow_close_logs() -> None:
        time.sleep(SLOW_S)  # queued index commits, a compaction
        real()

    store._close_logs = slow_close_logs
    ticker.reset()
    t0 = time.monotonic()
    backend.close()
    assert time.monotonic() - t0 >= SLOW_S  # close returned only once the store closed
    assert store.closed
    assert ticker.max_gap < MAX_GAP_S, f"the loop stalled {ticker.max_gap:.2f}s"
    # the devices were let go: the same file opens again
    _plugin(f"file://{tmp_path}/kv.img", ticker.loop).close()


def test_a_failed_open_still_raises_from_the_constructor(tmp_path, ticker, monkeypatch):
    def broken_open(*args: Any, **kwargs: Any) -> Any:
        raise PluginStartError("the device said no")

    monkeypatch.setattr(plugin_mod, "open_store", broken_open)
    with pytest.raises(PluginStartError, match="the device said no"):
        _plugin(f"file://{tmp_path}/kv.img", ticker.loop)
    monkeypatch.undo()
    _plugin(f"file://{tmp_path}/kv.img", ticker.loop).close()  # the device lock went


def test_a_failed_close_is_logged(tmp_path, ticker):
    backend = _plugin(f"file://{tmp_path}/kv.img", ticker.loop)
    store = backend._store
    real = store._close_logs

    def failing_close_logs() -> None:
        real()
        raise OSError(5, "the index log could not be closed")

    store._close_logs = failing_close_logs
    with LogCapture() as logs:
        backend.close()
    assert "the index log could not be closed" in logs.text()


def test_a_close_that_outlasts_its_wait_keeps_the_devices_locked(tmp_path, ticker, monkeypatch):
    """A store still closing when close() gives up waiting keeps its devices
    locked (it still writes them): a second plugin on the same device is
    refused until the close has ended, and then opens."""
    backend = _plugin(f"file://{tmp_path}/kv.img", ticker.loop)
    store = backend._store
    real = store._close_logs

    def slow_close_logs() -> None:
        time.sleep(3 * SLOW_S)  # a long compaction
        real()

    store._close_logs = slow_close_logs
    monkeypatch.setattr(FX100ioBackend, "_close_wait_s", lambda self: SLOW_S / 2)
    with LogCapture() as logs:
        backend.close()
    assert "still closing" in logs.text()
    with pytest.raises(PluginStartError):
        _plugin(f"file://{tmp_path}/kv.img", ticker.loop)
    # once the close has ended in the background, the devices are let go
    deadline = time.monotonic() + 10
    while backend._device_locks and time.monotonic() < deadline:
        time.sleep(0.05)
    _plugin(f"file://{tmp_path}/kv.img", ticker.loop).close()

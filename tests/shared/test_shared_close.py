"""close() of a shared pool while other threads are inside its blocking
calls: each of them returns (StoreClosedError, or its own outcome) within
a bound, close() returns, and no loop thread outlives the store; a
blocking call after close() raises StoreClosedError and starts nothing."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.shared_redis import serve

from fx100io import errors
from fx100io.store.shared import SharedChunkStore
from fx100io.store.shared.runner import Runner

MiB = 1 << 20


@pytest.fixture
def redis_server(tmp_path: Path):
    yield from serve(tmp_path)


def loop_threads() -> int:
    return sum(t.name == "fx100io-shared" for t in threading.enumerate())


def in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    """Run fn in a thread; its outcome (value or exception) lands in the list."""
    out: list[Any] = []

    def go() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 (the test looks at it)
            out.append(e)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, out


def stall_gets(st: SharedChunkStore, entered: threading.Event, cancellable: bool) -> None:
    """Make every get of st wait inside its index call (for ever), having
    set entered; cancellable=False: it ignores cancels for 3 s first."""
    async def get_begin(*_a: Any, **_kw: Any) -> Any:
        entered.set()
        if not cancellable:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 3:
                try:
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    pass
        await asyncio.Event().wait()
    st._index.get_begin = get_begin  # type: ignore[method-assign]


def test_close_during_a_blocking_get_ends_it_with_store_closed(tmp_path, redis_server):
    base = loop_threads()
    st = SharedChunkStore([str(tmp_path / "a.img")], redis_server.url, create=True,
                          size=16 * MiB)
    st.batch_put_blocking(["k"], [np.full(8192, 7, np.uint8)])
    entered = threading.Event()
    stall_gets(st, entered, cancellable=True)
    t, out = in_thread(lambda: st.batch_get_blocking(["k"], [np.zeros(8192, np.uint8)]))
    assert entered.wait(5)
    t0 = time.monotonic()
    st.close()
    t.join(5)
    assert not t.is_alive(), "the blocking get still waits after close()"
    assert time.monotonic() - t0 < 5
    assert isinstance(out[0], errors.StoreClosedError), out
    # later calls: refused at once, no loop thread started again
    for _ in range(3):
        with pytest.raises(errors.StoreClosedError):
            st.batch_get_blocking(["k"], [np.zeros(8192, np.uint8)])
        with pytest.raises(errors.StoreClosedError):
            st.batch_put_blocking(["k"], [b"x"])
    assert loop_threads() == base


def test_close_does_not_wait_for_ever_for_a_call_that_ignores_its_cancel(
        tmp_path, redis_server, monkeypatch):
    """A call that does not end within the bound: close() stops the loop all
    the same, and the caller gets StoreClosedError, not a hang and not the
    error of scheduling on a closed loop."""
    monkeypatch.setattr(Runner, "CLOSE_WAIT_S", 0.3, raising=False)
    st = SharedChunkStore([str(tmp_path / "a.img")], redis_server.url, create=True,
                          size=16 * MiB)
    entered = threading.Event()
    stall_gets(st, entered, cancellable=False)
    t, out = in_thread(lambda: st.batch_get_blocking(["k"], [np.zeros(64, np.uint8)]))
    assert entered.wait(5)
    t0 = time.monotonic()
    st.close()
    assert time.monotonic() - t0 < 12
    t.join(5)
    assert not t.is_alive(), "the blocking get still waits after close()"
    assert isinstance(out[0], errors.StoreClosedError), out


def test_closing_a_store_no_blocking_call_used_then_calling_starts_no_loop(
        tmp_path, redis_server):
    base = loop_threads()
    st = SharedChunkStore([str(tmp_path / "a.img")], redis_server.url, create=True,
                          size=16 * MiB)
    st.close()
    for _ in range(5):
        with pytest.raises(errors.StoreClosedError):
            st.batch_get_blocking(["k"], [np.zeros(64, np.uint8)])
        with pytest.raises(errors.StoreClosedError):
            st.batch_exists_blocking(["k"])
        with pytest.raises(errors.StoreClosedError):
            st.delete_blocking("k")
    assert loop_threads() == base


def test_a_call_registered_just_before_close_never_starts() -> None:
    """close() can run between a blocking call's registration and the start
    of its task on the loop (the calling thread preempted there): the task
    is then cancelled before its first step, and the caller gets
    StoreClosedError at once, not after the call ran its course."""
    runner = Runner()
    runner.run(asyncio.sleep(0))  # the loop is up
    loop = runner._loop
    real = loop.call_soon_threadsafe
    preempted = threading.Event()

    def preempt_before_start(cb: Any, *a: Any, **k: Any) -> Any:
        if getattr(cb, "__name__", "") == "start" and not preempted.is_set():
            preempted.set()
            time.sleep(0.3)  # close() runs meanwhile
        return real(cb, *a, **k)
    loop.call_soon_threadsafe = preempt_before_start
    ran: list[str] = []

    async def long_call() -> str:
        ran.append("started")
        await asyncio.sleep(5)
        return "done"
    out: dict[str, Any] = {}

    def caller() -> None:
        try:
            out["r"] = runner.run(long_call())
        except BaseException as e:  # noqa: BLE001
            out["r"] = e
    t = threading.Thread(target=caller)
    t.start()
    preempted.wait(5)

    async def last() -> None:
        pass
    t0 = time.monotonic()
    runner.close(last)
    t.join(5)
    assert not t.is_alive()
    assert time.monotonic() - t0 < 3
    assert isinstance(out["r"], errors.StoreClosedError), out
    assert ran == []

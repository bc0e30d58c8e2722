"""The adapters' runtime plumbing: one event loop for all store I/O, bounded waits, and a
circuit breaker that turns a failing device into cache misses.  Shared by every engine
adapter under fx100io.contrib (written first for the LMCache plugin, whose story follows).

Why one loop: the ChunkStore's async API completes requests through an eventfd reader
on the loop that issued them, so every read and write goes through the loop LMCache
gives the plugin (the StorageManager's), and threads that need a result block on a
future instead of issuing I/O themselves.

Why no cancellation on timeout: a read or write that is still in the kernel keeps
using its buffer. Handing that MemoryObj back to LMCache's allocator would let the
late completion scribble over someone else's KV cache, so a timed-out request keeps
its buffers until it really finishes, and only then releases them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fx100io.errors import Fx100ioMessageError

T = TypeVar("T")

logger = logging.getLogger("fx100io.contrib")


def adapter_logger(name: str) -> logging.Logger:
    """The named logger of an engine adapter, printing INFO and up to stderr unless the
    process has configured logging itself: engines such as LMCache configure only their
    own loggers, so without this our lines (what was opened, what failed) would vanish
    inside a serving process."""
    log = logging.getLogger(name)
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(asctime)s] fx100io %(levelname)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    return log


class TimedOut(Fx100ioMessageError):
    """A store request did not finish within the plugin's timeout_s.  Not a
    TimeoutError: asyncio's timeouts are, and this must not pass for one."""

    ERRNO = errno.ETIMEDOUT


class LoopGone(Fx100ioMessageError, RuntimeError):
    """The loop is closed: a coroutine handed to it will never run."""

    ERRNO = errno.ESHUTDOWN


# errnos that say the device or the way to it failed: only these trip the breaker
DEVICE_ERRNOS = frozenset({
    errno.EIO, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED,
    errno.ENOTCONN, errno.ENODEV, errno.ENXIO, errno.EPIPE, errno.EHOSTUNREACH,
    errno.ENETUNREACH, errno.ENETDOWN, errno.ESHUTDOWN, errno.EBADF, errno.EREMOTEIO,
    errno.ENOLINK, errno.EPROTO, errno.EBADMSG,
})


def is_device_error(exc: BaseException) -> bool:
    """True for a transport or device failure (the breaker's business); False for an
    error of one call (no space, a bad argument, a buffer too small, ...)."""
    from fx100io.errors import (
        DeviceClosedError,
        DeviceIOError,
        Fx100ioMessageError,
        FxProtocolError,
        NvmeStatusError,
    )

    if isinstance(exc, (TimedOut, TimeoutError, ConnectionError, DeviceIOError,
                        DeviceClosedError, FxProtocolError, NvmeStatusError)):
        return True
    if isinstance(exc, Fx100ioMessageError):
        # our own refusals (a closed loop, a bad setting, a failed start): their
        # errno names the kind of failure, not a device that failed
        return False
    if isinstance(exc, OSError):
        return exc.errno in DEVICE_ERRNOS
    return False


class Breaker:
    """Trips on a device error and keeps the plugin answering 'miss' for a while.

    LMCache treats a miss as 'recompute', which is exactly what a serving engine should
    do while storage is broken; retrying every request against a dead target would
    instead add a timeout to each one.
    """

    def __init__(self, retry_after_s: float, log: logging.Logger | None = None,
                 engine: str = "LMCache") -> None:
        self._log = log or logger
        self._engine = engine
        self._retry_after_s = retry_after_s
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._reason: str | None = None
        self.trips = 0

    def usable(self) -> bool:
        with self._lock:
            if self._reason is None:
                return True
            if time.monotonic() < self._down_until:
                return False
            self._log.warning("fx100io: retrying the store after %s", self._reason)
            self._reason = None
            return True

    def trip(self, what: str, exc: BaseException) -> None:
        with self._lock:
            first = self._reason is None
            self._reason = f"{what} failed: {exc!r}"
            self._down_until = time.monotonic() + self._retry_after_s
            self.trips += 1
        if first:
            self._log.error(
                "fx100io: %s failed (%r); the plugin reports misses for %.1fs so %s "
                "recomputes instead of waiting on the device",
                what,
                exc,
                self._retry_after_s,
                self._engine,
            )
        else:
            self._log.debug("fx100io: %s failed again: %r", what, exc)


class LoopRunner:
    """Runs coroutines on the plugin's loop, owning a private one if LMCache gave none."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None, engine: str = "lmcache") -> None:
        self._own_thread: threading.Thread | None = None
        if loop is None:
            loop = asyncio.new_event_loop()
            self._own_thread = threading.Thread(
                target=loop.run_forever, name=f"fx100io-{engine}-loop", daemon=True
            )
            self._own_thread.start()
        self.loop = loop

    def on_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def alive(self) -> bool:
        if self.loop.is_closed():
            return False
        if self._own_thread is not None:
            return self._own_thread.is_alive()
        return self.loop.is_running()

    def wait_running(self, timeout_s: float) -> bool:
        """True once the loop runs; LMCache starts its loop's thread just before it
        builds the backends, so the loop may be a moment away from running."""
        deadline = time.monotonic() + timeout_s
        while not self.alive():
            if self.loop.is_closed() or time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    def submit(self, coro: Awaitable[T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def call(
        self,
        coro: Awaitable[T],
        wait_s: float,
        on_abandon: Callable[[T], None] | None = None,
    ) -> T:
        """Block the calling thread on a coroutine run on the loop.

        The coroutines bound their own I/O; ``wait_s`` only guards against a wedged
        loop. If we give up, ``on_abandon`` receives the late result so it can free
        whatever the coroutine produced.
        """
        try:
            future = self.submit(coro)
        except RuntimeError as exc:
            if hasattr(coro, "close"):
                coro.close()  # never ran: its cleanup is the caller's
            raise LoopGone(str(exc)) from exc
        try:
            return future.result(timeout=wait_s)
        except concurrent.futures.TimeoutError:
            if on_abandon is not None:

                def late(f: concurrent.futures.Future[T]) -> None:
                    if not f.cancelled() and f.exception() is None:
                        on_abandon(f.result())

                future.add_done_callback(late)
            raise TimedOut(f"event loop did not answer within {wait_s:.1f}s") from None

    def stop(self) -> None:
        if self._own_thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._own_thread.join(timeout=5)
            if not self._own_thread.is_alive():
                self.loop.close()


async def bounded(
    awaitable: Awaitable[T],
    timeout_s: float,
    on_late: Callable[[], None] | None = None,
) -> T:
    """Await a store request for at most timeout_s, without cancelling it.

    On timeout, raises TimedOut and arranges for ``on_late`` to run once the request
    finally completes (successfully or not), which is when its buffers are free. If the
    awaiting coroutine itself is cancelled, the request goes on the same way: the
    CancelledError propagates and ``on_late`` runs when the request ends.
    """
    task = asyncio.ensure_future(awaitable)

    def finished(t: asyncio.Future[T]) -> None:
        if not t.cancelled():
            t.exception()  # mark retrieved; the failure was already reported as a timeout
        if on_late is not None:
            try:
                on_late()
            except Exception:
                logger.exception("fx100io: releasing buffers of a late request failed")

    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        # The caller was cancelled, not the request: its I/O goes on in the caller's
        # buffers, which are released (on_late) only once it ends, as after a timeout.
        # The caller must not release them itself.
        task.add_done_callback(finished)
        raise
    if done:
        return task.result()
    task.add_done_callback(finished)
    raise TimedOut(f"store request still running after {timeout_s:.1f}s")

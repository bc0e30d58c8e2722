"""The loop thread that runs a shared store's blocking twins for every
calling thread (see Runner)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from typing import Any

from fx100io.errors import StoreClosedError
from fx100io.store.core.loop import refuse_in_running_loop

log = logging.getLogger("fx100io")


class Call:
    """One blocking call on the runner's loop: its coroutine, its task once
    the loop made it, its outcome for the calling thread, and whether it
    ended (its task finished, or it was failed without one)."""

    def __init__(self, coro: Any):
        self.coro = coro
        self.task: asyncio.Task | None = None
        self.ended = threading.Event()
        self.result: concurrent.futures.Future = concurrent.futures.Future()

    def fail(self, e: BaseException) -> None:
        if not self.result.done():
            try:
                self.result.set_exception(e)
            except concurrent.futures.InvalidStateError:
                pass  # its task ended meanwhile: that outcome stands
        self.ended.set()


class Runner:
    """The one event loop, on a thread of its own, that runs a store's
    blocking twins for every calling thread: a thread that calls them once
    and ends leaves nothing behind (no loop, no Redis connection).

    close() cancels the calls in flight and waits for them (their reads
    land, their extents go back) before it stops the loop; a call it could
    not wait out, or that never started, fails with StoreClosedError, so no
    caller waits for ever on a stopped loop.  Once closed, a call raises
    StoreClosedError at once: no loop is started again."""

    CLOSE_WAIT_S = 5.0

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._calls: set[Call] = set()

    def run(self, coro: Any) -> Any:
        refuse_in_running_loop(coro)
        call = Call(coro)
        with self._mu:
            # checked under the lock close() takes: a call either is in
            # _calls before close() looks, or sees the store closed
            if self._closed:
                coro.close()
                raise StoreClosedError(9, "SharedChunkStore is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                t = threading.Thread(target=loop.run_forever, name="fx100io-shared",
                                     daemon=True)
                t.start()
                self._loop, self._thread = loop, t
            loop = self._loop
            self._calls.add(call)

        def finish(t: asyncio.Task) -> None:
            with self._mu:
                self._calls.discard(call)
                closing = self._closed
            if t.cancelled():
                if closing:  # cancelled by close(), not by its caller
                    call.fail(StoreClosedError(9, "SharedChunkStore was closed during this "
                                               "call"))
                    return
                call.result.cancel()
            elif t.exception() is not None:
                call.result.set_exception(t.exception())  # type: ignore[arg-type]
            else:
                call.result.set_result(t.result())
            call.ended.set()

        def start() -> None:
            # The call's task is made here, not by run_coroutine_threadsafe,
            # so an interrupted caller can wait for the task itself to end.
            if call.result.done():  # failed by close() before the loop got here
                coro.close()
                return
            call.task = loop.create_task(coro)
            call.task.add_done_callback(finish)
            with self._mu:
                closing = self._closed
            if closing:
                # close() looked at the calls before this task existed: it
                # must not start (its first step is a cancel)
                call.task.cancel()
        try:
            loop.call_soon_threadsafe(start)
        except RuntimeError:  # close() closed the loop since: it failed this call
            coro.close()
            call.fail(StoreClosedError(9, "SharedChunkStore is closed"))
        try:
            return call.result.result()
        except BaseException:
            # Interrupted (KeyboardInterrupt in this thread): the call is
            # cancelled and waited out before the interrupt goes on, so the
            # reads it started have landed and no byte of the caller's
            # buffers changes after this returns.  (start() runs first: the
            # loop takes callbacks in order.)  A second interrupt, or the
            # loop stopping, cuts the wait short.  A call that ended (its
            # own error, or failed by close()) has nothing to cancel.
            if not call.ended.is_set():
                try:
                    loop.call_soon_threadsafe(self._cancel, call)
                except RuntimeError:  # the loop is closed: close() failed the call
                    pass
                while not call.ended.wait(0.05) and loop.is_running():
                    pass
            raise

    @staticmethod
    def _cancel(call: Call) -> None:
        if call.task is not None:
            call.task.cancel()

    def close(self, last: Any) -> None:
        """Cancel the calls in flight and wait for them (CLOSE_WAIT_S at
        most), run last() (closing the loop's Redis client) on the loop,
        stop it, and fail whatever call is still pending."""
        with self._mu:
            self._closed = True
            loop, t = self._loop, self._thread
            self._loop = self._thread = None
            calls = list(self._calls)
        if loop is None or t is None:
            return
        if calls:
            def cancel_all() -> None:
                for c in calls:
                    self._cancel(c)
            loop.call_soon_threadsafe(cancel_all)
            deadline = time.monotonic() + self.CLOSE_WAIT_S
            for c in calls:
                if not c.ended.wait(max(0.0, deadline - time.monotonic())):
                    log.warning("fx100io: a call on the shared pool did not end within "
                                "%g s of close(); stopping its loop all the same",
                                self.CLOSE_WAIT_S)
                    break
        try:
            asyncio.run_coroutine_threadsafe(last(), loop).result(timeout=5)
        except Exception:  # noqa: BLE001 (best effort: the sockets go with the loop)
            pass
        loop.call_soon_threadsafe(loop.stop)
        t.join(timeout=5)
        # no caller waits for ever on a loop that stopped under its call
        with self._mu:
            left = list(self._calls)
            self._calls.clear()
        for c in left:
            c.fail(StoreClosedError(9, "SharedChunkStore was closed during this call"))
        if not t.is_alive():
            for c in left:
                if c.task is None:  # its start() never ran: nothing else will close it
                    c.coro.close()
            loop.close()

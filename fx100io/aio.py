"""Completions into asyncio without threads (docs/architecture.md rule 4).

A :class:`QueueDriver` owns one C queue, used by one thread.  Each request
gets a tag; its waiter (an asyncio future, or a holder for blocking calls)
and the memoryview that keeps its buffer alive are kept until the completion
is reaped.  Async callers are woken through the queue's eventfd and
``loop.add_reader`` (on a queue made for that: fd_wake, see Device._driver);
blocking callers wait in C without the GIL.  Either way one reap dispatches
every finished request, whoever asked for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fx100io import _core
from fx100io.errors import BufferStillInUseError, error_from_errno

if TYPE_CHECKING:
    import asyncio

# (asyncio is imported where a caller is in an event loop already: a program
# that only uses the blocking calls, fx100io bench's C loop among them, never
# pays for its import.  A waiter is a future, or a list for a blocking call.)
_get_running_loop: Callable[[], asyncio.AbstractEventLoop] | None = None


def _running_loop() -> asyncio.AbstractEventLoop:
    """asyncio.get_running_loop(), asyncio imported on the first call only
    (an import statement per submit costs about 0.2 us)."""
    global _get_running_loop
    if _get_running_loop is None:
        import asyncio

        _get_running_loop = asyncio.get_running_loop
    return _get_running_loop()

#: One request: (op, memoryview or None, address, length, offset); op may
#: carry _core.OP_CRC32C, and carries its priority class and stream
#: (fx100io.priority.tagged)
Request = tuple[int, Any, int, int, int]
#: One completion: (res, status): bytes or -errno, and the raw NVMe status;
#: (res, status, crc32c) for a request that asked for the data's CRC32C
Completion = tuple[int, ...]


def left_with_kernel() -> dict[str, int]:
    """What queue closes left with the kernel, process-wide: ``ios`` (I/Os
    the C core counted), ``buffers`` and ``bytes`` (request buffers kept
    for good because of them)."""
    kept = _core._kept_for_kernel
    nbytes = sum(memoryview(b).nbytes for b in kept)
    return {"ios": int(_core.leaked_ios()), "buffers": len(kept), "bytes": nbytes}


def _class_of(queued: tuple[int, int, int, int, int]) -> int:
    return (queued[0] >> _core.PRIO_SHIFT) & 0xFF


class QueueDriver:
    def __init__(self, queue: _core.Queue, fd_wake: bool = False):
        self.queue = queue
        self.fd = queue.fd
        #: made for an event loop waiting on fd (FX_QUEUE_FD_WAKE)
        self.fd_wake = fd_wake
        #: its queue was handed out by Device.raw_queue(): never replaced
        self.raw = False
        self._waiters: dict[int, Any] = {}
        self._keep: dict[int, Any] = {}
        # The queue holds this same dict from the start: whichever thread
        # destroys it (a close, its ring's thread after a handoff, the last
        # reference) finds the buffers of what the kernel may still hold,
        # with no window where neither side has them.
        queue.parked = self._keep
        self._want_crc: set[int] = set()
        self._backlog: list[tuple[int, int, int, int, int]] = []
        self._next_tag = 1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flush_scheduled = False

    @property
    def busy(self) -> bool:
        return bool(self._waiters)

    @property
    def idle(self) -> bool:
        """Nothing waiting, queued or in flight (raw_queue users included):
        the queue can be closed without failing anything."""
        return not self._waiters and not self._backlog and not self.queue.pending

    # -- plumbing -------------------------------------------------------
    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch the eventfd from this loop (a thread may switch loops, as
        pytest-asyncio and asyncio.run do)."""
        if self._loop is loop:
            return
        # (first off the old loop, whatever follows: a registration left
        # there would swallow a later reader of the same fd number)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.fd)
        self._loop = None
        # A queue closed by another thread (Device.aclose's thread, a close
        # from a worker) has no eventfd left: raise DeviceClosedError here
        # rather than let the loop's selector fail on a closed descriptor.
        fd = self.queue.fd
        try:
            loop.add_reader(fd, self._on_ready)
        except OSError:
            if self.queue.destroyed:  # closed between the check and the register
                raise error_from_errno(9, "the queue was closed") from None
            raise
        self._loop = loop

    def detach(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.remove_reader(self.fd)
            except RuntimeError:
                pass  # the loop is closing in another thread
        self._loop = None

    def abandon(self, make_exc: Callable[[], BaseException]) -> None:
        """After the C queue was closed (it completes nothing more): fail
        every request still waiting with make_exc(), so no caller awaits
        forever (a request may be waiting for a reconnect).  Futures are
        resolved on their loop's thread."""
        waiters, self._waiters = self._waiters, {}
        # Requests never handed to C hold no buffer the kernel could use;
        # the others' buffers stay with the queue (the dict it shares) until
        # its close is finished, for good where the kernel kept I/O.
        for queued in self._backlog:
            self._keep.pop(queued[4], None)
        self._keep = {}
        self._want_crc.clear()
        self._backlog.clear()
        kept = getattr(self.queue, "kept_tags", None) or frozenset()

        def exc_for(tag: int) -> BaseException:
            if tag in kept:
                # the kernel may still write this buffer: the caller must
                # not reuse it (it is kept referenced, _core._kept_for_kernel)
                return BufferStillInUseError(
                    9, "device closed while the kernel still held this request's I/O; "
                    "its buffer must not be reused")
            return make_exc()

        excs = {t: exc_for(t) for t in waiters}
        futs = [(w, excs[t]) for t, w in waiters.items() if not isinstance(w, list)]
        for t, w in waiters.items():
            if isinstance(w, list):
                w.append(excs[t])
        if not futs:
            return
        loop = futs[0][0].get_loop()
        try:
            running = _running_loop()
        except RuntimeError:
            running = None

        def fail() -> None:
            for f, exc in futs:
                if not f.done():
                    f.set_exception(exc)

        if running is loop:
            fail()
        elif not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fail)
            except RuntimeError:
                pass  # the loop closed meanwhile: nobody awaits these

    def _queue(self, reqs: list[Request], make_waiter: Any) -> list[Any]:
        waiters = []
        for op, keep, addr, length, off in reqs:
            tag = self._next_tag
            self._next_tag += 1
            w = make_waiter()
            self._waiters[tag] = w
            if keep is not None:
                self._keep[tag] = keep
            if op & _core.OP_CRC32C:
                self._want_crc.add(tag)
            self._backlog.append((op, addr, length, off, tag))
            waiters.append(w)
        return waiters

    def _drain_backlog(self) -> None:
        """Hand waiting requests to C; what does not fit (all request slots
        taken) waits for the next reap (docs/architecture.md rule 5)."""
        if len(self._backlog) > 1:
            # C orders what it holds by class (fx100io.priority); what waits
            # here for a slot goes to C in the same order: by class, then
            # first come (a stable sort: a no-op for one class)
            self._backlog.sort(key=_class_of)
        while self._backlog:
            try:
                n = self.queue.submit(self._backlog)
            except OSError as e:
                # C validates a batch before queueing any of it: fail the
                # whole backlog rather than leave waiters hanging.
                failed, self._backlog = self._backlog, []
                for *_, tag in failed:
                    self._resolve(tag, e)
                return
            if n == 0:
                return
            del self._backlog[:n]

    def _resolve(self, tag: int, result: Any) -> None:
        w = self._waiters.pop(tag, None)
        self._keep.pop(tag, None)
        self._want_crc.discard(tag)
        if w is None:
            return
        if not isinstance(w, list):
            # (a waiter whose loop was closed meanwhile, e.g. a withdrawn
            # read's, has nobody to wake: setting it would raise here and
            # lose the completions reaped with it)
            if not w.cancelled() and not w.get_loop().is_closed():
                if isinstance(result, BaseException):
                    w.set_exception(result)
                else:
                    w.set_result(result)
        else:
            w.append(result)

    def withdraw(self, waiter: Any) -> asyncio.Future | None:
        """The caller awaiting waiter (a future of submit) was cancelled.  A
        request not handed to C yet is taken back (nothing moved): None.  One
        in flight gets a fresh future, resolved when its completion is
        reaped: until then the kernel or the transport may still move the
        caller's buffer, so the caller waits for it before returning."""
        tag = next((t for t, w in self._waiters.items() if w is waiter), None)
        if tag is None:
            return None  # it had completed already
        for i, queued in enumerate(self._backlog):
            if queued[4] == tag:
                del self._backlog[i]
                self._waiters.pop(tag, None)
                self._keep.pop(tag, None)
                self._want_crc.discard(tag)
                return None
        fresh = waiter.get_loop().create_future()
        self._waiters[tag] = fresh
        return fresh

    def _reap(self) -> None:
        want_crc = self._want_crc
        while True:
            for tag, res, status, crc in self.queue.reap():
                self._resolve(tag, (res, status, crc) if tag in want_crc else (res, status))
            waiting = len(self._backlog)
            self._drain_backlog()
            if len(self._backlog) == waiting:
                return
            # Requests just handed over may have finished inside submit (empty
            # ones, psync) without a wake-up through the eventfd: reap again.
            # Each turn hands over at least one request, so this ends.

    def _on_ready(self) -> None:
        self._reap()

    # -- the two ways in ------------------------------------------------
    def submit(self, reqs: list[Request]) -> list[asyncio.Future]:
        """Queue requests; returns one future per request with (res, status).

        The hand-over to C happens once per event-loop turn, so the many
        small submissions of concurrent tasks share one io_uring_enter."""
        loop = _running_loop()
        self._attach(loop)
        futs = self._queue(reqs, loop.create_future)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return futs

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._drain_backlog()
        # psync completes inside submit, io_uring sometimes too: reaping now
        # saves a wake-up through the eventfd.
        self._reap()

    def run_blocking(self, reqs: list[Request]) -> list[Completion]:
        """Submit and wait (the GIL released) until all of reqs finished."""
        holders = self._queue(reqs, list)
        self._drain_backlog()
        self._reap()
        return self._finish(holders)

    def _finish(self, holders: list[Any]) -> list[Completion]:
        """run_blocking's wait for holders (requests handed to C)."""
        for h in holders:
            while not h:
                self.queue.wait(1, -1)
                self._reap()
        out = []
        for h in holders:
            if isinstance(h[0], BaseException):
                # a close another thread handed to this one (the ring's):
                # what the kernel holds comes back before the caller's
                # buffers do
                self.queue.settle()
                raise h[0]
            out.append(h[0])
        return out


async def close_in_thread(close: Callable[[], None], name: str) -> None:
    """Run a blocking close on a thread of its own and wait for it without
    blocking the loop; cancelled, the close still runs to its end (shielded).
    (asyncio is imported here: this is only called from a running loop.)"""
    import asyncio

    loop = asyncio.get_running_loop()
    ended = loop.create_future()

    def run() -> None:
        try:
            close()
        finally:
            def end() -> None:
                if not ended.done():
                    ended.set_result(None)

            try:
                loop.call_soon_threadsafe(end)
            except RuntimeError:
                pass  # the loop closed meanwhile

    threading.Thread(target=run, daemon=True, name=name).start()
    await asyncio.shield(ended)

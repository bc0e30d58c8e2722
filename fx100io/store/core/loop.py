"""The event loop each thread's blocking calls run on."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from fx100io.errors import BlockingCallInLoopError

_tls = threading.local()


def refuse_in_running_loop(coro: Any) -> None:
    """A blocking call from a coroutine would stall its loop (or deadlock on
    it): close coro and raise, before anything runs."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    coro.close()
    raise BlockingCallInLoopError(
        35, "a *_blocking method was called from a running event loop; await the async "
        "method instead")


def run_blocking(coro: Any) -> Any:
    """Run a coroutine to completion on this thread's private event loop:
    the blocking twins share the async code and its queue per thread."""
    refuse_in_running_loop(coro)
    loop = getattr(_tls, "loop", None)
    if loop is None or loop.is_closed():
        loop = _tls.loop = asyncio.new_event_loop()
    task = loop.create_task(coro)
    try:
        return loop.run_until_complete(task)
    except BaseException:
        # Interrupted (KeyboardInterrupt in this thread): the call is
        # cancelled and run to its end before the interrupt goes on, so the
        # reads it started have landed and no byte of the caller's buffers
        # changes after this returns.  A second interrupt cuts that short.
        if not task.done():
            task.cancel()
            loop.run_until_complete(asyncio.wait([task]))
        raise

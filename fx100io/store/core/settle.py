"""Waiting out I/O that a cancelled call started."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


async def settle(futs: Iterable[asyncio.Future]) -> None:
    """Wait until every I/O of futs has ended, however often the caller is
    cancelled meanwhile: I/O handed to the kernel or a transport goes on
    after the caller leaves, so the buffers it moves, and the extents it
    lands in, are not the caller's to give back before then.  Marks their
    errors retrieved (the caller is already failing for its own reason).
    A cancel that arrived during the wait is raised once the I/O ended."""
    futs = list(futs)
    pending = [f for f in futs if not f.done()]
    cancelled = False
    while pending:
        try:
            await asyncio.shield(asyncio.gather(*pending, return_exceptions=True))
        except asyncio.CancelledError:
            cancelled = True  # cancelled again: the I/O still has to end first
        pending = [f for f in pending if not f.done()]
    for f in futs:
        if not f.cancelled():
            f.exception()
    if cancelled:
        raise asyncio.CancelledError()

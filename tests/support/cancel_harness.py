"""One cancellation harness for every async read into a caller's buffer.

The contract: once an awaited read returns -- with its result or with
CancelledError -- no byte of the caller's buffer changes any more.  A
serving engine that times out a load and hands the page to another request
must never find the old chunk landing in it.

``check_cancellation(read, buf, expected)`` starts ``read()`` (a coroutine
factory that reads ``expected`` into ``buf``), cancels it at several
moments -- before it ran at all, once it reached its first suspension,
once the first piece's bytes showed, half-way, once bytes of the last
piece showed, cancelled again while it waits its I/O out, and once bytes
showed at random places --, then, as soon as the call returned,
fills the buffer with a sentinel and watches it.  Any byte that is not the
sentinel afterwards landed after the call returned.

The bytes read must have no long run of zeros (random data), because the
buffer is zeroed before each trial to see when pieces land.  Read chunks
much larger than a piece (64 MiB in 128 KiB pieces, a small queue depth),
so that a cancel can fall between pieces.  Adapters' tests import this
module and pass their own load as ``read``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

SENTINEL = 0xA5
MOMENTS = ("before", "submitted", "first", "middle", "last", "twice")


@dataclass
class Trial:
    moment: str
    cancelled: bool  # the call ended in CancelledError (not with its result)
    in_flight: bool  # some bytes had landed, not all, when it was cancelled
    changed: int  # bytes of the buffer that changed after the call returned


async def _until(cond: Callable[[], bool], task: asyncio.Future, limit: float) -> None:
    """Let the loop run until cond() holds or the task ended."""
    deadline = time.monotonic() + limit
    while not cond() and not task.done() and time.monotonic() < deadline:
        await asyncio.sleep(0)


async def cancel_once(read: Callable[[], Awaitable[Any]], buf: np.ndarray, expected: np.ndarray,
                      moment: str, *, piece: int, watch_s: float, where: float = 0.0) -> Trial:
    """One trial; where: for the moment "random", where in the chunk (0..1)
    bytes must have landed before the cancel."""
    n = expected.nbytes
    buf[:] = 0
    task = asyncio.ensure_future(read())
    if moment == "submitted":
        await asyncio.sleep(0)
    elif moment in ("first", "twice"):
        await _until(lambda: bool(buf[:piece].any()), task, 10)
    elif moment == "middle":
        mid = n // 2 // piece * piece
        await _until(lambda: bool(buf[mid:mid + piece].any()), task, 10)
    elif moment == "last":
        last = (n - 1) // piece * piece
        await _until(lambda: bool(buf[last:n].any()), task, 10)
    elif moment == "random":  # once the piece at a random place shows bytes
        pos = int(where * (n // piece)) * piece
        await _until(lambda: bool(buf[pos:pos + piece].any()), task, 10)
    # "before": cancelled before the coroutine took its first step
    landed = np.count_nonzero(buf[:n])
    task.cancel()
    if moment == "twice":
        # cancelled again while it waits out its I/O (a timeout, then a
        # shutdown): the second cancel must not cut that wait short
        for _ in range(3):
            await asyncio.sleep(0)
            task.cancel()
    try:
        await task
        cancelled = False
    except asyncio.CancelledError:
        cancelled = True
    if not cancelled:  # it had finished: its result must be the whole chunk
        assert np.array_equal(buf[:n], expected), f"{moment}: wrong bytes from a finished read"
    buf[:] = SENTINEL
    await asyncio.sleep(watch_s)  # the loop runs: completions are reaped meanwhile
    changed = int(np.count_nonzero(buf != SENTINEL))
    return Trial(moment, cancelled, cancelled and 0 < landed < n * 0.99, changed)


async def check_cancellation(read: Callable[[], Awaitable[Any]], buf: np.ndarray,
                             expected: np.ndarray, *, piece: int, watch_s: float = 0.25,
                             randoms: int = 3, seed: int = 0) -> list[Trial]:
    """Cancel read() at every moment of MOMENTS and at `randoms` random
    times; assert that no byte changed after any call returned and that at
    least one cancel caught the read with bytes landed and others still to
    come (else the harness proved nothing).  Returns the trials."""
    t0 = time.monotonic()
    buf[:] = 0
    await read()
    assert np.array_equal(buf[:expected.nbytes], expected), "the read itself returns wrong bytes"
    whole = time.monotonic() - t0
    rng = random.Random(seed)
    trials = [await cancel_once(read, buf, expected, m, piece=piece, watch_s=watch_s)
              for m in MOMENTS]
    for _ in range(randoms):
        trials.append(await cancel_once(read, buf, expected, "random", piece=piece,
                                        watch_s=watch_s, where=rng.random()))
    bad = [t for t in trials if t.changed]
    assert not bad, ("bytes landed in the caller's buffer after the call returned: "
                     + "; ".join(f"{t.changed} bytes after a cancel at {t.moment!r}" for t in bad))
    assert any(t.in_flight for t in trials), (
        f"no cancel caught a read in flight (a whole read took {whole * 1e3:.1f} ms): "
        f"{trials}")
    return trials

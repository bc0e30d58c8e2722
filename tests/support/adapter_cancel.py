"""Pieces of the adapters' cancellation checks (no tests of their own; stdlib only, so
the SGLang and vLLM drivers import it in their engines' venvs too).

A device keeps writing the pieces of a read it was already sent, whatever happens to the
call that sent them. :class:`LandingStore` puts that in slow motion around a real store:
its reads land in the caller's buffers piece by piece, a pause between pieces, and when
cancelled it still lands the pieces "in flight" before it raises, as the store's own
reads do. An adapter keeps its promise when none of those late pieces lands after its
load returned: :func:`watch_unchanged` fills the buffers with a sentinel once the load
returned and checks that no byte changes for a while.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

SENTINEL = 0xA5
WATCH_S = 0.5


def _parts(buf: Any) -> list[memoryview]:
    """A buffer the store takes (one buffer, or a list of pieces) as byte views."""
    items = buf if isinstance(buf, (list, tuple)) else [buf]
    out = []
    for item in items:
        mv = memoryview(item)
        out.append(mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B"))
    return out


class LandingStore:
    """The real store, with reads that land slowly and keep landing when cancelled."""

    def __init__(self, real: Any, piece: int = 16 << 10, pause_s: float = 0.004,
                 in_flight: int = 8) -> None:
        self._real = real
        self.piece = piece
        self.pause_s = pause_s
        self.in_flight = in_flight
        self.landing = threading.Event()  # set once the first piece of a read landed
        self.late_pieces = 0  # pieces landed after a cancel
        self.running = 0  # reads still landing (a call that returned meanwhile is early)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def batch_get(self, keys: Sequence[Any], bufs: Sequence[Any],
                        **kw: Any) -> list[bool]:
        dests = [_parts(b) for b in bufs]
        bounce = [bytearray(sum(p.nbytes for p in d)) for d in dests]
        self.running += 1
        try:
            return await self._land_all(await self._real.batch_get(list(keys), bounce, **kw),
                                        bounce, dests)
        finally:
            self.running -= 1

    async def _land_all(self, hits: list[bool], bounce: list[bytearray],
                        dests: list[list[memoryview]]) -> list[bool]:
        steps = []
        for src, dst in zip(bounce, dests):
            pos = 0
            for part in dst:
                for off in range(0, part.nbytes, self.piece):
                    n = min(self.piece, part.nbytes - off)
                    steps.append((part, off, src, pos + off, n))
                pos += part.nbytes
        i = 0
        try:
            while i < len(steps):
                self._land(steps[i])
                i += 1
                self.landing.set()
                await asyncio.sleep(self.pause_s)
        except asyncio.CancelledError:
            for step in steps[i:i + self.in_flight]:  # sent before the cancel: they land
                await asyncio.sleep(self.pause_s)
                self._land(step)
                self.late_pieces += 1
            raise
        return hits

    @staticmethod
    def _land(step: tuple[memoryview, int, bytearray, int, int]) -> None:
        part, off, src, at, n = step
        part[off:off + n] = src[at:at + n]


def fill(views: Sequence[Any], value: int = SENTINEL) -> None:
    for v in views:
        for p in _parts(v):
            p[:] = bytes([value]) * p.nbytes


def watch_unchanged(views: Sequence[Any], watch_s: float = WATCH_S) -> str | None:
    """Fill the views with the sentinel, then watch them: None if no byte changed for
    watch_s, else what changed."""
    fill(views)
    want = [bytes([SENTINEL]) * sum(p.nbytes for p in _parts(v)) for v in views]
    deadline = time.monotonic() + watch_s
    while time.monotonic() < deadline:
        for i, v in enumerate(views):
            got = b"".join(bytes(p) for p in _parts(v))
            if got != want[i]:
                changed = sum(1 for a, b in zip(got, want[i]) if a != b)
                return f"buffer {i}: {changed} bytes changed after the load returned"
        time.sleep(0.01)
    return None

"""Counters shared between job processes and the parent's status line.

Each job instance owns one slot of a shared int64 array and refreshes it
every sample tick (100 ms); the parent only reads.  One shared flag asks all
jobs to stop early (Ctrl-C), so they still report what they measured.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

# Slot layout.
RBYTES, WBYTES, RIOS, WIOS, STATE, ELAPSED_MS = range(6)
SLOT = 6

# Job states for the status line (fio's letters: R read, W write, M mixed...).
SETUP, RAMP, RUNNING, VERIFYING, DONE = range(5)


class SharedProgress:
    def __init__(self, njobs: int, ctx: Any = None) -> None:
        ctx = ctx or multiprocessing
        self.njobs = njobs
        self.values = ctx.RawArray("q", njobs * SLOT)
        self.stop_flag = ctx.RawValue("i", 0)

    def slot(self, i: int) -> ProgressSlot:
        return ProgressSlot(self, i)

    def read(self, i: int) -> list[int]:
        base = i * SLOT
        return list(self.values[base : base + SLOT])

    def request_stop(self) -> None:
        self.stop_flag.value = 1

    @property
    def stop_requested(self) -> bool:
        return bool(self.stop_flag.value)


class ProgressSlot:
    """The view one job has of its own slot."""

    def __init__(self, shared: SharedProgress, index: int) -> None:
        self._values = shared.values
        self._flag = shared.stop_flag
        self._base = index * SLOT

    def update(self, rbytes: int, wbytes: int, rios: int, wios: int, elapsed_ms: int) -> None:
        b = self._base
        v = self._values
        v[b + RBYTES] = rbytes
        v[b + WBYTES] = wbytes
        v[b + RIOS] = rios
        v[b + WIOS] = wios
        v[b + ELAPSED_MS] = elapsed_ms

    def set_state(self, state: int) -> None:
        self._values[self._base + STATE] = state

    @property
    def stop_requested(self) -> bool:
        return bool(self._flag.value)


class NullSlot:
    """Progress sink for code run outside a bench run (tests, layout)."""

    def update(self, *args: int) -> None:
        pass

    def set_state(self, state: int) -> None:
        pass

    stop_requested = False

"""Priority classes of I/O, and how a request carries one to the C queue.

A queue issues the pieces of ``LOAD`` requests first, then ``STORE``, then
``BACKGROUND`` ones, giving each lower class at least one piece in
``SHARE`` while it waits (none starves); load requests of different
streams (one ``batch_get``, one ``read_into``) take turns piece by piece;
while a load read waits or is in flight, store and background writes in
flight are capped at the device's ``write_depth``.  The scheduler is in C
(csrc/reqs.c); docs/architecture.md, "Priority and write admission", says
why it is built so.
"""

from __future__ import annotations

import enum
import itertools
from typing import Any

from fx100io import _core
from fx100io.errors import InvalidArgumentError

#: pieces in which a waiting lower class gets at least one
SHARE: int = _core.PRIO_SHARE
#: store and background writes in flight while a load read waits
WRITE_DEPTH_DEFAULT: int = _core.WRITE_DEPTH_DEFAULT


class Priority(enum.IntEnum):
    """Which work goes first at the device: a load (a cache hit someone
    waits for), a store, background work (prefetch, eviction writes,
    compaction)."""

    LOAD = _core.PRIO_LOAD
    STORE = _core.PRIO_STORE
    BACKGROUND = _core.PRIO_BACKGROUND


LOAD, STORE, BACKGROUND = Priority.LOAD, Priority.STORE, Priority.BACKGROUND

_streams = itertools.count(1)


def new_stream() -> int:
    """A stream id: the requests of one caller's batch share one, so that
    concurrent batches take turns with each other, not with their own
    chunks."""
    return next(_streams) & 0xFFFFFFFF


def stream_or_new(stream: Any) -> int:
    """stream (a caller's id from new_stream()) checked, or a new one for None."""
    if stream is None:
        return new_stream()
    if not isinstance(stream, int) or isinstance(stream, bool) or not 0 <= stream <= 0xFFFFFFFF:
        raise InvalidArgumentError(22, f"stream must be an int of 32 bits (fx100io.priority."
                                   f"new_stream()), got {stream!r}")
    return stream


def parse(priority: Any, default: Priority) -> Priority:
    """priority as a Priority: None (default), a Priority or its int value,
    or its name ("load", "store", "background", any case)."""
    if priority is None:
        return default
    if isinstance(priority, str):
        try:
            return Priority[priority.upper()]
        except KeyError:
            pass
    elif isinstance(priority, int) and not isinstance(priority, bool):
        try:
            return Priority(priority)
        except ValueError:
            pass
    raise InvalidArgumentError(
        22, f"priority must be 'load', 'store' or 'background' (fx100io.Priority), "
        f"got {priority!r}")


def tagged(op: int, priority: Priority, stream: int) -> int:
    """op carrying its class and stream to the C queue (_core.Queue.submit)."""
    return op | int(priority) << _core.PRIO_SHIFT | (stream & 0xFFFFFFFF) << _core.STREAM_SHIFT


def of(op: int) -> int:
    """The class a tagged op carries."""
    return (op >> _core.PRIO_SHIFT) & 0xFF

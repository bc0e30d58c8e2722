"""Extents and eviction: where each chunk lives on a device, how much of the
capacity is used, and which chunks go first (least recently used).

Everything here runs with the store's lock (ChunkStore._mu) held and does no
I/O: a victim's DEL record is made durable by the caller before its blocks
are handed out again.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field

from fx100io import _core
from fx100io.device import Device
from fx100io.store.local import layout
from fx100io.store.local.index_log import IndexLog, Live

log = logging.getLogger("fx100io")


@dataclass(eq=False)
class Entry:
    key: bytes
    dev: int
    off: int
    length: int
    crc: int
    seq: int
    readers: int = 0
    dead: bool = False  # superseded/deleted while being read: free on last reader


@dataclass(eq=False)
class Member:
    """One device of the store: its index log and its share of the chunks."""
    dev: Device
    sb: layout.Superblock
    log: IndexLog
    capacity: int
    alloc: _core.Allocator = field(init=False)
    used: int = 0
    lru: OrderedDict = field(default_factory=OrderedDict)  # key -> Entry, oldest first
    # Entries out of the index whose DEL records are not durable yet: the
    # log still holds them, so a compaction meanwhile must keep them too, or
    # a failed DEL would restore chunks the log no longer has (id -> Entry).
    leaving: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.alloc = _core.Allocator(self.sb.data_off, self.sb.data_size, self.sb.block_size)

    @property
    def index(self) -> int:
        return self.sb.dev_index

    def blocks(self, length: int) -> int:
        """Capacity a chunk of length bytes takes (whole blocks)."""
        return layout.align_up(length, self.sb.block_size)

    def adopt(self, found: dict[bytes, Live]) -> list[Entry]:
        """Reserve the extents of replayed chunks; returns their entries in
        LRU order (oldest first).  Newest first: if two records claim the
        same blocks, the later put is the one whose data is there."""
        kept = []
        for e in sorted(found.values(), key=lambda e: e.seq, reverse=True):
            if e.length:
                try:
                    self.alloc.reserve(e.off, e.length)
                except OSError:
                    log.error("fx100io: %s: chunk %r overlaps a newer one; dropped",
                              self.dev.uri, e.key)
                    continue
            self.used += self.blocks(e.length)
            kept.append(Entry(e.key, self.index, e.off, e.length, e.crc, e.seq))
        kept.reverse()
        for entry in kept:
            self.lru[entry.key] = entry
        return kept

    def take(self, length: int) -> int | None:
        """An extent for length bytes within capacity, or None."""
        need = self.blocks(length)
        if self.used + need > self.capacity:
            return None
        off = self.alloc.alloc(length) if length else 0
        if off is None:
            return None
        self.used += need
        return off

    def give_back(self, off: int, length: int) -> None:
        """Return an extent from take() that no entry refers to."""
        if length:
            self.alloc.free(off, length)
        self.used -= self.blocks(length)

    def victims(self, length: int) -> list[Entry]:
        """Least recently used chunks, none being read, whose space makes
        room for length bytes (as many as there are, if not enough)."""
        need = self.blocks(length)
        out: list[Entry] = []
        freed = 0
        for e in self.lru.values():
            if freed >= need and self.used - freed + need <= self.capacity:
                break
            if e.readers:
                continue
            out.append(e)
            freed += self.blocks(e.length)
        return out

    def release(self, e: Entry) -> None:
        """Give e's extent back, or defer that to its last reader."""
        if e.readers:
            e.dead = True
            return
        self.give_back(e.off, e.length)

"""The index log of one device: the durable half of a ChunkStore's index.

Two halves of ``sb.index_half`` bytes each; each holds a header block (magic,
generation, CRC) and then a chain of segments, each one block-aligned write
of up to SEGMENT_RECORDS records.  The half whose valid header has the higher
generation is live.  A segment belongs to the log only if it carries the live
generation and the next sequence number after its predecessor, so replay
stops at the first torn or foreign segment.

Appends go after the tail of the live half.  A commit that does not fit
there is folded into a compaction: the other half receives the live records
with the commit applied, is flushed, and only then gets its header (the
switch).  So a commit is durable either entirely in the old half or entirely
in the new one, never split across them, and nothing that was acknowledged
is ever left only in a half that replay ignores.

Callers give the log the current live records (a callback: the log keeps no
copy of the index) and an ``apply`` callback run after the records are
durable and before the next commit may start, so a compaction never misses a
record that is already in the log.  Every commit and compaction of one log
is serialised by ``IndexLog.lock``.  Its I/O is blocking: :meth:`commit`
runs on the calling thread, :meth:`commit_async` on the log's own thread,
so that an event loop keeps running while a compaction rewrites up to a
whole index half (docs/architecture.md rule 14).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from fx100io import _core
from fx100io.device import Device
from fx100io.errors import DeviceFullError, DeviceIOError, NotAStoreError, StoreClosedError
from fx100io.pool import aligned_array
from fx100io.store.local import layout

#: Records per index segment: a segment is written as one block-aligned
#: write, so keep it well under the index half.
SEGMENT_RECORDS = 2048
REC_PUT, REC_DEL = _core.REC_PUT, _core.REC_DEL


class Record(NamedTuple):
    """One index record, as a segment stores it."""
    type: int
    key: bytes
    dev: int
    off: int
    length: int
    crc: int


class Live(NamedTuple):
    """A key's current version as the log knows it (seq: its segment's)."""
    key: bytes
    off: int
    length: int
    crc: int
    seq: int


def apply_records(state: dict[bytes, Any], recs: Iterable[Sequence], make: Callable) -> None:
    """Apply index records to a key -> entry map, in log order: the one
    rule that replay and compaction share.  make(key, off, length, crc)
    builds the entry of a PUT; entries need .off and .length.  A DEL names
    the version it removes: a DEL logged after a newer PUT of the same key
    (an eviction racing a put) must not remove that newer chunk."""
    for typ, key, _dev, off, length, crc in recs:
        if typ == REC_PUT:
            state[key] = make(key, off, length, crc)
        else:
            cur = state.get(key)
            if cur is not None and (cur.off, cur.length) == (off, length):
                del state[key]


def _groups(recs: Sequence) -> list[Sequence]:
    return [recs[i:i + SEGMENT_RECORDS] for i in range(0, len(recs), SEGMENT_RECORDS)]


class IndexLog:
    """Append, compact and replay one device's index log.  Use
    :meth:`format` for a new device and :meth:`open` for an existing one."""

    def __init__(self, dev: Device, sb: layout.Superblock, generation: int, half: int,
                 tail: int, seq: int):
        self.dev = dev
        self.sb = sb
        self.generation = generation
        self.half = half  # live half (0 or 1)
        self.tail = tail  # next segment offset within the live half
        self.seq = seq  # sequence number of the last segment in the log
        self.compactions = 0
        self.lock = threading.Lock()
        self._thread: ThreadPoolExecutor | None = None
        self._tainted = False  # the live half's tail holds a failed commit
        # Set when a compaction failed after its header write was issued: the
        # switch may or may not be on the device, so which half replay will
        # take is unknown, and any commit appended to either could be lost.
        self._in_doubt: str | None = None
        self._tried_gen = generation  # highest generation a compaction has used
        self._closed = False
        self._thread_mu = threading.Lock()

    # ------------------------------------------------------------ lifetime
    @classmethod
    def format(cls, dev: Device, sb: layout.Superblock) -> IndexLog:
        """Initialise both halves of a device being formatted (half 0 live,
        empty); durable on return."""
        gen = layout.new_generation()
        blank = aligned_array(layout.BLOCK)
        dev.write_from_blocking(sb.index_off + sb.index_half, blank)
        dev.write_from_blocking(sb.index_off + layout.BLOCK, blank)
        hdr = aligned_array(layout.BLOCK)
        hdr[:] = memoryview(layout.encode_index_header(gen))
        dev.write_from_blocking(sb.index_off, hdr)
        dev.flush_blocking()
        return cls(dev, sb, gen, 0, layout.BLOCK, 0)

    @classmethod
    def open(cls, dev: Device, sb: layout.Superblock) -> tuple[IndexLog, dict[bytes, Live]]:
        """Replay the live half: the log, and every key's live version."""
        gens = []
        for half in (0, 1):
            raw = aligned_array(layout.BLOCK)
            dev.read_into_blocking(sb.index_off + half * sb.index_half, raw)
            g = layout.decode_index_header(raw.tobytes())
            if g is not None:
                gens.append((g, half))
        if not gens:
            raise NotAStoreError(74, "both index headers of the store are corrupt", dev.uri)
        gen, half = max(gens)
        buf = aligned_array(sb.index_half)
        dev.read_into_blocking(sb.index_off + half * sb.index_half, buf)
        pos, last_seq = layout.BLOCK, None
        found: dict[bytes, Live] = {}
        while pos < sb.index_half:
            size, seq, recs = _core.decode_segment(buf, pos, gen)
            if size <= 0 or (last_seq is not None and seq != last_seq + 1):
                break  # end of log, or a torn segment from an interrupted commit
            apply_records(found, recs, lambda k, o, n, c, seq=seq: Live(k, o, n, c, seq))
            last_seq = seq
            pos += layout.align_up(size, sb.block_size)
        log = cls(dev, sb, gen, half, pos, last_seq or 0)
        log._scrub_after_tail(buf)
        return log, found

    def _scrub_after_tail(self, buf: Any) -> None:
        """Erase segment headers of this generation found after the log's
        tail (what a torn multi-segment commit leaves).  Otherwise a later
        commit ending where such a leftover starts would let a future replay
        chain into it (same generation, next sequence number) and resurrect
        records of a commit that never returned.  Older generations cannot
        chain, so they are left alone."""
        bs = self.sb.block_size
        blank = None
        for p in range(self.tail, self.sb.index_half, bs):
            if _core.decode_segment(buf, p, self.generation)[0] != 0:
                blank = blank if blank is not None else aligned_array(bs)
                self.dev.write_from_blocking(self._half_off(self.half) + p, blank)
        if blank is not None:
            self.dev.flush_blocking()

    # ------------------------------------------------------------- writing
    def _half_off(self, half: int) -> int:
        return self.sb.index_off + half * self.sb.index_half

    def write_at(self, half: int, pos: int, data: bytes) -> None:
        """Write data at pos of a half, zero-padded to whole blocks (no flush)."""
        buf = aligned_array(layout.align_up(len(data), self.sb.block_size))
        buf[:len(data)] = memoryview(data)
        self.dev.write_from_blocking(self._half_off(half) + pos, buf)

    def _encode(self, gen: int, first_seq: int, recs: Sequence) -> tuple[list[bytes], int]:
        segs = [_core.encode_segment(gen, first_seq + j, list(g))
                for j, g in enumerate(_groups(recs))]
        return segs, sum(layout.align_up(len(s), self.sb.block_size) for s in segs)

    def commit(self, recs: Sequence[Sequence], live: Callable[[], Iterable[Any]],
               apply: Callable[[int], None] | None = None,
               failed: Callable[[], None] | None = None) -> int:
        """Make recs durable, in order, as one commit; returns the sequence
        number their keys' versions carry.  live() returns the current live
        entries (objects with .key .off .length .crc), read only if the
        commit triggers a compaction; apply(seq) runs after the records are
        durable, still under the lock.  Raises DeviceFullError, with nothing
        changed on the device or in memory, when the commit cannot fit even
        in a freshly compacted half.  If the commit fails, failed() runs
        before the error is raised, still under the lock: a caller that
        undoes in memory what it did ahead of the commit does so before any
        later commit is applied."""
        with self.lock:
            try:
                return self._commit_locked(recs, live, apply)
            except BaseException:
                if failed is not None:
                    failed()
                raise

    def _commit_locked(self, recs: Sequence[Sequence], live: Callable[[], Iterable[Any]],
                       apply: Callable[[int], None] | None) -> int:
        """commit() with self.lock held."""
        if self._in_doubt:
            raise DeviceIOError(
                5, f"the store's index is in doubt after a failed compaction "
                f"({self._in_doubt}); no change is accepted until the store is closed and "
                "reopened (reopening finds every change acknowledged before it)",
                self.dev.target)
        segs, need = self._encode(self.generation, self.seq + 1, recs)
        if self._tainted or self.tail + need > self.sb.index_half:
            self._compact(live, recs)
        else:
            try:
                for seg in segs:
                    self.write_at(self.half, self.tail, seg)
                    self.seq += 1
                    self.tail += layout.align_up(len(seg), self.sb.block_size)
                self.dev.flush_blocking()
            except BaseException:
                # Part of this failed commit may be on the device, and a
                # later flush could make it durable: never append after
                # it; the next commit moves to a fresh half.
                self._tainted = True
                raise
        if apply is not None:
            apply(self.seq)
        return self.seq

    async def commit_async(self, recs: Sequence[Sequence], live: Callable[[], Iterable[Any]],
                           apply: Callable[[int], None] | None = None,
                           failed: Callable[[], None] | None = None) -> int:
        """:meth:`commit` on the log's own thread; the caller's event loop
        runs meanwhile.  Commits of every caller still go through the one
        lock, in the order they take it, so the durability protocol's
        ordering holds: whatever the caller awaited before (its data writes
        and their flush) is complete before this commit's writes are issued,
        and this commit is durable before the await returns.

        A commit that has started is never abandoned: if the caller is
        cancelled, the await still waits for the commit's end (apply done
        or the error raised) and only then raises CancelledError, so the
        caller's cleanup never races a commit that may yet succeed."""
        fut = asyncio.get_running_loop().run_in_executor(
            self._executor(), self.commit, recs, live, apply, failed)
        cancelled = False
        while True:
            try:
                seq = await asyncio.shield(fut)
                break
            except asyncio.CancelledError:
                if fut.cancelled():
                    raise
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError()
        return seq

    @property
    def in_doubt(self) -> bool:
        """A compaction failed after its header write was issued."""
        return self._in_doubt is not None

    def _executor(self) -> ThreadPoolExecutor:
        with self._thread_mu:
            if self._closed:
                raise StoreClosedError(9, "ChunkStore is closed")
            if self._thread is None:
                self._thread = ThreadPoolExecutor(max_workers=1,
                                                  thread_name_prefix="fx100io-index")
            return self._thread

    def close(self) -> None:
        """Stop the log's thread once the commits queued on it are done."""
        with self._thread_mu:
            thread, self._thread = self._thread, None
            self._closed = True
        if thread is not None:
            thread.shutdown(wait=True)

    def compact(self, live: Callable[[], Iterable[Any]]) -> None:
        """Rewrite the live entries into the other half and switch to it."""
        with self.lock:
            self._compact(live, ())

    def _compact(self, live: Callable[[], Iterable[Any]], pending: Sequence[Sequence]) -> None:
        """Write live() with pending applied into the other half, then switch
        (with self.lock held).  Nothing changes unless all of it fits."""
        state = {e.key: e for e in live()}
        apply_records(state, pending, lambda k, o, n, c: Live(k, o, n, c, 0))
        entries = list(state.values())
        del state
        # A random step, not +1: a compaction cut short by a crash leaves
        # segments of generation g+k in the other half; the next attempt
        # must not reuse g+k, or replay could chain into that leftover.  In
        # this process every attempt also goes past the last one tried, so a
        # failed attempt's leftovers can never be chained into by a retry.
        new_half = 1 - self.half
        new_gen = max(self.generation, self._tried_gen) + 1 + int.from_bytes(os.urandom(4),
                                                                             "little")
        self._tried_gen = new_gen
        dev_index = self.sb.dev_index
        room = self.sb.index_half
        pos, nsegs = layout.BLOCK, 0
        # One segment at a time, its records made just before: a compaction
        # of a large index then holds few Python objects at once (no garbage
        # collection of the whole heap with the GIL held, which would stall
        # the caller's event loop), and segments written into the half that
        # is not live yet are harmless if it turns out not to fit.
        for i in range(0, len(entries), SEGMENT_RECORDS):
            seg = _core.encode_segment(
                new_gen, self.seq + 1 + nsegs,
                [(REC_PUT, e.key, dev_index, e.off, e.length, e.crc)
                 for e in entries[i:i + SEGMENT_RECORDS]])
            size = layout.align_up(len(seg), self.sb.block_size)
            if pos + size > room:
                raise DeviceFullError(
                    28, f"the store's index is full: {len(entries)} chunks do not fit in an "
                    f"index half of {room} bytes even after compaction ({len(pending)} records "
                    "of this commit included); store fewer chunks per batch or format with a "
                    "larger index_size", self.dev.target)
            self.write_at(new_half, pos, seg)
            pos += size
            nsegs += 1
        self.dev.flush_blocking()
        try:
            self.write_at(new_half, 0, layout.encode_index_header(new_gen))
            self.dev.flush_blocking()
        except BaseException as exc:
            # The header may have landed (a write reported failed, or a
            # failed flush of a write the device kept): replay could take
            # either half, so appending to either could lose what is
            # acknowledged next.  Stop here; a reopen decides.
            self._in_doubt = f"{type(exc).__name__}: {exc}"
            raise
        self.half, self.generation, self.tail = new_half, new_gen, pos
        self.seq += nsegs
        self._tainted = False
        self.compactions += 1

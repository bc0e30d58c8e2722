"""ChunkStore: keys to extents on one or more devices, with a CRC32C per
chunk, an on-device index that survives restarts and crashes, LRU eviction
under a capacity limit, and striping across devices by key hash.

Durability protocol of a put (per device):
  1. evicted chunks whose space is reused: DEL records written and flushed
     before any of their blocks is overwritten;
  2. chunk data written, then flushed;
  3. PUT records (extent + CRC) appended to the index log, then flushed;
     a commit that does not fit after the log's tail is folded into a
     compaction instead, so it is durable whole in the new index half or
     not at all, never split between the halves (see index_log).
A put returns only after 3, so after a crash every acknowledged chunk is
found; a chunk whose put did not return has no durable record (absent) or a
complete one.  The CRC catches whatever a device corrupts: a mismatch is a
miss and a logged corruption event, never data.

Each step is awaited before the next starts.  The index log I/O of 1 and 3
(appends, and compactions that can rewrite a whole index half) runs on the
device's index thread (IndexLog.commit_async), never on the caller's event
loop; the log's lock serialises every commit and compaction of one device,
and the data writes of 2 are complete before the commit's writes are issued.
A flush makes every completed write of the device durable, whichever thread
issued it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fx100io import _core
from fx100io import priority as prio
from fx100io.device import Device, open_device
from fx100io.errors import (
    BufferTooSmallError,
    DeviceFullError,
    InvalidArgumentError,
    NotAStoreError,
    error_from_errno,
)
from fx100io.locks import FileLock
from fx100io.pool import aligned_array
from fx100io.store.core import extent_io
from fx100io.store.core.base import StoreBase
from fx100io.store.core.extent_io import READ, WRITE, landed, written
from fx100io.store.core.keys import normalize_key
from fx100io.store.core.loop import run_blocking
from fx100io.store.core.pieces import (
    gather,
    join_crc,
    limit,
    nbytes,
    pieces,
    placed_pieces,
    scatter,
)
from fx100io.store.core.settle import settle
from fx100io.store.core.superblock import (
    BLOCK,
    SHARED_SB_MAGIC,
    check_same_set,
    check_whole_set,
    new_set_id,
    read_block0,
    write_block0,
)
from fx100io.store.flock import lock_device, unlock
from fx100io.store.local import layout
from fx100io.store.local.index_log import REC_DEL, REC_PUT, IndexLog, Record
from fx100io.store.local.space import Entry, Member

log = logging.getLogger("fx100io")


class ChunkStore(StoreBase):
    """A persistent key -> chunk store over one device or several (striped).

    ``ChunkStore(uris, create=False, size=None, **opts)``: ``create=True``
    formats the devices (files are created or grown to ``size`` bytes),
    but refuses (NotAStoreError) a device holding a shared pool's namespace
    unless ``force=True``; otherwise an existing store is opened and its
    chunks are found again.

    Options: capacity (bytes of chunk data kept before LRU eviction; default
    all of the data area), index_size (bytes per index half, default about
    1/512 of a device), and the device options of :func:`open_device`
    (direct, engine, queue_depth, max_io).
    """

    def __init__(self, uris: str | Sequence[str], create: bool = False, size: int | None = None,
                 *, capacity: int | None = None, index_size: int | None = None, force: bool = False,
                 **opts: Any):
        uri_list = [uris] if isinstance(uris, str) else list(uris)
        if not uri_list:
            raise InvalidArgumentError(22, "ChunkStore needs at least one device URI")
        if capacity is not None and (not isinstance(capacity, int) or capacity <= 0):
            raise InvalidArgumentError(22, f"capacity must be a positive int, got {capacity!r}")
        self._mu = threading.RLock()
        self._entries: dict[bytes, Entry] = {}
        self._closed = False
        # on_evict(pairs): (key, length) of chunks the LRU evicted, once their DEL
        # records are durable; called on the index log's thread, must not block
        self.on_evict: Callable[[list[tuple[bytes, int]]], None] | None = None
        self._counters = dict(puts=0, gets=0, hits=0, misses=0, corruptions=0, evictions=0,
                              deletes=0, bytes_written=0, bytes_read=0)
        devices: list[Device] = []
        self._locks: list[FileLock] = []
        try:
            for u in uri_list:
                devices.append(open_device(u, create=create, size=size if create else None, **opts))
                held = lock_device(devices[-1])
                if held is not None:
                    self._locks.append(held)
            # the devices' URIs: on the kernel path without their DH-HMAC-CHAP secrets
            names = [d.uri for d in devices]
            if create:
                if not force:
                    self._refuse_shared_pools(devices)
                self._members = self._format(devices, names, index_size)
            else:
                self._members = self._load(devices, names)
        except BaseException:
            for d in devices:
                d.close()
            unlock(self._locks)
            raise
        per_dev = None if capacity is None else capacity // len(self._members)
        for m in self._members:
            m.capacity = m.sb.data_size if per_dev is None else min(per_dev, m.sb.data_size)

    # ------------------------------------------------------------ format/load
    @staticmethod
    def _refuse_shared_pools(devices: list[Device]) -> None:
        """A namespace of a shared pool is not this store's to format: other
        hosts may be using it, and its index lives in Redis, where a local
        create cannot see it.  Checked on every device before any is
        written."""
        for d in devices:
            if read_block0(d)[:len(SHARED_SB_MAGIC)] == SHARED_SB_MAGIC:
                raise NotAStoreError(
                    17, "the device holds a namespace of a shared pool (SharedChunkStore); "
                    "ChunkStore(create=True) would destroy that pool: pass force=True to "
                    "format it anyway", d.uri)

    def _format(self, devices: list[Device], uris: list[str],
                index_size: int | None) -> list[Member]:
        set_id = new_set_id()
        members = []
        for i, d in enumerate(devices):
            sb = layout.plan(d.size, d.block_size, i, len(devices), set_id, index_size, uris[i])
            # Both index halves first, superblock last: a device whose
            # format was interrupted is not mistaken for a store.
            index = IndexLog.format(d, sb)
            write_block0(d, sb.encode())
            members.append(Member(d, sb, index, sb.data_size))
        return members

    def _load(self, devices: list[Device], uris: list[str]) -> list[Member]:
        sbs: list[layout.Superblock | None] = []
        missing: NotAStoreError | None = None
        for d, u in zip(devices, uris):
            # a short read (a file under one block) reads as zeros after its end
            raw = read_block0(d).ljust(BLOCK, b"\0")
            try:
                sb = layout.Superblock.decode(raw, u)
            except NotAStoreError as absent:
                if len(devices) == 1 or raw.startswith(layout.SB_MAGIC):
                    raise  # one device, or a store's block 0 that is corrupt or too new
                missing = missing or absent
                sbs.append(None)
                continue
            layout.check_geometry(sb, d.size, d.block_size, u)
            sbs.append(sb)
        if missing is not None:
            held = [u for u, sb in zip(uris, sbs) if sb is not None]
            if not held:
                raise missing
            # create=True would erase the members that do hold the store: never hint it
            bad = [u for u, sb in zip(uris, sbs) if sb is None]
            raise NotAStoreError(22, f"no fx100io store on {', '.join(bad)}, while "
                                 f"{', '.join(held)} hold(s) one: a wrong or swapped device in "
                                 "the list? (create=True would erase the store on the others "
                                 "too)", bad[0])
        sbs_ok = [sb for sb in sbs if sb is not None]
        check_same_set(sbs_ok, uris, "device belongs to a different store than")
        check_whole_set(sbs_ok, uris, "the store has {ndevs} devices; {given} given "
                        "(pass every device of the store)")
        members = []
        for i in sorted(range(len(devices)), key=lambda i: sbs_ok[i].dev_index):
            index, found = IndexLog.open(devices[i], sbs_ok[i])
            m = Member(devices[i], sbs_ok[i], index, sbs_ok[i].data_size)
            for e in m.adopt(found):
                self._entries[e.key] = e
            members.append(m)
        return members

    # ------------------------------------------------------------- helpers
    def _member_of(self, key: bytes) -> Member:
        return self._members[_core.crc32c(key) % len(self._members)]

    async def _commit(self, m: Member, recs: list[Record], apply: Any = None,
                      failed: Any = None) -> int:
        """Append records to m's index log durably, then apply them to
        memory, off the event loop (see IndexLog.commit_async)."""
        return await m.log.commit_async(recs, lambda: self._live(m), apply, failed)

    def _live(self, m: Member) -> list[Entry]:
        """What m's log holds now: the index, and the entries on their way
        out (oldest version first, so the newest of a key wins)."""
        with self._mu:
            # one pass over the index, no second copy: a compaction snapshots
            # millions of entries on the log's thread, with the GIL held
            live = sorted(m.leaving.values(), key=lambda e: e.seq) if m.leaving else []
            live.extend(m.lru.values())
            return live

    def _take_out(self, m: Member, e: Entry) -> None:
        """Remove e from the index ahead of its DEL commit (with self._mu
        held: a compaction snapshot sees it in the index or leaving, never
        in neither)."""
        if self._entries.get(e.key) is e:
            del self._entries[e.key]
        m.lru.pop(e.key, None)
        m.leaving[id(e)] = e

    # Attributes, not calls of extent_io: a diagnostic (tools/bench_lmcache
    # --skip-crc) swaps them on one store to read without the CRC32C check.
    _io_parts = staticmethod(extent_io.io_parts)
    _chunk_crc = staticmethod(extent_io.chunk_crc)

    # ------------------------------------------------------------------ put
    async def _allocate(self, m: Member, length: int, taken: list) -> int:
        """Extent for length bytes on m, evicting least recently used chunks
        (their DEL records made durable before their space is reused)."""
        if m.blocks(length) > m.capacity:
            raise DeviceFullError(28, f"a chunk of {length} bytes exceeds the store's capacity "
                                  f"per device ({m.capacity} bytes)", m.dev.target)
        while True:
            with self._mu:
                off = m.take(length)
                if off is not None:
                    taken.append((m, off, length))
                    return off
                victims = m.victims(length)
                if not victims:
                    raise DeviceFullError(
                        28, f"no space for a chunk of {length} bytes: every chunk is in use",
                        m.dev.target)
                for victim in victims:
                    self._take_out(m, victim)
            await self._commit_dels(m, victims, self._evicted)

    async def _commit_dels(self, m: Member, gone: list[Entry], done: Any,
                           restore: bool = True) -> None:
        """Log DEL records for entries already taken out of the index (by
        _take_out); once they are durable, done(m, gone).  If the commit
        fails, the entries still hold their extents (reusing blocks the log
        points at could let a crash resurrect an old record over new data)
        and, unless restore is False, go back into the index as the oldest
        chunks, where the key was not stored again meanwhile: the log still
        has them (a compaction meanwhile kept them, see _live), so they are
        still the store's."""
        applied: list[int] = []
        settled: list[bool] = []

        def apply(seq: int) -> None:
            # on the log's thread, before its next commit: from here on a
            # compaction must not keep them
            applied.append(seq)
            with self._mu:
                for e in gone:
                    m.leaving.pop(id(e), None)
            done(m, gone)

        def failed() -> None:
            # On the log's thread, under its lock, before any later commit
            # is applied: a newer put of one of these keys (and its delete)
            # can only come after, so "not stored again meanwhile" is exact.
            settled.append(True)
            with self._mu:
                for e in gone:
                    m.leaving.pop(id(e), None)
                if not restore or applied:
                    return
                for e in reversed(gone):
                    if e.key not in self._entries:
                        self._entries[e.key] = e
                        m.lru[e.key] = e
                        m.lru.move_to_end(e.key, last=False)
                    else:  # superseded meanwhile: only its extent is left
                        m.release(e)
        try:
            await self._commit(m, [Record(REC_DEL, e.key, m.index, e.off, e.length, 0)
                                   for e in gone], apply, failed)
        except BaseException:
            if not applied and not settled:
                failed()  # the commit never ran (its thread was shut down)
            raise

    def _evicted(self, m: Member, victims: list[Entry]) -> None:
        """Their DEL records are durable: their space may be reused."""
        with self._mu:
            for e in victims:
                m.release(e)
            self._counters["evictions"] += len(victims)
        hook = self.on_evict
        if hook is not None and victims:
            try:
                hook([(e.key, e.length) for e in victims])
            except Exception:  # noqa: BLE001 - a listener's failure is not the store's
                log.exception("fx100io: on_evict failed")

    async def batch_put(self, keys: Sequence[Any], bufs: Sequence[Any], *,
                        priority: Any = None) -> None:
        """Store each buffer under its key, durably; replaces existing chunks.
        A list or tuple of buffers in place of one is stored as one chunk,
        the pieces one after the other, each written straight from its own
        memory (gathered: a host page whose K and V lie apart).  priority:
        "store" unless given (fx100io.Priority)."""
        self._check_open()
        pr = prio.parse(priority, prio.STORE)
        sid = prio.new_stream()
        if len(keys) != len(bufs):
            raise InvalidArgumentError(22, f"{len(keys)} keys but {len(bufs)} buffers")
        items = [(normalize_key(k), pieces(b, writable=False)) for k, b in zip(keys, bufs)]
        if not items:
            return
        taken: list = []
        started: list = []
        try:
            placed = [(key, ps, self._member_of(key)) for key, ps in items]
            offs = [await self._allocate(m, nbytes(ps), taken) for _key, ps, m in placed]
            # Every write at once; each chunk's CRC32C is computed in C as its
            # pieces leave, while the device works on the rest.
            for i, ((_key, ps, m), off) in enumerate(zip(placed, offs)):
                segs: list = []
                started.append((m, i, segs))  # each piece is recorded once it started
                for pos, mv in placed_pieces(self._gathered(m, ps, WRITE)):
                    parts = self._io_parts(m.dev, WRITE, off + pos, mv)[0]
                    segs.append((mv, m.dev.start(parts, priority=pr, stream=sid), parts))
            crcs = [0] * len(placed)  # an empty chunk's CRC32C is 0
            for m, i, segs in started:
                crc, crc_len = 0, 0
                for mv, fs, parts in segs:
                    done = await written(m.dev, fs, parts)
                    crc = join_crc(crc, crc_len, self._chunk_crc(m.dev, mv, done), mv.nbytes)
                    crc_len += mv.nbytes
                crcs[i] = crc
            members = {id(m): m for m, *_ in started}
            for m in members.values():
                await m.dev.flush(priority=pr)
            by_member: dict[int, tuple[Member, list]] = {}
            for (key, ps, m), off, crc in zip(placed, offs, crcs):
                by_member.setdefault(id(m), (m, []))[1].append((key, off, nbytes(ps), crc))
            for m, rows in by_member.values():
                recs = [Record(REC_PUT, key, m.index, off, n, crc) for key, off, n, crc in rows]
                await self._commit(m, recs,
                                   lambda seq, m=m, rows=rows: self._apply_puts(m, rows, seq,
                                                                                taken))
        except BaseException:
            # Writes already handed to the kernel still land; their extents
            # may be reused only after they have (cancelling the await does
            # not cancel the I/O).
            writes = [f for _m, _i, segs in started for _mv, fs, _parts in segs for f in fs]
            try:
                await settle(writes)
            except asyncio.CancelledError:
                pass  # cancelled again while waiting: this put is failing anyway
            with self._mu:
                for m, off, length in taken:
                    if m.log.in_doubt:
                        # A reopen may take the half that holds this put's
                        # records (folded into the failed compaction): its
                        # extents stay taken, so no other put overwrites them.
                        continue
                    m.give_back(off, length)
            raise
        with self._mu:
            self._counters["puts"] += len(items)
            self._counters["bytes_written"] += sum(nbytes(p) for _, p in items)

    @staticmethod
    def _gathered(m: Member, ps: list[memoryview], op: int) -> list[memoryview]:
        """The pieces as they can move in place: a device that moves whole
        blocks only needs every piece but the last to be whole blocks (the
        next one starts on a block); otherwise the chunk goes through one
        aligned bounce buffer (filled here for a write; for a read the
        caller scatters it, see pieces.scatter)."""
        if len(ps) < 2 or not m.dev.aligned_only or all(
                p.nbytes % m.dev.block_size == 0 for p in ps[:-1]):
            return ps
        return [gather(ps) if op == WRITE else aligned_array(nbytes(ps)).data]

    def _apply_puts(self, m: Member, rows: list, seq: int, taken: list) -> None:
        """Point the keys at their new extents, now owned by their entries
        (so no longer the put's to give back if it fails or is cancelled
        later)."""
        with self._mu:
            taken[:] = [t for t in taken if t[0] is not m]
            for key, off, n, crc in rows:
                old = self._entries.get(key)
                e = Entry(key, m.index, off, n, crc, seq)
                self._entries[key] = e
                if old is not None:
                    om = self._members[old.dev]
                    om.lru.pop(key, None)
                    om.release(old)
                m.lru[key] = e

    # ------------------------------------------------------------------ get
    async def batch_get(self, keys: Sequence[Any], bufs: Sequence[Any], *,
                        priority: Any = None) -> list[bool]:
        """Fill each buffer with its key's chunk; True where found and intact.
        A list or tuple of buffers in place of one receives the chunk piece
        after piece (scattered, straight into each piece's memory).
        priority: "load" unless given (fx100io.Priority); the batch is one
        stream, taking turns with other loads piece by piece."""
        self._check_open()
        pr = prio.parse(priority, prio.LOAD)
        sid = prio.new_stream()
        if len(keys) != len(bufs):
            raise InvalidArgumentError(22, f"{len(keys)} keys but {len(bufs)} buffers")
        vecs = [pieces(b, writable=True) for b in bufs]
        nkeys = [normalize_key(k) for k in keys]
        hits: list[Entry | None] = []
        with self._mu:
            for key, ps in zip(nkeys, vecs):
                e = self._entries.get(key)
                if e is not None and nbytes(ps) < e.length:
                    raise BufferTooSmallError(
                        22, f"buffer of {nbytes(ps)} bytes is smaller than the chunk of "
                        f"{e.length} bytes under key {key!r}")
                hits.append(e)
            for e in hits:
                if e is not None:
                    e.readers += 1
                    self._members[e.dev].lru.move_to_end(e.key, last=True)
        out = [False] * len(nkeys)
        try:
            groups: dict[int, list] = {}
            for i, (e, ps) in enumerate(zip(hits, vecs)):
                if e is None:
                    continue
                if e.length == 0:
                    out[i] = True
                    continue
                groups.setdefault(e.dev, []).append((i, e, limit(ps, e.length)))
            started: list = []
            corrupt: list = []
            try:
                for dev, rows in groups.items():
                    m = self._members[dev]
                    for i, e, ps in rows:
                        moved = self._gathered(m, ps, READ)
                        segs: list = []
                        # recorded before its pieces start: each started piece is
                        # awaited below, or by the cleanup if a later start fails
                        started.append((m, i, e, segs, ps if moved is not ps else None))
                        for pos, view in placed_pieces(moved):
                            parts, fixup = self._io_parts(m.dev, READ, e.off + pos, view)
                            segs.append((view, m.dev.start(parts, priority=pr, stream=sid),
                                         fixup))
                for m, i, e, segs, scatter_to in started:
                    total, crc, crc_len, failed = 0, 0, 0, None
                    for view, fs, fixup in segs:
                        res, done = await landed(fs, fixup)
                        if failed is not None:
                            continue
                        if res != view.nbytes:
                            failed = (error_from_errno(-res, m.dev.target) if res < 0
                                      else f"short read {total + res} of {e.length}")
                            continue
                        total += res
                        crc = join_crc(crc, crc_len, self._chunk_crc(m.dev, view, done),
                                       view.nbytes)
                        crc_len += view.nbytes
                    if failed is not None:
                        log.error("fx100io: read of chunk %r failed: %s", e.key, failed)
                        continue
                    if crc != e.crc:
                        log.error("fx100io: corruption: chunk %r on %s at %d failed its CRC32C "
                                  "check; dropping it", e.key, m.dev.target, e.off)
                        corrupt.append((m, e))
                        continue
                    if scatter_to is not None:
                        scatter(segs[0][0], scatter_to)
                    out[i] = True
            except BaseException:
                # reads already handed to the kernel still land in the caller's
                # buffers: return only once they have
                reads = [f for *_x, segs, _s in started for _v, fs, _f in segs for f in fs]
                try:
                    await settle(reads)
                except asyncio.CancelledError:
                    pass  # cancelled again while waiting: raised below all the same
                raise
        finally:
            with self._mu:
                for e in hits:
                    if e is not None:
                        e.readers -= 1
                        if e.dead and not e.readers:
                            self._members[e.dev].release(e)
                nhit = sum(out)
                self._counters["gets"] += len(nkeys)
                self._counters["hits"] += nhit
                self._counters["misses"] += len(nkeys) - nhit
                self._counters["bytes_read"] += sum(e.length for e, ok in zip(hits, out) if ok and e)
        for m, e in corrupt:
            self._count(corruptions=1)
            await self._drop(m, e, corrupt=True)
        return out

    async def _drop(self, m: Member, e: Entry, corrupt: bool = False) -> bool:
        with self._mu:
            if self._entries.get(e.key) is not e:
                return False
            self._take_out(m, e)
        # A corrupt chunk stays out of the index even if its DEL is lost.
        await self._commit_dels(m, [e], self._released, restore=not corrupt)
        return True

    def _released(self, m: Member, gone: list[Entry]) -> None:
        with self._mu:
            for e in gone:
                m.release(e)

    # --------------------------------------------------------------- others
    async def batch_exists(self, keys: Iterable[Any]) -> int:
        """How many leading keys are present (the prefix hit count)."""
        self._check_open()
        n = 0
        with self._mu:
            for k in keys:
                if normalize_key(k) not in self._entries:
                    break
                n += 1
        return n

    def contains(self, key: Any) -> bool:
        self._check_open()
        return normalize_key(key) in self._entries

    def chunk_size(self, key: Any) -> int | None:
        """Size in bytes of the chunk under key, or None."""
        self._check_open()
        e = self._entries.get(normalize_key(key))
        return None if e is None else e.length

    def keys(self) -> list[bytes]:
        self._check_open()
        with self._mu:
            return list(self._entries)

    async def delete(self, key: Any) -> bool:
        """Remove a chunk durably; False if it was not there."""
        self._check_open()
        k = normalize_key(key)
        e = self._entries.get(k)
        if e is None:
            return False
        ok = await self._drop(self._members[e.dev], e)
        if ok:
            self._count(deletes=1)
        return ok

    async def batch_delete(self, keys: Sequence[Any]) -> list[bool]:
        """Remove many chunks durably with one index commit per device; per
        key, whether it was there and is now gone.  A device whose commit
        fails keeps its chunks (False); if none could be deleted because of
        that, the error is raised."""
        self._check_open()
        out = [False] * len(keys)
        by_member: dict[int, list[tuple[int, Entry]]] = {}
        with self._mu:
            for i, key in enumerate(keys):
                k = normalize_key(key)
                e = self._entries.get(k)
                if e is None:
                    continue
                self._take_out(self._members[e.dev], e)
                by_member.setdefault(e.dev, []).append((i, e))
        error: BaseException | None = None
        for dev, pairs in by_member.items():
            try:
                await self._commit_dels(self._members[dev], [e for _, e in pairs],
                                        self._released)
            except Exception as exc:  # noqa: BLE001 - the others still go
                error = error or exc
                continue
            for i, _ in pairs:
                out[i] = True
        n = sum(out)
        if n:
            self._count(deletes=n)
        if error is not None and not n:
            raise error
        return out

    def touch(self, keys: Iterable[Any]) -> int:
        """Mark chunks as just used (the LRU evicts them last); how many were there."""
        self._check_open()
        n = 0
        with self._mu:
            for key in keys:
                e = self._entries.get(normalize_key(key))
                if e is not None:
                    lru = self._members[e.dev].lru
                    if e.key in lru:
                        lru.move_to_end(e.key)
                    n += 1
        return n

    def _count(self, **deltas: int) -> None:
        with self._mu:
            for name, n in deltas.items():
                self._counters[name] += n

    def stats(self) -> dict[str, Any]:
        with self._mu:
            s: dict[str, Any] = dict(self._counters)
            s["compactions"] = sum(m.log.compactions for m in self._members)
            s["chunks"] = len(self._entries)
            s["bytes_used"] = sum(m.used for m in self._members)
            s["capacity"] = sum(m.capacity for m in self._members)
            s["devices"] = [
                dict(uri=m.dev.uri, chunks=len(m.lru), used=m.used, capacity=m.capacity,
                     free_extents=int(m.alloc.free_extents), engine=m.dev.engine,
                     direct=m.dev.direct, index_generation=m.log.generation)
                for m in self._members]
            return s

    def _run_blocking(self, coro: Any) -> Any:
        # this thread's own loop: each thread gets its own device queues
        return run_blocking(coro)

    # ---------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Close the devices.  Every put that returned is already durable.
        Index commits already queued finish first (up to a compaction): in
        a running event loop use ``await store.aclose()`` (or ``async
        with``), which waits for them off the loop."""
        if self._closed:
            return
        self._closed = True
        self._close_logs()
        self._close_devices()

    async def aclose(self) -> None:
        """:meth:`close` for coroutines: the wait for queued index commits
        runs off the event loop."""
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._close_logs)
        self._close_devices()

    def _close_logs(self) -> None:
        for m in self._members:
            m.log.close()  # commits already queued finish first

    def _close_devices(self) -> None:
        for m in self._members:
            m.dev.close()
        unlock(self._locks)

    def __repr__(self) -> str:
        uris = [m.dev.uri for m in self._members] if not self._closed else "closed"
        return f"ChunkStore({uris}, chunks={len(self._entries)})"


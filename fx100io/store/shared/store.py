"""SharedChunkStore: the ChunkStore API over namespaces that many hosts
open at once, with the index and the allocator in Redis.

Protocol of a put:
  1. extents allocated by an atomic script (never the same extent to two
     hosts), each under a lease that Redis reclaims if the host dies;
  2. chunk data written (its CRC32C computed in C as it leaves), then the
     extent's header (key, length, CRC32C, version), then the device
     flushed;
  3. only then published by a second script, which also retires the key's
     older extent.  A put whose lease was reclaimed meanwhile publishes
     nothing and fails.
While it writes, a put renews its leases (every third of lease_s), so a
slow device never lets its extents be reclaimed under it; a put that
finds a lease gone (or cannot confirm it within lease_s, Redis being
unreachable) writes nothing more -- no header -- and fails, since the
extent may already hold another host's chunk.
Protocol of a get: a script returns the entries and pins their extents
(reader leases), the data is read and its CRC32C checked (a mismatch is a
miss, never bytes), and the pins are dropped.  An extent retired while
pinned is freed by its last reader, or when the pin expires.

Redis unreachable, or answering with an error of its own (BUSY with
another client's long script, READONLY after a failover, OOM, LOADING):
gets are misses, exists/contains/keys say nothing is there, puts and
deletes raise IndexUnavailableError, within the socket timeout, and for
``retry_after`` seconds without even trying.

Every extent that leaves the index (a delete, a newer put of its key, an
eviction) has its header erased before its space is reused (see
``rebuild``), even where the put or delete that took it out is cancelled
once its script was sent: the cancel propagates after the erase.  A put
that finds no room evicts least recently used chunks (by order of last
access); one that fails all the same (DeviceFullError) leaves them
evicted.

A cancelled get returns only once every read it started has landed: no
byte of the caller's buffers changes after it returned.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any

from fx100io import _core, fabric_uri
from fx100io import priority as prio
from fx100io.device import Device, open_device
from fx100io.errors import (
    BufferTooSmallError,
    DeviceFullError,
    FxTimeoutError,
    InvalidArgumentError,
    NotAStoreError,
    error_from_errno,
)
from fx100io.pool import aligned_array
from fx100io.store.core.base import StoreBase
from fx100io.store.core.extent_io import READ, WRITE, chunk_crc, io_parts, landed, written
from fx100io.store.core.keys import normalize_key
from fx100io.store.core.pieces import one_buffer
from fx100io.store.core.settle import settle
from fx100io.store.core.superblock import (
    BLOCK,
    SB_MAGIC,
    check_same_set,
    check_whole_set,
    new_set_id,
    read_block0,
    write_block0,
)
from fx100io.store.shared import format as fmt
from fx100io.store.shared.index import (
    Hit,
    IndexLostError,
    IndexNotReplicatedError,
    IndexUnavailableError,
    RedisIndex,
    parse_entry,
)
from fx100io.store.shared.runner import Runner

log = logging.getLogger("fx100io")

DEFAULT_INDEX = "redis://127.0.0.1:6379/0"


class Namespace:
    """One namespace of the pool: its device and its superblock."""

    def __init__(self, dev: Device, sb: fmt.Superblock):
        self.dev = dev
        self.sb = sb

    @property
    def index(self) -> int:
        return self.sb.dev_index


class _Found:
    """What a namespace held before a create: block 0 as it was (None where
    there was no such file yet, or a shorter one: it reads as zeros once
    created), the shared pool's superblock there if any, and whether it is
    a ChunkStore's."""

    def __init__(self, raw: bytes | None, sb: fmt.Superblock | None, plain: bool):
        self.raw = raw
        self.sb = sb
        self.plain = plain

    def same(self, now: bytes) -> bool:
        """Whether block 0 still holds what it held when probed."""
        return now == (self.raw if self.raw is not None else bytes(len(now)))


def _probe(uri: str, opts: dict[str, Any]) -> _Found:
    """What uri holds as it is now (opened read-only)."""
    try:
        d = open_device(uri, **{**opts, "readonly": True})
    except FileNotFoundError:
        return _Found(None, None, False)
    try:
        got = read_block0(d) if d.size >= BLOCK else b""
        if len(got) < BLOCK:
            return _Found(None, None, False)
        try:
            return _Found(got, fmt.Superblock.decode(got, d.uri), False)
        except NotAStoreError:
            return _Found(got, None, got[:len(SB_MAGIC)] == SB_MAGIC)
    finally:
        d.close()


DEFAULT_INDEX_TIMEOUT_S = 0.5


def default_index_timeout() -> float:
    """Redis socket timeout when the caller gives none: FX100IO_INDEX_TIMEOUT (seconds)
    where set, for hosts too loaded to answer within 0.5 s, else 0.5 s."""
    text = os.environ.get("FX100IO_INDEX_TIMEOUT", "").strip()
    if not text:
        return DEFAULT_INDEX_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InvalidArgumentError(
            22, f"FX100IO_INDEX_TIMEOUT must be a positive number of seconds, got {text!r}")
    return value


class SharedChunkStore(StoreBase):
    """A key -> chunk store shared by every host that opens the same
    namespaces and the same Redis index.

    ``SharedChunkStore(uris, index="redis://host:port/0", create=False,
    size=None, **opts)``: ``create=True`` formats the namespaces and
    installs a fresh, empty index (one host does that, once); the others
    open them.  Options: name (the pool's name in Redis, default "pool"),
    capacity (bytes of extents kept before LRU eviction, whole pool),
    lease_s (how long an unpublished allocation outlives its host, 30),
    pin_s (how long a reader's pin outlives its reader, 30), timeout
    (Redis socket timeouts: 0.5 s, or FX100IO_INDEX_TIMEOUT from the
    environment), retry_after (1 s), index_replicas (how many Redis replicas
    must confirm a put's or a delete's index change before it returns: by
    default 1 where the primary has a replica, else 0; also an index URL
    option; see docs/shared-pool.md), force (with create: format and
    install all the same where create refuses: Redis holds a pool of that
    name, a namespace holds a ChunkStore or any shared pool, whether its
    index is in this Redis, lost, or elsewhere; those are wiped), and the
    device options of :func:`open_device`.

    A pool's name is 1 to 64 characters of A-Z a-z 0-9 . _ - (the first a
    letter or digit): it is part of the index's Redis keys.  create claims
    the name in Redis before it writes a byte, so a create that is refused
    changes nothing.

    The blocking twins run on one event loop thread of the store's own,
    whatever thread calls them: one Redis connection pool and one I/O
    queue per store, not per calling thread.  close() cancels the blocking
    calls other threads are inside, waits for them (5 s at most; their
    reads land, their extents go back), and they raise StoreClosedError;
    so does every call after close().
    """

    def __init__(self, uris: str | Sequence[str], index: str = DEFAULT_INDEX,
                 create: bool = False, size: int | None = None, *, name: str | None = None,
                 capacity: int | None = None, lease_s: float = 30.0, pin_s: float = 30.0,
                 timeout: float | None = None, retry_after: float = 1.0, force: bool = False,
                 index_replicas: int | None = None, **opts: Any):
        if timeout is None:
            timeout = default_index_timeout()
        uri_list = [uris] if isinstance(uris, str) else list(uris)
        if not uri_list:
            raise InvalidArgumentError(22, "SharedChunkStore needs at least one namespace URI")
        if capacity is not None and (not isinstance(capacity, int) or capacity <= 0):
            raise InvalidArgumentError(22, f"capacity must be a positive int, got {capacity!r}")
        for what, v in (("lease_s", lease_s), ("pin_s", pin_s), ("timeout", timeout)):
            if not isinstance(v, (int, float)) or v <= 0:
                raise InvalidArgumentError(22, f"{what} must be positive, got {v!r}")
        for what, v in (("lease_s", lease_s), ("pin_s", pin_s)):
            if v < 0.001:  # Redis counts them in whole milliseconds
                raise InvalidArgumentError(22, f"{what} must be at least 0.001 s, got {v!r}")
        self._closed = False
        self._bg: set[asyncio.Task] = set()
        self._runner = Runner()
        self._mu = threading.Lock()
        self._lease_ms = int(lease_s * 1000)
        self._pin_ms = int(pin_s * 1000)
        self._host = f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        self._counters = dict(puts=0, gets=0, hits=0, misses=0, corruptions=0, deletes=0,
                              bytes_written=0, bytes_read=0, index_errors=0, superseded=0)
        devices: list[Device] = []
        try:
            if create:
                pool_name = fmt.check_name("pool" if name is None else name)
                self._create(uri_list, index, pool_name, size, capacity, force, devices,
                             timeout=timeout, retry_after=retry_after,
                             replicas=index_replicas, **opts)
            else:
                if name is not None:
                    fmt.check_name(name, given_for="name=")
                for u in uri_list:
                    devices.append(open_device(u, **opts))
                self._ns = self._load(devices, uri_list, name)
                pool = self._ns[0].sb
                self._index = RedisIndex(index, pool.name, pool.set_id, timeout=timeout,
                                         retry_after=retry_after, replicas=index_replicas)
                self._index.check_policy()
                self._check_index()
        except BaseException:
            for d in devices:
                d.close()
            raise

    # ------------------------------------------------------------ format/open
    def _create(self, uris: list[str], url: str, name: str, size: int | None,
                capacity: int | None, force: bool, devices: list[Device], *, timeout: float,
                replicas: int | None,
                retry_after: float, **opts: Any) -> None:
        """Create the pool: check what each namespace holds, claim the name
        in Redis, and only then write a byte.  Without force it refuses a
        namespace that holds a ChunkStore, or any shared pool but a create
        of its own name that died (its claim's deadline passed): a pool
        whose index is live here, being created, lost (``fx100io
        shared-rebuild`` recovers it) or kept in another Redis.  A refusal
        leaves the namespaces and Redis as they were.

        Two creates over the same namespaces under different names (or
        with different Redis servers) claim different names, so the
        namespaces themselves arbitrate: before each superblock it writes,
        a create renews its claim and re-reads block 0, and refuses where it
        is no longer what it probed (another create wrote there); at the
        install it re-reads every superblock and refuses unless all are its
        own.  A create refused that way puts back the blocks it wrote that
        still hold its superblock, and gives the name back.  What remains:
        two creates whose re-read and write of one namespace interleave
        (one read and one write apart) both write it; then at most one of
        them installs, and the other may also put back the block it wrote
        over the winner's (both then refuse, or the winner's pool misses a
        superblock and does not open).  A create that dies after its first
        write leaves its claim, and its namespaces may be formatted again
        once the claim's deadline passed (lease_s after its last renewal)."""
        set_id = new_set_id()
        found = [_probe(u, opts) for u in uris]
        for u, f in zip(uris, found):
            if f.plain and not force:
                raise NotAStoreError(
                    17, "the namespace holds a ChunkStore: refusing to format it; pass "
                    "force=True to wipe that store", fabric_uri.redact(u))
        idx = self._index = RedisIndex(url, name, set_id, timeout=timeout,
                                       retry_after=retry_after, replicas=replicas)
        idx.check_policy()
        prev = idx.claim(self._host, self._lease_ms, force)
        # P:meta of this name before the claim (a flat list of bytes)
        before = {prev[i]: prev[i + 1] for i in range(0, len(prev), 2)}
        written: list[tuple[Device, _Found]] = []
        try:
            # every namespace checked before any other pool's index is wiped
            # (namespaces of one pool share it)
            wipe = {(sb.name, sb.set_id) for u, f in zip(uris, found) if (sb := f.sb)
                    and self._may_format(idx, u, sb, name, before, force)}
            for other, other_set in wipe:
                idx.wipe_pool(other, other_set)
            for u in uris:
                devices.append(open_device(u, create=True, size=size, **opts))
            sbs = [fmt.plan(d.size, i, len(devices), set_id, name, d.uri)
                   for i, d in enumerate(devices)]
            self._ns = []
            for d, sb, f in zip(devices, sbs, found):
                idx.renew_claim(self._lease_ms)  # still ours, and lease_s more to write
                if not f.same(read_block0(d)):
                    raise NotAStoreError(
                        17, "the namespace changed since this create looked at it (another "
                        "create formatted it at the same time?): refusing to format it",
                        d.uri)
                written.append((d, f))
                self._ns.append(self._write_superblock(d, sb))
            self._install(capacity)
        except NotAStoreError:
            # refused (nothing written yet, or another create raced this one):
            # what this create wrote goes back, then its claim
            if self._put_back(written, set_id):
                self._unclaim(idx, prev, name)
            idx.close()
            raise
        except BaseException:
            if not written:  # nothing written: the name goes back as it was
                self._unclaim(idx, prev, name)
            idx.close()
            raise

    @staticmethod
    def _may_format(idx: RedisIndex, u: str, sb: fmt.Superblock, name: str,
                    before: dict[Any, Any], force: bool) -> bool:
        """Refuse (unless force) to format a namespace that holds the shared
        pool sb, but where it is a create that died; True where the index
        (or claim) of that pool, under another name, is to be wiped."""
        if sb.name == name and before.get(b"set_id") == sb.set_id.hex().encode():
            # this name's claim or index (CLAIM granted it: a create that died,
            # or force); the install replaces it
            return False
        state = idx.pool_of(sb.name, sb.set_id)
        if state is not None and (state == "dead" or force):
            return sb.name != name  # (one of this name the install replaces)
        if state is None and force:
            return False
        if state is None:
            why = (f"Redis at {idx.url} holds no index of it: it was lost (`fx100io "
                   "shared-rebuild` re-derives it from the namespaces), or it is kept in "
                   "another Redis")
        else:
            why = (f"its index is {'installed' if state == 'live' else 'being created'} in "
                   f"{idx.url}")
        raise NotAStoreError(
            17, f"the namespace holds shared pool {sb.name!r} ({why}): refusing to format "
            "it; pass force=True to wipe that pool", fabric_uri.redact(u))

    @staticmethod
    def _put_back(written: list[tuple[Device, _Found]], set_id: bytes) -> bool:
        """Put back block 0 of each namespace this create wrote, where it
        still holds its superblock; True if none is left with one."""
        clean = True
        for d, f in written:
            try:
                now = read_block0(d)
                try:
                    mine = fmt.Superblock.decode(now, d.uri).set_id == set_id
                except NotAStoreError:
                    mine = False
                if not mine:
                    continue  # another create's by now: not ours to touch
                write_block0(d, f.raw if f.raw is not None else bytes(BLOCK))
            except OSError as e:
                log.warning("fx100io: could not put back block 0 of %s: %s", d.uri, e)
                clean = False
        return clean

    @staticmethod
    def _unclaim(idx: RedisIndex, prev: list[Any], name: str) -> None:
        try:
            idx.unclaim(prev)
        except Exception as e:  # noqa: BLE001 (the claim then ends after lease_s)
            log.warning("fx100io: could not give back the claim on pool %r: %s", name, e)

    @staticmethod
    def _write_superblock(d: Device, sb: fmt.Superblock) -> Namespace:
        write_block0(d, sb.encode())
        return Namespace(d, sb)

    @staticmethod
    def _load(devices: list[Device], uris: list[str], name: str | None) -> list[Namespace]:
        sbs = []
        uris = [d.uri for d in devices]  # redacted: these go into messages
        for d, u in zip(devices, uris):
            # a short read (a namespace under one block) reads as zeros after its end
            sb = fmt.Superblock.decode(read_block0(d).ljust(BLOCK, b"\0"), u)
            if sb.data_off + sb.data_size > d.size:
                raise NotAStoreError(22, "the namespace is smaller than the pool's layout", u)
            sbs.append(sb)
        check_same_set(sbs, uris, "namespace belongs to another pool than")
        if name is not None and sbs[0].name != name:
            raise NotAStoreError(22, f"the pool on these namespaces is {sbs[0].name!r}, "
                                 f"not {name!r}", uris[0])
        check_whole_set(sbs, uris, "the pool has {ndevs} namespaces; {given} given "
                        "(pass every namespace of the pool)")
        order = sorted(range(len(devices)), key=lambda i: sbs[i].dev_index)
        return [Namespace(devices[i], sbs[i]) for i in order]

    def _caps(self, capacity: int | None) -> list[int]:
        per = None if capacity is None else capacity // len(self._ns)
        return [ns.sb.data_size if per is None else min(per, ns.sb.data_size)
                for ns in self._ns]

    def _install(self, capacity: int | None) -> None:
        def all_ours() -> None:
            # another create may have formatted a namespace since we wrote it
            for ns in self._ns:
                if read_block0(ns.dev) != ns.sb.encode():
                    raise NotAStoreError(
                        17, "the namespace no longer holds this create's superblock (another "
                        "create formatted it at the same time?): nothing installed",
                        ns.dev.uri)
        free = [[(ns.sb.data_off, ns.sb.data_size)] for ns in self._ns]
        self._index.install(len(self._ns), self._caps(capacity), free, replace="claimed",
                            check=all_ours)

    def _check_index(self) -> None:
        """A pool whose index is down opens (gets miss until it is back);
        one whose index names another pool does not."""
        try:
            sid = self._index.meta_set_id()
        except IndexUnavailableError as e:
            log.warning("fx100io: %s; opening the pool anyway (gets miss, puts fail until "
                        "it answers)", e)
            return
        if sid is None:
            log.warning("fx100io: Redis at %s holds no index of pool %r: gets miss and puts "
                        "fail until `fx100io shared-rebuild` re-derives it", self._index.url,
                        self._ns[0].sb.name)
        elif sid != self._index.set_id:
            raise NotAStoreError(22, f"the index of pool {self._ns[0].sb.name!r} in Redis "
                                 "belongs to other namespaces (another pool of the same "
                                 "name?)", self._index.url)

    # ------------------------------------------------------------ helpers
    def _ns_of(self, key: bytes) -> Namespace:
        return self._ns[_core.crc32c(key) % len(self._ns)]

    def _count(self, **deltas: int) -> None:
        with self._mu:
            for k, n in deltas.items():
                self._counters[k] += n

    # ------------------------------------------------------------------ put
    async def batch_put(self, keys: Sequence[Any], bufs: Sequence[Any], *,
                        priority: Any = None) -> None:
        """Store each buffer under its key, durably, visible to every host
        once this returns; replaces existing chunks.  Raises
        IndexUnavailableError when Redis does not answer.  priority:
        "store" unless given (fx100io.Priority)."""
        self._check_open()
        pr = prio.parse(priority, prio.STORE)
        sid = prio.new_stream()
        if len(keys) != len(bufs):
            raise InvalidArgumentError(22, f"{len(keys)} keys but {len(bufs)} buffers")
        items = [(normalize_key(k), one_buffer(b, False)) for k, b in zip(keys, bufs)]
        if not items:
            return
        placed = [(key, mv, self._ns_of(key)) for key, mv in items]
        exts = [fmt.extent_len(mv.nbytes) for _k, mv, _ns in placed]
        wants = [(ns.index, ext) for (_k, _mv, ns), ext in zip(placed, exts)]
        for _round in range(16):
            got, evicted = await self._alloc(wants)
            if got is not None:
                break
        else:
            raise DeviceFullError(28, "no space for this put after evicting chunks 16 times: "
                                  "the rest is being written or read", self._index.url)
        allocs = got
        eraser: asyncio.Task | None = (
            asyncio.get_running_loop().create_task(self._erase(evicted)) if evicted else None)
        leases = [f"{ns.index}:{off}:{ext}:{ver}"
                  for (_k, _mv, ns), ext, (off, ver) in zip(placed, exts, allocs)]
        started: list[tuple[Namespace, int, memoryview, list, list]] = []
        headers: list[asyncio.Future] = []
        published = False
        keeper = _LeaseKeeper(self._index, self._lease_ms, leases)
        try:
            for i, ((_key, mv, ns), (off, _ver)) in enumerate(zip(placed, allocs)):
                if mv.nbytes:
                    parts = io_parts(ns.dev, WRITE, off + BLOCK, mv)[0]
                    started.append((ns, i, mv, ns.dev.start(parts, priority=pr, stream=sid),
                                    parts))
            crcs = [0] * len(placed)
            for ns, i, mv, fs, parts in started:
                crcs[i] = chunk_crc(ns.dev, mv, await written(ns.dev, fs, parts))
            keeper.check()  # the extents are still ours: their headers may go there
            bufs_alive = []
            for (key, mv, ns), (off, ver), crc in zip(placed, allocs, crcs):
                hdr = aligned_array(BLOCK)
                hdr[:] = memoryview(fmt.ExtentHeader(ns.sb.set_id, ns.index, ver, mv.nbytes,
                                                     crc, key).encode())
                bufs_alive.append(hdr)
                headers += ns.dev.start([(WRITE, off, hdr)], priority=pr, stream=sid)
            for f in headers:
                c = await asyncio.shield(f)
                if c[0] < 0:
                    raise error_from_errno(-c[0], "write extent header")
            for ns in {id(ns): ns for _k, _mv, ns in placed}.values():
                await ns.dev.flush(priority=pr)
            await keeper.stop()
            rows = [(ns.index, off, ext, ver, key, mv.nbytes, crc)
                    for (key, mv, ns), ext, (off, ver), crc in zip(placed, exts, allocs, crcs)]

            async def publish() -> list[int]:
                nonlocal published
                try:
                    res, retired = await self._index.publish(self._lease_ms, rows)
                except IndexNotReplicatedError as e:
                    # published on the primary all the same: its older
                    # versions' headers are erased, then the put fails
                    published = True
                    await self._erase(e.result[1])
                    raise
                published = True
                await self._erase(retired)  # the keys' older versions
                return res
            res = await _to_the_end(publish())
            if -1 in res:
                raise FxTimeoutError(
                    62, f"{res.count(-1)} of {len(res)} chunks were not published: their "
                    "allocation lease expired before their data was durable (raise lease_s?)")
            self._count(superseded=res.count(0))
        except BaseException:
            # Every step of this cleanup goes to its end however many times
            # the caller is cancelled meanwhile: writes still in flight land
            # in the extents before they are given back, else another put
            # could be handed them under our writes; and extents not given
            # back stay taken until their leases expire.
            await keeper.settle()
            if eraser is not None:  # evicted chunks: their headers are erased first
                await _wait_out(eraser)
            await _settle([f for *_x, fs, _p in started for f in fs] + headers)
            if not published:
                await _wait_out(asyncio.ensure_future(self._abort(leases)))
            raise
        if eraser is not None and await _wait_out(eraser):
            # cancelled while the evicted chunks' headers were being erased:
            # the erase went on to its end (a cancel inside it would leave
            # them erased but not flushed); the put is published all the same
            raise asyncio.CancelledError
        self._count(puts=len(items), bytes_written=sum(mv.nbytes for _k, mv in items))

    async def _abort(self, leases: list[str]) -> None:
        """Give back the extents of a put that publishes nothing."""
        try:
            await self._index.abort(leases)
        except Exception as e:  # noqa: BLE001 (the leases expire instead)
            log.warning("fx100io: could not give back %d extents (%s); they return when "
                        "their lease expires", len(leases), e)

    async def _alloc(self, wants: list[tuple[int, int]]
                     ) -> tuple[list[tuple[int, int]] | None, list[tuple[int, int, int]]]:
        """One allocation round (see RedisIndex.alloc).  Where it evicted
        chunks and found no room yet, their headers are erased before it
        returns.  A cancel once the script was sent waits for its answer:
        the allocations go back and the evicted chunks' headers are erased
        before the cancel propagates."""
        async def round_() -> tuple[list[tuple[int, int]] | None, list[tuple[int, int, int]]]:
            got, evicted = await self._index.alloc(self._lease_ms, wants)
            if got is None:
                # chunks were evicted to make room: their headers go before their space
                await self._erase(evicted)
            return got, evicted

        task = asyncio.ensure_future(round_())
        if not await _wait_out(task):
            return task.result()
        if not task.cancelled() and task.exception() is None:
            got, evicted = task.result()
            if got is not None:  # allocated meanwhile: give it back
                await _wait_out(asyncio.ensure_future(self._give_back(wants, got, evicted)))
        raise asyncio.CancelledError

    async def _give_back(self, wants: list[tuple[int, int]], got: list[tuple[int, int]],
                         evicted: list[tuple[int, int, int]]) -> None:
        await self._erase(evicted)
        await self._abort([f"{d}:{off}:{ext}:{ver}" for (d, ext), (off, ver) in zip(wants, got)])

    async def _erase(self, tombs: list[tuple[int, int, int]]) -> None:
        """Erase the headers of extents that left the index (held in P:tomb
        meanwhile), so that a rebuild of the index does not bring them back,
        then let the index retire them.  Never raises but cancellation: a
        header that could not be erased is logged, and its extent freed
        when the hold expires or at once.  Cancelled, it waits for the
        erasing writes it started and leaves the extents held: they are
        freed when the hold expires, never before the erased headers are
        flushed (else a rebuild could bring back a chunk whose extent holds
        another's data by then)."""
        if not tombs:
            return
        t0 = time.monotonic()
        try:
            blank = aligned_array(BLOCK)
            blank[:] = 0
            futs, devs = [], {}
            for d, off, _ext in tombs:
                if d < len(self._ns):
                    ns = devs[d] = self._ns[d]
                    # nobody waits for it: background work
                    futs += ns.dev.start([(WRITE, off, blank)], priority=prio.BACKGROUND)
            try:
                for f in futs:
                    c = await asyncio.shield(f)
                    if c[0] < 0:
                        raise error_from_errno(-c[0], "erase extent header")
            except BaseException:
                await _settle(futs)  # blank goes only once no write reads it
                raise
            for ns in devs.values():
                await ns.dev.flush(priority=prio.BACKGROUND)
            if time.monotonic() - t0 > self._lease_ms / 1000:
                log.warning("fx100io: erasing the headers of %d chunks that left the index "
                            "took longer than lease_s: their extents may have been reused "
                            "meanwhile", len(tombs))
        except Exception as e:  # noqa: BLE001 (only a rebuild of the index sees it)
            log.warning("fx100io: %d chunks left the index, but their headers could not be "
                        "erased (%s): a rebuild of the index may bring them back",
                        len(tombs), e)
        # (a cancel skips this: the hold expires, then the extents are freed)
        try:
            await self._index.tomb_done(tombs)
        except (IndexUnavailableError, IndexLostError):
            pass  # the hold expires, then the extents are freed

    # ------------------------------------------------------------------ get
    async def batch_get(self, keys: Sequence[Any], bufs: Sequence[Any], *,
                        priority: Any = None) -> list[bool]:
        """Fill each buffer with its key's chunk; True where found and
        intact.  Every key misses while Redis does not answer.  The pins
        are dropped by a task of the loop after this returns: one Redis
        round trip (an AOF fsync with appendfsync always) less per get.
        priority: "load" unless given (fx100io.Priority)."""
        return await self._get(keys, bufs, wait_unpin=False, priority=priority)

    async def _get(self, keys: Sequence[Any], bufs: Sequence[Any],
                   wait_unpin: bool, priority: Any = None) -> list[bool]:
        self._check_open()
        pr = prio.parse(priority, prio.LOAD)
        sid = prio.new_stream()
        if len(keys) != len(bufs):
            raise InvalidArgumentError(22, f"{len(keys)} keys but {len(bufs)} buffers")
        mvs = [one_buffer(b, True) for b in bufs]
        nkeys = [normalize_key(k) for k in keys]
        out = [False] * len(nkeys)
        if not nkeys:
            return out
        try:
            hits = await self._index.get_begin(self._host, self._pin_ms, nkeys)
        except (IndexUnavailableError, IndexLostError) as e:
            log.debug("fx100io: get misses: %s", e)
            self._count(gets=len(nkeys), misses=len(nkeys), index_errors=1)
            return out
        corrupt: list[tuple[bytes, Hit]] = []
        started: list[tuple[Namespace, int, Hit, memoryview, list, Any]] = []
        try:
            for key, h, mv in zip(nkeys, hits, mvs):
                if h is not None and mv.nbytes < h.length:
                    raise BufferTooSmallError(
                        22, f"buffer of {mv.nbytes} bytes is smaller than the chunk of "
                        f"{h.length} bytes under key {key!r}")
            for i, (h, mv) in enumerate(zip(hits, mvs)):
                if h is None:
                    continue
                if h.length == 0:
                    out[i] = h.crc == 0
                    continue
                ns = self._ns[h.dev]
                view = mv[:h.length]
                parts, fixup = io_parts(ns.dev, READ, h.off + BLOCK, view)
                started.append((ns, i, h, view, ns.dev.start(parts, priority=pr, stream=sid),
                                fixup))
            for ns, i, h, view, fs, fixup in started:
                res, done = await landed(fs, fixup)
                if res != h.length:
                    why = (error_from_errno(-res, ns.dev.target) if res < 0
                           else f"short read {res} of {h.length}")
                    log.error("fx100io: read of chunk %r failed: %s", nkeys[i], why)
                    continue
                if chunk_crc(ns.dev, view, done) != h.crc:
                    log.warning("fx100io: chunk %r on %s at %d failed its CRC32C check (torn, "
                                "or its extent was reused): a miss", nkeys[i], ns.dev.target,
                                h.off)
                    corrupt.append((nkeys[i], h))
                    continue
                out[i] = True
        except BaseException:
            # reads already started still land in the caller's buffers (a
            # cancel does not stop the I/O): return only once they have, and
            # keep the extents pinned until then
            await _settle([f for *_x, fs, _fix in started for f in fs])
            raise
        finally:
            pins = [h.pin for h in hits if h is not None]
            if pins and wait_unpin:
                await self._unpin(pins)
            elif pins:
                t = asyncio.get_running_loop().create_task(self._unpin(pins))
                self._bg.add(t)
                t.add_done_callback(self._bg.discard)
            nhit = sum(out)
            self._count(gets=len(nkeys), hits=nhit, misses=len(nkeys) - nhit,
                        bytes_read=sum(h.length for h, ok in zip(hits, out) if ok and h))
        for key, h in corrupt:
            self._count(corruptions=1)
            try:
                await self._index.drop(key, h.ver)
            except (IndexUnavailableError, IndexLostError):
                pass
        return out

    async def _unpin(self, pins: list[bytes]) -> None:
        try:
            await self._index.get_end(pins)
        except (IndexUnavailableError, IndexLostError):
            pass  # the pins expire

    # --------------------------------------------------------------- others
    async def batch_exists(self, keys: Iterable[Any]) -> int:
        """How many leading keys are present (0 while Redis does not answer)."""
        self._check_open()
        nkeys = [normalize_key(k) for k in keys]
        if not nkeys:
            return 0
        try:
            return await self._index.exists(nkeys)
        except (IndexUnavailableError, IndexLostError):
            self._count(index_errors=1)
            return 0

    async def _entries(self, keys: Sequence[Any]) -> list[tuple[int, ...] | None]:
        nkeys = [normalize_key(k) for k in keys]
        if not nkeys:
            return []
        try:
            vs = await self._index.call(lambda r, p: r.hmget(f"{p}:idx", nkeys))
        except IndexUnavailableError:
            self._count(index_errors=1)
            return [None] * len(nkeys)
        return [None if v is None else parse_entry(v) for v in vs]

    async def acontains(self, key: Any) -> bool:
        """contains() without blocking the event loop (False while Redis
        does not answer)."""
        self._check_open()
        return (await self._entries([key]))[0] is not None

    async def achunk_size(self, key: Any) -> int | None:
        """chunk_size() without blocking the event loop."""
        self._check_open()
        e = (await self._entries([key]))[0]
        return None if e is None else e[3]

    async def achunk_sizes(self, keys: Sequence[Any]) -> list[int | None]:
        """chunk_size() of many keys in one round trip to the index."""
        self._check_open()
        return [None if e is None else e[3] for e in await self._entries(keys)]

    async def akeys(self) -> list[bytes]:
        """keys() without blocking the event loop."""
        self._check_open()
        try:
            return list(await self._index.call(lambda r, p: r.hkeys(f"{p}:idx")))
        except IndexUnavailableError:
            self._count(index_errors=1)
            return []

    def _entry_sync(self, key: Any) -> tuple[int, ...] | None:
        k = normalize_key(key)
        try:
            v = self._index.call_sync(lambda r, p: r.hget(f"{p}:idx", k))
        except IndexUnavailableError:
            return None
        return None if v is None else parse_entry(v)

    def contains(self, key: Any) -> bool:
        """Whether key is in the index: a synchronous round trip to Redis
        (up to the socket timeout); on an event loop, use acontains."""
        self._check_open()
        return self._entry_sync(key) is not None

    def chunk_size(self, key: Any) -> int | None:
        """Size in bytes of the chunk under key, or None (a synchronous round
        trip to Redis; on an event loop, use achunk_size)."""
        self._check_open()
        e = self._entry_sync(key)
        return None if e is None else e[3]

    def keys(self) -> list[bytes]:
        """Every key in the index (a synchronous round trip to Redis; on an
        event loop, use akeys); empty while Redis does not answer, as
        contains() is False then."""
        self._check_open()
        try:
            return list(self._index.call_sync(lambda r, p: r.hkeys(f"{p}:idx")))
        except IndexUnavailableError:
            self._count(index_errors=1)
            return []

    async def delete(self, key: Any) -> bool:
        """Remove a chunk for every host; False if it was not there.

        The chunk leaves the index at once; its extent is held (for lease_s
        at most) while its header is erased on the namespace, so that a
        rebuild of the index does not bring the chunk back, and only then
        freed.  Readers still reading it are not disturbed (they read the
        data, not the header); a deleter that dies leaves the header, and
        the extent returns when the hold expires."""
        self._check_open()
        k = normalize_key(key)

        async def delete() -> bool:
            try:
                got = await self._index.delete(k, self._lease_ms)
            except IndexNotReplicatedError as e:
                if e.result is not None:  # gone from the primary all the same
                    await self._erase([e.result])
                raise
            if got is None:
                return False
            self._count(deletes=1)
            await self._erase([got])
            return True
        # once Redis dropped the key, the header is erased even if the caller
        # is cancelled meanwhile (else a rebuild would bring the chunk back)
        return await _to_the_end(delete())

    def stats(self) -> dict[str, Any]:
        """Counters of this host and the pool's state in the index (a
        synchronous round trip to Redis; on an event loop, use astats)."""
        try:
            return self._stats(self._index.run_sync("stats", []))
        except (IndexUnavailableError, IndexLostError) as e:
            return self._stats(e)

    async def astats(self) -> dict[str, Any]:
        """stats() without blocking the event loop."""
        try:
            return self._stats(await self._index.run("stats", []))
        except (IndexUnavailableError, IndexLostError) as e:
            return self._stats(e)

    def _stats(self, res: Any) -> dict[str, Any]:
        with self._mu:
            s: dict[str, Any] = dict(self._counters)
        s["index"] = self._index.url
        if isinstance(res, Exception):
            s["index_state"] = "unavailable" if isinstance(res, IndexUnavailableError) else "lost"
            return s
        nchunks, devs, cnt, leases, pins, limbo = res
        c = {cnt[i].decode(): int(cnt[i + 1]) for i in range(0, len(cnt), 2)}
        s.update(index_state="ok", chunks=int(nchunks), leases=int(leases), pins=int(pins),
                 limbo=int(limbo), evictions=c.get("evictions", 0),
                 reclaimed_leases=c.get("reclaimed_leases", 0),
                 expired_pins=c.get("expired_pins", 0))
        s["bytes_used"] = sum(int(d[0]) for d in devs)
        s["capacity"] = sum(int(d[1]) for d in devs)
        s["devices"] = [dict(uri=ns.dev.uri, used=int(d[0]), capacity=int(d[1]),
                             chunks=int(d[2]), free_extents=int(d[3]), engine=ns.dev.engine,
                             direct=ns.dev.direct) for ns, d in zip(self._ns, devs)]
        return s

    # ----------------------------------------------------------- blocking twins
    def _run_blocking(self, coro: Any) -> Any:
        # the store's one loop thread, whatever thread calls
        return self._runner.run(coro)

    def _get_to_the_end(self, keys: Sequence[Any], bufs: Sequence[Any], priority: Any = None
                        ) -> Coroutine[Any, Any, list[bool]]:
        # the pins are dropped before returning: no task outlives the call
        return self._get(keys, bufs, wait_unpin=True, priority=priority)

    # ---------------------------------------------------------------- lifetime
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._runner.close(self._index.aclose_loop)
        self._index.close()
        for ns in self._ns:
            ns.dev.close()

    async def aclose(self) -> None:
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        mine = [t for t in list(self._bg) if t.get_loop() is loop]
        if mine:  # pins still being dropped
            await asyncio.gather(*mine, return_exceptions=True)
        await self._index.aclose_loop()
        self.close()

    def __repr__(self) -> str:
        uris = [ns.dev.uri for ns in self._ns] if not self._closed else "closed"
        return f"SharedChunkStore({uris}, index={self._index.url!r})"


async def _wait_out(task: asyncio.Future) -> bool:
    """Wait until task ended, whatever cancels the caller meanwhile (the
    task is not cancelled with it); True if the caller was cancelled."""
    hit = False
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            hit = True
    return hit


async def _to_the_end(aw: Any) -> Any:
    """Await aw to its end even if the caller is cancelled meanwhile; then
    the cancel propagates (whatever aw returned or raised).  For steps that
    must not stop half-way: a chunk that Redis took out of the index has its
    header erased before anyone returns, or a rebuild would bring it back."""
    task = asyncio.ensure_future(aw)
    if await _wait_out(task):
        if not task.cancelled():
            task.exception()  # retrieved: the caller sees its own cancel
        raise asyncio.CancelledError
    return task.result()


async def _settle(futs: list[asyncio.Future]) -> None:
    """fx100io.store.core.settle.settle, with a cancel during the wait dropped:
    every caller is already failing for its own reason, and raises that."""
    try:
        await settle(futs)
    except asyncio.CancelledError:
        pass


class _LeaseKeeper:
    """Renews a put's leases while it writes.  ``check()`` raises where a
    lease is gone or was last confirmed too long ago to be sure it is still
    held: the extent may be another put's by now, so nothing more may be
    written there."""

    def __init__(self, index: RedisIndex, lease_ms: int, leases: list[str]):
        self._index = index
        self._lease_ms = lease_ms
        self._leases = leases
        # the allocation itself confirmed them, a moment ago
        self._until = time.monotonic() + lease_ms / 1000
        self._lost = False
        self._task = asyncio.get_running_loop().create_task(self._keep())

    async def _keep(self) -> None:
        period = self._lease_ms / 3000
        while True:
            await asyncio.sleep(period)
            t0 = time.monotonic()
            try:
                held = await self._index.renew(self._lease_ms, self._leases)
            except (IndexUnavailableError, IndexLostError) as e:
                log.debug("fx100io: could not renew %d leases: %s", len(self._leases), e)
                continue  # not confirmed: check() refuses once the last confirmation ages
            if not all(held):
                self._lost = True
                return
            self._until = t0 + self._lease_ms / 1000

    def check(self) -> None:
        margin = self._lease_ms / 10000  # the writes about to start take some time too
        if self._lost or time.monotonic() > self._until - margin:
            raise FxTimeoutError(
                62, "the allocation lease of this put was lost (reclaimed while its data was "
                "being written, or Redis did not confirm it in time): nothing more is written "
                "to its extents, which may be another put's by now")

    async def stop(self) -> None:
        if not self._task.done():
            self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def settle(self) -> None:
        """stop(), waiting for the renewal task to end even through repeated
        cancels of the caller (a cleanup that must go on)."""
        if not self._task.done():
            self._task.cancel()
        await _settle([self._task])

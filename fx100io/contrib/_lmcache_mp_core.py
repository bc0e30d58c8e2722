"""What both LMCache multi-process adapters share: one ChunkStore on a loop thread of its
own, per-key batch operations that turn every failure into a miss, store key names, and
zero-copy views of LMCache's buffers.

No lmcache import here: the adapters in :mod:`fx100io.contrib.lmcache_mp` translate
LMCache's types; this module only moves bytes between buffers and the store.

Threads: LMCache calls the adapters from its store and prefetch threads at once. A
ChunkStore is used from the thread that opened it (each thread gets its own device
queue), so every store call runs on one asyncio loop thread owned by :class:`StoreService`;
caller threads only hand it coroutines. A request is reported done only when its I/O has
really ended: LMCache reuses a buffer as soon as its task completes, so a late read must
never land in it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import errno
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import (
    DeviceClosedError,
    DeviceFullError,
    DeviceIOError,
    Fx100ioMessageError,
    FxTimeoutError,
    InvalidArgumentError,
)
from ..priority import Priority
from ._runtime import Breaker, LoopRunner, TimedOut, adapter_logger
from ._settings import BackendSettings, open_backend_store

logger = adapter_logger("fx100io.contrib.lmcache_mp")

# Longest wait for the store to open (it may format a device) or close on its loop;
# 4 x timeout_s when that is longer.
OPEN_WAIT_MIN_S = 60.0

# Store keys of the two adapter types live apart from each other and from the
# in-process plugin's keys (fx100io.contrib._lmcache_codec), so one device can serve all.
OBJECT_PREFIX = "lmcache-mp/1/"
NATIVE_PREFIX = "lmcache-mp-native/1/"


class ServiceClosed(Fx100ioMessageError, RuntimeError):
    """The adapter was closed: no more requests are taken."""

    ERRNO = errno.EBADF


def is_device_failure(exc: BaseException) -> bool:
    """Whether exc says the device (or its path) is failing, not that this one request
    was bad. Only a device failure trips the breaker: a chunk larger than the store, a
    full index or a key too long fails its own task and nothing else."""
    if isinstance(exc, DeviceClosedError):
        return True  # a closed device or store is a device-wide state
    # a full store, a bad argument (buffer, key): this request's fault, not the device's
    return not isinstance(exc, (DeviceFullError, InvalidArgumentError, ValueError, TypeError,
                                KeyError, IndexError))


# ------------------------------------------------------------------------- key names


def object_key_name(kv_rank: int, group: int, chunk_hash: bytes, salt: str, model: str) -> str:
    """The store key of an LMCache ObjectKey: every field, reversibly.

    The model name goes last because it is the only field that may contain ``/``;
    LMCache forbids ``/`` and ``@`` in the salt, so splitting at the first five ``/``
    gives the fields back (:func:`parse_object_key_name`).
    """
    if "/" in salt:
        raise ValueError(f"cache_salt {salt!r} contains '/'")
    return f"{OBJECT_PREFIX}{int(kv_rank)}/{int(group)}/{bytes(chunk_hash).hex()}/{salt}/{model}"


def parse_object_key_name(name: str | bytes) -> tuple[int, int, bytes, str, str] | None:
    """(kv_rank, group, chunk_hash, salt, model) of a name made by object_key_name, or
    None for any other store key."""
    if isinstance(name, (bytes, bytearray)):
        try:
            name = bytes(name).decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not name.startswith(OBJECT_PREFIX):
        return None
    parts = name[len(OBJECT_PREFIX):].split("/", 4)
    if len(parts) != 5:
        return None
    rank, group, hash_hex, salt, model = parts
    try:
        return int(rank), int(group), bytes.fromhex(hash_hex), salt, model
    except ValueError:
        return None


def native_key_name(key: str) -> str:
    return NATIVE_PREFIX + str(key)


# ----------------------------------------------------------------------------- views


@functools.lru_cache(maxsize=1024)
def _ubyte_array(n: int) -> Any:
    # ctypes makes a new type per length and never frees it: one type per size, kept.
    return ctypes.c_ubyte * n


def view_at(ptr: int, nbytes: int) -> memoryview:
    """A writable byte view of nbytes at address ptr; it does not own the memory."""
    if nbytes <= 0:
        return memoryview(bytearray(0))
    if not ptr:
        raise ValueError("buffer has a null data pointer")
    return memoryview(_ubyte_array(int(nbytes)).from_address(int(ptr))).cast("B")


def shared_memory_mapping(ptr: int, nbytes: int,
                          maps: str = "/proc/self/maps") -> str | None:
    """The /dev/shm file whose whole shared mapping is exactly [ptr, ptr + nbytes), or
    None: memory that cannot move or grow under us (a POSIX shared-memory arena of a
    fixed size), told apart from a lazily grown anonymous one."""
    if ptr <= 0 or nbytes <= 0:
        return None
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) < 6:
                    continue
                lo, _, hi = fields[0].partition("-")
                if int(lo, 16) != ptr:
                    continue
                path = fields[5].rstrip("\n").removesuffix(" (deleted)")
                shared = len(fields[1]) == 4 and fields[1][3] == "s"
                whole = int(hi, 16) - ptr == nbytes and int(fields[2], 16) == 0
                if shared and whole and path.startswith("/dev/shm/"):
                    return path
                return None
    except (OSError, ValueError):
        return None
    return None


def byte_view(buf: Any) -> memoryview:
    mv = memoryview(buf)
    return mv if mv.ndim == 1 and mv.format == "B" else mv.cast("B")


# --------------------------------------------------------------------------- service


class StoreService:
    """A ChunkStore opened, used and closed on one loop thread, with per-key results.

    ``run(coro, done)`` hands a coroutine of this class to the loop; ``done(result,
    error)`` is called once, on the loop thread, when its I/O has ended. ``close()``
    waits (up to ``timeout_s``) for those still running, then closes the store on the
    loop, releases the device and stops the loop.
    """

    def __init__(self, settings: BackendSettings) -> None:
        self.settings = settings
        self._prefetch = Priority[settings.prefetch_priority.upper()]
        self._breaker = Breaker(settings.retry_after_s)
        self._down_until = 0.0
        self._cond = threading.Condition()
        self._pending = 0
        self._closed = False
        self._runner = LoopRunner(None)
        wait_s = max(OPEN_WAIT_MIN_S, 4 * settings.timeout_s)
        opening = self._runner.submit(self._open())
        try:
            self._backend = opening.result(timeout=wait_s)
        except concurrent.futures.TimeoutError:
            # The open goes on (formatting, a slow device): whatever it makes is
            # closed when it ends, or it would hold the device's lock until exit.
            # (on the loop thread: an open that ended just now would otherwise run
            # the callback here, closing its store from this thread)
            loop = self._runner.loop
            opening.add_done_callback(
                lambda f: loop.call_soon_threadsafe(self._open_abandoned, f))
            raise TimedOut(f"opening the store took more than {wait_s:.0f}s") from None
        except BaseException:
            self._runner.stop()
            raise
        self.store = self._backend.store

    async def _open(self) -> Any:
        return open_backend_store(self.settings, log=logger)

    def _open_abandoned(self, f: concurrent.futures.Future[Any]) -> None:
        """The loop thread, once an open we gave up on ended: close what it made,
        then end the loop."""
        try:
            if not f.cancelled() and f.exception() is None:
                f.result().close()
                logger.warning("fx100io: closed a store whose open ended after it was given up")
        finally:
            self._runner.loop.stop()  # the loop's thread ends; the runner closes nothing more

    # ------------------------------------------------------------------ requests

    def run(self, coro: Any, done: Callable[[Any, BaseException | None], None]) -> None:
        with self._cond:
            if self._closed:
                coro.close()
                raise ServiceClosed("the fx100io adapter is closed")
            self._pending += 1
        try:
            future = self._runner.submit(self._watched(coro))
        except BaseException as exc:
            coro.close()
            self._finished()
            done(None, exc)
            return

        def finish(f: concurrent.futures.Future[Any]) -> None:
            try:
                if f.cancelled():
                    done(None, ServiceClosed("request cancelled"))
                else:
                    exc = f.exception()
                    done(None if exc is not None else f.result(), exc)
            except Exception:
                logger.exception("fx100io: completing a request failed")
            finally:
                self._finished()

        future.add_done_callback(finish)

    async def _watched(self, coro: Any) -> Any:
        """Run coro; if it has not ended after timeout_s, trip the breaker (lookups and
        new requests miss from then on) but keep waiting: the request is reported only
        when its I/O has really ended, since LMCache reuses its buffer at once."""
        timeout = float(self.settings.timeout_s)
        handle = None
        if timeout > 0:
            handle = asyncio.get_running_loop().call_later(
                timeout, self._failed, "request",
                FxTimeoutError(110, f"a request ran past timeout_s={timeout:g}s"))
        try:
            return await coro
        finally:
            if handle is not None:
                handle.cancel()

    def call(self, coro: Any) -> Any:
        """Run a coroutine on the loop and wait for it (listing, delete)."""
        with self._cond:
            if self._closed:
                coro.close()
                raise ServiceClosed("the fx100io adapter is closed")
        return self._runner.call(coro, max(60.0, 4 * self.settings.timeout_s))

    def _finished(self) -> None:
        with self._cond:
            self._pending -= 1
            self._cond.notify_all()

    def _usable(self) -> bool:
        return self._breaker.usable()

    def healthy(self) -> bool:
        """Whether the breaker is closed, without ending its back-off (a status poll
        must not make the next request retry a failing device early)."""
        return not self._closed and time.monotonic() >= self._down_until

    def _failed(self, what: str, exc: BaseException) -> None:
        if is_device_failure(exc):
            self._down_until = time.monotonic() + float(self.settings.retry_after_s)
            self._breaker.trip(what, exc)
        else:
            logger.warning("fx100io: %s failed: %r (this request only)", what, exc)

    # Coroutines: run on the loop thread only.

    async def put(self, names: Sequence[str], views: Sequence[memoryview]) -> list[bool]:
        """Store each view under its name; all True, or all False if the batch failed."""
        if not names:
            return []
        if not self._usable():
            return [False] * len(names)
        try:
            await self.store.batch_put(list(names), list(views), priority=Priority.STORE)
        except Exception as exc:  # noqa: BLE001 - a failed store is a failed task
            self._failed("store", exc)
            return [False] * len(names)
        return [True] * len(names)

    # The store's index may be remote (shared_index: Redis): every index question goes
    # through these, which use the store's async forms where it has them, so the loop
    # thread never waits on a synchronous round trip.

    async def _index_sizes(self, names: Sequence[str]) -> list[int | None]:
        if not names:
            return []
        asizes = getattr(self.store, "achunk_sizes", None)
        if asizes is not None:
            return list(await asizes(list(names)))
        return [self.store.chunk_size(n) for n in names]

    async def _index_keys(self) -> list[Any]:
        akeys = getattr(self.store, "akeys", None)
        return list(await akeys()) if akeys is not None else list(self.store.keys())

    async def _index_stats(self) -> dict[str, Any]:
        astats = getattr(self.store, "astats", None)
        return dict(await astats()) if astats is not None else dict(self.store.stats())

    async def get(self, names: Sequence[str | None], views: Sequence[memoryview]) -> list[bool]:
        """Fill each view with its chunk; True only where the chunk has exactly the
        view's size and passed its CRC. A chunk of another size is a miss: a shorter
        one would leave stale bytes in the buffer, a longer one does not fit.

        The size is checked before the read and, where another host may replace the
        chunk meanwhile (a shared index), again after it: a chunk replaced by one of
        another size in between is a miss, not a buffer with a stale tail."""
        out = [False] * len(names)
        if not names or not self._usable():
            return out
        asked = [(i, n) for i, n in enumerate(names) if n is not None]
        sizes = await self._index_sizes([n for _, n in asked])
        idx: list[int] = []
        keys: list[str] = []
        bufs: list[memoryview] = []
        for (i, name), size in zip(asked, sizes):
            if size is None:
                continue
            view = views[i]
            if size != view.nbytes:
                logger.warning("fx100io: chunk %r holds %d bytes, the buffer %d: a miss",
                               name, size, view.nbytes)
                continue
            idx.append(i)
            keys.append(name)
            bufs.append(view)
        if not keys:
            return out
        try:
            # LMCache's prefetch of a looked-up prefix from L2 into L1: the
            # request waits for it (query_prefetch_status), so the
            # prefetch_priority class is load by default
            got = await self.store.batch_get(keys, bufs, priority=self._prefetch)
        except Exception as exc:  # noqa: BLE001 - a failed read is a miss
            self._failed("load", exc)
            return out
        after = await self._index_sizes(keys)
        # another host may have replaced the chunk (shared index) while it was read
        got = [bool(ok) and s == b.nbytes for ok, s, b in zip(got, after, bufs)]
        unread = [k for k, ok, s, b in zip(keys, got, after, bufs) if not ok and s == b.nbytes]
        if unread:
            # still indexed with its size yet not read: not a CRC failure (the store
            # drops those) but the device failing under it (short read, EIO)
            self._failed("load", DeviceIOError(5, f"{len(unread)} chunk(s) could not be read, "
                                               f"first {unread[0]!r}"))
        for i, ok in zip(idx, got):
            out[i] = bool(ok)
        return out

    async def exists(self, names: Sequence[str | None]) -> list[bool]:
        if not self._usable():
            return [False] * len(names)
        asked = [(i, n) for i, n in enumerate(names) if n is not None]
        out = [False] * len(names)
        for (i, _), size in zip(asked, await self._index_sizes([n for _, n in asked])):
            out[i] = size is not None
        touch = getattr(self.store, "touch", None)
        if touch is not None:
            # a chunk LMCache is about to load (it holds a lock on it now) is the
            # store's most recently used: its LRU evicts it last
            touch([n for (i, n) in asked if out[i]])
        return out

    async def sizes(self, names: Sequence[str]) -> list[int | None]:
        return await self._index_sizes(names)

    async def delete(self, names: Sequence[str]) -> list[bool]:
        return [s is not None for s in await self.delete_sized(names)]

    async def delete_sized(
        self,
        names: Sequence[str],
        keep: Callable[[int], bool] | None = None,
        on_deleted: Callable[[list[int], list[int]], None] | None = None,
    ) -> list[int | None]:
        """Delete each chunk; the size of each one deleted, None for the others.

        keep(i), asked on this thread just before names[i] leaves the index, spares
        it. on_deleted(indices, sizes) is called here, on the loop, as soon as chunks
        are durably gone: the caller learns of them even if it stopped waiting.
        A store with batch_delete deletes them all in one index commit per device."""
        out: list[int | None] = [None] * len(names)
        batch = getattr(self.store, "batch_delete", None)
        if batch is not None:
            # local index: the checks, the sizes and batch_delete's removal from the
            # index happen in one step of the loop (no await in between)
            idx = [i for i in range(len(names)) if keep is None or not keep(i)]
            sizes = [self.store.chunk_size(names[i]) for i in idx]
            idx, sizes = ([i for i, s in zip(idx, sizes) if s is not None],
                          [s for s in sizes if s is not None])
            if not idx:
                return out
            try:
                gone = await batch([names[i] for i in idx])
            except Exception as exc:  # noqa: BLE001 - a failed delete leaves the chunks
                self._failed("delete", exc)
                return out
            done_i = [i for i, ok in zip(idx, gone) if ok]
            done_s = [s for s, ok in zip(sizes, gone) if ok]
            for i, size in zip(done_i, done_s):
                out[i] = size
            if done_i and on_deleted is not None:
                on_deleted(done_i, done_s)
            return out
        for i, name in enumerate(names):
            if keep is not None and keep(i):
                continue
            size = (await self._index_sizes([name]))[0]
            if keep is not None and keep(i):  # locked while the index answered
                continue
            try:
                ok = size is not None and bool(await self.store.delete(name))
            except Exception as exc:  # noqa: BLE001 - a failed delete leaves the chunk
                self._failed("delete", exc)
                ok = False
            if ok and size is not None:
                out[i] = size
                if on_deleted is not None:
                    on_deleted([i], [size])
        return out

    async def listing(self, prefix: str, sort: bool = True) -> list[tuple[str, int]]:
        """(name, size) of every chunk whose key starts with prefix, sorted by name
        unless sort is False (the caller sorts, off the loop)."""
        names: list[str] = []
        for raw in await self._index_keys():
            try:
                name = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
            except UnicodeDecodeError:
                continue
            if name.startswith(prefix):
                names.append(name)
        sizes = await self._index_sizes(names)
        rows = [(n, s) for n, s in zip(names, sizes) if s is not None]
        if sort:
            rows.sort()
        return rows

    async def usage(self) -> tuple[int, int]:
        stats = await self._index_stats()
        return int(stats.get("bytes_used", 0)), int(stats.get("capacity", 0))

    # ------------------------------------------------------------------ lifetime

    def close(self) -> bool:
        """Drain, close the store, stop the loop. True if every request had ended (their
        buffers are free); False if some were still running after timeout_s."""
        with self._cond:
            if self._closed:
                return True
            self._closed = True
            drained = self._cond.wait_for(lambda: self._pending == 0,
                                          timeout=max(5.0, self.settings.timeout_s))
        if not drained:
            logger.error("fx100io: requests still running after %.1fs at close",
                         self.settings.timeout_s)
        loop = self._runner.loop
        try:
            closing = self._runner.submit(self._close_backend())
        except RuntimeError:  # no loop any more: nothing else uses the queues
            self._backend.close()
            self._runner.stop()
            return drained
        try:
            closing.result(timeout=max(OPEN_WAIT_MIN_S, 4 * self.settings.timeout_s))
        except concurrent.futures.TimeoutError:
            # The loop is stuck (a request inside a device call): the store's queues
            # are that thread's, so it is not closed from here. The close stays queued
            # on the loop: if the stuck call ever returns, the store closes there and
            # the loop ends; until then the device stays locked.
            logger.error("fx100io: the adapter's event loop is stuck; the store closes "
                         "only if it recovers (its device stays locked until then)")
            closing.add_done_callback(lambda _f: loop.call_soon_threadsafe(loop.stop))
            return False
        except Exception as exc:  # noqa: BLE001 - closing anyway
            logger.warning("fx100io: closing the store failed: %r", exc)
        self._runner.stop()
        return drained

    async def _close_backend(self) -> None:
        # the store's own background tasks (a shared index's unpins) end first: a task
        # left on a stopped loop is destroyed half-way, its pins left to expire
        me = asyncio.current_task()
        others = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        if others:
            await asyncio.wait(others, timeout=max(1.0, self.settings.timeout_s))
        self._backend.close()

    @property
    def closed(self) -> bool:
        return self._closed


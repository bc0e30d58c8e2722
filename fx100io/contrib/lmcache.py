"""LMCache storage plugin backed by an fx100io ChunkStore.

Load it from an LMCache config (every key is documented in docs/lmcache.md)::

    storage_plugins: ["fx100io"]
    extra_config:
      storage_plugin.fx100io.module_path: fx100io.contrib.lmcache
      storage_plugin.fx100io.class_name: FX100ioBackend
      storage_plugin.fx100io.devices: "file:///var/lib/fx100io/kv.img"
      storage_plugin.fx100io.size: "64G"

The plugin has no storage logic of its own: it maps LMCache keys to store keys,
remembers enough to rebuild a MemoryObj (a small record per chunk, stored beside the
data, so a new engine over the same devices finds everything), and moves bytes between
the store and the MemoryObj buffers that LMCache's LocalCPUBackend allocates. Reads land
in those buffers directly; nothing is staged through Python bytes.

Failure policy: a device error or a request that outlives ``timeout_s`` is logged and
turned into misses (LMCache then recomputes); the plugin stays down for
``retry_after_s`` and then tries the store again. A broken config raises at start.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface

from ..priority import Priority
from . import _lmcache_codec as codec
from ._lmcache_config import PluginConfigError, PluginOptions, parse_options
from ._runtime import Breaker, LoopGone, LoopRunner, TimedOut, adapter_logger, bounded
from ._settings import (
    BackendStartError,
    lock_devices,
    open_store,
    prepare_files,
    should_create,
    unlock_devices,
)

logger = adapter_logger("fx100io.contrib.lmcache")

__all__ = ["FX100ioBackend", "PluginConfigError", "PluginStartError"]

# Records of recently seen chunks stay in memory so a warm engine reads each chunk
# once; the bound keeps a large store's index out of RAM.
_RECORD_CACHE_ENTRIES = 1 << 16


# The configured devices could not be opened, formatted or claimed.
PluginStartError = BackendStartError


class FX100ioBackend(StoragePluginInterface):
    """LMCache StoragePluginInterface over fx100io.ChunkStore."""

    def __init__(
        self,
        dst_device: str = "cpu",
        config: Any = None,
        metadata: Any = None,
        local_cpu_backend: Any = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(
            dst_device=dst_device,
            config=config,
            metadata=metadata,
            local_cpu_backend=local_cpu_backend,
            loop=loop,
        )
        try:
            self._start(config, metadata, loop)
        except Exception as exc:
            # LMCache's loader logs one short line and drops the plugin, leaving a
            # server that silently never hits storage. Say it loudly, then raise.
            logger.critical(
                "fx100io LMCache plugin NOT loaded: %s. LMCache will run WITHOUT the "
                "fx100io storage tier. Fix the storage_plugin.<name>.* keys in "
                "extra_config (every key is documented in fx100io's docs/lmcache.md).",
                exc,
            )
            raise

    # ------------------------------------------------------------------ setup

    def _start(self, config: Any, metadata: Any, loop: asyncio.AbstractEventLoop | None) -> None:
        if config is None:
            raise PluginConfigError("LMCache passed no config to the plugin")
        self._closed = False
        self._lock = threading.Lock()
        self._inflight: dict[CacheEngineKey, MemoryObj] = {}
        self._put_futures: set[concurrent.futures.Future] = set()
        self._pins: dict[CacheEngineKey, int] = {}
        self._records: collections.OrderedDict[str, codec.ChunkRecord] = collections.OrderedDict()
        self._warned: set[str] = set()
        # Store requests that still use LMCache buffers, counted until the I/O really
        # ends (a timed-out request keeps counting): LMCache must not free its pool first.
        self._io_cond = threading.Condition()
        self._io_pending = 0

        self.options: PluginOptions = parse_options(
            getattr(config, "storage_plugins", None),
            getattr(config, "extra_config", None),
            type(self).__name__,
            worker_id=int(getattr(metadata, "worker_id", 0) or 0),
            world_size=int(getattr(metadata, "world_size", 1) or 1),
        )
        self._breaker = Breaker(self.options.retry_after_s, logger)
        create = should_create(self.options)
        prepare_files(self.options, create)
        self._device_locks = lock_devices(self.options, create)
        try:
            self._runner = LoopRunner(loop)
        except Exception:
            self._unlock_devices()
            raise
        try:
            # Opened here, on the thread that builds the plugin, never on LMCache's loop:
            # formatting a device or replaying up to 128 MiB of index log would stall
            # every coroutine of the StorageManager meanwhile. (The queue this thread
            # gets on the device stays idle; the loop gets its own for the I/O.)
            self._store = self._off_loop(lambda: open_store(self.options, create, logger))
        except Exception:
            self._runner.stop()
            self._unlock_devices()
            raise
        try:
            self._register_pool()
            self._guard_pool_release()
        except Exception:
            self._close_store()
            self._runner.stop()
            self._unlock_devices()
            raise
        if self.local_cpu_backend is None:
            logger.warning(
                "fx100io: no LocalCPUBackend (scheduler role?): lookups work, loads return "
                "misses because there is no pinned pool to read into"
            )
        logger.info("fx100io LMCache plugin %r ready: %s", self.options.name, self.options.describe())

    def _off_loop(self, fn: Callable[[], Any]) -> Any:
        """Run a blocking call (the store's open) anywhere but on the loop thread.

        Built from LMCache's own thread it just runs; built on the loop thread itself
        (a plugin made from a coroutine) it runs on a worker thread while the
        constructor waits, which blocks the loop all the same: say so."""
        if not self._runner.on_loop_thread():
            return fn()
        logger.warning("fx100io: plugin built on LMCache's event loop; the loop waits "
                       "while the store opens")
        with concurrent.futures.ThreadPoolExecutor(1, "fx100io-lmcache-open") as pool:
            return pool.submit(fn).result()

    def _close_store(self) -> bool:
        """Close the store without blocking LMCache's loop; False while it is
        still closing in the background.

        The wait for index commits still queued (and a compaction they may start) runs
        on a worker thread (``aclose``); the devices are closed on the loop thread,
        which owns the queues all reads and writes used (an nvme+tcp queue is best torn
        down by its owner). With no running loop the store closes right here."""
        store = self._store
        runner = self._runner
        if runner.on_loop_thread() or not runner.wait_running(1.0):
            if runner.on_loop_thread():
                logger.warning("fx100io: store closed on LMCache's event loop; the loop "
                               "waits for its queued index commits")
            store.close()
            return True
        # "waiting" -> "done" (closed in time) or "abandoned" (we stopped waiting:
        # the close unlocks the devices itself when it ends)
        state = ["waiting"]
        state_mu = threading.Lock()

        async def close_then_unlock() -> None:
            try:
                await store.aclose()
            finally:
                with state_mu:
                    if state[0] == "abandoned":
                        self._unlock_devices()
                    state[0] = "done"
        try:
            runner.call(close_then_unlock(), self._close_wait_s())
        except LoopGone:  # the loop ended just now: nothing else uses the queues
            store.close()
        except TimedOut:
            with state_mu:
                if state[0] == "done":
                    return True
                state[0] = "abandoned"
            # still closing on the loop (a long compaction): it ends the devices when
            # done; nothing here may close them under it, nor stop that loop, nor
            # unlock the devices it still writes
            logger.warning("fx100io: the store is still closing after %.0fs; it finishes "
                           "in the background, and its devices stay locked until then",
                           self._close_wait_s())
            return False
        return True

    def _close_wait_s(self) -> float:
        return max(60.0, self._wait_s())

    def _unlock_devices(self) -> None:
        unlock_devices(getattr(self, "_device_locks", []))

    def _register_pool(self) -> None:
        """Hand LMCache's pinned pool to io_uring as fixed buffers when the core can.

        Every MemoryObj LMCache allocates lives inside this one pool, so registering it
        once (``fx100io.register_memory``) lets every read and write skip per-request page
        pinning. Builds without ``register_memory`` leave the pool unregistered and say so.
        """
        if not self.options.register_buffers or self.local_cpu_backend is None:
            return
        import fx100io

        register = getattr(fx100io, "register_memory", None)
        pool = getattr(self.local_cpu_backend.get_memory_allocator(), "buffer", None)
        if register is None or not isinstance(pool, torch.Tensor) or pool.device.type != "cpu":
            logger.info(
                "fx100io: LMCache's CPU pool is not registered with io_uring (%s); reads "
                "still land in the MemoryObj buffers directly",
                "this fx100io build cannot register outside memory"
                if register is None
                else "no CPU pool tensor found",
            )
            return
        view = pool.view(torch.uint8).numpy().data  # a memoryview of the pool
        try:
            # Kept, and closed before LMCache frees the pool (see
            # _guard_pool_release): a registration outliving its memory
            # would make later I/O land in the old pages.
            self._pool_registration = register(view)
        except Exception as exc:  # noqa: BLE001 - an unregistered pool still works
            logger.warning("fx100io: registering LMCache's CPU pool failed (%r); continuing without", exc)
            return
        logger.info("fx100io: registered LMCache's CPU pool (%d MiB) with io_uring", view.nbytes >> 20)

    def _guard_pool_release(self) -> None:
        """Make LMCache wait for our I/O before it frees its CPU pool.

        StorageManager.close() closes LocalCPUBackend, which frees the pool, before it
        closes plugins. Writes still reading a MemoryObj, or reads still filling one,
        would then touch freed memory. Its close is wrapped (on this instance only) to
        drain our requests first; if the device never answers, the pool is left
        allocated, which at shutdown costs nothing and corrupts nothing.
        """
        backend = self.local_cpu_backend
        if backend is None:
            return
        original_close = backend.close
        plugin = weakref.ref(self)

        def close_after_fx100io_io() -> None:
            me = plugin()
            if me is not None and not me._quiesce():
                logger.error(
                    "fx100io: device requests still use LMCache's CPU pool after %.1fs; "
                    "leaving the pool allocated rather than freeing memory under them",
                    me._quiesce_s(),
                )
                return
            if me is not None:
                me._unregister_pool()
            original_close()

        backend.close = close_after_fx100io_io

    def _unregister_pool(self) -> None:
        reg = getattr(self, "_pool_registration", None)
        self._pool_registration = None
        if reg is not None:
            reg.close()

    # --------------------------------------------------------------- helpers

    @staticmethod
    def _names(key: CacheEngineKey) -> tuple[str, str, str]:
        text = codec.lmcache_key_text(key)
        return text, codec.data_key(text), codec.record_key(text)

    def _usable(self) -> bool:
        return not self._closed and self._breaker.usable()

    def _failed(self, what: str, exc: BaseException) -> None:
        errors = sys.modules.get("fx100io.errors")
        full = getattr(errors, "DeviceFullError", None) if errors else None
        if full is not None and isinstance(exc, full):
            # A full device is not a broken one: reads keep working.
            self._warn_once("full", "fx100io: device full, chunk not stored (%r)", exc)
            return
        if isinstance(exc, (OSError, TimedOut)):
            self._breaker.trip(what, exc)
        else:
            logger.error("fx100io: %s raised unexpectedly", what, exc_info=exc)
            self._breaker.trip(what, exc)

    def _warn_once(self, tag: str, msg: str, *args: Any) -> None:
        if tag in self._warned:
            logger.debug(msg, *args)
            return
        self._warned.add(tag)
        logger.warning(msg, *args)

    def _remember(self, record: codec.ChunkRecord) -> None:
        with self._lock:
            self._records[record.key_text] = record
            self._records.move_to_end(record.key_text)
            while len(self._records) > _RECORD_CACHE_ENTRIES:
                self._records.popitem(last=False)

    def _forget(self, key_text: str) -> None:
        with self._lock:
            self._records.pop(key_text, None)

    def _tracked(self, awaitable: Any) -> Any:
        """Count a store request that uses LMCache buffers until it really finishes."""
        with self._io_cond:
            self._io_pending += 1

        async def run() -> Any:
            try:
                return await awaitable
            finally:
                with self._io_cond:
                    self._io_pending -= 1
                    self._io_cond.notify_all()

        return run()

    def _quiesce_s(self) -> float:
        return 2 * max(self.options.timeout_s, 1.0)

    def _quiesce(self) -> bool:
        """Wait for submitted puts and for every request using LMCache memory."""
        if self._runner.on_loop_thread():
            return self._io_pending == 0
        deadline = self._quiesce_s()
        self.flush(timeout=deadline)
        with self._io_cond:
            return self._io_cond.wait_for(lambda: self._io_pending == 0, timeout=deadline)

    def _wait_s(self) -> float:
        # Coroutines bound each of their (at most two) store requests by timeout_s;
        # this only catches a loop that stopped answering at all.
        return 2 * self.options.timeout_s + 5.0

    @staticmethod
    def _view(obj: MemoryObj) -> memoryview:
        """The MemoryObj's own bytes as a plain 'B' buffer, no copy.

        LMCache builds byte_array from a ctypes array, whose memoryview format is '<B';
        casting is free and gives every buffer consumer the format it expects.
        """
        return memoryview(obj.byte_array).cast("B")

    @staticmethod
    def _release(objs: Iterable[MemoryObj | None]) -> None:
        for obj in objs:
            if obj is not None:
                obj.ref_count_down()

    # ------------------------------------------------------------- lookups

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        if not self._usable():
            return False
        text, dkey, rkey = self._names(key)
        try:
            hit = self._stored(text, dkey, rkey)
        except Exception as exc:  # noqa: BLE001 - any failure is a miss
            self._failed("contains", exc)
            return False
        if hit and pin:
            self._pin(key)
        return hit

    def _shared(self) -> bool:
        return hasattr(self._store, "achunk_sizes")  # a SharedChunkStore: its index is Redis

    def _stored(self, text: str, dkey: str, rkey: str) -> bool:
        """Whether a chunk's data and record are both in the store (the record is
        written in the same batch as the data; both must be there).

        A shared pool's index is a Redis round trip away, which LMCache's event loop
        must never wait for (it may take the socket timeout while Redis hangs). On
        the loop, the answer comes from what this host knows: the bounded cache of
        records it wrote or read, the same answer the in-process index gives for
        them. Another host's chunk is then missed (a recompute, or a put that
        writes it again), never served wrong: loads check the index again, without
        blocking. Off the loop, the caller's thread asks the index itself.
        """
        if self._shared() and self._runner.on_loop_thread():
            with self._lock:
                return text in self._records
        return bool(self._store.contains(dkey)) and bool(self._store.contains(rkey))

    async def _sizes(self, names: Sequence[str]) -> list[int | None]:
        """chunk_size of each name, without blocking the loop on a shared index
        (one round trip for all, bounded by timeout_s)."""
        if not names:
            return []
        if self._shared():
            return list(await bounded(self._store.achunk_sizes(list(names)), self.options.timeout_s))
        return [self._store.chunk_size(n) for n in names]  # the in-process index: no I/O

    def batched_contains(self, keys: list[CacheEngineKey], pin: bool = False) -> int:
        hits = 0
        for key in keys:
            if not self.contains(key, pin):
                break
            hits += 1
        return hits

    async def batched_async_contains(
        self, lookup_id: str, keys: list[CacheEngineKey], pin: bool = False
    ) -> int:
        if not keys or not self._usable():
            return 0
        names: list[str] = []
        for key in keys:
            _, dkey, rkey = self._names(key)
            names += [dkey, rkey]
        try:
            present = await bounded(self._store.batch_exists(names), self.options.timeout_s)
        except Exception as exc:  # noqa: BLE001
            self._failed("batch_exists", exc)
            return 0
        hits = int(present) // 2  # a chunk counts only with both its data and record
        if pin:
            for key in keys[:hits]:
                self._pin(key)
        return hits

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        with self._lock:
            return key in self._inflight

    # ------------------------------------------------------------------ pins

    def _pin(self, key: CacheEngineKey) -> None:
        with self._lock:
            self._pins[key] = self._pins.get(key, 0) + 1

    def pin(self, key: CacheEngineKey) -> bool:
        if not self.contains(key):
            return False
        self._pin(key)
        return True

    def unpin(self, key: CacheEngineKey) -> bool:
        with self._lock:
            count = self._pins.get(key, 0)
            if count <= 0:
                return False
            if count == 1:
                del self._pins[key]
            else:
                self._pins[key] = count - 1
            return True

    def is_pinned(self, key: CacheEngineKey) -> bool:
        with self._lock:
            return self._pins.get(key, 0) > 0

    # ------------------------------------------------------------------ puts

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> list[concurrent.futures.Future] | None:
        batch = self._claim_puts(keys, objs)
        if not batch:
            return None
        try:
            future = self._runner.submit(self._put_batch(batch, on_complete_callback))
        except RuntimeError as exc:  # the loop is closed: nothing will ever write these
            self._finish_puts(batch)
            self._failed("put", exc)
            return None
        with self._lock:
            self._put_futures.add(future)
        future.add_done_callback(self._put_done)
        return [future]

    async def async_batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> None:
        batch = self._claim_puts(keys, objs)
        if batch:
            await self._put_batch(batch, on_complete_callback)

    def _claim_puts(
        self, keys: Sequence[CacheEngineKey], objs: Sequence[MemoryObj]
    ) -> list[tuple[CacheEngineKey, MemoryObj, codec.ChunkRecord, str, str]]:
        """Pick the keys worth writing and take a reference on their buffers.

        The StorageManager drops its own reference right after this call returns, so
        each MemoryObj we keep needs ref_count_up until its write completes.
        """
        if not self._usable():
            return []
        batch: list[Any] = []
        for key, obj in zip(keys, objs):
            text, dkey, rkey = self._names(key)
            with self._lock:
                if key in self._inflight:
                    continue
                self._inflight[key] = obj
            try:
                stored = self._stored(text, dkey, rkey)
            except Exception as exc:  # noqa: BLE001
                with self._lock:
                    self._inflight.pop(key, None)
                self._failed("contains", exc)
                self._finish_puts(batch)
                return []
            if stored:
                with self._lock:
                    self._inflight.pop(key, None)
                continue
            obj.ref_count_up()
            batch.append((key, obj, codec.record_for(text, obj), dkey, rkey))
        return batch

    async def _put_batch(
        self,
        batch: list[tuple[CacheEngineKey, MemoryObj, codec.ChunkRecord, str, str]],
        callback: Callable[[CacheEngineKey], None] | None,
    ) -> int:
        # Data and records go in one batch: the store writes them in parallel and a
        # chunk only counts as present when both landed (see contains).
        names = [d for _, _, _, d, _ in batch] + [r for _, _, _, _, r in batch]
        bufs: list[Any] = [self._view(obj) for _, obj, _, _, _ in batch]
        bufs += [record.encode() for _, _, record, _, _ in batch]
        late = False
        try:
            await bounded(
                self._tracked(self._store.batch_put(names, bufs, priority=Priority.STORE)),
                self.options.timeout_s,
                on_late=lambda: self._finish_puts(batch),
            )
        except TimedOut as exc:
            late = True
            self._failed(f"put of {len(batch)} chunks", exc)
            return 0
        except asyncio.CancelledError:
            late = True  # the write still reads the buffers: bounded() releases them
            raise
        except Exception as exc:  # noqa: BLE001
            self._failed(f"put of {len(batch)} chunks", exc)
            return 0
        finally:
            if not late:
                self._finish_puts(batch)
        for key, _, record, _, _ in batch:
            self._remember(record)
            if callback is not None:
                try:
                    callback(key)
                except Exception:
                    logger.exception("fx100io: on_complete_callback failed for %s", key)
        return len(batch)

    def _finish_puts(self, batch: Iterable[tuple[CacheEngineKey, MemoryObj, Any, Any, Any]]) -> None:
        for key, obj, _, _, _ in batch:
            with self._lock:
                self._inflight.pop(key, None)
            obj.ref_count_down()

    def _put_done(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._put_futures.discard(future)
        if not future.cancelled() and future.exception() is not None:
            logger.error("fx100io: put task crashed", exc_info=future.exception())

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted put has finished; True if none is left."""
        with self._lock:
            pending = list(self._put_futures)
        if not pending:
            return True
        _, not_done = concurrent.futures.wait(pending, timeout=timeout)
        return not not_done

    # ------------------------------------------------------------------ gets

    async def _read_records(self, keys: Sequence[CacheEngineKey],
                            priority: Priority = Priority.LOAD) -> list[codec.ChunkRecord | None]:
        """Records for keys, from memory when possible, else one parallel store read
        (of the class priority: a retrieve's load, or a prefetch's class).

        Records read from the store here are marked fresh, so the data read that follows
        does not read them again (see _read_data).
        """
        out: list[codec.ChunkRecord | None] = []
        want: list[tuple[int, str, str]] = []
        for i, key in enumerate(keys):
            text, _, rkey = self._names(key)
            with self._lock:
                record = self._records.get(text)
            out.append(record)
            if record is None:
                want.append((i, text, rkey))
        if not want:
            return out
        names, bufs, slots = [], [], []
        sizes = await self._sizes([rkey for _, _, rkey in want])
        for (i, text, rkey), size in zip(want, sizes):
            if size is None or not 0 < size <= codec.MAX_RECORD:
                continue
            names.append(rkey)
            bufs.append(bytearray(size))
            slots.append((i, text))
        if not names:
            return out
        hits = await bounded(self._store.batch_get(names, bufs, priority=priority),
                             self.options.timeout_s)
        for (i, text), hit, buf in zip(slots, hits, bufs):
            if not hit:
                continue
            try:
                record = codec.ChunkRecord.decode(buf, text)
            except codec.RecordError as exc:
                self._warn_once("record", "fx100io: ignoring unreadable record for %s: %s", text, exc)
                continue
            self._remember(record)
            out[i] = dataclasses.replace(record, fresh=True)
        return out

    def _allocate(
        self, records: Sequence[codec.ChunkRecord | None], busy_loop: bool
    ) -> list[MemoryObj | None]:
        """A MemoryObj per present chunk, until the first one LMCache cannot allocate.

        LMCache only uses a hit prefix, so after one failure the rest would be thrown
        away anyway; stopping keeps the pool free for the chunks that matter.
        """
        objs: list[MemoryObj | None] = []
        for record in records:
            if record is None or self.local_cpu_backend is None:
                objs.append(None)
                continue
            try:
                shapes = [torch.Size(s) for s in record.shapes]
                dtypes = [codec.dtype_from_name(torch, d) for d in record.dtypes]
                fmt = MemoryFormat[record.fmt]
            except (KeyError, codec.RecordError) as exc:
                self._warn_once("record", "fx100io: record for %s unusable: %r", record.key_text, exc)
                objs.append(None)
                continue
            obj = self.local_cpu_backend.allocate(shapes, dtypes, fmt, busy_loop=busy_loop)
            if obj is None:
                self._warn_once("alloc", "fx100io: LMCache's CPU pool is full; loading fewer chunks")
                objs += [None] * (len(records) - len(objs))
                break
            size = obj.get_size()
            if record.nbytes < size:
                obj.set_used_size(record.nbytes)
            elif record.nbytes > size:
                logger.warning(
                    "fx100io: record says %d bytes, LMCache allocated %d; skipping", record.nbytes, size
                )
                obj.ref_count_down()
                obj = None
            objs.append(obj)
        return objs

    async def _read_data(
        self,
        keys: Sequence[CacheEngineKey],
        records: Sequence[codec.ChunkRecord | None],
        objs: list[MemoryObj | None],
        priority: Priority = Priority.LOAD,
    ) -> list[MemoryObj | None]:
        """Fill the allocated MemoryObjs from the store (reads of the class priority);
        misses come back as None.

        Records known from memory are read again in the same parallel batch (a few KiB
        next to MiBs of data): that checks they still describe the data, and it keeps
        them as recently used as their data in the store's LRU, so capacity eviction
        does not drop the record of a hot chunk and make the chunk invisible.
        """
        idx = []
        rec_names: list[str] = []
        rec_bufs: list[bytearray] = []
        rec_of: list[int] = []
        try:
            asked: list[str] = []
            for key, record, obj in zip(keys, records, objs):
                if obj is not None and record is not None:
                    _, dkey, rkey = self._names(key)
                    asked += [dkey] if record.fresh else [dkey, rkey]
            known = dict(zip(asked, await self._sizes(asked)))
            for i, (key, record, obj) in enumerate(zip(keys, records, objs)):
                if obj is None or record is None:
                    continue
                text, dkey, rkey = self._names(key)
                if known[dkey] != record.nbytes:
                    # Data missing (evicted) or from another write: reading it would
                    # hand LMCache a half-filled buffer.
                    obj.ref_count_down()
                    objs[i] = None
                    self._forget(text)
                    continue
                idx.append((i, dkey))
                if not record.fresh:
                    size = known[rkey]
                    if size is not None and 0 < size <= codec.MAX_RECORD:
                        rec_names.append(rkey)
                        rec_bufs.append(bytearray(size))
                        rec_of.append(i)
        except BaseException:
            self._release(objs)
            objs[:] = [None] * len(objs)
            raise
        if not idx:
            return objs
        reading = [objs[i] for i, _ in idx]
        names = [d for _, d in idx] + rec_names
        bufs: list[Any] = [self._view(o) for o in reading] + rec_bufs
        try:
            all_hits = await bounded(
                # a retrieve (a load), or LMCache's async loading of a looked-up
                # prefix (prefetch_priority's class)
                self._tracked(self._store.batch_get(names, bufs, priority=priority)),
                self.options.timeout_s,
                # Still in flight: the buffers go back to LMCache only once the reads end.
                on_late=lambda: self._release(reading),
            )
        except (TimedOut, asyncio.CancelledError):
            # still reading into them: bounded() releases them once the reads end
            for i, _ in idx:
                objs[i] = None
            raise
        except BaseException:
            for i, _ in idx:
                objs[i] = None
            self._release(reading)
            raise
        hits = dict(zip((i for i, _ in idx), all_hits[: len(idx)]))
        for i, hit, buf in zip(rec_of, all_hits[len(idx) :], rec_bufs):
            record = records[i]
            assert record is not None  # rec_of lists only slots that have a record
            try:
                same = hit and codec.ChunkRecord.decode(buf, record.key_text) == record
            except codec.RecordError:
                same = False
            if not same:
                hits[i] = False  # the chunk changed or lost its record: not ours to serve
                self._forget(record.key_text)
        for i, hit in hits.items():
            obj = objs[i]
            rec = records[i]
            assert obj is not None and rec is not None  # idx lists only filled slots
            if not hit:
                obj.ref_count_down()
                objs[i] = None
                continue
            positions = rec.cached_positions
            if positions is not None:
                obj.metadata.cached_positions = torch.tensor(positions, dtype=torch.long)
        return objs

    async def _load_async(self, keys: Sequence[CacheEngineKey]) -> list[MemoryObj | None]:
        # LMCache's async lookup and prefetch (the request is not scheduled until it
        # ends) and a layerwise retrieve (use_layerwise: LMCache calls
        # batched_get_non_blocking for it too, and the GPU worker waits layer by
        # layer): one class for both, prefetch_priority's, load by default
        prefetch = Priority[self.options.prefetch_priority.upper()]
        records = await self._read_records(keys, prefetch)
        # On the loop thread LMCache's busy loop would stall our own put completions.
        objs = self._allocate(records, busy_loop=False)
        return await self._read_data(keys, records, objs, prefetch)

    def _load_blocking(self, keys: Sequence[CacheEngineKey]) -> list[MemoryObj | None]:
        if not keys or not self._usable() or self.local_cpu_backend is None:
            return [None] * len(keys)
        if self._runner.on_loop_thread() or not self._runner.alive():
            # Cannot block the loop on itself; nothing sensible to wait for either.
            self._warn_once("loopget", "fx100io: blocking get on the plugin's loop thread; reporting misses")
            return [None] * len(keys)
        try:
            records = self._runner.call(self._read_records(keys), self._wait_s())
        except Exception as exc:  # noqa: BLE001
            self._failed("record read", exc)
            return [None] * len(keys)
        # Allocate on the caller's thread: LMCache may wait here for puts to free memory,
        # and those puts complete on the loop.
        objs = self._allocate(records, busy_loop=False)
        try:
            return self._runner.call(
                self._read_data(keys, records, list(objs)),
                self._wait_s(),
                on_abandon=self._release,
            )
        except LoopGone as exc:
            self._release(objs)  # the read never started, so the buffers are still ours
            self._failed("read", exc)
            return [None] * len(keys)
        except Exception as exc:  # noqa: BLE001 - the coroutine released what it held
            self._failed("read", exc)
            return [None] * len(keys)

    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        return self._load_blocking([key])[0]

    def batched_get_blocking(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        return self._load_blocking(keys)

    async def batched_get_non_blocking(
        self, lookup_id: str, keys: list[CacheEngineKey], transfer_spec: Any = None
    ) -> list[MemoryObj]:
        """The async-loading path: a prefix of loaded chunks, all read in parallel."""
        if not keys or not self._usable() or self.local_cpu_backend is None:
            return []
        try:
            objs = await self._load_async(keys)
        except Exception as exc:  # noqa: BLE001
            self._failed("prefetch", exc)
            return []
        prefix: list[MemoryObj] = []
        for n, obj in enumerate(objs):
            if obj is None:
                self._release(objs[n + 1 :])
                break
            prefix.append(obj)
        return prefix

    # --------------------------------------------------------------- removal

    async def _delete(self, names: Sequence[str]) -> list[Any]:
        return await bounded(
            asyncio.gather(*(self._store.delete(n) for n in names), return_exceptions=True),
            self.options.timeout_s,
        )

    def _removable(self, keys: Sequence[CacheEngineKey], force: bool) -> list[CacheEngineKey]:
        chosen = []
        with self._lock:
            for key in keys:
                if self._pins.get(key, 0) > 0:
                    if not force:
                        continue
                    del self._pins[key]  # a forced remove abandons the lookup's pins
                chosen.append(key)
        return chosen

    def batched_remove(self, keys: list[CacheEngineKey], force: bool = True) -> int:
        if self._closed:
            return 0
        chosen = self._removable(keys, force)
        if self._shared() and self._runner.on_loop_thread():
            # No index round trip on the loop: delete them all (an absent key's
            # delete is a no-op), and count them as removed.
            present = list(chosen) if self._usable() else []
        else:
            present = [k for k in chosen if self.contains(k)]
        if not present:
            return 0
        names: list[str] = []
        for key in present:
            text, dkey, rkey = self._names(key)
            self._forget(text)
            names += [rkey, dkey]  # record first: a half-removed chunk reads as absent
        if not self._runner.alive():
            self._warn_once("loopdown", "fx100io: LMCache's event loop is gone; cannot remove chunks")
            return 0
        if self._runner.on_loop_thread():
            # Cannot wait for the loop from the loop: the deletes run right after us.
            task = self._runner.loop.create_task(self._delete(names))
            task.add_done_callback(self._delete_done)
            return len(present)
        try:
            results = self._runner.call(self._delete(names), self._wait_s())
        except Exception as exc:  # noqa: BLE001
            self._failed("remove", exc)
            return 0
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            self._failed("remove", errors[0])
        # Every key here was present a moment ago; count those whose data delete went through.
        return sum(1 for r in results[1::2] if not isinstance(r, BaseException))

    def _delete_done(self, task: asyncio.Task[list[Any]]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        failures = [exc] if exc is not None else [r for r in task.result() if isinstance(r, BaseException)]
        if failures:
            self._failed("remove", failures[0])

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        return self.batched_remove([key], force=force) == 1

    # ------------------------------------------------------------ lifecycle

    def get_allocator_backend(self) -> Any:
        return self.local_cpu_backend

    def touch_cache(self) -> None:
        # Recency lives in the store (it sees every read); nothing to replay here.
        return None

    def stats(self) -> dict:
        with self._lock:
            mine = {
                "inflight_puts": len(self._inflight),
                "pinned_keys": len(self._pins),
                "cached_records": len(self._records),
            }
        mine["breaker_trips"] = self._breaker.trips
        store_stats: Any
        try:
            store_stats = self._store.stats()
        except Exception as exc:  # noqa: BLE001
            store_stats = repr(exc)
        mine["store"] = store_stats
        return mine

    def close(self) -> None:
        if self._closed:
            return
        # Finish what LMCache already handed us: those chunks were promised durable.
        draining = not self._runner.on_loop_thread() and self._runner.alive()
        if draining and not self.flush(timeout=self._wait_s()):
            logger.warning("fx100io: closing with puts still in flight")
        self._closed = True
        closed = True
        try:
            closed = self._close_store()
        except Exception as exc:  # noqa: BLE001
            logger.warning("fx100io: closing the store failed: %r", exc)
        if closed:
            self._runner.stop()
            self._unlock_devices()
        self._unregister_pool()
        logger.info("fx100io LMCache plugin %r closed", self.options.name)

    def __str__(self) -> str:
        return type(self).__name__

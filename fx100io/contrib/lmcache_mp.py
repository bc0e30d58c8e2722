"""fx100io as an L2 tier of LMCache's multi-process server (``lmcache server``).

Two ways in, both by configuration alone (every setting is the in-process plugin's, under
``adapter_params``; values may be strings such as ``"64G"``)::

    lmcache server ... --l2-adapter '{"type": "plugin",
        "module_path": "fx100io.contrib.lmcache_mp", "class_name": "FX100ioL2Adapter",
        "adapter_params": {"devices": "file:///var/lib/fx100io/kv.img", "size": "64G"}}'

    lmcache server ... --l2-adapter '{"type": "native_plugin",
        "module_path": "fx100io.contrib.lmcache_mp", "class_name": "FX100ioNativeClient",
        "adapter_params": {"devices": "file:///var/lib/fx100io/kv.img", "size": "64G"}}'

``FX100ioL2Adapter`` is a full ``L2AdapterInterface``: it registers LMCache's L1 arena once
(``l1_memory_desc``) so reads land in LMCache's memory through io_uring fixed buffers, and
its keys carry every ObjectKey field, so ``list_l2_keys`` finds every chunk after a
restart. ``FX100ioNativeClient`` is the six-method client LMCache wraps in its own
NativeConnectorL2Adapter (locks, byte counts) for sites that use ``native_plugin``.

Both stay thin: the store (fx100io.ChunkStore) owns placement, durability, CRCs and LRU;
here LMCache's contract is translated (task ids, event fds, bitmaps, locks). Failures are
misses, never wrong bytes: a chunk that fails its CRC32C, has another size than the buffer,
or sits on a failing device is reported as not loaded.

Checked against lmcache 0.5.6 (its plugin loader passes ``(adapter_params,
l1_memory_desc=...)`` or, as here, ``FX100ioL2AdapterConfig.from_dict(adapter_params)``,
and ``group_layout_descs`` to lookups; the adapter also works when a revision passes no
layout).
"""

from __future__ import annotations

import bisect
import errno
import itertools
import os
import threading
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.api import KeyEntry, KeyListPage, ObjectKey
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import AdapterUsage, L2AdapterInterface, L2TaskId
from lmcache.v1.distributed.l2_adapters.config import L2AdapterConfigBase

from ._lmcache_mp_core import (
    NATIVE_PREFIX,
    OBJECT_PREFIX,
    ServiceClosed,
    StoreService,
    byte_view,
    logger,
    native_key_name,
    object_key_name,
    parse_object_key_name,
    shared_memory_mapping,
    view_at,
)
from ._settings import BackendConfigError, BackendSettings, parse_settings

__all__ = [
    "BackendConfigError",
    "FX100ioL2Adapter",
    "FX100ioL2AdapterConfig",
    "FX100ioNativeClient",
]

WHERE = "adapter_params."


def _eventfd() -> int:
    return os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


def _signal(fd: int) -> None:
    try:
        os.eventfd_write(fd, 1)
    except OSError as exc:  # closed under us at shutdown: nobody waits any more
        if exc.errno != errno.EBADF:
            raise


def _drain(fd: int) -> None:
    try:
        os.eventfd_read(fd)
    except (BlockingIOError, OSError):
        pass


def _object_keys(rows: Any) -> tuple[list[ObjectKey], list[int]]:
    """LMCache ObjectKeys and sizes of (store key, size) rows; rows whose key is not one of
    this adapter's object keys are skipped."""
    keys: list[ObjectKey] = []
    sizes: list[int] = []
    for raw, size in rows:
        fields = parse_object_key_name(raw)
        if fields is None:
            continue
        rank, group, chash, salt, model = fields
        try:
            keys.append(ObjectKey(chunk_hash=chash, model_name=model, kv_rank=rank,
                                  object_group_id=group, cache_salt=salt))
        except ValueError:
            continue
        sizes.append(int(size))
    return keys, sizes


class FX100ioL2AdapterConfig(L2AdapterConfigBase):
    """``adapter_params`` of the ``plugin`` type, checked when LMCache parses them.

    LMCache 0.5.6's plugin loader finds this class by name (``<class_name>Config``) and
    builds the adapter with ``FX100ioL2Adapter(FX100ioL2AdapterConfig.from_dict(params),
    l1_memory_desc=...)``."""

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        self.params = dict(params or {})
        self.settings: BackendSettings = parse_settings(self.params, WHERE)

    @classmethod
    def from_dict(cls, d: dict) -> FX100ioL2AdapterConfig:
        if not isinstance(d, Mapping):
            raise BackendConfigError(f"adapter_params must be a JSON object, got {type(d).__name__}")
        return cls(d)

    @classmethod
    def help(cls) -> str:
        return (
            "fx100io L2 adapter (adapter_params, the in-process plugin's settings):\n"
            "- devices (str or list, required): file:///path, /dev/nvme0n1, nvme+tcp://..., "
            "nvme+rdma://...\n"
            "- size: bytes to create a file store with (\"64G\"); create: auto|never|always\n"
            "- capacity, queue_depth, max_io, direct, engine, host_nqn, timeout_s, "
            "retry_after_s, register_buffers, path (user|kernel)\n"
            'Example: {"type":"plugin","module_path":"fx100io.contrib.lmcache_mp",'
            '"class_name":"FX100ioL2Adapter","adapter_params":'
            '{"devices":"file:///var/lib/fx100io/kv.img","size":"64G"}}'
        )


class FX100ioL2Adapter(L2AdapterInterface):
    """LMCache MP ``L2AdapterInterface`` over an fx100io ChunkStore."""

    def __init__(
        self,
        config: FX100ioL2AdapterConfig | Mapping[str, Any] | None = None,
        l1_memory_desc: Any = None,
        **params: Any,
    ) -> None:
        super().__init__(max_capacity_bytes=0)
        if isinstance(config, FX100ioL2AdapterConfig):
            settings = config.settings
        elif config is None or isinstance(config, Mapping):
            settings = parse_settings({**dict(config or {}), **params}, WHERE)
        else:
            raise BackendConfigError(
                f"FX100ioL2Adapter takes adapter_params (a dict), got {type(config).__name__}")
        self._lock = threading.Lock()
        self._next_id = 0
        self._stores: dict[L2TaskId, L2StoreResult] = {}
        self._lookups: dict[L2TaskId, Bitmap] = {}
        self._loads: dict[L2TaskId, Bitmap] = {}
        self._locks: dict[ObjectKey, int] = {}
        self._registration: Any = None
        self._kept_registration: Any = None
        self._snapshot: tuple[list[str], list[tuple[str, int]]] | None = None
        self._closed = False
        self._fds: list[int] = []
        try:
            self._fds = [_eventfd(), _eventfd(), _eventfd()]
            self._svc = StoreService(settings)
        except BaseException:
            for fd in self._fds:
                os.close(fd)
            raise
        self._store_fd, self._lookup_fd, self._load_fd = self._fds
        try:
            used, capacity = self._svc.call(self._svc.usage())
            self._max_capacity_bytes = capacity
            self._seed_usage()
            self._watch_evictions()
            self._register_l1(l1_memory_desc, settings)
        except BaseException:
            self._svc.close()
            for fd in self._fds:
                os.close(fd)
            raise
        logger.info("fx100io LMCache MP adapter ready: %s (%d bytes in use)",
                    settings.describe(), used)

    # ----------------------------------------------------------------- set-up

    def _register_l1(self, desc: Any, settings: BackendSettings) -> None:
        """Register LMCache's L1 arena once: every MemoryObj lies in it, so each read
        and write then uses io_uring fixed buffers (no per-request page pinning)."""
        if desc is None or not settings.register_buffers:
            return
        # only the stable prefix LMCache exposes: None means the arena may still move
        # or grow (a lazy allocator), so nothing is registered (LMCache's own raw
        # block adapter does the same) ...
        size = getattr(desc, "stable_registration_size", None)
        ptr = getattr(desc, "ptr", 0)
        what = "L1 arena"
        if ptr and not size:
            # ... except a POSIX shared-memory arena (an MP server with shm_name), for
            # which LMCache exposes no stable size because older kernels refused
            # file-backed io_uring fixed buffers.  Its mapping never moves or grows;
            # where the kernel refuses it, the I/O falls back to plain reads and writes.
            shm = shared_memory_mapping(int(ptr), int(getattr(desc, "size", 0) or 0))
            if shm is not None:
                size = int(desc.size)
                what = f"L1 arena in POSIX shared memory ({shm})"
        if not ptr or not size:
            return
        import fx100io

        try:
            self._registration = fx100io.register_memory(view_at(ptr, int(size)))
        except Exception as exc:  # noqa: BLE001 - unregistered memory still works
            logger.warning("fx100io: registering LMCache's %s failed (%r); continuing "
                           "without", what, exc)
            return
        logger.info("fx100io: registered LMCache's %s (%d MiB)", what, int(size) >> 20)

    def _seed_usage(self) -> None:
        """Byte counts per cache_salt of what a previous server left on the device."""
        per_salt: dict[str, int] = {}
        total = 0
        for name, size in self._svc.call(self._svc.listing(OBJECT_PREFIX, sort=False)):
            fields = parse_object_key_name(name)
            if fields is not None:
                per_salt[fields[3]] = per_salt.get(fields[3], 0) + size
                total += size
        with self._usage_lock:
            self._total_bytes_used = total
            self._bytes_by_cache_salt = {k: v for k, v in per_salt.items() if v > 0}

    def _watch_evictions(self) -> None:
        """Chunks the store's own LRU evicts (to make room for a put) are reported to
        LMCache as deleted, with their sizes: its byte counts and eviction policy then
        never keep keys the device no longer has."""
        store = self._svc.store
        if not hasattr(store, "on_evict"):
            return  # a shared index evicts for every host: not reported here
        loop = self._svc._runner.loop

        def evicted(pairs: list[tuple[bytes, int]]) -> None:
            try:  # the hook runs on the store's index thread: report from the loop
                loop.call_soon_threadsafe(self._report_evicted, pairs)
            except RuntimeError:
                pass  # the loop is gone: the adapter is closed

        store.on_evict = evicted

    def _report_evicted(self, pairs: list[tuple[bytes, int]]) -> None:
        keys, sizes = _object_keys(pairs)
        if keys:
            self._notify_keys_deleted(keys, sizes)

    def register_listener(self, listener: Any) -> None:
        """Register a listener and tell it first of every chunk already on the device
        (a previous server's, oldest-named first): LMCache's eviction policy then knows
        them, and evicts them before chunks stored since. Byte counts are unchanged
        (they were taken from the device at start)."""
        super().register_listener(listener)
        try:
            rows = sorted(self._svc.call(self._svc.listing(OBJECT_PREFIX, sort=False)))
        except Exception as exc:  # noqa: BLE001 - the listener still gets new events
            logger.warning("fx100io: listing the device for a new listener failed: %r", exc)
            return
        keys, sizes = _object_keys(rows)
        if keys:
            listener.on_l2_keys_stored(keys, sizes)

    # ----------------------------------------------------------------- helpers

    def _task_id(self) -> L2TaskId:
        with self._lock:
            if self._closed:
                raise ServiceClosed("the fx100io L2 adapter is closed")
            tid = self._next_id
            self._next_id += 1
            return tid

    @staticmethod
    def _name(key: ObjectKey) -> str | None:
        try:
            return object_key_name(key.kv_rank, key.object_group_id, key.chunk_hash,
                                   key.cache_salt, key.model_name)
        except (TypeError, ValueError, AttributeError) as exc:
            logger.warning("fx100io: key %r cannot be stored: %s", key, exc)
            return None

    @staticmethod
    def _view(obj: Any) -> memoryview:
        # exactly get_size() bytes: a bf16 tensor's numel is half its bytes, and the
        # allocator's padding after the object is not part of it
        return view_at(int(obj.data_ptr), int(obj.get_size()))

    def _publish(self, table: str, tid: L2TaskId, result: Any, fd: int) -> None:
        with self._lock:
            if fd not in self._fds:
                return  # closed: the fd number may already belong to someone else
            # looked up under the lock: pop_completed_store_tasks swaps the dict
            getattr(self, table)[tid] = result
            _signal(fd)  # after the result is visible

    # ----------------------------------------------------------------- event fds

    def get_store_event_fd(self) -> int:
        return self._store_fd

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._lookup_fd

    def get_load_event_fd(self) -> int:
        return self._load_fd

    # ----------------------------------------------------------------- store

    def submit_store_task(self, keys: list[ObjectKey], objects: list[Any]) -> L2TaskId:
        tid = self._task_id()
        keys = list(keys)
        names = [self._name(k) for k in keys]
        try:
            if len(keys) != len(objects):
                raise ValueError(f"{len(keys)} keys but {len(objects)} objects")
            views = [self._view(o) for o in objects]
        except Exception as exc:  # noqa: BLE001 - a bad batch is a failed task
            logger.warning("fx100io: store task rejected: %s", exc)
            names = [None]
            views = []
        if any(n is None for n in names):
            self._publish("_stores", tid, L2StoreResult(False, 0), self._store_fd)
            return tid
        svc = self._svc
        held = list(objects)  # the buffers stay referenced until the writes end

        async def put() -> tuple[list[bool], list[int | None]]:
            before = await svc.sizes(names)  # type: ignore[arg-type]
            return await svc.put(names, views), before  # type: ignore[arg-type]

        def done(result: Any, exc: BaseException | None) -> None:
            del held[:]
            ok = exc is None and result is not None and all(result[0])
            nbytes = sum(v.nbytes for v in views) if ok else 0
            self._publish("_stores", tid, L2StoreResult(ok, nbytes), self._store_fd)
            if ok:
                # a chunk stored again adds no bytes; the listener still sees the key
                sizes = [v.nbytes if old is None else 0 for v, old in zip(views, result[1])]
                self._notify_keys_stored(keys, sizes)

        self._svc.run(put(), done)
        return tid

    def pop_completed_store_tasks(self) -> dict[L2TaskId, L2StoreResult]:
        with self._lock:
            out, self._stores = self._stores, {}
        return out

    # ----------------------------------------------------------------- lookup

    def submit_lookup_and_lock_task(
        self, keys: list[ObjectKey], group_layout_descs: Any = None, layout_desc: Any = None
    ) -> L2TaskId:
        # The layout is advisory and a chunk's bytes and size are all the store needs, so
        # every revision's form is accepted and none is used: group_layout_descs (lmcache
        # 0.5.6), one layout_desc (earlier revisions), or nothing (later ones).
        tid = self._task_id()
        keys = list(keys)
        names = [self._name(k) for k in keys]

        svc = self._svc

        async def find_and_lock() -> list[bool]:
            # the locks are taken here, on the loop thread, in the same step as the
            # lookup: delete's drop() checks them on this thread just before it
            # deletes, so no eviction can slip between a hit and its lock
            found = await svc.exists(names)
            with self._lock:
                for k, hit in zip(keys, found):
                    if hit:
                        self._locks[k] = self._locks.get(k, 0) + 1
            return found

        def done(result: Any, exc: BaseException | None) -> None:
            bitmap = Bitmap(len(keys))
            if exc is None and result is not None:
                for i, hit in enumerate(result):
                    if hit:
                        bitmap.set(i)
            self._publish("_lookups", tid, bitmap, self._lookup_fd)

        self._svc.run(find_and_lock(), done)
        return tid

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._lookups.pop(task_id, None)

    def submit_unlock(self, keys: list[ObjectKey]) -> None:
        # never fails: an unknown or already unlocked key is simply not locked
        try:
            with self._lock:
                for key in keys:
                    n = self._locks.get(key, 0)
                    if n > 1:
                        self._locks[key] = n - 1
                    else:
                        self._locks.pop(key, None)
        except Exception:  # noqa: BLE001 - unlock must not raise (contract)
            logger.exception("fx100io: unlock failed")

    def _locked(self, key: ObjectKey) -> bool:
        with self._lock:
            return self._locks.get(key, 0) > 0

    # ----------------------------------------------------------------- load

    def submit_load_task(self, keys: list[ObjectKey], objects: list[Any]) -> L2TaskId:
        tid = self._task_id()
        keys = list(keys)
        names = [self._name(k) for k in keys]
        try:
            if len(keys) != len(objects):
                raise ValueError(f"{len(keys)} keys but {len(objects)} objects")
            views = [self._view(o) for o in objects]
        except Exception as exc:  # noqa: BLE001 - a bad batch loads nothing
            logger.warning("fx100io: load task rejected: %s", exc)
            self._publish("_loads", tid, Bitmap(len(keys)), self._load_fd)
            return tid
        held = list(objects)

        def done(result: Any, exc: BaseException | None) -> None:
            del held[:]
            bitmap = Bitmap(len(keys))
            loaded = []
            if exc is None and result is not None:
                for i, ok in enumerate(result):
                    if ok:
                        bitmap.set(i)
                        loaded.append(keys[i])
            self._publish("_loads", tid, bitmap, self._load_fd)
            if loaded:
                self._notify_keys_accessed(loaded)

        self._svc.run(self._svc.get(names, views), done)
        return tid

    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._loads.pop(task_id, None)

    # ----------------------------------------------------------------- eviction

    def delete(self, keys: list[ObjectKey]) -> None:
        """Delete chunks durably (LMCache's eviction). Locked keys stay: a load that
        LMCache was promised by a lookup still finds them."""
        pairs = [(k, n) for k in keys if (n := self._name(k)) is not None]
        if not pairs:
            return
        svc = self._svc

        def deleted(idx: list[int], sizes: list[int]) -> None:
            # on the loop as each chunk is gone: still told if this thread gave up
            self._notify_keys_deleted([pairs[i][0] for i in idx], sizes)

        async def drop() -> None:
            # on the loop thread, where lookups take their locks, just before each
            # chunk leaves the index: a key locked by then stays
            await svc.delete_sized([n for _, n in pairs],
                                   keep=lambda i: self._locked(pairs[i][0]),
                                   on_deleted=deleted)

        try:
            self._svc.call(drop())
        except Exception as exc:  # noqa: BLE001 - eviction retries later
            logger.warning("fx100io: delete of %d keys failed: %r", len(pairs), exc)

    def list_l2_keys(
        self, model_name: str | None = None, page_size: int = 500, cursor: str | None = None
    ) -> KeyListPage:
        """Every chunk on the device, also those a previous server stored (sorted by
        store key; the cursor is the last key of the previous page).

        A listing pages through one snapshot of the index, taken by its first page:
        a chunk stored after it is not listed, one deleted since may still be. Each
        further page costs a binary search, not a new pass over the device's keys."""
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        if cursor is not None and (not isinstance(cursor, str) or not cursor.startswith(OBJECT_PREFIX)):
            raise ValueError(f"malformed cursor {cursor!r}")
        names, rows = self._listing_snapshot(cursor is None)
        start = 0 if cursor is None else bisect.bisect_right(names, cursor)
        entries: list[KeyEntry] = []
        last: str | None = None
        more = False
        for name, size in itertools.islice(rows, start, None):
            fields = parse_object_key_name(name)
            if fields is None:
                continue
            rank, group, chash, salt, model = fields
            if model_name is not None and model != model_name:
                continue
            if len(entries) == page_size:
                more = True
                break
            try:
                key = ObjectKey(chunk_hash=chash, model_name=model, kv_rank=rank,
                                object_group_id=group, cache_salt=salt)
            except ValueError:
                continue
            entries.append(KeyEntry(key=key.to_encoded_object_key(), size_bytes=size))
            last = name
        return KeyListPage(entries=tuple(entries), next_page_token=last if more else None)

    def _listing_snapshot(self, fresh: bool) -> tuple[list[str], list[tuple[str, int]]]:
        """(sorted names, sorted rows) of the last snapshot, or a new one if fresh or
        none was taken. The loop only collects the names; sorting happens here."""
        with self._lock:
            snap = self._snapshot
        if fresh or snap is None:
            rows = self._svc.call(self._svc.listing(OBJECT_PREFIX, sort=False))
            rows.sort()
            snap = ([n for n, _ in rows], rows)
            with self._lock:
                self._snapshot = snap
        return snap

    def get_usage(self) -> AdapterUsage:
        """Bytes on the device (the store's own count, which also sees its LRU
        evictions) and the per-cache_salt counts kept by LMCache's base class."""
        try:
            used, capacity = self._svc.call(self._svc.usage())
        except Exception:  # noqa: BLE001 - closed or wedged: LMCache's own count
            return super().get_usage()
        with self._usage_lock:
            per_salt = {k: v for k, v in self._bytes_by_cache_salt.items() if v > 0}
        return AdapterUsage(total_bytes_used=used, total_capacity_bytes=capacity,
                            bytes_by_cache_salt=MappingProxyType(per_salt))

    def report_status(self) -> dict:
        """Health and counters, on LMCache's calling thread: store.stats() runs there
        (with a shared index, a Redis round trip on that thread, never on the loop).
        Health is read without side effects: a poll does not end the back-off."""
        s = self._svc.store.stats() if not self._svc.closed else {}
        return {
            "is_healthy": not self._closed and self._svc.healthy(),
            "type": "fx100io",
            "devices": [d.get("uri") for d in s.get("devices", [])],
            "chunks": s.get("chunks"),
            "hits": s.get("hits"),
            "misses": s.get("misses"),
            "corruptions": s.get("corruptions"),
        }

    # ----------------------------------------------------------------- close

    def close(self) -> None:
        """Wait for running I/O, unregister the L1 arena, close the store and release
        the device (a new adapter on it can start in this process), close the fds."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        drained = self._svc.close()
        reg, self._registration = self._registration, None
        if reg is not None:
            if drained:
                reg.close()
            else:  # I/O may still use the pages: the handle is kept, so they stay
                # registered (dropping it would unregister them)
                self._kept_registration = reg
                logger.error("fx100io: L1 arena left registered: requests still running")
        with self._lock:
            fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)


class FX100ioNativeClient:
    """The client LMCache's ``native_plugin`` type wraps (NativeConnectorL2Adapter).

    Built as ``FX100ioNativeClient(**adapter_params)``. Keys are LMCache's strings
    (``model@kvrank@group@hash[@salt]``); buffers are byte memoryviews of each object's
    logical size. One event fd; ``drain_completions`` returns ``(future_id, ok, error,
    per_key_bools)``.
    """

    def __init__(self, **adapter_params: Any) -> None:
        settings = parse_settings(adapter_params, WHERE)
        self._lock = threading.Lock()
        self._next_id = 1
        self._done: list[tuple[int, bool, str, list[bool] | None]] = []
        self._closed = False
        self._fd = _eventfd()
        try:
            self._svc = StoreService(settings)
        except BaseException:
            os.close(self._fd)
            raise
        logger.info("fx100io LMCache native client ready: %s", settings.describe())

    def event_fd(self) -> int:
        return self._fd

    def _submit(self, coro: Any, n: int, all_or_nothing: bool = False) -> int:
        with self._lock:
            if self._closed:
                coro.close()
                raise ServiceClosed("the fx100io native client is closed")
            fid = self._next_id
            self._next_id += 1

        def done(result: Any, exc: BaseException | None) -> None:
            if exc is not None or result is None:
                row = (fid, False, repr(exc), [False] * n)
            else:
                flags = [bool(x) for x in result]
                if all_or_nothing and not all(flags):
                    # LMCache's wrapper reads only the batch flag of a store: a chunk
                    # not stored must fail the whole batch, or it is counted as stored
                    row = (fid, False, "fx100io: the store failed", flags)
                else:
                    row = (fid, True, "", flags)
            with self._lock:
                if self._fd < 0:
                    return
                self._done.append(row)
                _signal(self._fd)

        self._svc.run(coro, done)
        return fid

    @staticmethod
    def _names(keys: list[str]) -> list[str]:
        return [native_key_name(k) for k in keys]

    def submit_batch_get(self, keys: list[str], buffers: list[Any]) -> int:
        views = [byte_view(b) for b in buffers]
        return self._submit(self._svc.get(self._names(keys), views), len(keys))

    def submit_batch_set(self, keys: list[str], buffers: list[Any]) -> int:
        views = [byte_view(b) for b in buffers]
        return self._submit(self._svc.put(self._names(keys), views), len(keys),
                            all_or_nothing=True)

    def submit_batch_exists(self, keys: list[str]) -> int:
        return self._submit(self._svc.exists(self._names(keys)), len(keys))

    def submit_batch_delete(self, keys: list[str]) -> int:
        return self._submit(self._svc.delete(self._names(keys)), len(keys))

    def drain_completions(self) -> list[tuple[int, bool, str, list[bool] | None]]:
        _drain(self._fd)  # first: a completion after this re-arms the fd
        with self._lock:
            out, self._done = self._done, []
        return out

    def list_keys(self) -> list[str]:
        """LMCache's key strings of every chunk this client type stored."""
        rows = sorted(self._svc.call(self._svc.listing(NATIVE_PREFIX, sort=False)))
        return [name[len(NATIVE_PREFIX):] for name, _ in rows]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._svc.close()
        with self._lock:
            fd, self._fd = self._fd, -1
        os.close(fd)

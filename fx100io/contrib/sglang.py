"""SGLang HiCache storage backend: the L3 tier of SGLang's hierarchical cache on a
ChunkStore (local files, block devices, NVMe-oF namespaces).

Loaded by SGLang's own backend factory, with no SGLang code of ours::

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
    '{"backend_name": "fx100io", "module_path": "fx100io.contrib.sglang",
      "class_name": "FX100ioHiCacheStorage", "interface_v1": 1,
      "devices": "file:///var/lib/fx100io/sglang-{worker_id}.img", "size": "256G"}'

The settings are those of every fx100io adapter (``devices``, ``size``, ``capacity``,
``direct``, ``queue_depth``, ``max_io``, ``create``, ...; see fx100io.contrib._settings),
read from the extra config beside SGLang's own keys; values may be strings.

What it translates (the logic lives in ChunkStore):

- ``batch_set_v1`` / ``batch_get_v1(keys, host_indices)``: one chunk per page, moved
  straight between the host KV pool's pages (``get_page_buffer_meta``: K and V of a
  page_first page, or 2 x layers pieces of a layer_first one) and the device, gathered
  and scattered by the store; the pool is registered with io_uring once
  (``register_mem_pool_host``). A page may come back into other host pages than it left.
- Keys: SGLang's page hashes carry no rank, so every chunk key is scoped by the
  ``namespace`` setting, the served model name (escaped one-to-one), the parallel
  layout (TP/PP/DP/CP/DCP rank), the pool layout as SGLang names it (page_first and
  page_first_direct order a page's bytes differently), dtype, page size and the pool's
  geometry (layers, heads, head dims, the sizes of a page's pieces): a chunk is never
  read into pages of another shape. Every field is escaped one-to-one and written out
  in full (fx100io.contrib._sglang_keys), so no two of these share a store key. The
  name does not say which weights: serving new
  weights under the same name needs a new ``namespace`` (or ``clear()``).
  With MLA the TP ranks hold the same KV and share one key: only the writer rank
  (``is_storage_writer``) writes, so TP > 1 needs ``shared_index`` (one pool that every
  rank reads); without it the backend refuses to start.
- Models with extra host pools (Mamba, SWA, DSA: SGLang's v2 calls) are refused at
  attach. With DP attention, ``dp_size`` in the extra config makes {world_size} right.
- Every call comes from SGLang's backup or prefetch thread, often both at once: they
  block on one event loop thread that owns the store. A read returns only when its I/O
  has ended, whatever happened (the pages are SGLang's to reuse once it returns).
  ``timeout_s`` bounds lookups and backups (an abandoned backup is never indexed), and
  is the io_timeout_ms of nvme+tcp/rdma devices, so a fabric read ends within it too;
  a local file's or block device's read is the kernel's and is not bounded. A device
  error, timeout or corrupt chunk answers False / a miss, never wrong bytes, and a
  device or transport failure (not a full device or a bad argument) leaves the device
  alone for ``retry_after_s`` (misses meanwhile). close() waits up to timeout_s for
  calls in flight, then cancels them and waits until their I/O has ended (a cancelled
  read answers False only once nothing more lands in its pages); calls after close
  miss at once.
- Chunks persist: a new instance on the same devices (after a restart, or a detach and
  re-attach in the same process) finds every chunk written before.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import ctypes
import dataclasses
import errno
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

from fx100io.errors import Fx100ioMessageError
from fx100io.pool import aligned_array
from fx100io.priority import Priority
from fx100io.store import ChunkStore
from fx100io.store.core.pieces import gather, nbytes, scatter

from . import _sglang_keys as sgl_keys
from ._runtime import Breaker, LoopRunner, TimedOut, is_device_error
from ._settings import BackendConfigError, BackendSettings, open_backend_store, parse_settings

logger = logging.getLogger("fx100io.contrib.sglang")


class StoreClosed(Fx100ioMessageError, RuntimeError):
    """The backend was closed before or during the call."""

    ERRNO = errno.EBADF

__all__ = ["FX100ioHiCacheStorage", "BackendConfigError"]

WHERE = "extra_config."
# SGLang's own keys in the extra config: the dynamic loader's, and the ones SGLang reads
# (or adds) for every backend.
SGLANG_KEYS = (
    "backend_name", "module_path", "class_name", "interface_v1", "file_storage_path",
    "tp_lcm_size", "prefetch_threshold", "prefetch_timeout_base",
    "prefetch_timeout_per_ki_token", "hicache_storage_pass_prefix_keys",
    "namespace",  # ours, read here: scopes every key (new weights under the same name)
    "dp_size",  # ours: the DP attention size, for {world_size} (SGLang passes dp_rank only)
)
# pool tensors the backend registers as io_uring fixed buffers, where the pool has them
POOL_TENSORS = ("kv_buffer", "k_buffer", "v_buffer")


def rank_scope(cfg: HiCacheStorageConfig) -> str:
    """The part of a chunk key that names which shard of the KV cache it holds."""
    parts = []
    if not cfg.is_mla_model:  # MLA KV is the same on every TP rank
        parts.append(f"tp{cfg.tp_rank}of{cfg.tp_size}")
    if cfg.pp_size > 1:
        parts.append(f"pp{cfg.pp_rank}of{cfg.pp_size}")
    if getattr(cfg, "attn_cp_size", 1) > 1:
        parts.append(f"cp{cfg.attn_cp_rank}of{cfg.attn_cp_size}")
    if getattr(cfg, "dcp_size", 1) > 1:
        parts.append(f"dcp{cfg.dcp_rank}of{cfg.dcp_size}p{cfg.logical_page_size}")
    if getattr(cfg, "dp_rank", 0):
        parts.append(f"dp{cfg.dp_rank}")
    if getattr(cfg, "tp_lcm_size", None) and getattr(cfg, "should_split_heads", False):
        parts.append(f"lcm{cfg.tp_lcm_size}")
    return ".".join(parts) or "all"


def worker_index(cfg: HiCacheStorageConfig, dp_size: int = 1) -> tuple[int, int]:
    """(worker_id, world_size) for {worker_id} in device URIs: one per scheduler
    process of this server (each rank opens devices of its own). With DP attention
    SGLang gives the DP rank but not the DP size: ``dp_size`` in the extra config
    makes {world_size} count every DP group."""
    tp, pp = max(cfg.tp_size, 1), max(cfg.pp_size, 1)
    cp = max(getattr(cfg, "attn_cp_size", 1), 1)
    dp_rank = getattr(cfg, "dp_rank", 0) or 0
    wid = (dp_rank * pp * cp + cfg.pp_rank * cp + getattr(cfg, "attn_cp_rank", 0)) * tp + cfg.tp_rank
    return wid, tp * pp * cp * max(dp_size, dp_rank + 1, 1)


def _with_io_timeout(uri: str, timeout_s: float) -> str:
    """A fabric URI whose commands fail after timeout_s unless it sets io_timeout_ms."""
    if not uri.startswith(("nvme+tcp://", "nvme+rdma://")) or "io_timeout_ms=" in uri:
        return uri
    ms = max(1, min(0x7FFFFFFF, int(timeout_s * 1000)))
    return f"{uri}{'&' if '?' in uri else '?'}io_timeout_ms={ms}"


def _byte_view(ptr: int, size: int) -> memoryview:
    """The host pool's memory at [ptr, ptr + size) as a writable byte view (no copy)."""
    return memoryview((ctypes.c_ubyte * size).from_address(ptr)).cast("B")


def _aligned(n: int) -> memoryview:
    return aligned_array(n).data


def _tensor_bytes(t: torch.Tensor, writable: bool) -> memoryview:
    if t.device.type != "cpu":
        raise ValueError(f"fx100io moves host memory; got a tensor on {t.device}")
    if not t.is_contiguous():
        if writable:
            raise ValueError("the target tensor must be contiguous")
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().data.cast("B")


class FX100ioHiCacheStorage(HiCacheStorage):
    """An SGLang HiCache storage backend on an fx100io ChunkStore."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None) -> None:
        self.storage_config = storage_config
        extra = dict(storage_config.extra_config or {})
        name = str(extra.get("backend_name") or "fx100io")
        try:
            dp_size = int(extra.get("dp_size") or 1)
        except (TypeError, ValueError):
            raise BackendConfigError(
                f"{WHERE}dp_size: expected a whole number, got {extra.get('dp_size')!r}") from None
        wid, world = worker_index(storage_config, dp_size)
        self.settings: BackendSettings = parse_settings(
            extra, WHERE, name=name, worker_id=wid, world_size=world, extra_keys=SGLANG_KEYS)
        # timeout_s bounds every fabric command (the device fails it, the call returns)
        self.settings = dataclasses.replace(self.settings, devices=tuple(
            _with_io_timeout(u, self.settings.timeout_s) for u in self.settings.devices))
        # (older SGLang has no is_storage_writer: MLA's writer is TP rank 0 there)
        self.is_writer = bool(getattr(storage_config, "is_storage_writer",
                                      not storage_config.is_mla_model or storage_config.tp_rank == 0))
        # SGLang calls the zero-copy pair with interface_v1, else the tensor API; each
        # has keys of its own (a flat tensor is not laid out as a page's pieces), and
        # batch_exists answers for the one in use
        # exactly as SGLang's cache controller reads it (a string "0" is true there)
        self.zero_copy = bool(extra.get("interface_v1", 0))
        namespace = str(extra.get("namespace") or "")
        self._scope = sgl_keys.scope(namespace, storage_config.model_name, rank_scope(storage_config))
        if (storage_config.is_mla_model
                and storage_config.tp_size > max(1, getattr(storage_config, "dcp_size", 1))
                and not self.settings.shared_index):
            # only the writer rank backs pages up; the others would read devices of their
            # own that stay empty, and SGLang takes the least prefetch hit count of the ranks
            raise BackendConfigError(
                f"{WHERE}shared_index: an MLA model with tp_size {storage_config.tp_size} "
                f"needs {WHERE}shared_index (one pool all TP ranks read; only one rank writes "
                "MLA pages), or run with tp_size 1")
        self.mem_pool_host: Any = None
        self._page_prefix: str | None = None
        self._page_sizes: list[int] = []  # the byte size of each piece of one page
        self._pool_spans: list[tuple[int, int]] = []  # [start, end) of the pool's tensors
        self._registrations: list[Any] = []
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        # calls running on the loop, each until its coroutine has ended there
        self._inflight: dict[concurrent.futures.Future[Any], _Call] = {}
        self._calls = 0
        self._closed = False
        self._breaker = Breaker(self.settings.retry_after_s, logger, engine="SGLang")
        self._prefetch = Priority[self.settings.prefetch_priority.upper()]
        # SGLang reads these only with enable_storage_metrics; bounded all the same
        self._metrics: dict[str, collections.deque[float]] = {
            k: collections.deque(maxlen=4096)
            for k in ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth")}
        self._runner = LoopRunner(None, engine="sglang")
        try:
            self._backend = self._runner.call(self._open(), wait_s=max(600.0, self.settings.timeout_s))
        except BaseException:
            self._runner.stop()
            raise
        self._store = self._backend.store
        # ChunkStore gathers a page's pieces itself; a store that takes one buffer per
        # chunk (a shared pool) gets them through one bounce buffer per page
        self._gather = not isinstance(self._store, ChunkStore)
        logger.info("fx100io: SGLang HiCache backend on %s, keys under %s (%s)",
                    self.settings.describe(), self._scope,
                    "writer" if self.is_writer else "reader")

    async def _open(self) -> Any:
        # on the loop thread: the store's queues belong to the thread that opened it
        return open_backend_store(self.settings, log=logger)

    # ------------------------------------------------------------ host pool
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Take the host KV pool: its page shape scopes the keys, and its memory is
        registered once so that every page moves with io_uring fixed buffers."""
        super().register_mem_pool_host(mem_pool_host)
        # the layout as SGLang names it: page_first_direct orders a page's bytes unlike
        # page_first (pages, then layers, then tokens), so the two never share a key
        layout = str(getattr(mem_pool_host, "layout", "page_first"))
        dtype = str(getattr(mem_pool_host, "dtype", "")).replace("torch.", "")
        page_size = int(getattr(mem_pool_host, "page_size", 1))
        self._pool_spans = [(int(t.data_ptr()), int(t.data_ptr()) + t.numel() * t.element_size())
                            for t in self._pool_tensors(mem_pool_host)]
        # the pieces of one page, as the pool gives them: their sizes, and the pool's
        # geometry, scope the keys (a pool of other heads or layers never reads a page)
        try:
            meta = mem_pool_host.get_page_buffer_meta(torch.arange(page_size))
            self._page_sizes = [int(n) for n in meta[1]] if meta else []
        except Exception:
            if self.zero_copy:
                raise
        geometry = sgl_keys.geometry(
            [(a, getattr(mem_pool_host, a, None))
             for a in ("layer_num", "head_num", "head_dim", "v_head_dim", "kv_lora_rank",
                       "qk_rope_head_dim", "start_layer", "end_layer")],
            self._page_sizes)
        self._page_prefix = sgl_keys.page_prefix(self._scope, layout, dtype, page_size, geometry)
        self._register_pool(mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """Hybrid models (Mamba, sliding window, DSA) move extra pools through SGLang's
        v2 calls, which this backend does not serve: refused at attach, not per request."""
        raise NotImplementedError(
            f"fx100io's SGLang backend stores the KV pool only (batch_*_v1); the model's "
            f"extra host pool {host_pool_name!r} needs the v2 interface: use another "
            "HiCache storage backend for hybrid (Mamba/SWA/DSA) models")

    @staticmethod
    def _pool_tensors(pool: Any) -> list[torch.Tensor]:
        tensors: list[torch.Tensor] = []
        for attr in POOL_TENSORS:
            t = getattr(pool, attr, None)
            for one in (t if isinstance(t, (list, tuple)) else [t]):
                if (isinstance(one, torch.Tensor) and one.device.type == "cpu"
                        and one.is_contiguous() and all(one is not s for s in tensors)):
                    tensors.append(one)
        return tensors

    def _register_pool(self, pool: Any) -> None:
        if not self.settings.register_buffers:
            return
        import fx100io

        tensors = self._pool_tensors(pool)
        for t in tensors:
            try:
                view = t.reshape(-1).view(torch.uint8).numpy().data.cast("B")
                self._registrations.append(fx100io.register_memory(view))
            except Exception as exc:  # noqa: BLE001 - unregistered memory still works
                logger.warning("fx100io: registering the host KV pool failed (%r); "
                               "continuing without", exc)
                return
        if tensors:
            logger.info("fx100io: registered the host KV pool (%d MiB) with io_uring",
                        sum(t.numel() * t.element_size() for t in tensors) >> 20)

    # ------------------------------------------------------------ keys
    def _page_key(self, key: str) -> str:
        if self._page_prefix is None:
            raise RuntimeError("no host pool registered yet (register_mem_pool_host)")
        return sgl_keys.page_key(self._page_prefix, key)

    def _flat_key(self, key: str) -> str:
        return sgl_keys.flat_key(self._scope, key)

    # ------------------------------------------------------------ plumbing
    def _run(self, coro: Any, bounded: bool = True) -> Any:
        """Run a store coroutine on the loop thread and wait for it to end.

        Whatever happens, this returns only once the coroutine has ended on the loop:
        its buffers are SGLang's pages, which SGLang reuses as soon as we return, and a
        store call that is cancelled still lets the pieces already sent land.
        ``bounded``: after timeout_s the call is cancelled (a put cancelled before its
        index commit is never found), and we wait for it to end. A read
        (``bounded=False``) is waited for until it ends. Fabric devices end every
        command within io_timeout_ms (timeout_s unless the URI says otherwise); a local
        file's read is the kernel's and is not bounded. After close() every call fails
        at once; close() cancels calls still in flight and waits for them to end."""
        call = _Call()
        with self._lock:
            if self._closed:
                if hasattr(coro, "close"):
                    coro.close()
                raise StoreClosed("the backend is closed")
            try:
                fut = self._runner.submit(call.run(coro))
            except RuntimeError:
                if hasattr(coro, "close"):
                    coro.close()
                raise
            self._inflight[fut] = call
        try:
            try:
                return fut.result(timeout=self.settings.timeout_s if bounded else None)
            except concurrent.futures.TimeoutError:
                call.cancel(self._runner.loop)
                try:
                    fut.result()  # ended: cancelled, or done just now
                except (concurrent.futures.CancelledError, Exception):  # noqa: BLE001
                    pass
                raise TimedOut(f"store call still running after {self.settings.timeout_s}s") \
                    from None
            except concurrent.futures.CancelledError:
                raise StoreClosed("the backend closed during the call") from None
        finally:
            with self._lock:
                self._inflight.pop(fut, None)
                self._idle.notify_all()

    def _usable(self) -> bool:
        return not self._closed and self._breaker.usable()

    def _pieces(self, keys: Sequence[str], host_indices: Any) -> list[list[memoryview]]:
        """Each key's page as the pool's pieces, checked: one page of host_indices per
        key, the pieces of a page as at registration, each inside the pool's memory."""
        pool = self.mem_pool_host
        if pool is None:
            raise RuntimeError("no host pool registered yet (register_mem_pool_host)")
        page_size = int(getattr(pool, "page_size", 1))
        n_idx = int(host_indices.numel()) if hasattr(host_indices, "numel") else len(host_indices)
        if n_idx != len(keys) * page_size:
            raise ValueError(f"{len(keys)} keys but {n_idx} host indices "
                             f"(pages of {page_size} tokens)")
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        per = len(self._page_sizes)
        if len(ptrs) != len(sizes) or len(ptrs) != len(keys) * per:
            raise ValueError(f"{len(keys)} keys but {len(ptrs)} page buffers "
                             f"({per} per page at registration)")
        out = []
        for i in range(len(keys)):
            page = []
            for j in range(per):
                ptr, size = int(ptrs[i * per + j]), int(sizes[i * per + j])
                if size != self._page_sizes[j]:
                    raise ValueError(f"a page piece of {size} bytes; {self._page_sizes[j]} "
                                     "at registration")
                if self._pool_spans and not any(a <= ptr and ptr + size <= b
                                                 for a, b in self._pool_spans):
                    raise ValueError(f"page piece at {ptr:#x}+{size} is outside the host pool")
                page.append(_byte_view(ptr, size))
            out.append(page)
        return out

    def _record(self, kind: str, pages: int, nbytes: int, started: float) -> None:
        if not getattr(self.storage_config, "enable_storage_metrics", False):
            return
        dt = time.perf_counter() - started
        with self._lock:
            self._metrics[f"{kind}_pgs"].append(pages)
            self._metrics[f"{kind}_bandwidth"].append(nbytes / dt / 1e9 if dt > 0 else 0.0)

    async def _sizes(self, names: list[str]) -> list[int | None]:
        many = getattr(self._store, "achunk_sizes", None)  # a shared pool: one round trip
        if many is not None:
            return list(await many(names))
        return [self._store.chunk_size(n) for n in names]

    async def _get_exact(self, names: list[str], bufs: list[Any], sizes: list[int]) -> list[bool]:
        """Read chunks whose size must be exactly the buffers': any other size is a
        miss (a chunk is never read into a part of the pages).  Every read of SGLang's
        comes from its prefetch thread, and under SGLang's default prefetch policy
        (timeout) a request waits for it: prefetch_priority's class, load by default."""
        have = await self._sizes(names)
        want = [i for i, n in enumerate(sizes) if have[i] == n]
        out = [False] * len(names)
        if not want:
            return out
        if self._gather:
            flat = [_aligned(sizes[i]) for i in want]
            hits = await self._store.batch_get([names[i] for i in want], flat,
                                               priority=self._prefetch)
            for i, f, ok in zip(want, flat, hits):
                if ok:
                    scatter(f, bufs[i])
        else:
            hits = await self._store.batch_get([names[i] for i in want],
                                               [bufs[i] for i in want], priority=self._prefetch)
        for i, ok in zip(want, hits):
            out[i] = bool(ok)
        return out

    async def _put_new(self, names: list[str], bufs: list[Any]) -> tuple[int, int]:
        """Store the chunks not stored yet (a page's bytes never change under its
        key); (chunks, bytes) written."""
        have = await self._sizes(names)
        # a chunk of another size under the key (never a page of this pool) is replaced
        todo = [i for i, n in enumerate(have) if n != nbytes(bufs[i])]
        if not todo:
            return 0, 0
        data = [bufs[i] for i in todo]
        if self._gather:
            data = [gather(b) for b in data]
        await self._store.batch_put([names[i] for i in todo], data, priority=Priority.STORE)
        return len(todo), sum(nbytes(bufs[i]) for i in todo)

    # ------------------------------------------------------------ zero copy
    def batch_get_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        if not keys:
            return []
        if not self._usable():
            return [False] * len(keys)
        started = time.perf_counter()
        try:
            bufs = self._pieces(keys, host_indices)
            sizes = [sum(p.nbytes for p in b) for b in bufs]
            out = self._run(self._get_exact([self._page_key(k) for k in keys], bufs, sizes),
                            bounded=False)
        except Exception as exc:  # noqa: BLE001 - SGLang takes False as "recompute"
            self._fail("batch_get_v1", exc)
            return [False] * len(keys)
        self._record("prefetch", sum(out), sum(n for n, ok in zip(sizes, out) if ok), started)
        return out

    def batch_set_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        if not keys:
            return []
        if not self.is_writer:
            return [True] * len(keys)  # the writer rank stores the shared MLA pages
        if not self._usable():
            return [False] * len(keys)
        started = time.perf_counter()
        try:
            bufs = self._pieces(keys, host_indices)
            pages, nbytes = self._run(self._put_new([self._page_key(k) for k in keys], bufs))
            if pages:
                self._record("backup", pages, nbytes, started)
        except Exception as exc:  # noqa: BLE001
            self._fail("batch_set_v1", exc)
            return [False] * len(keys)
        return [True] * len(keys)

    # ------------------------------------------------------------ lookups
    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many LEADING keys are stored (SGLang loads that prefix)."""
        if not keys or not self._usable():
            return 0
        try:
            if not self.zero_copy:
                return int(self._run(self._store.batch_exists([self._flat_key(k) for k in keys])))
            # a page key counts only with a chunk of this pool's page size under it
            page = sum(self._page_sizes)
            sizes = self._run(self._sizes([self._page_key(k) for k in keys]))
            n = 0
            while n < len(sizes) and sizes[n] == page:
                n += 1
            return n
        except Exception as exc:  # noqa: BLE001
            self._fail("batch_exists", exc)
            return 0

    # ------------------------------------------------------------ tensor API
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        out = self.batch_get([key], [target_location])
        return out[0] if out else None

    def batch_get(self, keys: list[str], target_locations: Any = None,
                  target_sizes: Any = None) -> list[Any]:
        if not keys:
            return []
        if target_locations is None or not self._usable():
            return [None] * len(keys)
        try:
            bufs = [[_tensor_bytes(t, writable=True)] for t in target_locations]
            hits = self._run(self._get_exact([self._flat_key(k) for k in keys], bufs,
                                             [nbytes(b) for b in bufs]), bounded=False)
        except Exception as exc:  # noqa: BLE001
            self._fail("batch_get", exc)
            return [None] * len(keys)
        return [t if ok else None for t, ok in zip(target_locations, hits)]

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        if not keys:
            return True
        if not self.is_writer:
            return True
        if values is None or not self._usable():
            return False
        try:
            bufs = [[_tensor_bytes(v, writable=False)] for v in values]
            self._run(self._put_new([self._flat_key(k) for k in keys], bufs))
        except Exception as exc:  # noqa: BLE001
            self._fail("batch_set", exc)
            return False
        return True

    # ------------------------------------------------------------ the rest
    def clear(self) -> None:
        """Delete this rank's chunks (those under its key scope), durably."""
        if self._closed:
            return
        mine = self._scope.encode() + b"/"

        async def drop() -> int:
            akeys = getattr(self._store, "akeys", None)  # a shared pool: off the loop
            keys = list(await akeys()) if akeys is not None else list(self._store.keys())
            doomed = [k for k in keys if k.startswith(mine)]
            many = getattr(self._store, "batch_delete", None)
            n = 0
            for i in range(0, len(doomed), 1024):
                part = doomed[i:i + 1024]
                if many is not None:
                    got = await many(part)
                    n += sum(map(bool, got)) if isinstance(got, (list, tuple)) else int(got or 0)
                else:
                    for k in part:
                        n += bool(await self._store.delete(k))
            return n
        try:
            logger.info("fx100io: cleared %d chunks", self._run(drop()))
        except Exception as exc:  # noqa: BLE001
            self._fail("clear", exc)

    def get_stats(self) -> Any:
        """SGLang's StorageMetrics (pages and GB/s of each prefetch and backup call
        since the last call), or None where that class cannot be imported."""
        with self._lock:
            snap: dict[str, list[float]] = {k: list(v) for k, v in self._metrics.items()}
            for v in self._metrics.values():
                v.clear()
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except Exception:  # noqa: BLE001 - its module needs prometheus_client
            return None
        m = StorageMetrics()
        for k, vals in snap.items():
            getattr(m, k).extend(vals)
        return m

    def stats(self) -> dict[str, Any]:
        """The store's counters (chunks, hits, misses, corruptions, bytes, ...)."""
        return dict(self._store.stats(), breaker_trips=self._breaker.trips)

    def _fail(self, what: str, exc: BaseException) -> None:
        """A device error leaves the device alone for retry_after_s (misses, not
        waits); anything else is this call's alone."""
        if self._closed or isinstance(exc, StoreClosed):
            return
        if is_device_error(exc):
            self._breaker.trip(what, exc)
        else:
            logger.error("fx100io: %s failed: %r", what, exc)

    def close(self) -> None:
        """Close the store (durable already), release the devices and the pool's
        registration; a new instance may open the same devices in this process.

        Calls in flight get timeout_s to end; then they are cancelled, and close waits
        for them to end (their pieces already sent still land in SGLang's pages, so
        neither they nor close return before). Only if one still runs after another
        timeout_s (a device that never answers) does close give up: the store, its
        loop and the pool's registration then stay as they are, for the call's I/O
        still uses them, and the call itself returns only when that I/O ends."""
        with self._lock:
            if self._closed:
                return
            self._closed = True  # no call starts from here on
            deadline = time.monotonic() + self.settings.timeout_s
            while self._inflight and time.monotonic() < deadline:
                self._idle.wait(max(0.0, deadline - time.monotonic()))
            stuck = list(self._inflight.values())
            if stuck:
                logger.error("fx100io: closing with %d store calls still running; "
                             "cancelling them", len(stuck))
                for call in stuck:
                    call.cancel(self._runner.loop)  # their callers return False / misses
                deadline = time.monotonic() + self.settings.timeout_s
                while self._inflight and time.monotonic() < deadline:
                    self._idle.wait(max(0.0, deadline - time.monotonic()))
            if self._inflight:
                logger.error("fx100io: %d store calls did not end after cancelling; the "
                             "store stays open under them", len(self._inflight))
                return

        async def shut() -> None:
            if hasattr(self._store, "aclose"):
                await self._store.aclose()  # index commits still queued end off the loop
            self._backend.close()
        try:
            self._runner.call(shut(), wait_s=max(60.0, self.settings.timeout_s))
        finally:
            for r in self._registrations:
                r.close()
            self._registrations.clear()
            self._runner.stop()


class _Call:
    """One store call on the loop, cancellable from any thread: cancelling cancels its
    task on the loop (the caller's future then ends once the task has), or, before the
    task started, makes it end before it touches the store."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False

    async def run(self, coro: Any) -> Any:
        with self._mu:
            if self._cancelled:
                coro.close()
                raise asyncio.CancelledError
            self._task = asyncio.current_task()
        return await coro

    def cancel(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._mu:
            self._cancelled = True
            task = self._task
        if task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop is closed: the task ended with it
                pass

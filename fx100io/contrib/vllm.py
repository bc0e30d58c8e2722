"""vLLM secondary offloading tier backed by an fx100io ChunkStore.

vLLM's native KV offloading (``OffloadingConnector`` with ``spec_name:
TieringOffloadingSpec``) keeps a CPU primary tier and hands chunks to secondary tiers
that it loads from ``kv_connector_extra_config.secondary_tiers``::

    "secondary_tiers": [{"type": "FX100ioTier", "module_path": "fx100io.contrib.vllm",
                         "devices": "file:///var/lib/fx100io/vllm.img", "size": "64G"}]

Every other key of the entry is one of the settings the LMCache plugin takes (devices,
size, capacity, direct, queue_depth, max_io, create, timeout_s, retry_after_s, ...;
values may be strings), plus ``namespace`` (any string, folded into every key: the
weights' revision, which vLLM's config does not name). devices may use {worker_id},
{world_size}, {dp_rank} and {dp_size} (data-parallel replicas on one host all have
worker rank 0: give each its own device with {dp_rank}).

The tier has no storage logic of its own: it names chunks (vLLM's OffloadKey is only a
block hash and a group index, so the model, dtype and parallel layout are folded into
each store key) and moves the primary tier's rows to and from the store. vLLM calls
the methods under the tiering manager's lock (from the scheduler thread, or another
thread holding that lock), so none of them waits on a device: stores and loads run as
coroutines on a loop thread of the tier's own. A lookup on a local ChunkStore reads its
in-memory index directly; with a shared index (Redis) the check runs on the loop and
lookup answers RETRY until it lands, the answer living while a request that asked
holds it. While a store of a chunk is in flight its lookup answers RETRY.

Breaker: after a device error, or a job running longer than timeout_s, lookups answer
MISS and new jobs are refused (failed at once) for retry_after_s, logged once; a job
in flight is never abandoned (its rows stay in use until its I/O ends, and
drain_jobs/shutdown wait for it; shutdown raises RuntimeError if it outlives
SHUTDOWN_WAIT_S, so vLLM does not free rows still being written).
touch marks chunks as just used in a local store's LRU (a shared index keeps its own
order); a store job's chunks that are already kept count as used too. With
``enable_kv_events`` (as vLLM's fs tier takes it, and only while KV cache events are on
globally; refused with a shared index, whose evictions are not observable here),
take_events reports the chunks each successful store job left in the store, then the
chunks the store's LRU evicted (removed), in the order they happened, owned by this tier
(``ownership`` = the tier's type, ``removal_expected``). Metrics are not implemented.

Failure policy: a chunk that is missing, has the wrong size or fails its CRC32C is a
failed load (vLLM recomputes it); a failed store only means the chunk is not kept. A
job is reported only once its I/O has really finished, because vLLM reuses the primary
rows of a finished job at once.
"""

from __future__ import annotations

import concurrent.futures
import errno
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import (
    JobId,
    JobResult,
    SecondaryTierManager,
    TransferJob,
)

from ..errors import Fx100ioMessageError
from ..priority import Priority
from . import _vllm_keys as vllm_keys
from ._runtime import LoopRunner
from ._settings import (
    BackendConfigError,
    BackendSettings,
    open_backend_store,
    parse_bool,
    parse_settings,
)
from ._vllm_keys import namespace

logger = logging.getLogger("fx100io.contrib.vllm")

WHERE = "secondary_tiers[FX100ioTier]."
# How long construction may take to open (or format) the store, and shutdown to wait
# for jobs still in flight before it gives up on them.
OPEN_WAIT_S = 300.0
SHUTDOWN_WAIT_S = 60.0


def _expand_dp(params: dict[str, Any], offloading_spec: Any) -> dict[str, Any]:
    """Fill {dp_rank}/{dp_size} in devices: data-parallel replicas on one host are each
    an EngineCore whose worker rank is 0, so {worker_id} alone would collide."""
    par = getattr(getattr(offloading_spec, "config", None), "parallel", None)
    dp = int(getattr(par, "data_parallel_index", 0) or 0)
    dps = int(getattr(par, "data_parallel_size", 1) or 1)

    def fill(v: Any) -> Any:
        if isinstance(v, str):
            return v.replace("{dp_rank}", str(dp)).replace("{dp_size}", str(dps))
        if isinstance(v, (list, tuple)):
            return type(v)(fill(x) for x in v)
        return v

    if "devices" in params:
        params["devices"] = fill(params["devices"])
    return params


def _rank_of(offloading_spec: Any) -> tuple[int, int]:
    par = getattr(getattr(offloading_spec, "config", None), "parallel", None)
    if par is None:
        return 0, 1
    return int(par.rank), int(par.world_size)


class FX100ioTier(SecondaryTierManager):  # type: ignore[misc]
    """A vLLM ``SecondaryTierManager`` over an fx100io ChunkStore (NVMe, NVMe-oF, files)."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        locality: str | None = None,
        **params: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = Locality(locality) if locality is not None else None
        rank, world = _rank_of(offloading_spec)
        params = dict(params)
        extra_ns = params.pop("namespace", None)
        if extra_ns is not None and not isinstance(extra_ns, str):
            raise ValueError(f"{WHERE}namespace: expected a string, got {extra_ns!r}")
        want_events = parse_bool(params.pop("enable_kv_events", None), WHERE + "enable_kv_events", False)
        if "prefetch_priority" in params:
            # vLLM's tier has no prefetch: every read is a load a request waits on.
            # Refused rather than ignored, so nobody believes it changed something.
            raise BackendConfigError(
                f"{WHERE}prefetch_priority: vLLM's tier has no prefetch reads (every read "
                "is a load a request waits for); remove the key")
        params = _expand_dp(params, offloading_spec)
        self.settings: BackendSettings = parse_settings(
            params, WHERE, worker_id=rank, world_size=world
        )
        if primary_kv_view.ndim != 2 or not primary_kv_view.c_contiguous:
            raise ValueError(
                f"{WHERE[:-1]}: the primary tier's view must be a C-contiguous 2-D memoryview "
                f"(chunks x bytes), got ndim={primary_kv_view.ndim}"
            )
        self._chunk_bytes = self.block_size_bytes
        self._nchunks = primary_kv_view.shape[0] if primary_kv_view.shape else 0
        # One flat byte view of the primary tier: chunk c is [c*size, (c+1)*size).
        self._flat: memoryview | None = primary_kv_view.cast("B")
        self._prefix = vllm_keys.prefix(namespace(offloading_spec, self._chunk_bytes, extra_ns))

        # Scheduler-thread state (vLLM serialises every call under its lock).
        self._jobs: dict[JobId, tuple[concurrent.futures.Future[JobResult], TransferJob]] = {}
        self._job_started: dict[JobId, float] = {}  # monotonic start of each running job
        self._breaker = _Breaker(self.settings.timeout_s, self.settings.retry_after_s)
        self._storing: dict[bytes, int] = {}  # store key -> stores in flight
        self._req_keys: dict[str, set[bytes]] = {}  # request -> keys it looked up
        self._key_refs: dict[bytes, int] = {}  # key -> requests that looked it up
        # Only for a store whose index answers by coroutine (a SharedChunkStore's Redis);
        # a local ChunkStore's index is an in-memory dict that lookup reads directly.
        # A key's epoch is set when its first holder asks and dropped with its last one;
        # an answer is kept only if the key still has the epoch it was asked under, so an
        # answer landing after every asker finished is thrown away.
        # Written by the loop thread, read by the scheduler: True present, False absent.
        # A key without a verdict is being checked (or not yet asked for).
        self._verdicts: dict[bytes, bool] = {}
        self._epoch: dict[bytes, int] = {}
        self._next_epoch = 0
        self._to_check: dict[bytes, int] = {}  # key -> epoch it was asked under
        self._check_lock = threading.Lock()
        self._torn_down = False
        self._check_scheduled = False
        self._closed = False

        # KV events (take_events), when asked for and on globally: appended by the
        # scheduler thread (stores) and the store's index thread (evictions).
        self._events: list[OffloadingEvent] | None = None
        self._events_lock = threading.Lock()
        if want_events:
            if getattr(getattr(offloading_spec, "kv_events_config", None),
                       "enable_kv_cache_events", False):
                self._events = []
            else:
                logger.warning("fx100io: enable_kv_events is set on tier %r but KV cache "
                               "events are off globally; the tier emits none", tier_type)

        self._runner = LoopRunner(None, engine="vllm")
        self._backend: Any = None
        self._registration: Any = None
        try:
            self._backend = self._runner.call(self._open(), OPEN_WAIT_S)
            self._register_primary()
            if self._events is not None:
                if _async_index(self.store) or not hasattr(self.store, "on_evict"):
                    raise ValueError(
                        f"{WHERE}enable_kv_events: not with a shared index (shared_index): "
                        "its evictions are not observable here, so removals would never be "
                        "reported and a KV-aware router's view would only grow")
                self.store.on_evict = self._evicted
        except BaseException:
            try:
                self._teardown(wait_s=5.0)
            except RuntimeError:  # no job can run yet; keep the original error
                pass
            raise
        logger.info(
            "fx100io: vLLM tier %r ready: %s; %d primary chunks of %d bytes",
            tier_type,
            self.settings.describe(),
            self._nchunks,
            self._chunk_bytes,
        )

    # ------------------------------------------------------------ setup
    async def _open(self) -> Any:
        # The store is opened, used and closed on the loop thread (its queues are
        # per thread); opening may format a device, which is fine at construction.
        return open_backend_store(self.settings, log=logger)

    @property
    def store(self) -> Any:
        return self._backend.store

    def _register_primary(self) -> None:
        if not self.settings.register_buffers or self._flat is None or not self._flat.nbytes:
            return
        import fx100io

        try:
            self._registration = fx100io.register_memory(self._flat)
        except Exception as exc:  # noqa: BLE001 - unregistered memory still works
            logger.warning("fx100io: registering vLLM's primary tier failed (%r); continuing", exc)

    # ------------------------------------------------------------ keys and views
    def _key(self, key: OffloadKey) -> bytes:
        return vllm_keys.chunk_key(self._prefix, bytes(key))

    def _rows(self, chunk_ids: Any) -> list[memoryview]:
        flat = self._flat
        assert flat is not None
        size = self._chunk_bytes
        rows = []
        for c in chunk_ids:
            c = int(c)
            if not 0 <= c < self._nchunks:
                raise IndexError(f"chunk id {c} outside the primary tier (0..{self._nchunks - 1})")
            rows.append(flat[c * size:(c + 1) * size])
        return rows

    def _offload_key(self, store_key: bytes) -> OffloadKey | None:
        """The vLLM key of one of this tier's store keys (None for another's)."""
        if not store_key.startswith(self._prefix):
            return None
        try:
            return OffloadKey(bytes.fromhex(store_key[len(self._prefix):].decode()))
        except ValueError:
            return None

    # ------------------------------------------------------------ events, LRU
    def _emit(self, keys: list[OffloadKey], removed: bool) -> None:
        if self._events is None or not keys:
            return
        with self._events_lock:
            # owned by this tier, whose removals are reported (vLLM's event tracker
            # then keeps a chunk's hashes until this tier removes it)
            self._events.append(OffloadingEvent(keys=keys, medium=self.medium, removed=removed,
                                                locality=self.locality, ownership=self.tier_type,
                                                removal_expected=True))

    def _evicted(self, pairs: list[tuple[bytes, int]]) -> None:
        """The local store's LRU evicted these (its index thread; must not block)."""
        self._emit([k for k in (self._offload_key(key) for key, _ in pairs) if k is not None],
                   removed=True)

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events is None:
            return []
        with self._events_lock:
            out, self._events = self._events, []
        return out

    def touch(self, keys: Any, req_context: ReqContext) -> None:
        """Mark chunks as just used, so the store's LRU evicts them last (a local
        store's index is in memory: nothing waits on the device)."""
        if self._closed or self._backend is None:
            return
        touch = getattr(self.store, "touch", None)
        if touch is None or _async_index(self.store):
            return  # a shared index orders eviction by its own clock
        try:
            touch([self._key(k) for k in keys])
        except Exception as exc:  # noqa: BLE001 - only an eviction hint
            logger.debug("fx100io: touch failed: %r", exc)

    # ------------------------------------------------------------ lookups
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._closed or self._backend is None or not self._breaker.usable():
            return LookupResult.MISS
        k = self._key(key)
        if self._storing.get(k):
            # Being written: vLLM's manager treats a secondary tier's HIT_PENDING as a
            # miss, RETRY makes it ask again once the write is done.
            return LookupResult.RETRY
        store = self.store
        if not _async_index(store):
            # A local ChunkStore: its index is a dict under a lock, nothing to wait for.
            # A chunk of another size is not this tier's chunk (its load would fail).
            try:
                present = store.chunk_size(k) == self._chunk_bytes
                return LookupResult.HIT if present else LookupResult.MISS
            except Exception:  # noqa: BLE001 - a closed store holds nothing
                return LookupResult.MISS
        asked = self._req_keys.setdefault(req_context.req_id, set())
        if k not in asked:
            asked.add(k)
            n = self._key_refs.get(k, 0)
            self._key_refs[k] = n + 1
            if n == 0:
                with self._check_lock:
                    self._next_epoch += 1
                    self._epoch[k] = self._next_epoch
        verdict = self._verdicts.get(k)
        if verdict is True:
            return LookupResult.HIT
        if verdict is False:
            return LookupResult.MISS
        self._ask([k])
        return LookupResult.RETRY

    def _ask(self, keys: Iterable[bytes]) -> None:
        with self._check_lock:
            for k in keys:
                epoch = self._epoch.get(k)
                if epoch is not None:
                    self._to_check[k] = epoch
            if self._check_scheduled or not self._to_check:
                return
            self._check_scheduled = True
        try:
            self._runner.submit(self._answer())
        except RuntimeError:  # the loop is gone: nothing will answer
            with self._check_lock:
                self._check_scheduled = False

    async def _answer(self) -> None:
        """Loop thread: answer every pending existence check from the store's index."""
        with self._check_lock:
            asked, self._to_check = self._to_check, {}
            self._check_scheduled = False
        keys = list(asked)
        try:
            sizes = await self.store.achunk_sizes(keys) if keys else []
        except Exception:  # noqa: BLE001 - an index that cannot answer holds nothing
            sizes = [None] * len(keys)
        with self._check_lock:
            for k, size in zip(keys, sizes):
                if self._epoch.get(k) == asked[k]:  # still asked for by the same holders
                    self._verdicts[k] = size == self._chunk_bytes

    def _set_verdicts(self, keys: Iterable[bytes], present: bool) -> None:
        """Loop thread: record what a job learnt, for keys some request still holds."""
        with self._check_lock:
            for k in keys:
                if k in self._epoch:
                    self._verdicts[k] = present

    def on_request_finished(self, req_context: ReqContext) -> None:
        # A verdict lives while some request that asked for it does: a later request
        # asks the store again (another process, or eviction, may have changed it).
        for k in self._req_keys.pop(req_context.req_id, ()):
            n = self._key_refs.get(k, 0) - 1
            if n > 0:
                self._key_refs[k] = n
            else:
                self._key_refs.pop(k, None)
                with self._check_lock:
                    self._epoch.pop(k, None)
                    self._verdicts.pop(k, None)
                    self._to_check.pop(k, None)

    # ------------------------------------------------------------ jobs
    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = [self._key(k) for k in job_metadata.keys]
        self._start(job_metadata, keys, store=True)
        for k in keys:
            self._storing[k] = self._storing.get(k, 0) + 1

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = [self._key(k) for k in job_metadata.keys]
        self._start(job_metadata, keys, store=False)

    def _start(self, job: TransferJob, keys: list[bytes], *, store: bool) -> None:
        fut: concurrent.futures.Future[JobResult]
        try:
            if self._closed:
                raise RuntimeError("the fx100io tier is shut down")
            if not self._breaker.usable():
                raise _Refused(self._breaker.reason)
            rows = self._rows(job.chunk_ids)
            if len(rows) != len(keys):
                raise ValueError(f"{len(keys)} keys but {len(rows)} chunk ids")
            coro = self._store(job, keys, rows) if store else self._load(job, keys, rows)
            fut = self._runner.submit(coro)
            self._job_started[job.job_id] = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - reported as a failed job
            level = logging.DEBUG if isinstance(exc, _Refused) or self._closed else logging.ERROR
            logger.log(level, "fx100io: %s job %s not started: %r", "store" if store else "load",
                       job.job_id, exc)
            fut = concurrent.futures.Future()
            fut.set_result(JobResult(job_id=job.job_id, success=False))
        self._jobs[job.job_id] = (fut, job)

    async def _store(self, job: TransferJob, keys: list[bytes], rows: list[memoryview]) -> JobResult:
        t0 = time.monotonic()
        store = self.store
        shared = _async_index(store)
        todo: list[tuple[bytes, memoryview]] = []
        try:
            sizes = await _sizes(store, keys)
            todo = [(k, r) for k, r, n in zip(keys, rows, sizes) if n != self._chunk_bytes]
            if not shared and len(todo) < len(keys):
                # kept, not rewritten: now the most recently used, so this job's own
                # new chunks do not evict them
                store.touch([k for k, n in zip(keys, sizes) if n == self._chunk_bytes])
            evictions = await _evictions(store) if shared else 0
            if todo:
                await store.batch_put([k for k, _ in todo], [r for _, r in todo],
                                      priority=Priority.STORE)
        except Exception as exc:  # noqa: BLE001 - the chunks are just not kept
            self._breaker.trip(f"a store of {len(todo)} chunks", exc)
            ok = False
        else:
            ok = True
            if self._events is not None:
                # here, on the loop, right after the put: any eviction of these chunks
                # comes later than this event (the index thread reports evictions as
                # they happen); only chunks still held are reported
                held = await _sizes(store, keys)
                self._emit([o for o, n in zip(job.keys, held) if n == self._chunk_bytes],
                           removed=False)
            if shared:
                if await _evictions(store) != evictions:
                    # Chunks were evicted to make room: a cached 'present' may be stale.
                    # Ask again for those (keeping the answer until the new one lands);
                    # a stale one costs a failed load, which vLLM recomputes.
                    self._ask([k for k, v in list(self._verdicts.items()) if v])
                self._set_verdicts(keys, True)
        return JobResult(
            job_id=job.job_id,
            success=ok,
            transfer_time=time.monotonic() - t0,
            transfer_bytes=len(todo) * self._chunk_bytes if ok else None,
        )

    async def _load(self, job: TransferJob, keys: list[bytes], rows: list[memoryview]) -> JobResult:
        t0 = time.monotonic()
        store = self.store
        size = self._chunk_bytes
        # A chunk of any other size is not this tier's chunk for this row (a short one
        # would leave the rest of the row as it was): a failure, never partial bytes.
        ok = [False] * len(keys)
        try:
            fit = [i for i, n in enumerate(await _sizes(store, keys)) if n == size]
            if fit:
                got = await store.batch_get([keys[i] for i in fit], [rows[i] for i in fit],
                                            priority=Priority.LOAD)
                for i, g in zip(fit, got):
                    ok[i] = bool(g)
        except Exception as exc:  # noqa: BLE001 - a failed load; vLLM recomputes
            self._breaker.trip(f"a load of {len(keys)} chunks", exc)
            ok = [False] * len(keys)
        # So lookup answers MISS, not HIT again (only for keys a request still holds).
        self._set_verdicts([k for k, good in zip(keys, ok) if not good], False)
        success = all(ok)
        loaded = [orig for orig, good in zip(job.keys, ok) if good]
        return JobResult(
            job_id=job.job_id,
            success=success,
            successful_keys=tuple(loaded) if not success and loaded else None,
            transfer_time=time.monotonic() - t0,
            transfer_bytes=sum(ok) * size or None,
        )

    def get_finished_jobs(self) -> Iterable[JobResult]:
        done: list[JobResult] = []
        self._watch_stuck()
        for job_id in [j for j, (f, _) in self._jobs.items() if f.done()]:
            fut, job = self._jobs.pop(job_id)
            self._job_started.pop(job_id, None)
            try:
                result = fut.result()
            except BaseException as exc:  # noqa: BLE001 - the loop died under it
                logger.error("fx100io: job %s ended with %r", job_id, exc)
                result = JobResult(job_id=job_id, success=False)
            if not job.is_promotion:
                for k in (self._key(k) for k in job.keys):
                    n = self._storing.get(k, 0) - 1
                    if n > 0:
                        self._storing[k] = n
                    else:
                        self._storing.pop(k, None)
            done.append(result)
        return done

    def _watch_stuck(self) -> None:
        """A job running past timeout_s means the device hangs: trip the breaker (new
        lookups MISS, new jobs refused) and keep it tripped while such a job runs. The
        job itself keeps its rows until its I/O ends: it is never abandoned."""
        if not self._job_started:
            return
        oldest = min(self._job_started.values())
        age = time.monotonic() - oldest
        if age > self._breaker.timeout_s:
            self._breaker.trip(f"a job running for {age:.1f}s (timeout_s "
                               f"{self._breaker.timeout_s:g})", TimeoutError())

    def has_pending_work(self) -> bool:
        return bool(self._jobs)

    def drain_jobs(self) -> None:
        # vLLM's contract: return only once no I/O touches the primary rows, so a hung
        # device blocks here; it is logged each timeout_s, and the breaker trips.
        futures = [f for f, _ in self._jobs.values()]
        while futures:
            _, pending = concurrent.futures.wait(futures, timeout=max(self._breaker.timeout_s, 1.0))
            if pending:
                self._watch_stuck()
                logger.warning("fx100io: drain_jobs still waiting on %d jobs", len(pending))
            futures = list(pending)

    # ------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        """Wait for the jobs in flight, close the store, let go of the primary memory.

        Raises RuntimeError if jobs are still running after SHUTDOWN_WAIT_S: their I/O
        still uses the primary rows, so vLLM must not free them (a later call, once
        they are done, closes the tier)."""
        if self._torn_down:
            return
        self._closed = True
        self._teardown(wait_s=SHUTDOWN_WAIT_S)

    def _teardown(self, wait_s: float) -> None:
        self._closed = True
        futures = [f for f, _ in self._jobs.values()]
        _, pending = concurrent.futures.wait(futures, timeout=wait_s) if futures else ((), ())
        if pending:
            # Their I/O still uses the primary rows: keep the registration and the store
            # rather than free what the kernel is still writing into.
            msg = (f"fx100io: {len(pending)} jobs still writing the primary rows after "
                   f"{wait_s:.0f}s; the device stays open and the rows must stay mapped")
            logger.error("%s", msg)
            raise RuntimeError(msg)
        self._torn_down = True
        backend, self._backend = self._backend, None
        if backend is not None:
            async def close() -> None:
                # On the loop: aclose waits for queued index commits (and a shared
                # store's Redis connections) without blocking the loop; then the
                # device locks go.
                aclose = getattr(backend.store, "aclose", None)
                try:
                    if aclose is not None:
                        await aclose()
                finally:
                    backend.close()

            try:
                self._runner.call(close(), wait_s)
            except Exception as exc:  # noqa: BLE001 - shutting down anyway
                logger.error("fx100io: closing the store failed: %r", exc)
        if self._registration is not None:
            self._registration.close()
            self._registration = None
        self._runner.stop()
        if self._flat is not None:
            self._flat.release()
            self._flat = None

    # ------------------------------------------------------------ metadata
    def config_info(self) -> dict[str, str]:
        return {}


class _Refused(Fx100ioMessageError):
    """A job not started because the breaker is tripped."""

    ERRNO = errno.EAGAIN


class _Breaker:
    """After a device error, or a job outliving timeout_s, the tier reports misses and
    refuses new jobs for retry_after_s (vLLM recomputes meanwhile), logging once."""

    def __init__(self, timeout_s: float, retry_after_s: float) -> None:
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self._lock = threading.Lock()
        self._down_until = 0.0
        self.reason: str | None = None

    def usable(self) -> bool:
        if self.reason is None:
            return True
        with self._lock:
            if self.reason is None:
                return True
            if time.monotonic() < self._down_until:
                return False
            logger.warning("fx100io: vLLM tier tries the store again after %s", self.reason)
            self.reason = None
            return True

    def trip(self, what: str, exc: BaseException) -> None:
        with self._lock:
            first = self.reason is None
            self.reason = f"{what} failed: {exc!r}"
            self._down_until = time.monotonic() + self.retry_after_s
        if first:
            logger.error("fx100io: %s failed (%r); the vLLM tier reports misses and refuses "
                         "stores for %.1fs, vLLM recomputes", what, exc, self.retry_after_s)
        else:
            logger.debug("fx100io: %s failed again: %r", what, exc)


def _async_index(store: Any) -> bool:
    """Whether the store's index answers by coroutine (a SharedChunkStore: Redis round
    trips, never to be waited on synchronously from the loop or the scheduler)."""
    return hasattr(store, "achunk_sizes")


async def _sizes(store: Any, keys: list[bytes]) -> list[int | None]:
    if _async_index(store):
        return list(await store.achunk_sizes(keys)) if keys else []
    return [store.chunk_size(k) for k in keys]


async def _evictions(store: Any) -> int:
    try:
        stats = await store.astats() if hasattr(store, "astats") else store.stats()
        return int(stats.get("evictions", 0))
    except Exception:  # noqa: BLE001
        return 0


__all__ = ["FX100ioTier", "namespace"]


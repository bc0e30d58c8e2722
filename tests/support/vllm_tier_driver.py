"""Drives fx100io's vLLM tier through vLLM's own loader, inside the vllm venv.

Run by tests/contrib/test_vllm_tier.py as
    <venv>/bin/python tests/support/vllm_tier_driver.py WORKDIR
with the checkout on PYTHONPATH. It loads FX100ioTier the way TieringOffloadingSpec loads
a secondary tier (SecondaryTierFactory.create_secondary_tier with a config entry that
names the class and its module), over the primary tier vLLM itself builds (a
SharedOffloadRegion: a 2-D int8 memoryview over an mmap, chunk c is view[c]).

Each check prints one JSON line {"check": name, "ok": bool, "detail": str}; the pytest
side asserts every check it expects is there and ok. Nothing here depends on timing:
waits poll a condition with a generous bound.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadingKVEventsConfig,
    ReqContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

NUM_CHUNKS = 8
CHUNK_BYTES = 256 * 1024
CTX = ReqContext(req_id="req-0")
WAIT_S = 30.0

results: list[dict[str, Any]] = []


def check(name: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except Exception:
                rec = {"check": name, "ok": False, "detail": traceback.format_exc()}
            else:
                rec = {"check": name, "ok": True, "detail": ""}
            results.append(rec)
            print(json.dumps(rec), flush=True)

        run.__name__ = fn.__name__
        return run

    return wrap


def make_spec(model: str = "org/test-model", dtype: str = "bfloat16", tp: int = 1,
              dp: int = 0, dp_size: int = 1, events: bool = False) -> Any:
    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0", "l1"), group_id=0),),
        worker_kv_bytes_per_block=CHUNK_BYTES,
        enable_kv_cache_events=False,
        extra_config={},
        engine_id="fx100io-test",
        model=OffloadingModelConfig(name=model, dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=tp, tp_size=tp, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=dp, data_parallel_size=dp_size, data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )
    return SimpleNamespace(
        config=config,
        blocks_per_chunk=1,
        kv_events_config=OffloadingKVEventsConfig(
            enable_kv_cache_events=events, self_describing_kv_events=False
        ),
    )


class Primary:
    """vLLM's own CPU primary tier memory: a SharedOffloadRegion and its view."""

    def __init__(self) -> None:
        self.region = SharedOffloadRegion(
            engine_id=f"fx100io-{uuid.uuid4().hex[:12]}",
            num_chunks=NUM_CHUNKS,
            rank=None,
            kv_bytes_per_chunk=CHUNK_BYTES,
            cpu_page_size=4096,
        )
        self.view = self.region.create_kv_memoryview()
        assert self.view.ndim == 2 and self.view.format == "b", (self.view.ndim, self.view.format)
        self.arr = np.asarray(self.view)  # int8, (chunks, bytes), same memory

    def fill(self, chunk: int, seed: int) -> bytes:
        rng = np.random.default_rng(seed)
        self.arr[chunk] = rng.integers(-128, 128, CHUNK_BYTES, dtype=np.int8)
        return self.arr[chunk].tobytes()

    def row(self, chunk: int) -> bytes:
        return self.arr[chunk].tobytes()

    def close(self) -> None:
        # What vLLM's primary tier does at shutdown: this raises BufferError if a tier
        # still holds an export of the view (a registration not closed).
        del self.arr
        self.view.release()
        self.region.cleanup()
        # vLLM unmaps its primary memory only when nothing exports it any more (it keeps
        # it mapped, and says so, while a native user such as a registration holds it).
        assert self.region.mmap_obj is None, "the primary tier's mmap is still exported"


def entry(path: str, **extra: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "type": "FX100ioTier",
        "module_path": "fx100io.contrib.vllm",
        "devices": f"file://{path}",
        "size": "64M",
    }
    e.update(extra)
    return e


def load_tier(cfg: dict[str, Any], primary: Primary, spec: Any = None) -> Any:
    return SecondaryTierFactory.create_secondary_tier(cfg, primary.view, spec or make_spec())


def load_tier_over(cfg: dict[str, Any], view: memoryview, spec: Any = None) -> Any:
    return SecondaryTierFactory.create_secondary_tier(cfg, view, spec or make_spec())


def key(n: int, group: int = 0) -> Any:
    return make_offload_key(n.to_bytes(32, "big"), group)


def job(job_id: int, keys: list[Any], chunk_ids: list[int], promotion: bool) -> TransferJob:
    return TransferJob(
        job_id=job_id,
        keys=keys,
        chunk_ids=np.array(chunk_ids, dtype=np.int32),
        is_promotion=promotion,
        req_context=CTX,
    )


def settle(tier: Any, k: Any) -> tuple[list[LookupResult], LookupResult]:
    """Look k up until it is no longer RETRY; returns what was seen before, and the end."""
    seen = []
    deadline = time.monotonic() + WAIT_S
    while True:
        r = tier.lookup(k, CTX)
        if r is not LookupResult.RETRY:
            return seen, r
        seen.append(r)
        if time.monotonic() > deadline:
            raise AssertionError(f"lookup still RETRY after {WAIT_S}s")
        time.sleep(0.001)


def settle_ctx(tier: Any, k: Any, ctx: ReqContext) -> LookupResult:
    deadline = time.monotonic() + WAIT_S
    while (r := tier.lookup(k, ctx)) is LookupResult.RETRY:
        if time.monotonic() > deadline:
            raise AssertionError(f"lookup still RETRY after {WAIT_S}s")
        time.sleep(0.001)
    return r


def finish(tier: Any) -> list[Any]:
    tier.drain_jobs()
    return list(tier.get_finished_jobs())


class AsyncOnly:
    """A store whose index answers only by coroutine (a SharedChunkStore's Redis):
    a blocking call from the tier's loop is an error here."""

    def __init__(self, store: Any) -> None:
        self._s = store

    def __getattr__(self, name: str) -> Any:
        if name in ("contains", "chunk_size", "stats", "batch_exists"):
            raise AssertionError(f"blocking index call {name} on the tier's loop")
        return getattr(self._s, name)

    async def acontains(self, k: Any) -> bool:
        return bool(self._s.contains(k))

    async def achunk_sizes(self, ks: Any) -> list[Any]:
        return [self._s.chunk_size(k) for k in ks]

    async def astats(self) -> dict[str, Any]:
        return dict(self._s.stats())


async def _noop() -> None:
    return None


async def _tasks() -> int:
    import asyncio

    return len(asyncio.all_tasks())


def main(workdir: str) -> int:
    img = os.path.join(workdir, "vllm.img")
    originals: dict[int, bytes] = {}
    primary = Primary()

    @check("loaded_by_vllm_factory")
    def _loaded() -> None:
        # Settings under the LMCache plugin's names, as strings (as a JSON config gives them).
        tier = load_tier(entry(img, create="auto", locality="LOCAL", queue_depth="8",
                               max_io="512K", capacity="48M", direct="auto",
                               register_buffers="true"), primary)
        try:
            from vllm.v1.kv_offload.tiering.base import SecondaryTierManager

            from fx100io.contrib.vllm import FX100ioTier

            assert isinstance(tier, FX100ioTier) and isinstance(tier, SecondaryTierManager)
            assert tier.tier_type == "FX100ioTier" and tier.block_size_bytes == CHUNK_BYTES
            assert tier.locality is not None and tier.locality.value == "LOCAL"
            st = tier.settings
            assert (st.queue_depth, st.max_io, st.capacity, st.size) == (
                8, 512 << 10, 48 << 20, 64 << 20), st
            assert st.devices == (f"file://{img}",), st.devices
        finally:
            tier.shutdown()

    @check("roundtrip_lookup_jobs")
    def _roundtrip() -> None:
        tier = load_tier(entry(img), primary)
        try:
            keys = [key(i) for i in range(4)]
            for c in range(4):
                originals[c] = primary.fill(c, seed=c + 1)
            absent_seen, absent = settle(tier, key(999))
            assert set(absent_seen) <= {LookupResult.RETRY} and absent is LookupResult.MISS, (
                absent_seen, absent)
            tier.submit_store(job(1, keys, [0, 1, 2, 3], promotion=False))
            # Until the store is reported finished the chunk is not readable: RETRY (vLLM's
            # manager takes a secondary tier's HIT_PENDING for a miss).
            assert tier.lookup(keys[0], CTX) is LookupResult.RETRY
            assert tier.has_pending_work()
            done = finish(tier)
            assert [(r.job_id, r.success) for r in done] == [(1, True)], done
            assert list(tier.get_finished_jobs()) == [], "a job reported twice"
            assert not tier.has_pending_work()
            seen, final = settle(tier, keys[0])
            assert final is LookupResult.HIT and set(seen) <= {LookupResult.RETRY}, (seen, final)
            # Never HIT for a key that is not there, even after the stores.
            assert settle(tier, key(998))[1] is LookupResult.MISS
            assert settle(tier, key(0, group=1))[1] is LookupResult.MISS
            for c in range(4, 8):
                primary.arr[c] = 0
            tier.submit_load(job(2, keys, [7, 6, 5, 4], promotion=True))
            done = finish(tier)
            assert [(r.job_id, r.success, r.successful_keys) for r in done] == [(2, True, None)], done
            assert done[0].transfer_bytes == 4 * CHUNK_BYTES
            for i, c in enumerate([7, 6, 5, 4]):
                assert primary.row(c) == originals[i], f"chunk {i} differs after the load into {c}"
        finally:
            tier.shutdown()

    @check("each_job_once")
    def _once() -> None:
        tier = load_tier(entry(img), primary)
        try:
            for c in range(4, 8):
                originals[c] = primary.fill(c, seed=100 + c)
            ids = []
            for n, c in enumerate(range(4, 8)):
                tier.submit_store(job(10 + n, [key(c)], [c], promotion=False))
                ids.append(10 + n)
            # Stores of chunks already kept are accepted and change nothing.
            tier.submit_store(job(20, [key(0)], [0], promotion=False))
            ids.append(20)
            got: list[int] = []
            deadline = time.monotonic() + WAIT_S
            while len(got) < len(ids) and time.monotonic() < deadline:
                for r in tier.get_finished_jobs():
                    assert r.success, r
                    got.append(r.job_id)
                time.sleep(0.001)
            assert sorted(got) == ids, got
            tier.drain_jobs()
            assert list(tier.get_finished_jobs()) == []
            # drain_jobs: after it returns, every result is there to collect.
            for c in range(4):
                primary.arr[c] = 0
            for n in range(4):
                tier.submit_load(job(30 + n, [key(4 + n)], [n], promotion=True))
            tier.drain_jobs()
            done = list(tier.get_finished_jobs())
            assert sorted((r.job_id, r.success) for r in done) == [(30 + n, True) for n in range(4)]
            for n in range(4):
                assert primary.row(n) == originals[4 + n]
        finally:
            tier.shutdown()

    @check("load_of_absent_key_fails")
    def _absent() -> None:
        tier = load_tier(entry(img), primary)
        try:
            tier.submit_load(job(40, [key(4242)], [3], promotion=True))
            done = finish(tier)
            assert [(r.job_id, r.success, r.successful_keys) for r in done] == [(40, False, None)]
            # One good and one absent: the good one is kept, the job is a failure.
            tier.submit_load(job(41, [key(4), key(4243)], [2, 3], promotion=True))
            done = finish(tier)
            assert len(done) == 1 and not done[0].success and tuple(done[0].successful_keys) == (
                key(4),), done
            assert primary.row(2) == originals[4]
        finally:
            tier.shutdown()

    @check("verdicts_live_per_request")
    def _per_request() -> None:
        tier = load_tier(entry(img), primary)
        # A local store's index is read directly: a change shows at once, no verdicts.
        ctx = ReqContext(req_id="req-l")
        assert tier.lookup(key(0), ctx) is LookupResult.HIT
        assert tier.lookup(key(12345), ctx) is LookupResult.MISS
        assert not tier._verdicts
        # An index that answers by coroutine: verdicts cached per request.
        real = tier._backend.store
        tier._backend.store = AsyncOnly(real)
        try:
            a, b, c = (ReqContext(req_id=r) for r in ("req-a", "req-b", "req-c"))
            assert tier.lookup(key(0), a) is LookupResult.RETRY
            deadline = time.monotonic() + WAIT_S
            while tier.lookup(key(0), a) is LookupResult.RETRY:
                assert time.monotonic() < deadline
                time.sleep(0.001)
            assert tier.lookup(key(0), a) is LookupResult.HIT
            assert tier.lookup(key(0), b) is LookupResult.HIT  # b shares a's answer
            tier.on_request_finished(a)
            assert tier.lookup(key(0), b) is LookupResult.HIT  # still asked for by b
            tier.on_request_finished(b)
            # Nobody holds the answer any more: a new request asks the store again.
            assert tier.lookup(key(0), c) is LookupResult.RETRY
            assert settle_ctx(tier, key(0), c) is LookupResult.HIT
            tier.on_request_finished(c)
            assert not tier._verdicts and not tier._key_refs and not tier._epoch
        finally:
            tier._backend.store = real
            tier.shutdown()

    @check("namespaced_by_model_dtype_layout")
    def _namespace() -> None:
        for spec in (make_spec(model="org/other-model"), make_spec(dtype="float16"),
                     make_spec(tp=2)):
            tier = load_tier(entry(img), primary, spec)
            try:
                assert settle(tier, key(0))[1] is LookupResult.MISS
            finally:
                tier.shutdown()
        tier = load_tier(entry(img), primary)
        try:
            assert settle(tier, key(0))[1] is LookupResult.HIT
        finally:
            tier.shutdown()

    @check("restart_same_file")
    def _restart() -> None:
        # A new instance over the same file (here in the same process, after shutdown:
        # the device was released) finds what the first one stored.
        tier = load_tier(entry(img, create="never"), primary)
        try:
            for i in range(8):
                assert settle(tier, key(i))[1] is LookupResult.HIT, i
            for c in range(8):
                primary.arr[c] = 0
            tier.submit_load(job(50, [key(i) for i in range(8)], [7, 6, 5, 4, 3, 2, 1, 0],
                                 promotion=True))
            done = finish(tier)
            assert [(r.job_id, r.success) for r in done] == [(50, True)], done
            for i in range(8):
                assert primary.row(7 - i) == originals[i], i
        finally:
            tier.shutdown()

    @check("corrupt_chunk_is_a_failed_load")
    def _corrupt() -> None:
        # Flip one byte inside chunk 1's data on the device, with no tier open.
        needle = originals[1][:4096]
        with open(img, "r+b") as f:
            data = f.read()
            at = data.find(needle)
            assert at >= 0, "chunk 1 not found in the file"
            assert data.find(needle, at + 1) < 0
            f.seek(at + 1000)
            b = f.read(1)
            f.seek(at + 1000)
            f.write(bytes([b[0] ^ 0x5A]))
        tier = load_tier(entry(img), primary)
        try:
            assert settle(tier, key(1))[1] is LookupResult.HIT  # the index still lists it
            for c in range(8):
                primary.arr[c] = 0
            tier.submit_load(job(60, [key(0), key(1), key(2)], [5, 6, 7], promotion=True))
            done = finish(tier)
            assert len(done) == 1 and done[0].job_id == 60 and not done[0].success, done
            assert set(done[0].successful_keys) == {key(0), key(2)}, done[0].successful_keys
            assert primary.row(5) == originals[0] and primary.row(7) == originals[2]
            # After the failed load the tier no longer claims the chunk.
            assert tier.lookup(key(1), CTX) is LookupResult.MISS
            tier.submit_load(job(61, [key(1)], [6], promotion=True))
            done = finish(tier)
            assert [(r.success, r.successful_keys) for r in done] == [(False, None)]
        finally:
            tier.shutdown()
        tier = load_tier(entry(img), primary)
        try:
            assert settle(tier, key(1))[1] is LookupResult.MISS  # dropped for good
        finally:
            tier.shutdown()

    @check("bad_config_clear_error")
    def _bad() -> None:
        from fx100io.contrib._settings import BackendConfigError

        cases = [
            (entry(img, bogus_knob=1), "secondary_tiers[FX100ioTier].bogus_knob"),
            ({k: v for k, v in entry(img).items() if k != "devices"},
             "secondary_tiers[FX100ioTier].devices"),
            (entry(img, queue_depth="many"), "secondary_tiers[FX100ioTier].queue_depth"),
            # 'always' would format a live shared pool at every start: refused when parsed
            (entry(img, create="always", shared_index="redis://127.0.0.1:1/0"),
             "secondary_tiers[FX100ioTier].create"),
            # the tier has no prefetch reads: the key is refused, not ignored
            (entry(img, prefetch_priority="background"),
             "secondary_tiers[FX100ioTier].prefetch_priority"),
            (entry(img, prefetch_priority="load"),
             "secondary_tiers[FX100ioTier].prefetch_priority"),
        ]
        for cfg, expect in cases:
            try:
                tier = load_tier(cfg, primary)
            except BackendConfigError as exc:
                assert expect in str(exc), (expect, str(exc))
            else:
                tier.shutdown()
                raise AssertionError(f"{cfg} was accepted")
        # Not a store and create=never: a clear error naming the device, not a crash.
        junk = os.path.join(workdir, "junk.img")
        with open(junk, "wb") as f:
            f.write(os.urandom(1 << 20))
        try:
            tier = load_tier(entry(junk, create="never"), primary)
        except Exception as exc:
            assert "junk.img" in str(exc), str(exc)
        else:
            tier.shutdown()
            raise AssertionError("a file that is not a store was opened")

    @check("late_answer_for_finished_request_kept_nowhere")
    def _late_answer() -> None:
        tier = load_tier(entry(os.path.join(workdir, "late.img"), create="always"), primary)
        try:
            # The loop is busy while requests ask and finish: their answers land late.
            tier._runner.loop.call_soon_threadsafe(time.sleep, 0.3)
            for i in range(50):
                ctx = ReqContext(req_id=f"gone-{i}")
                tier.lookup(key(10000 + i), ctx)
                tier.on_request_finished(ctx)
            # Whatever the loop answers now is for nobody: nothing may stay behind.
            tier._runner.call(_noop(), WAIT_S)
            left = dict(tier._verdicts)
            assert not left, f"{len(left)} verdicts kept for finished requests"
            # The same through an index that answers by coroutine (verdicts cached).
            real = tier._backend.store
            tier._backend.store = AsyncOnly(real)
            try:
                tier._runner.loop.call_soon_threadsafe(time.sleep, 0.3)
                for i in range(50):
                    ctx = ReqContext(req_id=f"gone-a{i}")
                    assert tier.lookup(key(20000 + i), ctx) is LookupResult.RETRY
                    tier.on_request_finished(ctx)
                tier._runner.call(_noop(), WAIT_S)
                tier._runner.call(_noop(), WAIT_S)
                assert not tier._verdicts, f"{len(tier._verdicts)} verdicts kept"
                assert not tier._epoch and not tier._to_check and not tier._key_refs
                # The request finishes while its check is inside the index (a Redis
                # round trip): the answer that then lands is for nobody.
                import asyncio
                import threading

                entered, gate = threading.Event(), threading.Event()

                class Slow(AsyncOnly):
                    async def achunk_sizes(self, ks: Any) -> list[Any]:
                        entered.set()
                        while not gate.is_set():
                            await asyncio.sleep(0.005)
                        return await super().achunk_sizes(ks)

                tier._backend.store = Slow(real)
                ctx = ReqContext(req_id="slow")
                assert tier.lookup(key(10001), ctx) is LookupResult.RETRY
                assert entered.wait(WAIT_S)
                tier.on_request_finished(ctx)
                gate.set()
                tier._runner.call(_noop(), WAIT_S)
                deadline = time.monotonic() + WAIT_S
                while tier._check_scheduled or tier._runner.call(_tasks(), WAIT_S) > 1:
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
                assert not tier._verdicts, "an answer landed for a finished request"
            finally:
                tier._backend.store = real
            k = key(10000)
            primary.fill(0, 5)
            tier.submit_store(job(1, [k], [0], False))
            assert [r.success for r in finish(tier)] == [True]
            assert tier._runner.call(tier.store.delete(tier._key(k)), WAIT_S)
            # A new request must not be told HIT for a chunk the store no longer has.
            assert settle_ctx(tier, k, ReqContext(req_id="b")) is LookupResult.MISS
        finally:
            tier.shutdown()

    @check("eviction_keeps_other_verdicts")
    def _eviction() -> None:
        tier = load_tier(entry(os.path.join(workdir, "small.img"), size="4M", create="always"),
                         primary)
        try:
            jid = 100
            for i in range(40):
                primary.fill(i % NUM_CHUNKS, 1000 + i)
                tier.submit_store(job(jid, [key(500 + i)], [i % NUM_CHUNKS], False))
                jid += 1
                finish(tier)
            assert int(tier.store.stats().get("evictions", 0)) > 0
            x = ReqContext(req_id="x")
            hot = key(539)
            assert settle_ctx(tier, hot, x) is LookupResult.HIT
            before = tier.store.stats().get("evictions")
            primary.fill(0, 77)
            tier.submit_store(job(jid, [key(9999)], [0], False))
            finish(tier)
            assert tier.store.stats().get("evictions") != before, "no eviction happened"
            assert tier.store.contains(tier._key(hot))
            # An eviction of some other chunk does not send this request back to RETRY.
            assert tier.lookup(hot, x) is LookupResult.HIT
        finally:
            tier.shutdown()

    @check("shutdown_with_job_in_flight_raises")
    def _inflight() -> None:
        import threading

        import fx100io.contrib.vllm as fv

        tier = load_tier(entry(os.path.join(workdir, "held.img"), create="always"), primary)
        gate = threading.Event()
        real_put = tier.store.batch_put

        class Held:
            def __init__(self, store: Any) -> None:
                self._s = store

            def __getattr__(self, name: str) -> Any:
                return getattr(self._s, name)

            async def batch_put(self, keys: Any, bufs: Any, **kw: Any) -> None:
                import asyncio

                while not gate.is_set():
                    await asyncio.sleep(0.01)
                await real_put(keys, bufs, **kw)

        backend = tier._backend
        real_store = backend.store
        backend.store = Held(real_store)
        saved = fv.SHUTDOWN_WAIT_S
        fv.SHUTDOWN_WAIT_S = 0.2
        try:
            primary.fill(1, 9)
            tier.submit_store(job(1, [key(777)], [1], False))
            try:
                tier.shutdown()
            except RuntimeError as exc:
                assert "still" in str(exc), exc
            else:
                raise AssertionError("shutdown returned with a job still using the primary rows")
            gate.set()
            tier.drain_jobs()
            tier.shutdown()  # now the jobs are done: it closes for real
            assert tier._backend is None and tier._flat is None
        finally:
            fv.SHUTDOWN_WAIT_S = saved
            gate.set()
            backend.store = real_store
            if tier._backend is not None:
                tier.drain_jobs()
                tier.shutdown()

    @check("shared_store_uses_async_index")
    def _shared() -> None:
        tier = load_tier(entry(os.path.join(workdir, "shared.img"), create="always"), primary)
        real = tier._backend.store

        tier._backend.store = AsyncOnly(real)
        try:
            ctx = ReqContext(req_id="s")
            k = key(4242)
            assert settle_ctx(tier, k, ctx) is LookupResult.MISS
            data = primary.fill(2, 42)
            tier.submit_store(job(1, [k], [2], False))
            assert [r.success for r in finish(tier)] == [True]
            tier.on_request_finished(ctx)
            assert settle_ctx(tier, k, ReqContext(req_id="t")) is LookupResult.HIT
            primary.fill(3, 0)
            tier.submit_load(job(2, [k], [3], True))
            assert [r.success for r in finish(tier)] == [True]
            assert primary.row(3) == data
        finally:
            tier._backend.store = real
            tier.shutdown()

    @check("failing_store_trips_breaker_logs_once")
    def _failing() -> None:
        import logging

        path = os.path.join(workdir, "fail.img")
        tier = load_tier(entry(path, create="always", retry_after_s="3600"), primary)
        real = tier._backend.store
        calls = []

        class Failing:
            def __init__(self, store: Any) -> None:
                self._s = store

            def __getattr__(self, name: str) -> Any:
                return getattr(self._s, name)

            async def batch_put(self, keys: Any, bufs: Any, **kw: Any) -> None:
                calls.append(len(keys))
                raise OSError(5, "injected device error")

        records: list[logging.LogRecord] = []

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                records.append(record)

        log = logging.getLogger("fx100io.contrib.vllm")
        handler = Keep(logging.DEBUG)
        log.addHandler(handler)
        try:
            primary.fill(0, 1)
            tier.submit_store(job(1, [key(1)], [0], False))
            assert [r.success for r in finish(tier)] == [True]
            tier._backend.store = Failing(real)
            for n in range(5):
                tier.submit_store(job(10 + n, [key(100 + n)], [0], False))
                assert [r.success for r in finish(tier)] == [False]
            assert calls == [1], f"stores kept going to a failing device: {calls}"
            errors = [r for r in records if r.levelno >= logging.ERROR]
            assert len(errors) == 1, [r.getMessage() for r in errors]
            # While tripped, lookups answer MISS (vLLM recomputes), loads are refused.
            assert tier.lookup(key(1), ReqContext(req_id="f")) is LookupResult.MISS
            # Once retry_after_s has passed, the tier tries the device again.
            tier._backend.store = real
            tier._breaker._down_until = 0.0
            assert settle_ctx(tier, key(1), ReqContext(req_id="g")) is LookupResult.HIT
            tier.submit_store(job(20, [key(200)], [0], False))
            assert [r.success for r in finish(tier)] == [True]
        finally:
            log.removeHandler(handler)
            records.clear()  # they hold the injected error, whose frames hold row views
            tier._backend.store = real
            tier.shutdown()

    @check("priorities_passed")
    def _priorities() -> None:
        """vLLM's store jobs reach the store as stores, its load jobs as loads."""
        from fx100io.priority import Priority

        tier = load_tier(entry(os.path.join(workdir, "prio.img"), create="always"), primary)
        real = tier._backend.store
        seen: list[tuple[str, Any]] = []

        class Recording:
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            async def batch_get(self, keys: Any, bufs: Any, **kw: Any) -> list[bool]:
                seen.append(("get", kw.get("priority")))
                return list(await real.batch_get(keys, bufs, **kw))

            async def batch_put(self, keys: Any, bufs: Any, **kw: Any) -> None:
                seen.append(("put", kw.get("priority")))
                await real.batch_put(keys, bufs, **kw)

        tier._backend.store = Recording()
        try:
            want = [primary.fill(c, seed=300 + c) for c in (0, 1)]
            tier.submit_store(job(40, [key(400), key(401)], [0, 1], promotion=False))
            assert [r.success for r in finish(tier)] == [True]
            primary.arr[2] = 0
            primary.arr[3] = 0
            tier.submit_load(job(41, [key(400), key(401)], [2, 3], promotion=True))
            assert [r.success for r in finish(tier)] == [True]
            assert [primary.row(2), primary.row(3)] == want
            assert seen == [("put", Priority.STORE), ("get", Priority.LOAD)], seen
        finally:
            tier._backend.store = real
            tier.shutdown()

    @check("hung_job_trips_breaker")
    def _hung() -> None:
        import asyncio
        import threading

        path = os.path.join(workdir, "hung.img")
        tier = load_tier(entry(path, create="always", timeout_s="0.05", retry_after_s="3600"),
                         primary)
        real = tier._backend.store
        gate = threading.Event()

        class Hung:
            def __init__(self, store: Any) -> None:
                self._s = store

            def __getattr__(self, name: str) -> Any:
                return getattr(self._s, name)

            async def batch_put(self, keys: Any, bufs: Any, **kw: Any) -> None:
                while not gate.is_set():
                    await asyncio.sleep(0.01)
                await self._s.batch_put(keys, bufs, **kw)

        try:
            primary.fill(0, 1)
            tier.submit_store(job(1, [key(1)], [0], False))
            assert [r.success for r in finish(tier)] == [True]
            tier._backend.store = Hung(real)
            primary.fill(1, 2)
            tier.submit_store(job(2, [key(2)], [1], False))
            ctx = ReqContext(req_id="h")
            deadline = time.monotonic() + WAIT_S
            while tier.lookup(key(1), ctx) is not LookupResult.MISS:
                assert time.monotonic() < deadline, "a hung job never tripped the breaker"
                assert list(tier.get_finished_jobs()) == []
                time.sleep(0.01)
            # New stores are refused at once (the hung one keeps its rows until it ends).
            tier.submit_store(job(3, [key(3)], [2], False))
            assert [(r.job_id, r.success) for r in tier.get_finished_jobs()] == [(3, False)]
            assert tier.has_pending_work()
            gate.set()
            assert [(r.job_id, r.success) for r in finish(tier)] == [(2, True)]
            tier._backend.store = real
            tier._breaker._down_until = 0.0
            assert settle_ctx(tier, key(1), ReqContext(req_id="i")) is LookupResult.HIT
        finally:
            gate.set()
            tier._backend.store = real
            tier.drain_jobs()
            tier.shutdown()

    @check("dp_rank_placeholder_and_namespace_setting")
    def _dp_ns() -> None:
        # Two data-parallel replicas on one host: each its own file through {dp_rank}.
        for dp in (0, 1):
            path = os.path.join(workdir, "dp-{dp_rank}-of-{dp_size}.img")
            tier = load_tier(entry(path, create="always"), primary, make_spec(dp=dp, dp_size=2))
            try:
                assert os.path.exists(os.path.join(workdir, f"dp-{dp}-of-2.img"))
            finally:
                tier.shutdown()
        # A namespace setting (e.g. the model's revision) keeps two weights apart.
        path = os.path.join(workdir, "ns.img")
        tier = load_tier(entry(path, create="always", namespace="rev-a"), primary)
        try:
            primary.fill(0, 3)
            tier.submit_store(job(1, [key(1)], [0], False))
            assert [r.success for r in finish(tier)] == [True]
        finally:
            tier.shutdown()
        for ns, want in (("rev-b", LookupResult.MISS), ("rev-a", LookupResult.HIT)):
            tier = load_tier(entry(path, namespace=ns), primary)
            try:
                assert settle_ctx(tier, key(1), ReqContext(req_id=ns)) is want, ns
            finally:
                tier.shutdown()

    @check("out_of_range_chunk_ids_fail_the_job")
    def _range() -> None:
        tier = load_tier(entry(os.path.join(workdir, "range.img"), create="always"), primary)
        try:
            tier.submit_store(job(1, [key(1)], [NUM_CHUNKS], False))
            tier.submit_load(job(2, [key(1)], [-1], True))
            assert sorted((r.job_id, r.success) for r in finish(tier)) == [(1, False), (2, False)]
            assert not tier.store.contains(tier._key(key(1)))
        finally:
            tier.shutdown()

    @check("chunk_of_another_size_is_a_miss")
    def _size() -> None:
        tier = load_tier(entry(os.path.join(workdir, "size.img"), create="always"), primary)
        try:
            k = key(4343)
            short = bytearray(4096)
            tier._runner.call(tier.store.batch_put([tier._key(k)], [short]), WAIT_S)
            assert tier.store.contains(tier._key(k))
            assert settle_ctx(tier, k, ReqContext(req_id="sz")) is LookupResult.MISS
        finally:
            tier.shutdown()

    @check("through_vllm_tiering_manager")
    def _manager() -> None:
        from vllm.v1.kv_offload.base import ScheduleEndContext
        from vllm.v1.kv_offload.tiering.manager import (
            CPUPrimaryTierOffloadingManager,
            TieringOffloadingManager,
        )

        path = os.path.join(workdir, "mgr.img")
        end = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())

        def build(create: bool) -> tuple[Any, Any, Any]:
            region = SharedOffloadRegion(
                engine_id=f"fx100io-{uuid.uuid4().hex[:12]}", num_chunks=NUM_CHUNKS, rank=None,
                kv_bytes_per_chunk=CHUNK_BYTES, cpu_page_size=4096)
            prim = CPUPrimaryTierOffloadingManager(num_chunks=NUM_CHUNKS, mmap_region=region)
            cfg = entry(path, **({"create": "always"} if create else {}))
            tier = load_tier_over(cfg, prim.get_kv_memoryview())
            return tier, TieringOffloadingManager(primary_tier=prim, secondary_tiers=[tier]), prim

        def step_until(mgr: Any, done: Callable[[], bool]) -> None:
            deadline = time.monotonic() + WAIT_S
            while not done():
                assert time.monotonic() < deadline, "vLLM's manager never got there"
                mgr.on_schedule_end(end)
                time.sleep(0.005)

        k = key(31337)
        data = np.random.default_rng(7).integers(-128, 128, CHUNK_BYTES, dtype=np.int8)
        # vLLM stores a chunk in its primary tier; the manager cascades it to fx100io.
        tier, mgr, prim = build(True)
        ctx = ReqContext(req_id="m1")
        mgr.on_new_request(ctx)
        assert mgr.lookup(k, ctx) is LookupResult.MISS
        out = mgr.prepare_store([k], ctx)
        arr = np.asarray(prim.get_kv_memoryview())
        arr[int(out.store_spec.chunk_ids[0])] = data
        del arr
        mgr.complete_store([k], ctx)
        step_until(mgr, lambda: not mgr.has_pending_work())
        mgr.on_request_finished(ctx)
        assert tier.store.contains(tier._key(k))
        mgr.shutdown()
        # A fresh engine, empty primary tier: the manager promotes it from fx100io.
        tier, mgr, prim = build(False)
        ctx = ReqContext(req_id="m2")
        mgr.on_new_request(ctx)
        step_until(mgr, lambda: mgr.lookup(k, ctx) is LookupResult.HIT)
        spec = mgr.prepare_load([k], ctx)
        arr = np.asarray(prim.get_kv_memoryview())
        assert arr[int(spec.chunk_ids[0])].tobytes() == data.tobytes()
        del arr
        mgr.complete_load([k], ctx)
        mgr.on_request_finished(ctx)
        mgr.shutdown()

    @check("shutdown_closes_the_store_with_aclose")
    def _aclose() -> None:
        tier = load_tier(entry(os.path.join(workdir, "aclose.img"), create="always"), primary)
        real = tier._backend.store
        used = []

        class Recording:
            def __init__(self, store: Any) -> None:
                self._s = store

            def __getattr__(self, name: str) -> Any:
                return getattr(self._s, name)

            async def aclose(self) -> None:
                used.append("aclose")
                await self._s.aclose()

            def close(self) -> None:
                used.append("close")
                self._s.close()

        tier._backend.store = Recording(real)
        tier.shutdown()
        assert used[:1] == ["aclose"] and real.closed, used

    @check("verdicts_random_orderings_against_a_model")
    def _model() -> None:
        """Seeded random interleavings of lookup / finish / store / delete / a busy loop
        on the cached-verdict path, against a model: a verdict lives while some request
        that asked holds it (so a delete by someone else shows only to requests asking
        after every holder from before it finished); this tier's own stores show at once;
        every verdict, epoch and count is gone once no request is left."""
        import random

        tier = load_tier(entry(os.path.join(workdir, "model.img"), create="always"), primary)
        real = tier._backend.store
        tier._backend.store = AsyncOnly(real)
        rng = random.Random(1234)
        keys = [key(70000 + i) for i in range(6)]
        deleted = dict.fromkeys(range(len(keys)), 0)  # key -> step of its last delete
        live: dict[str, dict[int, int]] = {}  # request -> key -> step it first asked
        jid = 5000
        try:
            for step in range(1, 400):
                op = rng.random()
                i = rng.randrange(len(keys))
                if op < 0.45:
                    if not live or rng.random() < 0.3:
                        live[f"r{step}"] = {}
                    rid = rng.choice(sorted(live))
                    ctx = ReqContext(req_id=rid)
                    live[rid].setdefault(i, step)
                    if rng.random() < 0.5:
                        got = settle_ctx(tier, keys[i], ctx)
                        since = min(asked[i] for asked in live.values() if i in asked)
                        if since > deleted[i]:
                            want = tier._key(keys[i]) in set(real.keys())
                            assert got is (LookupResult.HIT if want else LookupResult.MISS), (
                                step, i, got, want)
                    else:
                        tier.lookup(keys[i], ctx)
                elif op < 0.65 and live:
                    rid = rng.choice(sorted(live))
                    del live[rid]
                    tier.on_request_finished(ReqContext(req_id=rid))
                elif op < 0.8:
                    primary.fill(i % NUM_CHUNKS, step)
                    tier.submit_store(job(jid, [keys[i]], [i % NUM_CHUNKS], False))
                    jid += 1
                    assert all(r.success for r in finish(tier))
                elif op < 0.9:
                    tier._runner.call(real.delete(tier._key(keys[i])), WAIT_S)
                    deleted[i] = step
                else:
                    tier._runner.loop.call_soon_threadsafe(time.sleep, 0.02)
            for rid in list(live):
                tier.on_request_finished(ReqContext(req_id=rid))
            tier._runner.call(_noop(), WAIT_S)
            tier._runner.call(_noop(), WAIT_S)
            assert not tier._verdicts and not tier._epoch and not tier._key_refs, (
                len(tier._verdicts), len(tier._epoch), len(tier._key_refs))
            assert not tier._req_keys and not tier._to_check
        finally:
            tier._backend.store = real
            tier.shutdown()

    def fill_until_eviction(tier: Any, first: int) -> list[Any]:
        """Store chunk after chunk (keys first, first+1, ...) until the store's LRU
        evicted one; the keys stored, oldest first."""
        stored = []
        jid = 10_000 + first
        for i in range(200):
            primary.fill(i % NUM_CHUNKS, first + i)
            k = key(first + i)
            tier.submit_store(job(jid + i, [k], [i % NUM_CHUNKS], False))
            assert all(r.success for r in finish(tier))
            stored.append(k)
            if int(tier.store.stats().get("evictions", 0)) > 0:
                return stored
        raise AssertionError("no eviction after 200 stores")

    @check("touch_keeps_a_chunk_from_eviction")
    def _touch() -> None:
        tier = load_tier(entry(os.path.join(workdir, "touch.img"), size="4M", create="always"),
                         primary)
        try:
            stored = fill_until_eviction(tier, 20_000)
            assert not tier.store.contains(tier._key(stored[0]))  # the oldest went first
            oldest, next_oldest = stored[1], stored[2]
            tier.touch([oldest], CTX)  # now the most recently used
            before = int(tier.store.stats()["evictions"])
            primary.fill(0, 4242)
            tier.submit_store(job(29_999, [key(29_999)], [0], False))
            assert all(r.success for r in finish(tier))
            assert int(tier.store.stats()["evictions"]) > before
            assert tier.store.contains(tier._key(oldest)), "the touched chunk was evicted"
            assert not tier.store.contains(tier._key(next_oldest))
            tier.touch([key(123_456)], CTX)  # unknown keys are nothing to touch
        finally:
            tier.shutdown()
        tier.touch([key(1)], CTX)  # after shutdown: nothing, no error

    @check("kv_events_stored_and_evicted")
    def _events() -> None:
        tier = load_tier(entry(os.path.join(workdir, "events.img"), size="4M", create="always",
                               enable_kv_events="true", locality="LOCAL"),
                         primary, make_spec(events=True))
        try:
            stored = fill_until_eviction(tier, 30_000)
            events = list(tier.take_events())
            added = [k for e in events if not e.removed for k in e.keys]
            removed = [k for e in events if e.removed for k in e.keys]
            assert added == stored, (len(added), len(stored))
            assert removed == [stored[0]], removed
            assert not tier.store.contains(tier._key(stored[0]))
            assert all(e.medium is tier.medium and e.locality is tier.locality
                       and e.ownership == tier.tier_type and e.removal_expected for e in events)
            assert list(tier.take_events()) == []  # taken once
            # A job of a chunk already kept (the oldest now) and a new one, in a full
            # store: the kept chunk counts as used, so the LRU evicts the next one, and
            # the events, replayed in order, say what the store holds.
            held = set(stored[1:])
            kept, nxt = stored[1], stored[2]
            primary.fill(1, 31_999)
            tier.submit_store(job(31_999, [kept, key(31_999)], [1, 2], False))
            assert all(r.success for r in finish(tier))
            for e in tier.take_events():
                for k in e.keys:
                    (held.discard if e.removed else held.add)(k)
            assert tier.store.contains(tier._key(kept)), "a chunk the job kept was evicted"
            assert not tier.store.contains(tier._key(nxt))
            assert held == {k for k in [*stored, key(31_999)] if tier.store.contains(tier._key(k))}
            # a failed store job is no "stored" event
            tier._breaker.trip("test", OSError(5, "test"))
            tier.submit_store(job(39_999, [key(39_999)], [0], False))
            assert not any(r.success for r in finish(tier))
            assert list(tier.take_events()) == []
        finally:
            tier.shutdown()

    @check("kv_events_off_unless_asked_and_on_globally")
    def _events_off() -> None:
        for extra, spec in (({}, make_spec(events=True)),
                            ({"enable_kv_events": True}, make_spec(events=False))):
            tier = load_tier(entry(os.path.join(workdir, "events-off.img"), size="4M",
                                   create="always", **extra), primary, spec)
            try:
                fill_until_eviction(tier, 40_000)
                assert list(tier.take_events()) == []
            finally:
                tier.shutdown()
        try:
            load_tier(entry(os.path.join(workdir, "events-bad.img"), enable_kv_events="maybe"),
                      primary)
        except Exception as exc:  # noqa: BLE001 - the error is what is checked
            assert "enable_kv_events" in str(exc), exc
        else:
            raise AssertionError("enable_kv_events='maybe' was accepted")
        # a shared index's evictions are not observable here: refused, not half-reported
        import fx100io.contrib.vllm as tier_mod

        real_open = tier_mod.open_backend_store

        def shared_open(settings: Any, log: Any) -> Any:
            backend = real_open(settings, log=log)
            backend.store = AsyncOnly(backend.store)
            return backend

        tier_mod.open_backend_store = shared_open
        try:
            load_tier(entry(os.path.join(workdir, "events-shared.img"), create="always",
                            enable_kv_events=True), primary, make_spec(events=True))
        except ValueError as exc:
            assert "shared index" in str(exc), exc
        else:
            raise AssertionError("enable_kv_events with a shared index was accepted")
        finally:
            tier_mod.open_backend_store = real_open
        # the device was let go: it opens again
        load_tier(entry(os.path.join(workdir, "events-shared.img")), primary).shutdown()

    @check("load_never_lands_after_the_job_is_reported")
    def _landing() -> None:
        """A load whose pieces land slowly, stopped at random moments the ways vLLM
        can stop waiting (polling past timeout_s, which trips the breaker; shutdown):
        once its job is reported, or shutdown returned, no byte of its rows changes."""
        import random

        from adapter_cancel import LandingStore, watch_unchanged

        tier = load_tier(entry(os.path.join(workdir, "landing.img"), create="always",
                               timeout_s="0.05", retry_after_s="0"), primary)
        real = tier._backend.store
        rng = random.Random(27)
        ks = [key(70_000 + i) for i in range(2)]
        primary.fill(4, 1)
        primary.fill(5, 2)
        tier.submit_store(job(1, ks, [4, 5], False))
        assert [r.success for r in finish(tier)] == [True]
        rows = [primary.arr[6], primary.arr[7]]
        for trial in range(5):
            landing = LandingStore(real, piece=8192, pause_s=0.002)
            tier._backend.store = landing
            time.sleep(0.01)  # retry_after_s=0: a tripped breaker lets the job in
            tier.submit_load(job(10 + trial, ks, [6, 7], True))
            assert landing.landing.wait(WAIT_S)
            time.sleep(rng.uniform(0, 0.1))
            if trial == 4:
                tier.shutdown()  # waits for the job: vLLM frees the rows after this
            else:
                deadline = time.monotonic() + WAIT_S
                while not any(r.job_id == 10 + trial for r in tier.get_finished_jobs()):
                    assert time.monotonic() < deadline, "the load job was never reported"
                    time.sleep(0.002)
            assert landing.running == 0, "reported while its read was still landing"
            problem = watch_unchanged(rows)
            assert problem is None, f"trial {trial}: {problem}"

    @check("shutdown_then_recreate")
    def _recreate() -> None:
        for _ in range(3):
            tier = load_tier(entry(img), primary)
            assert settle(tier, key(0))[1] is LookupResult.HIT
            tier.shutdown()
            tier.shutdown()  # idempotent
            assert tier.lookup(key(0), CTX) is LookupResult.MISS
        # The tier let go of vLLM's primary memory (the tier object itself still alive):
        # vLLM can release the view and unmap the region at its shutdown.
        primary.close()

    for fn in (_loaded, _roundtrip, _once, _absent, _per_request, _namespace, _restart, _corrupt, _bad,
               _late_answer, _eviction, _inflight, _shared, _failing, _priorities, _hung, _dp_ns, _range, _size, _manager, _aclose, _model, _touch, _events, _events_off, _landing,
               _recreate):
        fn()
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

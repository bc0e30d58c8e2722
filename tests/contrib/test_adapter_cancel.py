"""A load that is cancelled or timed out never writes into the engine's memory after it
returned (or after the memory went back to the engine).

One contract over every adapter's load. The store under the adapter lands its reads
slowly, piece by piece, and keeps landing the pieces already sent when cancelled
(tests/support/adapter_cancel.py), as a device does. Each trial cancels at a random
moment of the read, waits for the call to return, fills the memory with a sentinel and
watches it for half a second: not one byte may change.

- LMCache in-process: the async prefetch (``batched_get_non_blocking``) cancelled by
  LMCache, and the blocking get timing out. The MemoryObjs the plugin allocated go
  back to LMCache's CPU pool only once their reads ended; the watch starts when the
  pool is whole again.
- LMCache MP (both adapter types): close() at a random moment of a load; the watch
  starts once the load's result was published and close() returned.
- SGLang: close() at a random moment of batch_get_v1 (tests/support/sglang_driver.py
  ``cancelled_read_never_lands_after_return``, run by test_sglang.py in SGLang's venv).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading
import time
from typing import Any

import pytest
from support.adapter_cancel import LandingStore, watch_unchanged

TRIALS = 6


# ------------------------------------------------------------------ LMCache in-process
@pytest.mark.parametrize("how", ["cancelled", "timed_out"])
def test_lmcache_load_never_lands_after_it_returned(tmp_path, how):
    support = pytest.importorskip("support.lmcache")
    torch = support.torch
    rng = random.Random(25)
    manager = support.make_storage_manager(
        support.make_config(f"file://{tmp_path}/kv.img", retry_after_s="0"))
    late = 0
    try:
        backend = support.plugin_of(manager)
        cpu = manager.storage_backends["LocalCPUBackend"]
        pool_bytes = cpu.get_memory_allocator().pin_allocator.address_manager
        meta = cpu.metadata
        keys = [support.CacheEngineKey(support.MODEL, 1, 0, 900 + i, torch.bfloat16)
                for i in range(3)]
        objs = []
        for i, _ in enumerate(keys):
            obj = manager.allocate(meta.get_shapes(support.CHUNK), meta.get_dtypes())
            support.fill_obj(obj, seed=i)
            objs.append(obj)
        manager.batched_put(keys, objs)
        assert backend.flush(30)
        support.cold_cpu_tier(manager)
        base = pool_bytes.total_allocated_size
        real = backend._store
        if how == "timed_out":
            backend.options = dataclasses.replace(backend.options, timeout_s=0.03)

        # every buffer the plugin reads into, as LMCache's pool memory
        views: list[memoryview] = []
        allocate = cpu.allocate

        def allocate_and_note(*args: Any, **kwargs: Any) -> Any:
            obj = allocate(*args, **kwargs)
            if obj is not None:
                views.append(memoryview(obj.byte_array).cast("B"))
            return obj

        cpu.allocate = allocate_and_note
        for trial in range(TRIALS):
            views.clear()
            landing = LandingStore(real, piece=512, pause_s=0.002)
            backend._store = landing
            if how == "cancelled":
                ended = threading.Event()

                async def prefetch(ended: threading.Event = ended, n: int = trial) -> Any:
                    try:
                        return await backend.batched_get_non_blocking(f"c{n}", keys)
                    finally:
                        ended.set()

                fut = asyncio.run_coroutine_threadsafe(prefetch(), manager.loop)
                assert landing.landing.wait(30)
                time.sleep(rng.uniform(0, 0.05))
                fut.cancel()
                assert ended.wait(30), "the cancelled prefetch never returned"
            else:
                assert backend.batched_get_blocking(keys) == [None] * len(keys)
            late += landing.running > 0  # returned while its read was still landing
            # LMCache may hand the memory out again from here on
            support.wait_until(lambda: pool_bytes.total_allocated_size == base, 30,
                               "the plugin's buffers back in LMCache's pool")
            assert views, "the plugin read into no buffer"
            problem = watch_unchanged(views)
            assert problem is None, f"trial {trial} ({how}): {problem}"
            time.sleep(0.01)  # retry_after_s=0: the breaker lets the next trial in
        assert late > 0, "no cancel came while a read was landing"
        backend._store = real
    finally:
        manager.close()


# ------------------------------------------------------------------ LMCache MP
def _native_round(client: Any, submit: Any) -> list[bool] | None:
    fid = submit()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for row in client.drain_completions():
            if row[0] == fid:
                return row[3]
        time.sleep(0.005)
    raise AssertionError("the native client never completed")


@pytest.mark.parametrize("kind", ["plugin", "native"])
def test_lmcache_mp_load_never_lands_after_close_returned(tmp_path, kind):
    mpt = pytest.importorskip("support.lmcache_mp")
    from fx100io.contrib.lmcache_mp import FX100ioNativeClient

    torch = mpt.torch
    rng = random.Random(26)
    late = 0
    for trial in range(TRIALS):
        arena = mpt.Arena(4 << 20)
        dev = f"file://{tmp_path}/mp-{kind}-{trial}.img"
        keys = [mpt.key(i) for i in range(2)]
        objs = [arena.obj(64 << 10) for _ in keys]
        for i, o in enumerate(objs):
            mpt.fill(o, seed=i)
        bufs = [o.raw_data.view(torch.uint8).numpy() for o in objs]
        if kind == "plugin":
            ad = mpt.load_adapter(mpt.spec(dev), arena)
            svc = ad._svc
            assert mpt.store(ad, keys, objs)
        else:
            ad = FX100ioNativeClient(devices=dev, size="64M")
            svc = ad._svc
            names = [f"m@0@0@{i}" for i in range(len(bufs))]
            assert _native_round(ad, lambda ad=ad, names=names, bufs=bufs:
                                 ad.submit_batch_set(names, bufs)) == [True] * 2
        landing = LandingStore(svc.store, piece=1024, pause_s=0.002)
        svc.store = landing
        if kind == "plugin":
            ad.submit_load_task(keys, objs)
        else:
            ad.submit_batch_get(names, bufs)
        assert landing.landing.wait(30)
        time.sleep(rng.uniform(0, 0.08))
        ad.close()  # the memory is LMCache's again once this returned
        late += landing.running > 0
        problem = watch_unchanged(bufs)
        assert problem is None, f"trial {trial}: {problem}"
    assert late == 0, "close() returned while a load was still landing"

"""Broken configs fail loudly at start; broken devices turn into misses, never crashes
or hangs, and LMCache keeps serving (it recomputes what it cannot load).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import pytest
from support.lmcache import (
    CHUNK,
    MODEL,
    CacheEngineKey,
    LogCapture,
    cold_cpu_tier,
    destroy_engine,
    fill_obj,
    make_config,
    make_engine,
    make_metadata,
    make_storage_manager,
    obj_bytes,
    plugin_of,
    random_kv,
    torch,
)

from fx100io.contrib.lmcache import FX100ioBackend, PluginConfigError, PluginStartError


@pytest.fixture
def device(tmp_path):
    return f"file://{tmp_path}/kv.img"


def allocated(manager) -> int:
    cpu = manager.storage_backends["LocalCPUBackend"]
    return cpu.get_memory_allocator().pin_allocator.address_manager.total_allocated_size


def put(manager, hashes, seed0=0):
    meta = manager.storage_backends["LocalCPUBackend"].metadata
    keys = [CacheEngineKey(MODEL, 1, 0, h, torch.bfloat16) for h in hashes]
    objs, want = [], []
    for i, _ in enumerate(keys):
        obj = manager.allocate(meta.get_shapes(CHUNK), meta.get_dtypes())
        want.append(fill_obj(obj, seed0 + i))
        objs.append(obj)
    manager.batched_put(keys, objs)
    assert plugin_of(manager).flush(30)
    return keys, want


# ------------------------------------------------------------ broken configs


@pytest.mark.parametrize(
    "opts, message",
    [
        ({"devices": None}, "devices is required"),
        ({"devices": "s3://bucket/kv"}, "not a device URI"),
        ({"size": "lots"}, "cannot read 'lots' as a size"),
        ({"queue_depth": "0"}, "queue_depth: must be >= 1"),
        ({"direct": "maybe"}, "expected true, false or auto"),
        ({"create": "sometimes"}, "create: expected one of"),
        ({"engine": "spdk"}, "engine: expected one of"),
        ({"queue_dpeth": "64"}, "unknown key"),
        ({"size": None}, "size is required to create"),
    ],
)
def test_broken_config_raises_a_clear_error(device, opts, message):
    devices = opts.pop("devices", device)
    config = make_config(devices, **opts)
    with LogCapture() as logs, pytest.raises(PluginConfigError, match=message):
        FX100ioBackend(config=config, metadata=make_metadata(), local_cpu_backend=None, loop=None)
    assert "NOT loaded" in logs.text(logging.CRITICAL)


def test_existing_file_that_is_not_a_store_is_not_formatted(tmp_path):
    junk = tmp_path / "kv.img"
    junk.write_bytes(b"precious data " * 1000)
    config = make_config(f"file://{junk}")
    with LogCapture() as logs, pytest.raises(PluginStartError, match="could not open"):
        FX100ioBackend(config=config, metadata=make_metadata(), local_cpu_backend=None, loop=None)
    assert junk.read_bytes() == b"precious data " * 1000  # 'auto' never formats existing data
    assert "NOT loaded" in logs.text(logging.CRITICAL)


def test_lmcache_without_the_plugin_still_serves_and_the_failure_is_loud(tmp_path):
    """LMCache only logs a plugin constructor error; our critical line says what broke."""
    config = make_config(f"file://{tmp_path}/kv.img", size=None)
    with LogCapture() as logs:
        engine = make_engine(config)
    try:
        assert "fx100io" not in engine.storage_manager.storage_backends
        assert "size is required" in logs.text(logging.CRITICAL)
        tokens = torch.arange(2 * CHUNK)
        kv = random_kv(len(tokens), seed=5)
        engine.store(tokens, kvcaches=kv)  # the CPU tier still works
        out = torch.zeros_like(kv)
        assert int(engine.retrieve(tokens, kvcaches=out).sum()) == len(tokens)
        assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))
    finally:
        destroy_engine(engine)


# ------------------------------------------------------------ broken devices


def test_store_gone_turns_into_misses_and_lmcache_keeps_serving(device):
    engine = make_engine(make_config(device, retry_after_s="60"))
    try:
        sm = engine.storage_manager
        backend = plugin_of(sm)
        tokens = torch.arange(3 * CHUNK)
        kv = random_kv(len(tokens), seed=6)
        engine.store(tokens, kvcaches=kv)
        cold_cpu_tier(sm)

        backend._store.close()  # the device is gone under the plugin
        with LogCapture() as logs:
            assert engine.lookup(tokens) == 0
            out = torch.zeros_like(kv)
            mask = engine.retrieve(tokens, kvcaches=out)
            assert int(mask.sum()) == 0  # nothing loaded: LMCache recomputes
            engine.store(tokens, kvcaches=kv)  # puts are skipped, the CPU tier takes them
            assert backend.flush(5)
        assert "failed" in logs.text(logging.ERROR)
        assert backend.stats()["breaker_trips"] >= 1

        out = torch.zeros_like(kv)
        assert int(engine.retrieve(tokens, kvcaches=out).sum()) == len(tokens)  # from CPU
        assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))
    finally:
        destroy_engine(engine)


def test_device_that_lost_its_data_gives_misses(device, tmp_path):
    manager = make_storage_manager(make_config(device))
    try:
        keys, _ = put(manager, [31, 32])
        cold_cpu_tier(manager)
        before = allocated(manager)
        os.truncate(tmp_path / "kv.img", 0)  # every chunk now reads short
        got = plugin_of(manager).batched_get_blocking(keys)
        assert got == [None, None]
        assert allocated(manager) == before  # the buffers went back to LMCache
    finally:
        manager.close()


class StallingStore:
    """The real store, except that reads wait for a gate, like a target that went quiet.

    Only the waiting is simulated: when the gate opens the real read runs and fills the
    buffers, which is exactly the late completion the plugin must survive.
    """

    def __init__(self, real, loop):
        self._real = real
        self.gate = asyncio.Event()
        self._loop = loop

    def __getattr__(self, name):
        return getattr(self._real, name)

    async def batch_get(self, keys, bufs, **kw):
        await self.gate.wait()
        return await self._real.batch_get(keys, bufs, **kw)

    async def batch_put(self, keys, bufs, **kw):
        await self.gate.wait()
        return await self._real.batch_put(keys, bufs, **kw)

    def open_gate(self):
        self._loop.call_soon_threadsafe(self.gate.set)


def test_stalled_reads_time_out_and_buffers_wait_for_the_late_completion(device):
    manager = make_storage_manager(make_config(device, timeout_s="0.5", retry_after_s="0.2"))
    try:
        backend = plugin_of(manager)
        keys, want = put(manager, [41, 42, 43])
        cold_cpu_tier(manager)
        real = backend._store
        stalling = StallingStore(real, manager.loop)
        backend._records.clear()  # make the first read a record read, to stall early too

        base = allocated(manager)
        backend._store = stalling
        with LogCapture() as logs:
            t0 = time.monotonic()
            assert backend.batched_get_blocking(keys) == [None, None, None]
            assert time.monotonic() - t0 < 5
        assert "recomputes" in logs.text(logging.ERROR)

        # Now with records known, so the data read itself stalls with buffers in flight.
        backend._store = real
        time.sleep(0.3)  # let the breaker's retry_after_s pass
        assert backend.batched_contains(keys) == 3
        for key in keys:  # warm the record cache with the real store
            obj = backend.get_blocking(key)
            obj.ref_count_down()
        backend._store = stalling
        assert backend.batched_get_blocking(keys) == [None, None, None]
        assert allocated(manager) > base  # kept: the kernel may still write into them

        stalling.open_gate()
        deadline = time.monotonic() + 10
        while allocated(manager) != base and time.monotonic() < deadline:
            time.sleep(0.01)
        assert allocated(manager) == base  # released once the late reads finished

        backend._store = real
        time.sleep(0.3)
        got = backend.batched_get_blocking(keys)  # the breaker closed again
        for obj, w in zip(got, want):
            assert obj is not None and torch.equal(obj_bytes(obj), w)
            obj.ref_count_down()
    finally:
        manager.close()


def test_stalled_prefetch_answers_the_scheduler(device):
    from support.lmcache import LookupRecorder

    tokens = torch.arange(2 * CHUNK)
    kv = random_kv(len(tokens), seed=7)
    writer = make_engine(make_config(device))
    try:
        writer.store(tokens, kvcaches=kv)
        assert plugin_of(writer.storage_manager).flush(30)
    finally:
        destroy_engine(writer)

    recorder = LookupRecorder()
    engine = make_engine(
        make_config(device, async_loading=True, timeout_s="0.5"), async_lookup_server=recorder
    )
    try:
        sm = engine.storage_manager
        backend = plugin_of(sm)
        backend._store = StallingStore(backend._store, sm.loop)
        engine.async_lookup_and_prefetch(lookup_id="stall", tokens=tokens)
        assert recorder.wait("stall", timeout=10) == 0  # vLLM recomputes instead of waiting
        out = torch.zeros_like(kv)
        assert int(engine.retrieve(tokens, kvcaches=out, req_id="stall").sum()) == 0
        backend._store.open_gate()
    finally:
        destroy_engine(engine)


def test_lmcache_frees_its_pool_only_after_our_writes_finish(device):
    """StorageManager.close() frees the CPU pool before closing plugins: it must wait."""
    import threading

    manager = make_storage_manager(make_config(device, timeout_s="0.5"))
    backend = plugin_of(manager)
    stalling = StallingStore(backend._store, manager.loop)
    backend._store = stalling
    meta = manager.storage_backends["LocalCPUBackend"].metadata
    key = CacheEngineKey(MODEL, 1, 0, 77, torch.bfloat16)
    obj = manager.allocate(meta.get_shapes(CHUNK), meta.get_dtypes())
    want = fill_obj(obj, 77)
    manager.batched_put([key], [obj])
    assert backend.flush(10)  # the put timed out (breaker) but its write is still pending
    allocator = manager.storage_backends["LocalCPUBackend"].get_memory_allocator()

    closer = threading.Thread(target=manager.close)
    closer.start()
    time.sleep(0.5)
    assert not allocator._unregistered  # LMCache's pool is still there: our write holds it
    stalling.open_gate()
    closer.join(30)
    assert not closer.is_alive()
    assert allocator._unregistered  # freed once the write ended

    again = make_storage_manager(make_config(device))
    try:
        (got,) = plugin_of(again).batched_get_blocking([key])
        assert got is not None and torch.equal(obj_bytes(got), want)  # and the write was whole
        got.ref_count_down()
    finally:
        again.close()


def test_pool_left_allocated_if_the_device_never_answers(device):
    manager = make_storage_manager(make_config(device, timeout_s="0.2"))
    backend = plugin_of(manager)
    stalling = StallingStore(backend._store, manager.loop)
    backend._store = stalling
    meta = manager.storage_backends["LocalCPUBackend"].metadata
    obj = manager.allocate(meta.get_shapes(CHUNK), meta.get_dtypes())
    fill_obj(obj, 1)
    manager.batched_put([CacheEngineKey(MODEL, 1, 0, 78, torch.bfloat16)], [obj])
    allocator = manager.storage_backends["LocalCPUBackend"].get_memory_allocator()
    with LogCapture() as logs:
        manager.close()  # bounded: about 2 x max(timeout_s, 1s)
    assert not allocator._unregistered
    assert "leaving the pool allocated" in logs.text(logging.ERROR)


def test_a_second_process_on_the_same_device_is_refused(device, tmp_path):
    """Two workers given one device would overwrite each other's chunks: fail at start."""
    import subprocess
    import sys
    import textwrap

    holder = make_storage_manager(make_config(device))
    try:
        plugin_of(holder)
        child = textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {os.path.dirname(os.path.dirname(__file__))!r})
            from support.lmcache import make_config, make_metadata
            from fx100io.contrib.lmcache import FX100ioBackend, PluginStartError
            try:
                FX100ioBackend(config=make_config({device!r}), metadata=make_metadata())
            except PluginStartError as exc:
                print("REFUSED", exc)
            """
        )
        out = subprocess.run(
            [sys.executable, "-c", child], check=False, capture_output=True, text=True, timeout=240
        )
        assert "REFUSED" in out.stdout and "in use by another process" in out.stdout, out.stderr[-3000:]
        assert "{worker_id}" in out.stdout  # and says how to fix it
    finally:
        holder.close()


def test_missing_block_device_is_reported_not_created(tmp_path):
    config = make_config("/dev/fx100io-test-no-such-disk", size=None)
    with pytest.raises(PluginStartError, match="could not open"):
        FX100ioBackend(config=config, metadata=make_metadata())
    assert not os.path.exists("/dev/fx100io-test-no-such-disk")

"""The plugin under LMCache's real StorageManager: put, drop the CPU tier, get back.

Run: python3 -m pytest tests/contrib/test_lmcache_*.py
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest
from support.lmcache import (
    CHUNK,
    MODEL,
    CacheEngineKey,
    LayerCacheEngineKey,
    MemoryFormat,
    cold_cpu_tier,
    fill_obj,
    keys_for,
    make_config,
    make_metadata,
    make_storage_manager,
    obj_bytes,
    plugin_of,
    put_chunks,
    torch,
)

import fx100io


@pytest.fixture
def device(tmp_path):
    return f"file://{tmp_path}/kv.img"


@pytest.fixture
def sm(device):
    manager = make_storage_manager(make_config(device))
    yield manager
    manager.close()


def test_put_clear_cpu_tier_get_is_byte_exact(sm):
    keys = keys_for([101, -202, b"\x01\x02\x03\x04" * 8])  # int, negative and bytes hashes
    expected = put_chunks(sm, keys)
    cold_cpu_tier(sm)

    got = sm.batched_get(keys, location="fx100io")

    assert [g is not None for g in got] == [True] * len(keys)
    for obj, want in zip(got, expected):
        assert torch.equal(obj_bytes(obj), want)
        assert obj.get_memory_format() == MemoryFormat.KV_2LTD
        assert obj.get_shape() == torch.Size([2, 4, CHUNK, 24])
        assert obj.get_dtype() == torch.bfloat16
    # A hit from a lower tier is written back to the CPU tier by the StorageManager:
    # proof the chunks really came through the plugin.
    assert set(sm.storage_backends["LocalCPUBackend"].get_keys()) == set(keys)
    for obj in got:
        obj.ref_count_down()


def test_single_get_and_contains(sm):
    (key,) = keys_for([7])
    (expected,) = put_chunks(sm, [key])
    backend = plugin_of(sm)
    assert backend.flush(30)
    assert backend.contains(key)
    assert not backend.contains(keys_for([8])[0])
    assert sm.contains(key, search_range=["fx100io"]) == "fx100io"

    obj = backend.get_blocking(key)
    assert obj is not None and torch.equal(obj_bytes(obj), expected)
    obj.ref_count_down()
    assert backend.get_blocking(keys_for([8])[0]) is None


def test_reads_land_in_lmcache_allocated_buffers(sm):
    """The returned MemoryObj is one LocalCPUBackend allocated, in its pinned pool."""
    keys = keys_for([11, 12])
    put_chunks(sm, keys)
    cold_cpu_tier(sm)
    cpu = sm.storage_backends["LocalCPUBackend"]
    pool = cpu.get_memory_allocator().buffer
    lo, hi = pool.data_ptr(), pool.data_ptr() + pool.numel() * pool.element_size()

    got = plugin_of(sm).batched_get_blocking(keys)

    for obj in got:
        assert obj.parent() is cpu.get_memory_allocator()
        assert lo <= obj.data_ptr < hi
        obj.ref_count_down()


def test_per_worker_keys_do_not_collide(device, tmp_path):
    """Same chunk hash, different worker / world size / dtype / hash type: different chunks."""
    manager = make_storage_manager(make_config(device))
    try:
        variants = [
            CacheEngineKey(MODEL, 1, 0, 0x1234, torch.bfloat16),
            CacheEngineKey(MODEL, 2, 0, 0x1234, torch.bfloat16),
            CacheEngineKey(MODEL, 2, 1, 0x1234, torch.bfloat16),
            CacheEngineKey(MODEL, 1, 0, b"\x12\x34", torch.bfloat16),  # same hex as 0x1234
            CacheEngineKey(MODEL, 1, 0, -0x1234, torch.bfloat16),
            CacheEngineKey(
                MODEL, 1, 0, 0x1234, torch.bfloat16, request_configs={"lmcache.tag.user": "alice"}
            ),
        ]
        expected = put_chunks(manager, variants, seed0=50)
        cold_cpu_tier(manager)
        got = plugin_of(manager).batched_get_blocking(variants)
        for obj, want in zip(got, expected):
            assert obj is not None and torch.equal(obj_bytes(obj), want)
            obj.ref_count_down()
    finally:
        manager.close()


def test_layerwise_keys(sm):
    """Layer keys (one chunk per layer, KV_T2D) round-trip, also via the async path."""
    backend = plugin_of(sm)
    cpu = sm.storage_backends["LocalCPUBackend"]
    base = CacheEngineKey(MODEL, 1, 0, -99, torch.bfloat16)
    layer_keys = base.split_layers(4)
    assert all(isinstance(k, LayerCacheEngineKey) for k in layer_keys)
    objs, expected = [], []
    for i, _ in enumerate(layer_keys):
        obj = cpu.allocate(torch.Size([CHUNK, 2, 24]), torch.bfloat16, MemoryFormat.KV_T2D)
        expected.append(fill_obj(obj, 300 + i))
        objs.append(obj)
    sm.batched_put(layer_keys, objs)
    cold_cpu_tier(sm)
    assert not backend.contains(base)  # the chunk key is not one of the layer keys

    got = backend.batched_get_blocking(layer_keys)
    for obj, want in zip(got, expected):
        assert obj.get_memory_format() == MemoryFormat.KV_T2D
        assert torch.equal(obj_bytes(obj), want)
        obj.ref_count_down()

    # LMCache's layerwise retrieval asks the backend per layer on its own loop.
    future = asyncio.run_coroutine_threadsafe(
        backend.batched_get_non_blocking("lookup-layer", layer_keys[1:3]), sm.loop
    )
    prefix = future.result(30)
    assert len(prefix) == 2
    for obj, want in zip(prefix, expected[1:3]):
        assert torch.equal(obj_bytes(obj), want)
        obj.ref_count_down()


def test_put_task_callbacks_and_reference_counts(sm):
    """One callback per key once durable; our reference is dropped afterwards."""
    backend = plugin_of(sm)
    cpu = sm.storage_backends["LocalCPUBackend"]
    meta = cpu.metadata
    keys = keys_for([401, 402, 403])
    objs = [cpu.allocate(meta.get_shapes(CHUNK), meta.get_dtypes()) for _ in keys]
    for i, obj in enumerate(objs):
        fill_obj(obj, i)
    done = []

    futures = backend.batched_submit_put_task(keys, objs, on_complete_callback=done.append)
    # While in flight the plugin holds its own reference, like LMCache expects.
    for key in keys:
        assert backend.exists_in_put_tasks(key) or backend.contains(key)
    for f in futures:
        f.result(30)

    assert sorted(done, key=lambda k: k.chunk_hash) == keys
    assert all(backend.contains(k) for k in keys)
    assert not any(backend.exists_in_put_tasks(k) for k in keys)
    assert [o.get_ref_count() for o in objs] == [1, 1, 1]  # only the caller's remains

    # Re-putting stored keys writes nothing and calls nothing.
    assert backend.batched_submit_put_task(keys, objs, on_complete_callback=done.append) is None
    assert len(done) == 3
    for obj in objs:
        obj.ref_count_down()


def test_pin_unpin_and_remove(sm):
    backend = plugin_of(sm)
    keys = keys_for([501, 502, 503])
    put_chunks(sm, keys)
    assert backend.flush(30)
    missing = keys_for([599])[0]

    assert backend.contains(keys[0], pin=True)
    assert backend.pin(keys[1])
    assert not backend.pin(missing)
    assert backend.is_pinned(keys[0]) and backend.is_pinned(keys[1])

    assert backend.remove(keys[0], force=False) is False  # pinned: eviction must not win
    assert backend.contains(keys[0])
    assert backend.unpin(keys[0])
    assert not backend.unpin(keys[0])  # no pin left
    assert backend.remove(keys[0], force=False) is True
    assert not backend.contains(keys[0])
    assert backend.get_blocking(keys[0]) is None

    assert backend.remove(keys[1], force=True) is True  # forced: drops its pins
    assert not backend.is_pinned(keys[1])
    assert backend.batched_remove([keys[2], missing]) == 1
    assert not any(backend.contains(k) for k in keys)


def test_batched_async_contains_counts_the_prefix_and_pins(sm):
    backend = plugin_of(sm)
    keys = keys_for([601, 602, 603, 604])
    put_chunks(sm, keys[:2] + keys[3:])  # a hole at keys[2]
    assert backend.flush(30)

    future = asyncio.run_coroutine_threadsafe(
        backend.batched_async_contains("lookup-1", keys, pin=True), sm.loop
    )
    assert future.result(30) == 2
    assert backend.is_pinned(keys[0]) and backend.is_pinned(keys[1])
    assert not backend.is_pinned(keys[3])
    assert backend.batched_contains(keys) == 2


def test_async_get_returns_the_prefix_and_frees_the_rest(sm):
    backend = plugin_of(sm)
    cpu = sm.storage_backends["LocalCPUBackend"]
    keys = keys_for([701, 702, 703, 704])
    expected = put_chunks(sm, [keys[0], keys[1], keys[3]])
    cold_cpu_tier(sm)
    used_before = cpu.get_memory_allocator().pin_allocator.address_manager.total_allocated_size

    future = asyncio.run_coroutine_threadsafe(backend.batched_get_non_blocking("lk", keys), sm.loop)
    prefix = future.result(30)

    assert len(prefix) == 2
    for obj, want in zip(prefix, expected[:2]):
        assert torch.equal(obj_bytes(obj), want)
        obj.ref_count_down()
    # The chunk after the hole was allocated and read, then handed back.
    used_after = cpu.get_memory_allocator().pin_allocator.address_manager.total_allocated_size
    assert used_after == used_before


def test_chunks_persist_across_storage_managers(device):
    keys = keys_for([801, -802])
    first = make_storage_manager(make_config(device))
    try:
        expected = put_chunks(first, keys)
        assert plugin_of(first).flush(30)
    finally:
        first.close()

    second = make_storage_manager(make_config(device))
    try:
        backend = plugin_of(second)
        assert backend.stats()["cached_records"] == 0  # nothing known but what is on the device
        assert backend.batched_contains(keys) == 2
        got = backend.batched_get_blocking(keys)
        for obj, want in zip(got, expected):
            assert obj is not None and torch.equal(obj_bytes(obj), want)
            obj.ref_count_down()
    finally:
        second.close()


def test_chunks_persist_across_processes(device, tmp_path):
    """A separate Python process stores; this one, a fresh engine, finds the bytes."""
    child = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {os.path.dirname(os.path.dirname(__file__))!r})
        from support.lmcache import *
        from support.lmcache import make_storage_manager, make_config, fill_obj, plugin_of
        sm = make_storage_manager(make_config({device!r}))
        meta = sm.storage_backends["LocalCPUBackend"].metadata
        keys = [CacheEngineKey({MODEL!r}, 1, 0, h, torch.bfloat16) for h in (901, -902, b"\\x09" * 32)]
        objs = [sm.allocate(meta.get_shapes({CHUNK}), meta.get_dtypes()) for _ in keys]
        for i, o in enumerate(objs):
            fill_obj(o, 900 + i)
        sm.batched_put(keys, objs)
        assert plugin_of(sm).flush(30)
        sm.close()
        print("STORED")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", child], check=False, capture_output=True, text=True, timeout=240
    )
    assert "STORED" in out.stdout, out.stderr[-4000:]

    manager = make_storage_manager(make_config(device))
    try:
        keys = keys_for([901, -902, b"\x09" * 32])
        got = plugin_of(manager).batched_get_blocking(keys)
        meta = manager.storage_backends["LocalCPUBackend"].metadata
        for i, obj in enumerate(got):
            assert obj is not None
            ref = manager.allocate(meta.get_shapes(CHUNK), meta.get_dtypes())
            want = fill_obj(ref, 900 + i)
            ref.ref_count_down()
            assert torch.equal(obj_bytes(obj), want)
            obj.ref_count_down()
    finally:
        manager.close()


def test_partial_last_chunk_and_other_dtype(device):
    """A short final chunk (fewer tokens) and float16 keys keep their own shapes."""
    manager = make_storage_manager(make_config(device), make_metadata(dtype=torch.float16))
    try:
        meta = manager.storage_backends["LocalCPUBackend"].metadata
        key = CacheEngineKey(MODEL, 1, 0, 4242, torch.float16)
        obj = manager.allocate(meta.get_shapes(5), meta.get_dtypes())
        want = fill_obj(obj, 42)
        manager.batched_put([key], [obj])
        cold_cpu_tier(manager)
        (got,) = plugin_of(manager).batched_get_blocking([key])
        assert got.get_shape() == torch.Size([2, 4, 5, 24])
        assert got.get_dtype() == torch.float16
        assert torch.equal(obj_bytes(got), want)
        got.ref_count_down()
    finally:
        manager.close()


def test_worker_placeholder_gives_each_worker_its_own_device(tmp_path):
    pattern = f"file://{tmp_path}/kv-{{worker_id}}-of-{{world_size}}.img"
    manager = make_storage_manager(make_config(pattern), make_metadata(worker_id=1, world_size=2))
    try:
        assert plugin_of(manager).options.devices == (f"file://{tmp_path}/kv-1-of-2.img",)
        assert os.path.exists(tmp_path / "kv-1-of-2.img")
    finally:
        manager.close()


def test_striped_file_devices(tmp_path):
    devices = f"file://{tmp_path}/a.img,file://{tmp_path}/b.img"
    keys = keys_for(range(1000, 1012))
    first = make_storage_manager(make_config(devices))
    try:
        expected = put_chunks(first, keys)
        assert plugin_of(first).flush(30)
        per_device = [d["chunks"] for d in plugin_of(first).stats()["store"]["devices"]]
        assert len(per_device) == 2 and all(n > 0 for n in per_device)  # spread over both
    finally:
        first.close()
    second = make_storage_manager(make_config(devices))
    try:
        got = plugin_of(second).batched_get_blocking(keys)
        for obj, want in zip(got, expected):
            assert obj is not None and torch.equal(obj_bytes(obj), want)
            obj.ref_count_down()
    finally:
        second.close()


def test_blank_block_device_is_formatted_once_then_reopened(loop_device):
    """create: auto on a brand-new (all-zero) disk formats it; a restart finds the chunks."""
    config = make_config(loop_device, size=None)
    keys = keys_for([1101, 1102])
    first = make_storage_manager(config)
    try:
        expected = put_chunks(first, keys)
        assert plugin_of(first).flush(30)
    finally:
        first.close()
    second = make_storage_manager(make_config(loop_device, size=None))
    try:
        got = plugin_of(second).batched_get_blocking(keys)
        for obj, want in zip(got, expected):
            assert obj is not None and torch.equal(obj_bytes(obj), want)
            obj.ref_count_down()
    finally:
        second.close()


def test_preallocated_zero_file_is_formatted(tmp_path):
    img = tmp_path / "kv.img"
    with open(img, "wb") as f:
        f.truncate(32 << 20)  # e.g. made with `truncate -s` or fallocate beforehand
    manager = make_storage_manager(make_config(f"file://{img}", size=None))
    try:
        keys = keys_for([1201])
        (want,) = put_chunks(manager, keys)
        cold_cpu_tier(manager)
        (obj,) = plugin_of(manager).batched_get_blocking(keys)
        assert torch.equal(obj_bytes(obj), want)
        obj.ref_count_down()
    finally:
        manager.close()


def test_a_hot_chunk_survives_capacity_eviction(device):
    """Loads keep a chunk's record as fresh as its data in the store's LRU.

    Otherwise the tiny record of a chunk read from memory-cached metadata would age and
    be evicted first, and the hot chunk would vanish from lookups.
    """
    manager = make_storage_manager(make_config(device, capacity="120K"))
    try:
        backend = plugin_of(manager)
        hot = keys_for([1300])
        (want,) = put_chunks(manager, hot)
        assert backend.flush(30)
        for n in range(30):
            put_chunks(manager, keys_for([1400 + n]), seed0=n)
            assert backend.flush(30)
            obj = backend.get_blocking(hot[0])
            assert obj is not None, f"hot chunk lost after {n + 1} more puts"
            assert torch.equal(obj_bytes(obj), want)
            obj.ref_count_down()
        assert backend.stats()["store"]["evictions"] > 0  # the store did evict
        assert backend.contains(hot[0])
        assert not backend.contains(keys_for([1400])[0])  # the coldest ones went
    finally:
        manager.close()


def test_a_record_that_no_longer_matches_is_a_miss(sm):
    from fx100io.contrib import _lmcache_codec as codec

    backend = plugin_of(sm)
    (key,) = keys_for([1500])
    put_chunks(sm, [key])
    assert backend.flush(30)
    obj = backend.get_blocking(key)  # the record is now cached in memory
    obj.ref_count_down()
    text = codec.lmcache_key_text(key)
    other = codec.ChunkRecord(text, 6144, "KV_2LTD", ((2, 4, 16, 24),), ("float16",))
    backend._store.batch_put_blocking([codec.record_key(text)], [other.encode()])
    assert backend.get_blocking(key) is None  # the cached record disagrees with the device


class CountingStore:
    """The real store, counting the batches the plugin hands it."""

    def __init__(self, real):
        self._real = real
        self.get_batches: list[int] = []
        self.priorities: list = []

    def __getattr__(self, name):
        return getattr(self._real, name)

    async def batch_get(self, keys, bufs, **kw):
        self.get_batches.append(len(keys))
        self.priorities.append(("get", kw.get("priority")))
        return await self._real.batch_get(keys, bufs, **kw)

    async def batch_put(self, keys, bufs, **kw):
        self.priorities.append(("put", kw.get("priority")))
        return await self._real.batch_put(keys, bufs, **kw)


def test_a_load_is_one_parallel_batch(sm):
    """N chunks go to the store as one batch (all reads in flight at once), not N calls."""
    backend = plugin_of(sm)
    keys = keys_for(range(1600, 1608))
    expected = put_chunks(sm, keys)
    assert backend.flush(30)
    backend._records.clear()  # as after a restart
    counting = CountingStore(backend._store)
    backend._store = counting

    got = backend.batched_get_blocking(keys)  # cold: the records, then the data
    assert counting.get_batches == [8, 8]
    assert {p for _, p in counting.priorities} == {fx100io.Priority.LOAD}
    got_warm = backend.batched_get_blocking(keys)  # warm: data and records together
    assert counting.get_batches == [8, 8, 16]
    for obj, obj2, want in zip(got, got_warm, expected):
        assert torch.equal(obj_bytes(obj), want) and torch.equal(obj_bytes(obj2), want)
        obj.ref_count_down()
        obj2.ref_count_down()


def test_loads_and_stores_carry_their_priority(sm):
    """Through LMCache's StorageManager: its puts reach the store as stores, its
    retrieves (cold and warm) as loads (docs/lmcache.md, "Priority")."""
    from fx100io.priority import Priority

    backend = plugin_of(sm)
    counting = CountingStore(backend._store)
    backend._store = counting
    keys = keys_for(range(1650, 1654))
    expected = put_chunks(sm, keys)
    assert backend.flush(30)
    assert counting.priorities and all(p == ("put", Priority.STORE) for p in counting.priorities)
    counting.priorities.clear()
    backend._records.clear()  # as after a restart: records are read too
    got = backend.batched_get_blocking(keys)
    assert counting.priorities == [("get", Priority.LOAD)] * 2
    for obj, want in zip(got, expected):
        assert torch.equal(obj_bytes(obj), want)
        obj.ref_count_down()


def test_async_lookup_and_prefetch_with_layerwise_keys(device):
    """StorageManager.async_lookup_and_prefetch over per-layer keys (keys_per_chunk > 1)."""
    from support.lmcache import LookupRecorder

    layers = 4
    chunks = [CacheEngineKey(MODEL, 1, 0, h, torch.bfloat16) for h in (-1700, 1701)]
    layer_keys = [k for c in chunks for k in c.split_layers(layers)]
    writer = make_storage_manager(make_config(device, layerwise=True))
    try:
        cpu = writer.storage_backends["LocalCPUBackend"]
        objs, expected = [], []
        for i, _ in enumerate(layer_keys):
            obj = cpu.allocate(torch.Size([CHUNK, 2, 24]), torch.bfloat16, MemoryFormat.KV_T2D)
            expected.append(fill_obj(obj, 1700 + i))
            objs.append(obj)
        writer.batched_put(layer_keys, objs)
        assert plugin_of(writer).flush(30)
    finally:
        writer.close()

    recorder = LookupRecorder()
    from lmcache.v1.event_manager import EventManager, EventType
    from lmcache.v1.storage_backend.storage_manager import StorageManager

    events = EventManager()
    manager = StorageManager(
        make_config(device, layerwise=True, async_loading=True),
        make_metadata(),
        events,
        async_lookup_server=recorder,
    )
    try:
        asyncio.run_coroutine_threadsafe(
            manager.async_lookup_and_prefetch(
                "layer-lookup", layer_keys, [0, CHUNK, 2 * CHUNK], keys_per_chunk=layers
            ),
            manager.loop,
        ).result(30)
        assert recorder.wait("layer-lookup") == 2 * CHUNK
        tiers = events.get_event_future(EventType.LOADING, "layer-lookup").result()  # done: answered
        loaded = [pair for tier in tiers for pair in tier]
        assert [k for k, _ in loaded] == layer_keys
        for (_, obj), want in zip(loaded, expected):
            assert torch.equal(obj_bytes(obj), want)
            obj.ref_count_down()
    finally:
        manager.close()


def test_the_cpu_pool_is_offered_for_registration(device, monkeypatch):
    """When the core can register outside memory, the plugin hands it LMCache's whole pool.

    The core has no such call yet, so a recorder stands in for it; without one, the
    other tests run the unregistered path.
    """
    import numpy as np

    import fx100io

    offered = []
    monkeypatch.setattr(fx100io, "register_memory", offered.append, raising=False)
    manager = make_storage_manager(make_config(device))
    try:
        pool = manager.storage_backends["LocalCPUBackend"].get_memory_allocator().buffer
        assert len(offered) == 1
        view = offered[0]
        assert view.nbytes == pool.numel()
        assert np.frombuffer(view, dtype=np.uint8).ctypes.data == pool.data_ptr()
    finally:
        manager.close()

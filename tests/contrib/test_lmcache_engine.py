"""The plugin under a full LMCacheEngine: store KV, drop the CPU tier, retrieve it.

A CPU-tensor connector stands in for vLLM's GPU KV cache, so every retrieved token's
KV can be compared byte for byte with what was stored.

These tests use file devices; the same engine over nvme+tcp (a namespace served by
fx100io's own NVMe/TCP target) is in test_lmcache_nvme_tcp.py.
"""

from __future__ import annotations

import pytest
from support.lmcache import (
    CHUNK,
    LookupRecorder,
    cold_cpu_tier,
    destroy_engine,
    make_config,
    make_engine,
    plugin_of,
    random_kv,
    torch,
)

NUM_TOKENS = 5 * CHUNK + 7  # five full chunks and a partial one


@pytest.fixture
def device(tmp_path):
    return f"file://{tmp_path}/kv.img"


def tokens_for(seed: int, n: int = NUM_TOKENS) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 32000, (n,), generator=gen)


def test_store_then_retrieve_from_fx100io_is_byte_exact(device):
    engine = make_engine(make_config(device))
    try:
        tokens = tokens_for(1)
        kv = random_kv(len(tokens), seed=1)
        engine.store(tokens, kvcaches=kv)
        sm = engine.storage_manager
        cold_cpu_tier(sm)

        out = torch.zeros_like(kv)
        mask = engine.retrieve(tokens, kvcaches=out)

        assert int(mask.sum()) == len(tokens)
        assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))
        # Written back to the CPU tier by LMCache: the hit came from the plugin.
        assert len(sm.storage_backends["LocalCPUBackend"].get_keys()) == 6
    finally:
        destroy_engine(engine)


def test_retrieve_after_engine_restart(device):
    tokens = tokens_for(2)
    kv = random_kv(len(tokens), seed=2)
    first = make_engine(make_config(device))
    try:
        first.store(tokens, kvcaches=kv)
        assert plugin_of(first.storage_manager).flush(30)
    finally:
        destroy_engine(first)

    second = make_engine(make_config(device))  # new engine, new CPU pool, same device
    try:
        assert second.storage_manager.storage_backends["LocalCPUBackend"].get_keys() == []
        assert second.lookup(tokens) == len(tokens)
        out = torch.zeros_like(kv)
        mask = second.retrieve(tokens, kvcaches=out)
        assert int(mask.sum()) == len(tokens)
        assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))
    finally:
        destroy_engine(second)


def test_partial_prefix_hit(device):
    """Only the stored prefix is retrieved; the rest is left for recomputation."""
    engine = make_engine(make_config(device))
    try:
        tokens = tokens_for(3)
        kv = random_kv(len(tokens), seed=3)
        prefix = 3 * CHUNK
        engine.store(tokens[:prefix], kvcaches=kv[:, :, :prefix])
        cold_cpu_tier(engine.storage_manager)

        out = torch.zeros_like(kv)
        mask = engine.retrieve(tokens, kvcaches=out)

        assert int(mask.sum()) == prefix and bool(mask[:prefix].all())
        assert torch.equal(out[:, :, :prefix].view(torch.uint8), kv[:, :, :prefix].view(torch.uint8))
        assert not out[:, :, prefix:].any()
    finally:
        destroy_engine(engine)


def test_async_lookup_and_prefetch(device):
    """vLLM's async-loading path: lookup+prefetch on LMCache's loop, then retrieve."""
    tokens = tokens_for(4)
    kv = random_kv(len(tokens), seed=4)
    writer = make_engine(make_config(device))
    try:
        writer.store(tokens, kvcaches=kv)
        assert plugin_of(writer.storage_manager).flush(30)
    finally:
        destroy_engine(writer)

    recorder = LookupRecorder()
    engine = make_engine(make_config(device, async_loading=True), async_lookup_server=recorder)
    try:
        sm = engine.storage_manager
        assert sm.storage_backends["LocalCPUBackend"].get_keys() == []
        engine.async_lookup_and_prefetch(lookup_id="req-1", tokens=tokens, pin=True)
        assert recorder.wait("req-1") == len(tokens)

        out = torch.zeros_like(kv)
        mask = engine.retrieve(tokens, kvcaches=out, req_id="req-1")
        assert int(mask.sum()) == len(tokens)
        assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))

        # A miss answers 0 right away instead of waiting on anything.
        engine.async_lookup_and_prefetch(lookup_id="req-2", tokens=tokens_for(99))
        assert recorder.wait("req-2") == 0
    finally:
        destroy_engine(engine)


def loop_queue_pieces(backend) -> dict[str, int]:
    """Pieces per class issued so far by the plugin's loop-thread queues (every
    read and write of the plugin's own runs there), summed over its devices."""
    async def stats() -> list[dict[str, int]]:
        return [m.dev.queue_stats() for m in backend._store._members]

    out = {"pieces_load": 0, "pieces_store": 0, "pieces_background": 0}
    for s in backend._runner.call(stats(), 30):
        for k in out:
            out[k] += s[k]
    return out


@pytest.mark.parametrize("setting", [None, "background"])
def test_async_prefetch_reaches_the_device_in_its_class(device, setting):
    """LMCache's async lookup and prefetch (LMCacheEngine.async_lookup_and_prefetch)
    reads at prefetch_priority's class, load by default, counted by the queue
    that issued the pieces; a retrieve from the device stays a load."""
    tokens = tokens_for(5)
    kv = random_kv(len(tokens), seed=5)
    writer = make_engine(make_config(device))
    try:
        writer.store(tokens, kvcaches=kv)
        assert plugin_of(writer.storage_manager).flush(30)
    finally:
        destroy_engine(writer)

    opts = {} if setting is None else {"prefetch_priority": setting}
    recorder = LookupRecorder()
    engine = make_engine(make_config(device, async_loading=True, **opts),
                         async_lookup_server=recorder)
    try:
        backend = plugin_of(engine.storage_manager)
        before = loop_queue_pieces(backend)
        engine.async_lookup_and_prefetch(lookup_id="req-p", tokens=tokens, pin=True)
        assert recorder.wait("req-p") == len(tokens)
        after = loop_queue_pieces(backend)
        moved = {k: after[k] - before[k] for k in after}
        cls = "pieces_background" if setting == "background" else "pieces_load"
        assert moved[cls] > 0 and sum(moved.values()) == moved[cls], moved
        out = torch.zeros_like(kv)
        mask = engine.retrieve(tokens, kvcaches=out, req_id="req-p")
        assert int(mask.sum()) == len(tokens)
        assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))
    finally:
        destroy_engine(engine)

    # a retrieve that reads the device (no prefetch): loads only
    engine = make_engine(make_config(device))
    try:
        backend = plugin_of(engine.storage_manager)
        before = loop_queue_pieces(backend)
        out = torch.zeros_like(kv)
        assert int(engine.retrieve(tokens, kvcaches=out).sum()) == len(tokens)
        after = loop_queue_pieces(backend)
        moved = {k: after[k] - before[k] for k in after}
        assert moved["pieces_load"] > 0 and sum(moved.values()) == moved["pieces_load"], moved
        assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))
    finally:
        destroy_engine(engine)

"""The LMCache plugin's shared option: two engines (two serving hosts) on
the same pool; what one stores, the other loads, byte for byte."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from support.lmcache import (
    CHUNK,
    PLUGIN,
    cold_cpu_tier,
    destroy_engine,
    keys_for,
    make_config,
    make_engine,
    make_storage_manager,
    obj_bytes,
    plugin_extra,
    plugin_of,
    put_chunks,
    random_kv,
    torch,
)
from support.shared_redis import RedisServer, serve

from fx100io.contrib._lmcache_config import PluginConfigError, parse_options
from fx100io.store.shared import SharedChunkStore


@pytest.fixture
def redis_server(tmp_path: Path):
    yield from serve(tmp_path)


def test_two_engines_share_one_pool(tmp_path, redis_server):
    devs = [str(tmp_path / "a.img"), str(tmp_path / "b.img")]
    SharedChunkStore(devs, redis_server.url, create=True, size=64 << 20).close()
    cfg = dict(devices=",".join(f"file://{d}" for d in devs), shared_index=redis_server.url)
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 32000, (3 * CHUNK + 5,), generator=gen)
    kv = random_kv(len(tokens), seed=7)
    a = make_engine(make_config(**cfg))
    b = make_engine(make_config(**cfg))  # both open the same devices: no lock refuses it
    try:
        a.store(tokens, kvcaches=kv)
        assert plugin_of(a.storage_manager).flush(30)
        cold_cpu_tier(b.storage_manager)
        assert b.lookup(tokens) == len(tokens)
        out = torch.zeros_like(kv)
        mask = b.retrieve(tokens, kvcaches=out)
        assert int(mask.sum()) == len(tokens)
        assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))
        assert plugin_of(b.storage_manager).stats()["store"]["chunks"] > 0
    finally:
        destroy_engine(a)
        destroy_engine(b)


def test_shared_option_never_formats_on_its_own(tmp_path, redis_server):
    blank = tmp_path / "blank.img"
    with open(blank, "wb") as f:
        f.truncate(16 << 20)  # blank: 'auto' would format it for a store of one host
    engine = make_engine(make_config(f"file://{blank}", shared_index=redis_server.url))
    try:
        assert PLUGIN not in engine.storage_manager.storage_backends
    finally:
        destroy_engine(engine)
    with open(blank, "rb") as f:
        assert not any(f.read(1 << 20))
    extra = plugin_extra(f"file://{blank}", shared_index="http://nope")
    with pytest.raises(PluginConfigError, match="redis://"):
        parse_options([PLUGIN], extra, "FX100ioBackend")


def test_a_hanging_index_never_blocks_the_plugins_event_loop(tmp_path, monkeypatch):
    """docs/architecture.md rule 14: while redis-server hangs (SIGSTOP), every call of the
    plugin that runs on LMCache's event loop (loads with and without known
    records, the async load, the async put, a remove on the loop) answers
    without a Redis round trip on the loop: a 10 ms ticker there never
    stalls for anything near the socket timeout (2 s here), as one
    synchronous call would (the margin leaves room for a loaded machine's
    scheduling)."""
    monkeypatch.setenv("FX100IO_INDEX_TIMEOUT", "2")
    srv = RedisServer(tmp_path / "redis")
    srv.start()
    devs = [str(tmp_path / "a.img")]
    SharedChunkStore(devs, srv.url, create=True, size=64 << 20).close()
    cfg = dict(shared_index=srv.url)
    a = make_storage_manager(make_config(f"file://{devs[0]}", **cfg))
    b = make_storage_manager(make_config(f"file://{devs[0]}", **cfg))
    pb = plugin_of(b)
    ticks: list[float] = []
    stop = threading.Event()

    async def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    def on_loop(coro, timeout: float = 30):  # noqa: ANN001, ANN202
        return asyncio.run_coroutine_threadsafe(coro, b.loop).result(timeout)

    def fresh() -> None:
        """Let the next call reach Redis again (no breaker, no fail-fast window)."""
        pb._breaker.__init__(pb.options.retry_after_s)
        pb._store._index._down_until = 0.0

    try:
        keys = keys_for([801, 802, 803])
        expected = put_chunks(a, keys)
        assert plugin_of(a).flush(30)
        objs = pb.batched_get_blocking(keys)  # b learns the records
        for obj, want in zip(objs, expected):
            assert obj is not None and torch.equal(obj_bytes(obj), want)
            obj.ref_count_down()
        ticking = asyncio.run_coroutine_threadsafe(ticker(), b.loop)
        time.sleep(0.1)
        os.kill(srv.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            # records known: the data's size is asked of the index, on the loop
            assert pb.batched_get_blocking(keys) == [None] * 3
            fresh()
            with pb._lock:
                pb._records.clear()  # records unknown: their sizes too
            assert pb.batched_get_blocking(keys) == [None] * 3
            fresh()
            assert on_loop(pb.batched_get_non_blocking("lk", keys)) == []
            fresh()
            meta = b.storage_backends["LocalCPUBackend"].metadata
            obj = b.allocate(meta.get_shapes(CHUNK), meta.get_dtypes())
            more = keys_for([811])
            on_loop(pb.async_batched_submit_put_task(more, [obj]))
            obj.ref_count_down()
            fresh()

            async def remove_on_loop() -> int:
                return int(pb.batched_remove(keys))
            on_loop(remove_on_loop())
            fresh()
            assert not pb.contains(keys[0])  # off the loop: waits here, not there
            time.sleep(0.05)
            assert time.monotonic() - t0 > 2  # the index was really asked, and hung
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)
        stop.set()
        ticking.result(10)
        gaps = [t1 - t0 for t0, t1 in zip(ticks, ticks[1:])]
        assert max(gaps) < 1.0, f"the event loop stalled for {max(gaps):.3f} s"
        fresh()
        # Redis back: the chunks are all there for b (the remove on the loop
        # is done, or nothing was removed)
        objs = pb.batched_get_blocking(keys)
        got = [o is not None for o in objs]
        for obj, want in zip(objs, expected):
            if obj is not None:
                assert torch.equal(obj_bytes(obj), want)
                obj.ref_count_down()
        assert got in ([True] * 3, [False] * 3)
    finally:
        stop.set()
        b.close()
        a.close()
        srv.stop(signal.SIGKILL)

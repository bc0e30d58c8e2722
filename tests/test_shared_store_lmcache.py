"""The LMCache plugin's shared option: two engines (two serving hosts) on
the same pool; what one stores, the other loads, byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest
from shared_redis import serve
from test_lmcache_support import (
    CHUNK,
    PLUGIN,
    cold_cpu_tier,
    destroy_engine,
    make_config,
    make_engine,
    plugin_extra,
    plugin_of,
    random_kv,
    torch,
)

from fx100io.contrib._lmcache_config import PluginConfigError, parse_options
from fx100io.shared import SharedChunkStore


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

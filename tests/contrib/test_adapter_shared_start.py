"""Starting an adapter on a live shared pool never destroys it.

Every adapter takes ``create`` and ``shared_index`` from its engine's config. ``create:
always`` formats at every start, which with a shared pool would erase what every host
stored at the next restart (or when a second host starts). It is refused when the
settings are parsed, naming the key as the user wrote it, before any device or Redis key
is touched. The start that is allowed (``create: auto``) is checked the way the danger
shows: start, store chunks, stop, start again with the same settings, read the chunks back
byte for byte (and the pool still opens for another host).

LMCache's two adapters run here against a real redis-server; SGLang's and vLLM's config
paths refuse it through their own constructors in their engines' venvs (the bad-config
checks of tests/support/sglang_driver.py and tests/support/vllm_tier_driver.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.shared_redis import serve

from fx100io.contrib._settings import BackendConfigError, parse_settings
from fx100io.store.shared import SharedChunkStore


@pytest.fixture
def redis_server(tmp_path: Path):
    yield from serve(tmp_path)


@pytest.fixture
def pool(tmp_path: Path, redis_server) -> tuple[str, str]:
    dev = tmp_path / "pool.img"
    SharedChunkStore([str(dev)], redis_server.url, create=True, size=64 << 20).close()
    return f"file://{dev}", redis_server.url


def _chunks_still_there(device: str, index: str, names: list[bytes], want: list[bytes]) -> None:
    """Another host opening the pool reads every chunk back."""
    with SharedChunkStore(device.removeprefix("file://"), index) as store:
        bufs = [bytearray(len(w)) for w in want]
        assert store.batch_get_blocking(names, bufs) == [True] * len(names)
        assert [bytes(b) for b in bufs] == want


@pytest.mark.parametrize("where", ["storage_plugin.fx100io.", "adapter_params.",
                                   "extra_config.", "secondary_tiers[FX100ioTier]."])
def test_create_always_with_a_shared_index_is_refused_naming_the_key(where):
    with pytest.raises(BackendConfigError, match=rf"{__import__('re').escape(where)}create"):
        parse_settings({"devices": "file:///nowhere.img", "create": "always",
                        "shared_index": "redis://127.0.0.1:1/0"}, where)
    # without a shared index, 'always' stays what it was for a store of one host
    assert parse_settings({"devices": "file:///nowhere.img", "create": "always"},
                          where).create == "always"


# ------------------------------------------------------------------ LMCache in-process
def test_lmcache_plugin_refuses_create_always_on_a_shared_pool(pool, tmp_path):
    support = pytest.importorskip("support.lmcache")
    from fx100io.contrib._lmcache_config import PluginConfigError, parse_options

    device, index = pool
    extra = support.plugin_extra(device, shared_index=index, create="always")
    with pytest.raises(PluginConfigError, match=r"storage_plugin\.fx100io\.create"):
        parse_options([support.PLUGIN], extra, "FX100ioBackend")


def test_lmcache_plugin_restarted_on_a_shared_pool_reads_its_chunks_back(pool):
    support = pytest.importorskip("support.lmcache")
    torch = support.torch
    from fx100io.contrib import _lmcache_codec as codec

    device, index = pool
    cfg = support.make_config(device, shared_index=index)
    keys = [support.CacheEngineKey(support.MODEL, 1, 0, h, torch.bfloat16) for h in (1, 2, 3)]
    manager = support.make_storage_manager(cfg)
    try:
        meta = manager.storage_backends["LocalCPUBackend"].metadata
        objs, want = [], []
        for i, _ in enumerate(keys):
            obj = manager.allocate(meta.get_shapes(support.CHUNK), meta.get_dtypes())
            want.append(support.fill_obj(obj, seed=10 + i))
            objs.append(obj)
        manager.batched_put(keys, objs)
        assert support.plugin_of(manager).flush(30)
    finally:
        manager.close()

    again = support.make_storage_manager(cfg)  # a restart with the same settings
    try:
        backend = support.plugin_of(again)
        for k, w in zip(keys, want):
            got = backend.get_blocking(k)
            assert got is not None and torch.equal(support.obj_bytes(got), w)
            got.ref_count_down()
    finally:
        again.close()
    names = [codec.data_key(codec.lmcache_key_text(k)).encode() for k in keys]
    _chunks_still_there(device, index, names, [bytes(w.numpy()) for w in want])


# ------------------------------------------------------------------ LMCache MP
def test_lmcache_mp_refuses_create_always_on_a_shared_pool(pool):
    pytest.importorskip("lmcache.v1.distributed.api", reason="lmcache is not installed")
    from fx100io.contrib.lmcache_mp import FX100ioL2AdapterConfig, FX100ioNativeClient

    device, index = pool
    params = {"devices": device, "shared_index": index, "create": "always"}
    with pytest.raises(BackendConfigError, match=r"adapter_params\.create"):
        FX100ioL2AdapterConfig.from_dict(params)
    with pytest.raises(BackendConfigError, match=r"adapter_params\.create"):
        FX100ioNativeClient(**params)


def test_lmcache_mp_restarted_on_a_shared_pool_reads_its_chunks_back(pool):
    mpt = pytest.importorskip("support.lmcache_mp")
    from fx100io.contrib._lmcache_mp_core import object_key_name

    device, index = pool
    arena = mpt.Arena(4 << 20)
    keys = [mpt.key(i) for i in range(3)]
    objs = [arena.obj(40_000) for _ in keys]
    want = [mpt.fill(o, seed=20 + i) for i, o in enumerate(objs)]
    ad = mpt.load_adapter(mpt.spec(device, shared_index=index), arena)
    try:
        assert mpt.store(ad, keys, objs)
    finally:
        ad.close()
    for o in objs:
        o.raw_data.view(mpt.torch.uint8).zero_()

    ad = mpt.load_adapter(mpt.spec(device, shared_index=index), arena)  # a restart
    try:
        assert mpt.lookup(ad, keys) == [True] * 3
        assert mpt.load(ad, keys, objs) == [True] * 3
        assert [mpt.content(o) for o in objs] == want
    finally:
        ad.close()
    names = [object_key_name(k.kv_rank, k.object_group_id, k.chunk_hash, k.cache_salt,
                             k.model_name).encode() for k in keys]
    _chunks_still_there(device, index, names, want)


def test_no_redis_key_or_device_byte_changes_when_refused(pool, redis_server):
    """The refusal comes before anything is opened: the pool is as it was."""
    device, index = pool
    path = device.removeprefix("file://")
    before = Path(path).read_bytes(), sorted(redis_server.client().keys("*"))
    with pytest.raises(BackendConfigError):
        parse_settings({"devices": device, "create": "always", "shared_index": index},
                       "adapter_params.")
    assert (Path(path).read_bytes(), sorted(redis_server.client().keys("*"))) == before

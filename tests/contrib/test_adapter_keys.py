"""Every adapter maps its engine's keys to store keys one-to-one, and a stored chunk is
never served under a key other than its own.

One contract, one suite, over the four adapters (LMCache in-process plugin, LMCache's
multi-process adapters, SGLang HiCache, vLLM's tier): Hypothesis draws engine keys over
every field the engine compares (separators, ``%``, ``@``, ``/``, ``~``, empty strings,
non-ASCII, very long values) and checks that two keys the engine keeps apart never share
a store key. The second half writes a chunk under one key and reads it under another
that is forced onto the same store key: the read must miss, not hand out the first
key's bytes.

The key mappings are plain functions (no engine needed); the LMCache plugin's record
check runs in a real LMCache StorageManager.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fx100io.contrib import _keys
from fx100io.contrib import _lmcache_mp_core as mp
from fx100io.contrib import _sglang_keys as sgl
from fx100io.contrib import _vllm_keys as vk

KEY_MAX = 1024  # the store's limit on a key's UTF-8 bytes

# Strings built to break naive joins: every separator an adapter uses or used, the
# escape character, empty strings, non-ASCII, and (below) very long values.
_TRICKY = list("%@/~.:;,=#_- a") + ["%2F", "%25", "é", "漢", "\N{PILE OF POO}", "\x00"]
# Few letters and separators, so that two draws often differ only in where a separator
# falls (the way "alice@b%c" and "alice", "b", "c" meet when joined naively).
tiny_text = st.lists(st.sampled_from(["a", "b", "%", "@", "/", "~", "%2F", ""]),
                     max_size=5).map("".join)
short_text = tiny_text | st.lists(st.sampled_from(_TRICKY), max_size=6).map("".join) \
    | st.text(max_size=8)
any_text = st.one_of(tiny_text, tiny_text, short_text, st.text(min_size=600, max_size=1500),
                     short_text.map(lambda s: s * 300))

SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclasses.dataclass
class Mapping:
    """One adapter's key contract: engine keys, how the engine tells them apart, and the
    store keys each one uses."""

    keys: st.SearchStrategy[Any]
    identity: Callable[[Any], Hashable]  # equal exactly when the engine's keys are equal
    store_keys: Callable[[Any], list[str | bytes | None]]  # None: the adapter refuses it
    limit_is_hashed: bool  # long keys are hashed (True) or refused by the store (False)
    # keys a naive join would confuse with the given one (a separator moved from one
    # field into the next), checked beside it: random draws rarely line up that way
    variants: Callable[[Any], list[Any]] = lambda key: []


# ------------------------------------------------------------------ LMCache in-process
def _lmcache() -> Mapping:
    lm = pytest.importorskip("lmcache.utils", reason="lmcache is not installed")
    import torch

    from fx100io.contrib import _lmcache_codec as codec

    dtypes = [torch.bfloat16, torch.float16, torch.float32, torch.uint8]
    tags = st.lists(st.tuples(any_text, any_text), max_size=3, unique_by=lambda t: t[0])

    @st.composite
    def keys(draw: Any) -> Any:
        configs = {"lmcache.tag." + k: v for k, v in draw(tags)}
        if draw(st.booleans()):
            configs["other.setting"] = draw(short_text)  # not a tag: not part of the key
        # small ranges: keys of one list often share all but one field
        fields = dict(
            model_name=draw(st.sampled_from(["m", "m@1", ""]) | any_text),
            world_size=draw(st.integers(1, 2)), worker_id=draw(st.integers(0, 1)),
            chunk_hash=draw(st.integers(-2, 2**64) | st.binary(max_size=40)),
            dtype=draw(st.sampled_from(dtypes)), request_configs=configs or None)
        if draw(st.booleans()):
            return lm.LayerCacheEngineKey(**fields, layer_id=draw(st.integers(0, 2)))
        return lm.CacheEngineKey(**fields)

    def store_keys(key: Any) -> list[str | bytes | None]:
        text = codec.lmcache_key_text(key)
        return [codec.data_key(text), codec.record_key(text)]

    def variants(key: Any) -> list[Any]:
        # what LMCache's own parser makes of the key's to_string(): another key wherever
        # a tag or the model name holds '@' or '%'
        try:
            other = lm.parse_cache_key(key.to_string())
        except (ValueError, KeyError, IndexError):
            return []
        return [other]

    # LMCache's own == and hash: (class, model, world, worker, hash, dtype, tags, layer)
    return Mapping(keys(), lambda k: k, store_keys, limit_is_hashed=True, variants=variants)


# ------------------------------------------------------------------ LMCache MP
def _lmcache_mp() -> Mapping:
    api = pytest.importorskip("lmcache.v1.distributed.api", reason="lmcache is not installed")

    @st.composite
    def keys(draw: Any) -> Any:
        if draw(st.booleans()):  # the native client's string keys
            return ("native", draw(any_text))
        try:
            return ("object", api.ObjectKey(
                chunk_hash=draw(st.binary(max_size=40)), model_name=draw(any_text),
                kv_rank=draw(st.integers(-4, 2**40)), object_group_id=draw(st.integers(0, 9)),
                cache_salt=draw(short_text)))
        except ValueError:  # LMCache refuses '@' in names, '/' and more in salts
            return ("native", "")

    def store_keys(key: Any) -> list[str | bytes | None]:
        kind, k = key
        if kind == "native":
            return [mp.native_key_name(k)]
        try:
            name = mp.object_key_name(k.kv_rank, k.object_group_id, k.chunk_hash,
                                      k.cache_salt, k.model_name)
        except ValueError:
            return [None]
        # the name is the whole key: it reads back as every field of the ObjectKey
        assert mp.parse_object_key_name(name) == (k.kv_rank, k.object_group_id,
                                                  bytes(k.chunk_hash), k.cache_salt,
                                                  k.model_name)
        return [name]

    return Mapping(keys(), lambda k: k, store_keys, limit_is_hashed=False)


# ------------------------------------------------------------------ SGLang
def _sglang() -> Mapping:
    geometry_fields = st.lists(
        st.tuples(st.sampled_from(["layer_num", "head_num", "head_dim", "v_head_dim"]),
                  st.none() | st.integers(0, 512) | short_text),
        max_size=4, unique_by=lambda t: t[0])

    @st.composite
    def keys(draw: Any) -> Any:
        scope = (draw(any_text), draw(any_text), draw(short_text))  # namespace, model, ranks
        if draw(st.booleans()):
            return (*scope, "flat", draw(any_text))
        pool = (draw(short_text), draw(short_text), draw(st.integers(1, 1024)),
                tuple(draw(geometry_fields)),
                tuple(draw(st.lists(st.integers(1, 1 << 30), max_size=4))))
        return (*scope, "page", pool, draw(any_text))

    def store_keys(key: Any) -> list[str | bytes | None]:
        namespace, model, ranks, kind = key[:4]
        scope = sgl.scope(namespace, model, ranks)
        if kind == "flat":
            return [sgl.flat_key(scope, key[4])]
        (layout, dtype, page_size, fields, sizes), page = key[4], key[5]
        prefix = sgl.page_prefix(scope, layout, dtype, page_size, sgl.geometry(fields, sizes))
        name = sgl.page_key(prefix, page)
        # the store key is the whole key: its fields read back
        assert _keys.split(name)[:4] == [sgl.VERSION, namespace, model, ranks]
        assert _keys.split(name)[-1] == page
        return [name]

    def variants(key: Any) -> list[Any]:
        # the scope's three strings with a '/' moved across a boundary, and "" <-> "~"
        out = []
        joined = "/".join(key[:3])
        cuts = [i for i, c in enumerate(joined) if c == "/"][:6]
        for i in cuts:
            for j in cuts:
                if i < j:
                    out.append((joined[:i], joined[i + 1:j], joined[j + 1:], *key[3:]))
        swap = {"": "~", "~": ""}
        out.append((swap.get(key[0], key[0]), swap.get(key[1], key[1]), *key[2:]))
        return out

    return Mapping(keys(), lambda k: k, store_keys, limit_is_hashed=False, variants=variants)


# ------------------------------------------------------------------ vLLM
def _vllm() -> Mapping:
    @st.composite
    def keys(draw: Any) -> Any:
        return (draw(st.none() | any_text), draw(st.integers(1, 1 << 30)),
                draw(st.binary(min_size=0, max_size=40)))

    def store_keys(key: Any) -> list[str | bytes | None]:
        extra, chunk_bytes, offload_key = key
        digest = vk.namespace(None, chunk_bytes, extra)
        return [vk.chunk_key(vk.prefix(digest), offload_key)]

    return Mapping(keys(), lambda k: k, store_keys, limit_is_hashed=True)


ADAPTERS: dict[str, Callable[[], Mapping]] = {
    "lmcache": _lmcache, "lmcache_mp": _lmcache_mp, "sglang": _sglang, "vllm": _vllm}


def _nbytes(name: str | bytes) -> int:
    return len(name) if isinstance(name, bytes) else len(name.encode("utf-8"))


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_distinct_engine_keys_never_share_a_store_key(adapter: str) -> None:
    mapping = ADAPTERS[adapter]()

    @SETTINGS
    @given(st.lists(mapping.keys, min_size=2, max_size=12))
    def check(drawn: list[Any]) -> None:
        owner: dict[str | bytes, Hashable] = {}
        keys = [v for key in drawn for v in (key, *mapping.variants(key))]
        for key in keys:
            for name in mapping.store_keys(key):
                if name is None:
                    continue  # refused by the adapter: never stored
                if mapping.limit_is_hashed:
                    assert _nbytes(name) <= KEY_MAX, name
                # (a longer name of the other adapters is refused by the store)
                ident = mapping.identity(key)
                assert owner.setdefault(name, ident) == ident, (
                    f"{owner[name]!r} and {ident!r} share the store key {name!r}")

    check()


def test_lmcache_tags_with_separators_keep_requests_apart() -> None:
    """The pair that made one request read another's KV: to_string() joins tags as
    k%v with @, so these two read the same there."""
    lm = pytest.importorskip("lmcache.utils", reason="lmcache is not installed")
    import torch

    from fx100io.contrib import _lmcache_codec as codec

    a = lm.CacheEngineKey("m", 1, 0, 7, torch.bfloat16, {"lmcache.tag.user": "alice@b%c"})
    b = lm.CacheEngineKey("m", 1, 0, 7, torch.bfloat16,
                          {"lmcache.tag.user": "alice", "lmcache.tag.b": "c"})
    assert a != b and a.to_string() == b.to_string()
    assert codec.lmcache_key_text(a) != codec.lmcache_key_text(b)
    assert codec.data_key(codec.lmcache_key_text(a)) != codec.data_key(codec.lmcache_key_text(b))


def test_sglang_empty_and_tilde_namespaces_are_two_scopes() -> None:
    """quote() leaves '~', and '~' stood for the empty name: "" and "~" shared keys."""
    assert sgl.scope("", "m", "all") != sgl.scope("~", "m", "all")
    assert sgl.scope("ns", "", "all") != sgl.scope("ns", "~", "all")
    assert sgl.scope("a/b", "c", "all") != sgl.scope("a", "b/c", "all")


def test_escaping_reads_back_every_field() -> None:
    @SETTINGS
    @given(st.lists(any_text, max_size=6))
    def check(fields: list[str]) -> None:
        text = _keys.join(fields)
        if fields:
            assert _keys.split(text) == fields

    check()


# ------------------------------------------------------------------ records
def test_lmcache_record_refuses_a_key_forced_onto_another_keys_chunk(tmp_path, monkeypatch):
    """Write under key A, then read key B with the mapping patched so that B lands on
    A's store keys (what a hash collision of a long key would do): the record, which
    holds A's whole key, makes the read a miss instead of handing out A's bytes. A and
    B are the tag pair that LMCache's to_string() renders alike."""
    support = pytest.importorskip("support.lmcache")
    torch = support.torch
    from fx100io.contrib import _lmcache_codec as codec

    monkeypatch.setattr(codec, "_name", lambda kind, text: f"{codec.NAMESPACE}/{kind}#same")
    key = support.CacheEngineKey
    a = key(support.MODEL, 1, 0, 7, torch.bfloat16, {"lmcache.tag.user": "alice@b%c"})
    b = key(support.MODEL, 1, 0, 7, torch.bfloat16,
            {"lmcache.tag.user": "alice", "lmcache.tag.b": "c"})
    manager = support.make_storage_manager(support.make_config(f"file://{tmp_path}/kv.img"))
    try:
        backend = support.plugin_of(manager)
        meta = manager.storage_backends["LocalCPUBackend"].metadata
        obj = manager.allocate(meta.get_shapes(support.CHUNK), meta.get_dtypes())
        want = support.fill_obj(obj, seed=5)
        manager.batched_put([a], [obj])
        assert backend.flush(30)
        for cached in (True, False):
            if not cached:
                backend._records.clear()  # the record comes from the device this time
            assert backend.get_blocking(b) is None
            got = backend.get_blocking(a)
            assert got is not None and torch.equal(support.obj_bytes(got), want)
            got.ref_count_down()
    finally:
        manager.close()

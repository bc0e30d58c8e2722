"""fx100io as an L2 adapter of LMCache's multi-process server, driven by LMCache itself.

Every adapter here is built by LMCache's own loader from an ``--l2-adapter`` JSON string
(parse_args_to_l2_adapters_config + create_l2_adapter, as ``lmcache server`` and ``lmcache
bench l2`` do), over CPU TensorMemoryObjs that lie in one L1 arena, and every result is
collected the way LMCache's controllers collect it: poll the event fd, consume it, then
query. Both adapter types are covered: ``plugin`` (our FX100ioL2Adapter) and
``native_plugin`` (our client inside LMCache's NativeConnectorL2Adapter).
"""

from __future__ import annotations

import json
import os
import threading

import pytest

lmcache = pytest.importorskip(
    "lmcache", reason="the real lmcache package is needed: run tools/install_lmcache.sh")
torch = pytest.importorskip("torch")

from lmcache.v1.distributed.api import MemoryLayoutDesc  # noqa: E402
from support.lmcache_mp import (  # noqa: E402
    MODULE,
    Arena,
    _lenient,
    content,
    fill,
    key,
    load,
    load_adapter,
    lookup,
    spec,
    store,
    wait_query,
)

from fx100io.contrib import lmcache_mp  # noqa: E402
from fx100io.contrib._settings import BackendConfigError  # noqa: E402


@pytest.fixture
def device(tmp_path):
    return f"file://{tmp_path}/kv.img"


@pytest.fixture(params=["plugin", "native_plugin"])
def kind(request):
    return request.param


# ---------------------------------------------------------------------------- tests


def test_lmcache_loader_builds_our_adapter_with_the_config_class(device):
    arena = Arena(1 << 20)
    adapter = load_adapter(spec(device), arena)
    try:
        assert isinstance(adapter, lmcache_mp.FX100ioL2Adapter)
        # the loader found FX100ioL2AdapterConfig and passed the L1 arena: registered
        assert adapter._registration is not None
        fds = {adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(),
               adapter.get_load_event_fd()}
        assert len(fds) == 3
    finally:
        adapter.close()


def test_round_trip_byte_exact_uint8_and_bf16(device, kind):
    arena = Arena(8 << 20)
    adapter = load_adapter(spec(device, kind), arena)
    try:
        # odd sizes; a bf16 object's numel is half its bytes
        srcs = [arena.obj(3 * 4096 + 17), arena.obj(70001, torch.bfloat16),
                arena.obj(1000, torch.float32)]
        keys = [key(i) for i in range(3)]
        want = [fill(o, i) for i, o in enumerate(srcs)]
        assert store(adapter, keys, srcs)
        assert lookup(adapter, keys + [key(99)]) == [True, True, True, False]
        dsts = [arena.obj(3 * 4096 + 17), arena.obj(70001, torch.bfloat16),
                arena.obj(1000, torch.float32)]
        for o in dsts:
            arena.padding_after(o).fill_(0xA5)
        assert load(adapter, keys, dsts) == [True, True, True]
        adapter.submit_unlock(keys)
        assert [content(o) for o in dsts] == want
        # exactly get_size() bytes moved: the allocator padding after each is untouched
        for o in dsts:
            pad = arena.padding_after(o)
            assert pad.numel() > 0 and bool((pad == 0xA5).all())
    finally:
        adapter.close()


def test_each_result_is_returned_once_and_unlock_never_fails(device, kind):
    arena = Arena(1 << 20)
    adapter = load_adapter(spec(device, kind), arena)
    try:
        src = arena.obj(4096)
        fill(src, 1)
        assert store(adapter, [key(1)], [src])
        assert adapter.pop_completed_store_tasks() == {}
        tid = adapter.submit_lookup_and_lock_task([key(1), key(2)], {})
        bm = wait_query(adapter, adapter.get_lookup_and_lock_event_fd(),
                        adapter.query_lookup_and_lock_result, tid)
        assert [bm.test(0), bm.test(1)] == [True, False]
        assert adapter.query_lookup_and_lock_result(tid) is None
        dst = arena.obj(4096)
        tid = adapter.submit_load_task([key(1)], [dst])
        assert wait_query(adapter, adapter.get_load_event_fd(), adapter.query_load_result,
                          tid).test(0)
        assert adapter.query_load_result(tid) is None
        # misses, keys never locked, and double unlocks are all fine
        adapter.submit_unlock([key(1), key(2), key(3)])
        adapter.submit_unlock([key(1), key(2)])
    finally:
        adapter.close()


def test_lookup_with_any_revisions_layout_argument(device):
    arena = Arena(1 << 20)
    adapter = load_adapter(spec(device), arena)
    try:
        src = arena.obj(8192)
        fill(src, 3)
        assert store(adapter, [key(3)], [src])
        assert lookup(adapter, [key(3), key(4)], layouts=False) == [True, False]
        # an earlier revision's form: one layout, by keyword
        tid = adapter.submit_lookup_and_lock_task(
            [key(3)], layout_desc=MemoryLayoutDesc(shapes=[], dtypes=[]))
        assert wait_query(adapter, adapter.get_lookup_and_lock_event_fd(),
                          adapter.query_lookup_and_lock_result, tid).test(0)
    finally:
        adapter.close()


def test_keys_keep_every_object_key_field_apart(device, kind):
    arena = Arena(4 << 20)
    adapter = load_adapter(spec(device, kind), arena)
    try:
        keys = [key(7), key(7, model="org/other"), key(7, model="org/model-7b/x"),
                key(7, rank=1), key(7, group=1), key(7, salt="alice"), key(8),
                key(7, model="org", salt="model-7b")]
        srcs = [arena.obj(4096 + i) for i in range(len(keys))]
        want = [fill(o, 100 + i) for i, o in enumerate(srcs)]
        assert store(adapter, keys, srcs)
        dsts = [arena.obj(4096 + i) for i in range(len(keys))]
        assert load(adapter, keys, dsts) == [True] * len(keys)
        assert [content(o) for o in dsts] == want
    finally:
        adapter.close()


def test_wrong_size_buffer_is_a_miss_not_partial_bytes(device, kind):
    arena = Arena(1 << 20)
    adapter = load_adapter(spec(device, kind), arena)
    try:
        src = arena.obj(8192)
        fill(src, 5)
        assert store(adapter, [key(5)], [src])
        small, big = arena.obj(4096), arena.obj(12288)
        big.raw_data.fill_(0x11)
        assert load(adapter, [key(5), key(5)], [small, big]) == [False, False]
    finally:
        adapter.close()


def test_many_threads_at_once(device, kind):
    arena = Arena(24 << 20)
    adapter = load_adapter(spec(device, kind), arena)
    nthreads, per = 8, 6
    errors: list[BaseException] = []
    lock = threading.Lock()
    slots = []
    with lock:
        for _t in range(nthreads):
            slots.append(([arena.obj(65536 + 512 * j) for j in range(per)],
                          [arena.obj(65536 + 512 * j) for j in range(per)]))

    def worker(t: int) -> None:
        _lenient.on = True
        try:
            srcs, dsts = slots[t]
            keys = [key(1000 * t + j, rank=t) for j in range(per)]
            want = [fill(o, 1000 * t + j) for j, o in enumerate(srcs)]
            for j in range(per):  # interleave stores, lookups and loads with the others
                assert store(adapter, [keys[j]], [srcs[j]])
            assert lookup(adapter, keys) == [True] * per
            assert load(adapter, keys, dsts) == [True] * per
            adapter.submit_unlock(keys)
            assert [content(o) for o in dsts] == want
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    try:
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(nthreads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors[0]
    finally:
        adapter.close()


def test_restart_lists_every_key_and_loads_it_byte_exact(device):
    arena = Arena(8 << 20)
    keys = [key(i, model="org/m" if i % 2 else "org/n", rank=i % 3, group=i % 2,
                salt="s1" if i % 4 == 0 else "") for i in range(13)]
    sizes = [4096 * (1 + i % 3) + i for i in range(13)]
    first = load_adapter(spec(device), arena)
    try:
        srcs = [arena.obj(n) for n in sizes]
        want = [fill(o, 200 + i) for i, o in enumerate(srcs)]
        assert store(first, keys, srcs)
    finally:
        first.close()

    second = load_adapter(spec(device), arena)  # a new server on the same device
    try:
        found = {}
        cursor = None
        pages = 0
        while True:
            page = second.list_l2_keys(page_size=5, cursor=cursor)
            pages += 1
            for e in page.entries:
                found[e.key.to_object_key()] = e.size_bytes
            cursor = page.next_page_token
            if cursor is None:
                break
        assert pages == 3
        assert found == dict(zip(keys, sizes))
        only_m = second.list_l2_keys(model_name="org/m", page_size=100)
        assert {e.key.to_object_key() for e in only_m.entries} == {
            k for k in keys if k.model_name == "org/m"}
        usage = second.get_usage()
        assert usage.total_bytes_used >= sum(sizes)
        assert usage.bytes_by_cache_salt["s1"] == sum(
            n for k, n in zip(keys, sizes) if k.cache_salt == "s1")
        assert lookup(second, keys) == [True] * len(keys)
        dsts = [arena.obj(n) for n in sizes]
        assert load(second, keys, dsts) == [True] * len(keys)
        second.submit_unlock(keys)
        assert [content(o) for o in dsts] == want
    finally:
        second.close()


def test_list_l2_keys_rejects_bad_arguments(device):
    adapter = load_adapter(spec(device), Arena(1 << 20))
    try:
        with pytest.raises(ValueError, match="page_size"):
            adapter.list_l2_keys(page_size=0)
        with pytest.raises(ValueError, match="cursor"):
            adapter.list_l2_keys(cursor="not-ours")
    finally:
        adapter.close()


def test_corrupted_chunk_on_disk_is_a_miss(tmp_path, kind):
    path = tmp_path / "kv.img"
    device = f"file://{path}"
    arena = Arena(1 << 20)
    first = load_adapter(spec(device, kind), arena)
    try:
        src, good = arena.obj(65536), arena.obj(65536)
        want_good = fill(good, 9)
        src.raw_data.fill_(0x5A)
        assert store(first, [key(1), key(2)], [src, good])
    finally:
        first.close()
    raw = bytearray(path.read_bytes())
    at = raw.find(b"\x5a" * 65536)
    assert at >= 0
    with open(path, "r+b") as f:
        f.seek(at + 1234)
        f.write(b"\x00")

    second = load_adapter(spec(device, kind), arena)
    try:
        dst, dst_good = arena.obj(65536), arena.obj(65536)
        assert load(second, [key(1), key(2)], [dst, dst_good]) == [False, True]
        assert content(dst_good) == want_good
        # the corrupt chunk is dropped, so the next lookup is a plain miss
        assert lookup(second, [key(1)]) == [False]
    finally:
        second.close()


def test_close_frees_fds_and_device_for_a_new_adapter(device):
    arena = Arena(1 << 20)
    for round_ in range(3):
        adapter = load_adapter(spec(device), arena)
        fds = [adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(),
               adapter.get_load_event_fd()]
        src = arena.obj(4096)
        fill(src, round_)
        assert store(adapter, [key(round_)], [src])
        adapter.close()
        adapter.close()  # idempotent
        for fd in fds:
            with pytest.raises(OSError):
                os.fstat(fd)
        arena.next = 0


def test_native_client_close_frees_its_fd_and_device(device):
    arena = Arena(1 << 20)
    for _ in range(2):
        adapter = load_adapter(spec(device, "native_plugin"), arena)
        fd = adapter._client_fd
        adapter.close()
        with pytest.raises(OSError):
            os.fstat(fd)


def test_delete_and_usage(device, kind):
    arena = Arena(2 << 20)
    adapter = load_adapter(spec(device, kind), arena)
    try:
        srcs = [arena.obj(65536), arena.obj(65536)]
        for i, o in enumerate(srcs):
            fill(o, i)
        assert store(adapter, [key(1), key(2)], srcs)
        assert adapter.get_usage().total_bytes_used >= 2 * 65536
        adapter.delete([key(1)])
        assert lookup(adapter, [key(1), key(2)]) == [False, True]
        if kind == "plugin":
            # key(2) is locked by that lookup: eviction leaves it until it is unlocked
            adapter.delete([key(2)])
            assert lookup(adapter, [key(2)]) == [True]
            adapter.submit_unlock([key(2)])
            adapter.submit_unlock([key(2)])
            adapter.delete([key(2)])
            assert lookup(adapter, [key(2)]) == [False]
            assert adapter.get_usage().total_bytes_used == 0
    finally:
        adapter.close()


@pytest.mark.parametrize("params, message", [
    ({"devices": None}, "adapter_params.devices"),
    ({"bogus_key": "1"}, "adapter_params.bogus_key"),
    ({"size": "lots"}, "adapter_params.size"),
    ({"queue_depth": "zero"}, "adapter_params.queue_depth"),
    ({"create": "sometimes"}, "adapter_params.create"),
])
def test_bad_adapter_params_give_clear_errors(device, kind, params, message):
    body = {"devices": device, "size": "64M", **params}
    body = {k: v for k, v in body.items() if v is not None}
    cls = "FX100ioL2Adapter" if kind == "plugin" else "FX100ioNativeClient"
    js = json.dumps({"type": kind, "module_path": MODULE, "class_name": cls,
                     "adapter_params": body})
    with pytest.raises(BackendConfigError, match=message.replace(".", r"\.")):
        load_adapter(js, Arena(1 << 20))


def test_string_values_are_accepted(device):
    adapter = load_adapter(spec(device, queue_depth="8", max_io="1M", direct="false",
                                capacity="32M"), Arena(1 << 20))
    try:
        assert adapter.get_usage().total_capacity_bytes == 32 << 20
    finally:
        adapter.close()


def test_adapter_built_from_a_raw_dict_as_without_a_config_class(device):
    # lmcache's plugin loader passes the raw adapter_params dict when the module has no
    # <ClassName>Config; that path must work too.
    arena = Arena(1 << 20)
    adapter = lmcache_mp.FX100ioL2Adapter({"devices": device, "size": "64M"},
                                          l1_memory_desc=arena.desc)
    try:
        src, dst = arena.obj(4096), arena.obj(4096)
        want = fill(src, 4)
        assert store(adapter, [key(4)], [src])
        assert load(adapter, [key(4)], [dst]) == [True]
        assert content(dst) == want
    finally:
        adapter.close()


def test_lmcache_bench_l2_verifies_our_adapter(tmp_path):
    """`lmcache bench l2` (LMCache's own CLI) stores, looks up and loads with byte checks."""
    import subprocess
    import sys

    env = dict(os.environ, LMCACHE_DISABLE_BANNER="1",
               PYTHONPATH=os.pathsep.join([str(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))),
                                           os.environ.get("PYTHONPATH", "")]))
    for kind in ("plugin", "native_plugin"):
        js = spec(f"file://{tmp_path}/{kind}.img", kind)
        p = subprocess.run(
            [sys.executable, "-m", "lmcache.cli.main", "bench", "l2", "--l2-adapter", js,
             "--num-keys", "4", "--data-size-kb", "64", "--rounds", "1",
             "--warmup-rounds", "0", "--no-skip-verify", "--lookup-max-hit-rate", "1.0",
             "--l1-align-bytes", "4096"],
            capture_output=True, text=True, env=env, timeout=300)
        out = p.stdout + p.stderr
        assert p.returncode == 0, out
        assert "data verified OK" in out, out
        assert "MISMATCH" not in out


@pytest.mark.parametrize("setting", [None, "background"])
def test_stores_and_loads_carry_their_priority(device, setting):
    """Through the L2 adapter that LMCache's MP server loads: its stores reach the
    device as stores, its loads (LMCache's prefetch of a looked-up prefix from L2
    into L1) at prefetch_priority's class, load by default; counted by the
    queue of the adapter's loop thread, which issued every piece."""
    arena = Arena(1 << 20)
    params = {} if setting is None else {"prefetch_priority": setting}
    adapter = load_adapter(spec(device, **params), arena)
    try:
        svc = adapter._svc

        def pieces() -> dict[str, int]:
            async def stats() -> list[dict[str, int]]:
                return [m.dev.queue_stats() for m in svc.store._members]

            out = {"pieces_load": 0, "pieces_store": 0, "pieces_background": 0}
            for s in svc._runner.call(stats(), 30):
                for k in out:
                    out[k] += s[k]
            return out

        src, dst = arena.obj(8192), arena.obj(8192)
        want = fill(src, 9)
        p0 = pieces()
        assert store(adapter, [key(9)], [src])
        p1 = pieces()
        assert load(adapter, [key(9)], [dst]) == [True]
        p2 = pieces()
        assert content(dst) == want
        stored = {k: p1[k] - p0[k] for k in p0}
        loaded = {k: p2[k] - p1[k] for k in p0}
        assert stored["pieces_store"] > 0 and sum(stored.values()) == stored["pieces_store"], stored
        cls = "pieces_background" if setting == "background" else "pieces_load"
        assert loaded[cls] > 0 and sum(loaded.values()) == loaded[cls], loaded
    finally:
        adapter.close()


def test_a_failing_device_gives_misses_then_recovers(device):
    arena = Arena(1 << 20)
    adapter = load_adapter(spec(device, retry_after_s="0"), arena)
    try:
        src, dst = arena.obj(8192), arena.obj(8192)
        want = fill(src, 6)
        assert store(adapter, [key(6)], [src])
        store_obj = adapter._svc.store
        real_get = store_obj.batch_get

        async def broken(keys, bufs, **kw):
            raise OSError(5, "I/O error")

        store_obj.batch_get = broken
        assert load(adapter, [key(6)], [dst]) == [False]
        store_obj.batch_get = real_get
        assert load(adapter, [key(6)], [dst]) == [True]
        assert content(dst) == want
    finally:
        adapter.close()

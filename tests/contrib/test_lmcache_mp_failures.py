"""Regression tests for the LMCache MP adapters' failure and race handling."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

pytest.importorskip("lmcache")

from support.lmcache_mp import (  # noqa: E402
    Arena,
    ShmArena,
    content,
    fill,
    key,
    load,
    load_adapter,
    lookup,
    spec,
    store,
    wait_fd,
)


@pytest.fixture
def device(tmp_path):
    return f"file://{tmp_path}/kv.img"


def test_native_store_the_device_refused_fails_the_batch(device):
    arena = Arena(8 << 20)
    ad = load_adapter(spec(device, "native_plugin", capacity="1M"), arena)
    try:
        big = arena.obj(2 << 20)
        fill(big, 1)
        assert store(ad, [key(2)], [big]) is False
        assert ad.get_usage().total_bytes_used == 0
        assert lookup(ad, [key(2)]) == [False]
    finally:
        ad.close()


@pytest.mark.parametrize("kind", ["plugin", "native_plugin"])
def test_one_oversized_store_fails_only_itself(device, kind):
    arena = Arena(8 << 20)
    ad = load_adapter(spec(device, kind, capacity="1M", retry_after_s="3600"), arena)
    try:
        o = arena.obj(4096)
        want = fill(o, 1)
        assert store(ad, [key(1)], [o])
        big = arena.obj(2 << 20)
        assert store(ad, [key(2)], [big]) is False
        assert lookup(ad, [key(1)]) == [True]
        ad.submit_unlock([key(1)])
        dst = arena.obj(4096)
        assert load(ad, [key(1)], [dst]) == [True]
        assert content(dst) == want
    finally:
        ad.close()


def test_delete_spares_a_key_locked_between_its_call_and_its_drop(device):
    arena = Arena(1 << 20)
    ad = load_adapter(spec(device), arena)
    try:
        o = arena.obj(4096)
        want = fill(o, 3)
        assert store(ad, [key(3)], [o])
        real_call = ad._svc.call

        def call(coro):
            # another thread's lookup-and-lock runs after delete() was called but
            # before its work reaches the loop
            if getattr(coro, "__name__", "") == "drop":
                assert lookup(ad, [key(3)]) == [True]
            return real_call(coro)

        ad._svc.call = call
        ad.delete([key(3)])
        ad._svc.call = real_call
        dst = arena.obj(4096)
        assert load(ad, [key(3)], [dst]) == [True]
        assert content(dst) == want
        ad.submit_unlock([key(3)])
        ad.delete([key(3)])
        assert lookup(ad, [key(3)]) == [False]
    finally:
        ad.close()


def test_a_hung_load_trips_the_breaker_but_is_reported_only_when_it_ends(device):
    arena = Arena(1 << 20)
    ad = load_adapter(spec(device, timeout_s="0.2", retry_after_s="3600"), arena)
    try:
        o = arena.obj(4096)
        fill(o, 1)
        assert store(ad, [key(1)], [o])
        loop = ad._svc._runner.loop
        release = ad._svc.call(_make_event())

        async def hung(keys, bufs, **kw):  # a device that stopped answering
            await release.wait()
            return [False] * len(keys)

        ad._svc.store.batch_get = hung
        tid = ad.submit_load_task([key(1)], [arena.obj(4096)])
        deadline = time.monotonic() + 60
        while lookup(ad, [key(1)]) != [False]:  # the watchdog trips the breaker
            assert time.monotonic() < deadline, "a hung load never tripped the breaker"
            ad.submit_unlock([key(1)])
            time.sleep(0.05)
        # never reported while its I/O may still land in the buffer
        assert ad.query_load_result(tid) is None
        loop.call_soon_threadsafe(release.set)
        wait_fd(ad.get_load_event_fd())
        deadline = time.monotonic() + 60
        while (bm := ad.query_load_result(tid)) is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not bm.test(0)
    finally:
        ad.close()


async def _make_event() -> asyncio.Event:
    return asyncio.Event()


def _shared_pair(tmp_path, arena):
    from support.shared_redis import serve

    from fx100io.store.shared import SharedChunkStore

    gen = serve(tmp_path)
    redis = next(gen)
    dev = tmp_path / "pool.img"
    SharedChunkStore([str(dev)], redis.url, create=True, size=32 << 20).close()
    params = dict(shared_index=redis.url, retry_after_s="3600")
    a = load_adapter(spec(f"file://{dev}", **params), arena)
    b = load_adapter(spec(f"file://{dev}", **params), arena)
    return gen, a, b


def test_shared_index_never_asked_synchronously_on_the_loop(tmp_path):
    from fx100io.store.shared import SharedChunkStore

    arena = Arena(4 << 20)
    gen, a, b = _shared_pair(tmp_path, arena)
    on_loop: list[str] = []
    try:
        loops = {ad._svc._runner.loop for ad in (a, b)}
        originals = {}
        for meth in ("contains", "chunk_size", "keys", "stats"):
            real = getattr(SharedChunkStore, meth)
            originals[meth] = real

            def spy(self, *args, _real=real, _meth=meth):
                try:
                    if asyncio.get_running_loop() in loops:
                        on_loop.append(_meth)
                except RuntimeError:
                    pass
                return _real(self, *args)

            setattr(SharedChunkStore, meth, spy)
        try:
            o = arena.obj(8192)
            want = fill(o, 5)
            assert store(a, [key(5)], [o])
            assert lookup(b, [key(5)]) == [True]
            b.submit_unlock([key(5)])
            dst = arena.obj(8192)
            assert load(b, [key(5)], [dst]) == [True]
            assert content(dst) == want
            assert [e.size_bytes for e in b.list_l2_keys().entries] == [8192]
            assert b.get_usage().total_bytes_used > 0
            b.delete([key(5)])
            assert lookup(a, [key(5)]) == [False]
        finally:
            for meth, real in originals.items():
                setattr(SharedChunkStore, meth, real)
        assert on_loop == []
    finally:
        a.close()
        b.close()
        gen.close()


def test_shared_chunk_replaced_by_a_smaller_one_during_a_load_is_a_miss(tmp_path):
    arena = Arena(4 << 20)
    gen, a, b = _shared_pair(tmp_path, arena)
    try:
        big = arena.obj(8192)
        fill(big, 1)
        assert store(a, [key(1)], [big])
        real_get = b._svc.store.batch_get
        small = arena.obj(4096)
        fill(small, 2)

        async def replaced_first(keys, bufs, **kw):
            # host a replaces the chunk after b checked its size, before b reads it
            assert store(a, [key(1)], [small])
            return await real_get(keys, bufs, **kw)

        b._svc.store.batch_get = replaced_first
        dst = arena.obj(8192)
        dst.tensor.fill_(0xEE)
        assert load(b, [key(1)], [dst]) == [False]
    finally:
        a.close()
        b.close()
        gen.close()


class _Listener:
    def __init__(self) -> None:
        self.stored: list = []
        self.deleted: list = []

    def on_l2_keys_stored(self, keys, sizes):
        self.stored.extend(keys)

    def on_l2_keys_accessed(self, keys):
        pass

    def on_l2_keys_deleted(self, keys):
        self.deleted.extend(keys)


def test_eviction_of_many_keys_is_one_index_commit(device, monkeypatch):
    from fx100io.store.local.chunk_store import ChunkStore

    arena = Arena(1 << 20)
    ad = load_adapter(spec(device), arena)
    try:
        keys = [key(i) for i in range(40)]
        objs = [arena.obj(512) for _ in keys]
        for i, o in enumerate(objs):
            fill(o, i)
        assert store(ad, keys, objs)
        commits = []
        real = ChunkStore._commit

        async def counting(self, m, recs, apply=None, failed=None):
            commits.append(len(recs))
            return await real(self, m, recs, apply, failed)

        monkeypatch.setattr(ChunkStore, "_commit", counting)
        ad.delete(keys)
        assert commits == [len(keys)]
        assert lookup(ad, keys) == [False] * len(keys)
        assert ad.get_usage().bytes_by_cache_salt.get("", 0) == 0
    finally:
        ad.close()


def test_deletes_are_reported_even_when_the_caller_stopped_waiting(device):

    arena = Arena(1 << 20)
    ad = load_adapter(spec(device), arena)
    try:
        listener = _Listener()
        ad.register_listener(listener)
        o = arena.obj(4096)
        fill(o, 1)
        assert store(ad, [key(1)], [o])
        finished = threading.Event()
        svc = ad._svc

        def call_that_gives_up(coro):
            fut = svc._runner.submit(coro)
            fut.add_done_callback(lambda _f: finished.set())
            raise TimeoutError("gave up waiting")  # as svc.call does after its bound

        ad._svc.call = call_that_gives_up
        ad.delete([key(1)])
        del ad._svc.call
        assert finished.wait(60)
        assert listener.deleted == [key(1)]
        assert ad.get_usage().bytes_by_cache_salt.get("", 0) == 0
    finally:
        ad.close()


def test_chunkstore_batch_delete_is_durable_and_per_key(tmp_path):
    from fx100io.store.local.chunk_store import ChunkStore

    path = str(tmp_path / "s.img")
    with ChunkStore(path, create=True, size=16 << 20) as s:
        s.batch_put_blocking([b"a", b"b", b"c"], [b"1" * 512, b"2" * 512, b"3" * 512])
        got = asyncio.run(_batch_delete(s, [b"a", b"zz", b"c", b"a"]))
        assert got == [True, False, True, False]
        assert sorted(s.keys()) == [b"b"]
    with ChunkStore(path) as s:
        assert sorted(s.keys()) == [b"b"]
        assert s.stats()["bytes_used"] > 0


async def _batch_delete(s, keys):
    return await s.batch_delete(keys)


def test_the_stores_own_lru_evictions_are_reported_to_lmcache(device):
    arena = Arena(8 << 20)
    ad = load_adapter(spec(device, capacity="1M"), arena)
    try:
        listener = _Listener()
        ad.register_listener(listener)
        keys = [key(i, salt="alice") for i in range(6)]
        for i, k in enumerate(keys):
            o = arena.obj(256 << 10)
            fill(o, i)
            assert store(ad, [k], [o])
        present = lookup(ad, keys)
        ad.submit_unlock(keys)
        gone = [k for k, p in zip(keys, present) if not p]
        assert gone, "the store never evicted: the test needs a fuller device"
        ad._svc.call(_noop())  # the loop has run every report queued before
        assert sorted(listener.deleted, key=repr) == sorted(gone, key=repr)
        u = ad.get_usage()
        assert u.bytes_by_cache_salt["alice"] == u.total_bytes_used
        ad.delete(gone)  # LMCache's own eviction of keys already gone changes nothing
        u = ad.get_usage()
        assert u.bytes_by_cache_salt["alice"] == u.total_bytes_used
    finally:
        ad.close()


async def _noop() -> None:
    return None


def test_after_restart_lmcache_evicts_old_chunks_before_new_ones(device):
    from lmcache.v1.distributed.config import EvictionConfig
    from lmcache.v1.distributed.storage_controllers.eviction_controller import (
        L2AdapterEvictionState,
        L2EvictionController,
    )

    arena = Arena(16 << 20)
    first = load_adapter(spec(device, capacity="1M"), arena)
    try:
        for i in range(3):  # 768 KiB of 1 MiB: over the watermark after one more
            o = arena.obj(256 << 10)
            fill(o, i)
            assert store(first, [key(i)], [o])
    finally:
        first.close()
    ad = load_adapter(spec(device, capacity="1M"), arena)
    try:
        state = L2AdapterEvictionState(0, ad, EvictionConfig(eviction_policy="LRU"))
        ctl = L2EvictionController([state])
        o = arena.obj(100 << 10)
        want = fill(o, 7)
        assert store(ad, [key(7)], [o])  # the one chunk stored since the restart
        ctl._check_and_evict(state)  # one pass of LMCache's eviction thread
        res = lookup(ad, [key(0), key(1), key(2), key(7)])
        ad.submit_unlock([key(0), key(1), key(2), key(7)])
        assert res[3], "LMCache's LRU evicted the only chunk stored since the restart"
        assert not all(res[:3]), "nothing old was evicted"
        dst = arena.obj(100 << 10)
        assert load(ad, [key(7)], [dst]) == [True]
        assert content(dst) == want
    finally:
        ad.close()


def test_a_paged_listing_walks_the_device_once(device):
    arena = Arena(1 << 20)
    ad = load_adapter(spec(device), arena)
    try:
        keys = [key(i, model=f"m{i % 3}") for i in range(25)]
        objs = [arena.obj(512) for _ in keys]
        for i, o in enumerate(objs):
            fill(o, i)
        assert store(ad, keys, objs)
        walks = []
        real = ad._svc.listing

        def counting(prefix, **kw):
            walks.append(prefix)
            return real(prefix, **kw)

        ad._svc.listing = counting
        got = []
        cursor = None
        pages = 0
        while True:
            page = ad.list_l2_keys(page_size=4, cursor=cursor)
            got.extend(e.key for e in page.entries)
            pages += 1
            if page.next_page_token is None:
                break
            cursor = page.next_page_token
        assert pages == 7
        assert len(walks) == 1
        assert sorted(map(repr, got)) == sorted(repr(k.to_encoded_object_key()) for k in keys)
        assert len(got) == len(keys)
        # a new listing takes a new snapshot: a chunk stored since is in it
        o = arena.obj(512)
        fill(o, 99)
        assert store(ad, [key(99)], [o])
        again = ad.list_l2_keys(page_size=100)
        assert len(again.entries) == 26 and len(walks) == 2
    finally:
        ad.close()


def test_the_helpers_catch_a_wake_up_sent_before_its_result(device, monkeypatch):
    """An adapter whose event fd fires before the result is visible loses LMCache's
    wake-up (its controller queries once per wake-up): the shared test helpers must
    fail on it, not poll again until the result shows up."""
    from fx100io.contrib import lmcache_mp

    late: dict = {}

    def signal_first(self, table, tid, result, fd):
        with self._lock:
            if fd not in self._fds:
                return
            lmcache_mp._signal(fd)  # the wake-up ...
            late[(table, tid)] = result  # ... before the result is visible

    real_query = lmcache_mp.FX100ioL2Adapter.query_load_result

    def query(self, tid):
        out = real_query(self, tid)
        with self._lock:  # what was published late is visible from the next query on
            for (table, t), r in list(late.items()):
                getattr(self, table)[t] = r
                del late[(table, t)]
        return out

    arena = Arena(1 << 20)
    ad = load_adapter(spec(device), arena)
    try:
        o = arena.obj(4096)
        fill(o, 1)
        assert store(ad, [key(1)], [o])
        monkeypatch.setattr(lmcache_mp.FX100ioL2Adapter, "_publish", signal_first)
        monkeypatch.setattr(lmcache_mp.FX100ioL2Adapter, "query_load_result", query)
        with pytest.raises(AssertionError, match="before its result|never completed"):
            load(ad, [key(1)], [arena.obj(4096)])
    finally:
        monkeypatch.undo()
        ad.close()


def test_a_truncated_device_misses_and_lookups_miss_during_the_outage(tmp_path):
    path = tmp_path / "kv.img"
    arena = Arena(1 << 20)
    ad = load_adapter(spec(f"file://{path}", size="16M", direct="false",
                           retry_after_s="3600"), arena)
    try:
        src = arena.obj(8192)
        fill(src, 6)
        assert store(ad, [key(6)], [src])
        assert lookup(ad, [key(6)]) == [True]
        ad.submit_unlock([key(6)])
        os.truncate(path, 4096)  # the data is gone under the store: a real failure
        dst = arena.obj(8192)
        dst.tensor.fill_(0xEE)
        assert load(ad, [key(6)], [dst]) == [False]
        assert lookup(ad, [key(6)]) == [False]  # the breaker holds: LMCache recomputes
        assert not ad.report_status()["is_healthy"]
    finally:
        ad.close()


def test_close_with_a_load_in_flight_reports_it_once_its_io_ends(device):
    arena = Arena(1 << 20)
    ad = load_adapter(spec(device, timeout_s="0.1"), arena)
    closer = None
    try:
        o = arena.obj(4096)
        fill(o, 1)
        assert store(ad, [key(1)], [o])
        loop = ad._svc._runner.loop
        release = ad._svc.call(_make_event())
        entered = threading.Event()

        async def slow(keys, bufs, **kw):
            entered.set()
            await release.wait()
            return [True] * len(keys)

        ad._svc.store.batch_get = slow
        tid = ad.submit_load_task([key(1)], [arena.obj(4096)])
        assert entered.wait(60)
        closer = threading.Thread(target=ad.close)
        closer.start()
        loop.call_soon_threadsafe(release.set)  # the I/O ends while close waits
        closer.join(120)
        assert not closer.is_alive()
        bm = ad.query_load_result(tid)
        assert bm is not None and bm.test(0)  # reported, not dropped by close
        with pytest.raises(Exception, match="closed"):
            ad.submit_load_task([key(1)], [arena.obj(4096)])
    finally:
        if closer is None:
            ad.close()


def test_a_locked_chunk_is_not_the_stores_next_victim(device):
    arena = Arena(8 << 20)
    ad = load_adapter(spec(device, capacity="1M"), arena)
    try:
        want = {}
        for i in range(4):
            o = arena.obj(256 << 10)
            want[i] = fill(o, i)
            assert store(ad, [key(i)], [o])
        assert lookup(ad, [key(0)]) == [True]  # LMCache now holds a lock on the oldest
        o = arena.obj(256 << 10)
        fill(o, 9)
        assert store(ad, [key(9)], [o])  # the store's LRU has to make room
        dst = arena.obj(256 << 10)
        assert load(ad, [key(0)], [dst]) == [True]
        assert content(dst) == want[0]
        ad.submit_unlock([key(0)])
    finally:
        ad.close()


def test_only_the_stable_part_of_the_arena_is_registered(device):
    import dataclasses

    arena = Arena(1 << 20)
    lazy = dataclasses.replace(arena.desc, stable_registration_size=None)
    import argparse

    from lmcache.v1.distributed.l2_adapters import create_l2_adapter
    from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config

    cfg = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[spec(device)]))
    ad = create_l2_adapter(cfg.adapters[0], l1_memory_desc=lazy)
    try:
        assert ad._registration is None  # the arena may still grow or move
    finally:
        ad.close()
    half = dataclasses.replace(arena.desc, stable_registration_size=1 << 19)
    ad = create_l2_adapter(cfg.adapters[0], l1_memory_desc=half)
    try:
        assert ad._registration is not None
        assert ad._registration.size == 1 << 19
        o = arena.obj(4096)
        want = fill(o, 1)
        assert store(ad, [key(1)], [o])
        dst = arena.obj(4096)
        assert load(ad, [key(1)], [dst]) == [True]
        assert content(dst) == want
    finally:
        ad.close()


def test_a_posix_shared_memory_arena_is_registered_whole(device):
    """An MP server's L1 in POSIX shared memory comes with no stable size (LMCache
    assumes io_uring refuses file-backed fixed buffers); it cannot move or grow, so the
    adapter registers it whole, and reads and writes through it are byte-exact and
    take fixed buffers where the kernel allows (this one does)."""
    arena = ShmArena(1 << 20)
    ad = load_adapter(spec(device), arena)
    try:
        assert ad._registration is not None
        assert ad._registration.size == 1 << 20
        o = arena.obj(64 << 10)
        want = fill(o, 3)
        assert store(ad, [key(3)], [o])
        dst = arena.obj(64 << 10)
        assert load(ad, [key(3)], [dst]) == [True]
        assert content(dst) == want
        dev = ad._svc.store._members[0].dev

        async def loop_queue_stats() -> dict:  # the adapter's I/O runs on its loop's queue
            return dev.queue_stats()

        stats = ad._svc.call(loop_queue_stats())
        assert stats["fixed_ios"] >= 2, stats
    finally:
        ad.close()


def test_only_a_whole_shared_mapping_counts_as_fixed_memory(tmp_path):
    import mmap

    from fx100io.contrib._lmcache_mp_core import shared_memory_mapping

    anon = mmap.mmap(-1, 1 << 20)
    arena = ShmArena(1 << 20)
    private = tmp_path / "f"
    private.write_bytes(bytes(1 << 20))
    with open(private, "r+b") as f:
        filemap = mmap.mmap(f.fileno(), 1 << 20)
    try:
        ptr = arena.buf.data_ptr()
        assert shared_memory_mapping(ptr, 1 << 20) is not None
        assert shared_memory_mapping(ptr, 1 << 19) is None  # not the whole mapping
        assert shared_memory_mapping(ptr + 4096, (1 << 20) - 4096) is None
        assert shared_memory_mapping(ptr, 2 << 20) is None
        addr = ctypes_address(anon)
        assert shared_memory_mapping(addr, 1 << 20) is None  # anonymous: may be lazy
        assert shared_memory_mapping(ctypes_address(filemap), 1 << 20) is None  # not /dev/shm
        assert shared_memory_mapping(0, 1 << 20) is None
    finally:
        filemap.close()


def ctypes_address(m) -> int:  # noqa: ANN001
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(m))


def test_a_status_poll_does_not_end_the_back_off(device):
    arena = Arena(1 << 20)
    ad = load_adapter(spec(device, retry_after_s="3600"), arena)
    try:
        o = arena.obj(4096)
        fill(o, 1)
        assert store(ad, [key(1)], [o])
        ad._svc._failed("load", OSError(5, "I/O error"))
        assert not ad.report_status()["is_healthy"]
        assert not ad.report_status()["is_healthy"]
        assert lookup(ad, [key(1)]) == [False]
    finally:
        ad.close()


def test_close_on_a_stuck_loop_never_closes_the_store_from_another_thread(device, monkeypatch):
    """A request stuck inside a device call holds the loop thread: close() gives up on
    the loop rather than close the store's queues from a second thread under the stuck
    one (the L1 arena stays registered); once the stuck call returns, the store closes
    on the loop thread and the loop ends."""
    import fx100io.contrib._lmcache_mp_core as core

    arena = Arena(1 << 20)
    ad = load_adapter(spec(device, timeout_s="0.1"), arena)
    monkeypatch.setattr(core, "OPEN_WAIT_MIN_S", 0.5)  # how long close waits for the loop
    svc = ad._svc
    backend = svc._backend
    closed_on = []
    real_close = backend.close

    def close():
        closed_on.append(threading.current_thread().name)
        real_close()

    backend.close = close
    stuck, release = threading.Event(), threading.Event()

    async def hold_the_loop():
        stuck.set()
        release.wait(60)  # a blocking call on the loop thread, as a wedged device call

    svc._runner.submit(hold_the_loop())
    assert stuck.wait(30)
    loop_thread = svc._runner._own_thread
    try:
        ad.close()
        assert closed_on == [], f"store closed from {closed_on} while the loop was stuck"
        assert ad._kept_registration is not None  # the arena stays registered
    finally:
        release.set()
    loop_thread.join(30)
    assert not loop_thread.is_alive(), "the loop did not end once it recovered"
    assert closed_on == [loop_thread.name], closed_on
    assert backend.store.closed


def test_an_open_given_up_on_closes_its_store_when_it_ends(device, monkeypatch):
    """An open slower than the wait fails the adapter's construction; the store it
    makes later is closed at once, on the loop's thread, and that loop ends, so the
    device is not left locked."""
    import fx100io.contrib._lmcache_mp_core as core

    monkeypatch.setattr(core, "OPEN_WAIT_MIN_S", 0.5)
    real_open = core.open_backend_store
    made, closed_on, loop_threads = [], [], []

    def slow_open(settings, log):
        loop_threads.append(threading.current_thread())
        time.sleep(2.0)
        b = real_open(settings, log=log)
        real_close = b.close

        def close():
            closed_on.append(threading.current_thread().name)
            real_close()

        b.close = close
        made.append(b)
        return b

    monkeypatch.setattr(core, "open_backend_store", slow_open)
    with pytest.raises(Exception, match="took more than"):
        load_adapter(spec(device, timeout_s="0.1"), Arena(1 << 20))
    monkeypatch.setattr(core, "open_backend_store", real_open)
    assert loop_threads
    loop_threads[0].join(60)  # the late open ends, its store is closed, the loop ends
    assert not loop_threads[0].is_alive(), "the abandoned open's loop never ended"
    assert made and made[0].store.closed, "the store of the abandoned open was left open"
    assert closed_on == [loop_threads[0].name], closed_on
    ad = load_adapter(spec(device), Arena(1 << 20))  # the device is free again
    ad.close()

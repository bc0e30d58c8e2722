"""Drives fx100io's SGLang HiCache backend through SGLang's own backend factory.

Run by tests/contrib/test_sglang.py with the python of tools/install_sglang.sh's venv (the real
sglang package), the checkout on PYTHONPATH. It loads the backend the way a server with
``--hicache-storage-backend dynamic`` does (StorageBackendFactory.create_backend with the
extra-config dict, then register_mem_pool_host), against a small host pool of our own
that offers what SGLang's pools offer a zero-copy backend: kv_buffer, page_size,
layout, dtype and get_page_buffer_meta (K and V per page for page_first, K and V per
layer for layer_first, as SGLang's MHA pool gives them).

Usage: sglang_driver.py suite DIR   -> runs every in-process check; prints one JSON line
                                       {check: "ok" | traceback}; leaves DIR/restart.img
       sglang_driver.py reopen DIR  -> a new process on DIR/restart.img: hits and bytes
       sglang_driver.py fabric URI  -> round trips on an nvme+tcp:// namespace
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback

import numpy as np
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

import fx100io
from fx100io.contrib._settings import BackendConfigError

LAYERS, HEADS, DIM, PAGE = 4, 2, 64, 16
CHECK_TIMEOUT_S = 180  # per check: a hang bound, never a timing assert  # bf16: K and V of a page are 16 KiB each


class HostPool:
    """A host KV pool shaped like SGLang's MHA pool, in page-aligned memory (SGLang pins
    its pool with the CUDA allocator, page aligned)."""

    def __init__(self, pages: int, layout: str = "page_first", page: int = PAGE) -> None:
        PAGE = page  # noqa: N806 - tokens per page
        self.page_size, self.layout, self.dtype = PAGE, layout, torch.bfloat16
        self.layer_num, self.head_num, self.head_dim = LAYERS, HEADS, DIM
        self.size = pages * PAGE
        n = 2 * self.size * LAYERS * HEADS * DIM * 2
        raw = np.zeros(n + 4096, dtype=np.uint8)
        start = (-raw.ctypes.data) % 4096
        flat = torch.from_numpy(raw[start:start + n]).view(torch.bfloat16)
        if layout == "page_first":  # [2, tokens, layers, heads, dim]
            self.kv_buffer = flat.view(2, self.size, LAYERS, HEADS, DIM)
        else:  # layer_first: [2, layers, tokens, heads, dim]
            self.kv_buffer = flat.view(2, LAYERS, self.size, HEADS, DIM)
        self._raw = raw

    def indices(self, pages: list[int]) -> torch.Tensor:
        n = self.page_size
        return torch.cat([torch.arange(p * n, (p + 1) * n) for p in pages])

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        assert len(indices) % self.page_size == 0
        PAGE = self.page_size  # noqa: N806
        base, item = self.kv_buffer.data_ptr(), 2  # bf16
        tok = HEADS * DIM * item
        idx = indices.tolist()
        ptrs: list[int] = []
        if self.layout == "page_first":
            v_off = self.size * LAYERS * tok
            for i in range(0, len(idx), PAGE):
                k = base + idx[i] * LAYERS * tok
                ptrs += [k, k + v_off]
            return ptrs, [PAGE * LAYERS * tok] * len(ptrs)
        v_off = LAYERS * self.size * tok
        for i in range(0, len(idx), PAGE):
            for layer in range(LAYERS):
                k = base + idx[i] * tok + layer * self.size * tok
                ptrs += [k, k + v_off]
        return ptrs, [PAGE * tok] * len(ptrs)

    def page_bytes(self, page: int) -> bytes:
        """The bytes of one page, K then V, in the order the backend stores them."""
        ptrs, sizes = self.get_page_buffer_meta(self.indices([page]))
        base = self._raw.ctypes.data
        return b"".join(self._raw[p - base:p - base + n].tobytes() for p, n in zip(ptrs, sizes))

    def fill(self, page: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        ptrs, sizes = self.get_page_buffer_meta(self.indices([page]))
        base = self._raw.ctypes.data
        for p, n in zip(ptrs, sizes):
            self._raw[p - base:p - base + n] = rng.integers(0, 256, n, dtype=np.uint8)

    def zero(self, page: int) -> None:
        ptrs, sizes = self.get_page_buffer_meta(self.indices([page]))
        base = self._raw.ctypes.data
        for p, n in zip(ptrs, sizes):
            self._raw[p - base:p - base + n] = 0


def config(extra: dict, tp_rank: int = 0, tp_size: int = 1, mla: bool = False,
           model: str = "org/tiny-model") -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
        is_page_first_layout=True, model_name=model, extra_config=dict(extra))


def extra_for(path: str, **more: object) -> dict:
    return {"backend_name": "fx100io", "module_path": "fx100io.contrib.sglang",
            "class_name": "FX100ioHiCacheStorage", "interface_v1": 1,
            "devices": f"file://{path}", "size": "64M", **more}


def attach(pool: HostPool, extra: dict, **cfg: object):
    """As HiCacheController.attach_storage_backend does it."""
    backend = StorageBackendFactory.create_backend("dynamic", config(extra, **cfg), pool)
    backend.register_mem_pool_host(pool)
    return backend


def keys_for(n: int, tag: str = "k") -> list[str]:
    return [f"{tag}{i:04d}" + "ab" * 28 for i in range(n)]


# ------------------------------------------------------------------ checks
def check_round_trip_other_pages(d: str, layout: str, bounced: bool = False) -> None:
    pool = HostPool(32, layout)
    b = attach(pool, extra_for(f"{d}/rt-{layout}-{bounced}.img"))
    b._gather = bounced  # as for a store that takes one buffer per chunk (a shared pool)
    try:
        assert type(b).__name__ == "FX100ioHiCacheStorage"
        keys = keys_for(8)
        src = list(range(8))
        for p in src:
            pool.fill(p, seed=100 + p)
        want = [pool.page_bytes(p) for p in src]
        assert b.batch_set_v1(keys, pool.indices(src)) == [True] * 8
        dst = [20, 9, 31, 12, 8, 30, 17, 25]  # other pages, out of order
        assert b.batch_get_v1(keys, pool.indices(dst)) == [True] * 8
        for w, p in zip(want, dst):
            assert pool.page_bytes(p) == w, f"page {p} differs"
        # a miss in the middle: False there, the rest still loaded
        mixed = [keys[0], "nope" + "0" * 60, keys[2]]
        for p in (10, 11, 13):
            pool.zero(p)
        assert b.batch_get_v1(mixed, pool.indices([10, 11, 13])) == [True, False, True]
        assert pool.page_bytes(10) == want[0] and pool.page_bytes(13) == want[2]
        assert set(pool.page_bytes(11)) == {0}
        s = b.stats()
        assert s["chunks"] == 8 and s["corruptions"] == 0
    finally:
        b.close()


def check_leading_hits(d: str) -> None:
    pool = HostPool(16)
    b = attach(pool, extra_for(f"{d}/lead.img"))
    try:
        keys = keys_for(6)
        present = [0, 1, 2, 4, 5]  # key 3 missing
        for p in present:
            pool.fill(p, p)
        assert b.batch_set_v1([keys[i] for i in present], pool.indices(present)) == [True] * 5
        assert b.batch_exists(keys) == 3
        assert b.batch_exists(keys[:3]) == 3
        assert b.batch_exists(keys[3:]) == 0
        assert b.batch_exists(keys[4:]) == 2
        assert b.exists(keys[0]) and not b.exists(keys[3])
    finally:
        b.close()


def check_concurrent_backup_and_prefetch(d: str) -> None:
    pool = HostPool(64)
    b = attach(pool, extra_for(f"{d}/conc.img"))
    errors: list[str] = []
    try:
        old = keys_for(16, "old")
        for p in range(16):
            pool.fill(p, 1000 + p)
        want = {k: pool.page_bytes(p) for k, p in zip(old, range(16))}
        assert b.batch_set_v1(old, pool.indices(list(range(16)))) == [True] * 16
        new = keys_for(16, "new")
        for p in range(16, 32):
            pool.fill(p, 2000 + p)
        want_new = {k: pool.page_bytes(p) for k, p in zip(new, range(16, 32))}

        def backup() -> None:  # SGLang's backup thread: 4 pages a call
            try:
                for _round in range(3):
                    for i in range(0, 16, 4):
                        pages = list(range(16 + i, 20 + i))
                        if b.batch_set_v1(new[i:i + 4], pool.indices(pages)) != [True] * 4:
                            errors.append("backup failed")
            except Exception:  # noqa: BLE001
                errors.append(traceback.format_exc())

        def prefetch(first: int) -> None:  # the prefetch thread, into pages of its own
            try:
                for r in range(6):
                    pages = [first + i for i in range(8)]
                    ks = old[r % 2 * 8:r % 2 * 8 + 8]
                    if b.batch_get_v1(ks, pool.indices(pages)) != [True] * 8:
                        errors.append("prefetch missed")
                    for k, p in zip(ks, pages):
                        if pool.page_bytes(p) != want[k]:
                            errors.append(f"prefetch read wrong bytes for {k}")
            except Exception:  # noqa: BLE001
                errors.append(traceback.format_exc())

        threads = [threading.Thread(target=backup), threading.Thread(target=prefetch, args=(40,)),
                   threading.Thread(target=prefetch, args=(50,))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert b.batch_exists(new) == 16
        assert b.batch_get_v1(new, pool.indices(list(range(40, 56)))) == [True] * 16
        for k, p in zip(new, range(40, 56)):
            assert pool.page_bytes(p) == want_new[k]
    finally:
        b.close()


def mla_attach(pool: HostPool, path: str, writer: bool, mla: bool = True):
    """An MLA rank on a device of its own (tp_size 1), made the writer or not."""
    b = attach(pool, extra_for(path), mla=mla)
    b.is_writer = writer
    return b


def check_mla_tp_needs_shared_index(d: str) -> None:
    """MLA with TP > 1: only the writer rank backs pages up, so ranks on devices of their
    own would never all hit (SGLang takes the least hit count): refused, naming
    shared_index; both worker-id devices and one shared file."""
    pool = HostPool(8)
    for path in (f"{d}/mla-{{worker_id}}.img", f"{d}/mla-one.img"):
        for rank in (0, 1):
            try:
                attach(pool, extra_for(path), tp_rank=rank, tp_size=2, mla=True).close()
            except BackendConfigError as exc:
                assert "shared_index" in str(exc), str(exc)
            else:
                raise AssertionError(f"MLA tp_size 2 rank {rank} on {path} accepted")


def check_mla_non_writer_does_not_write(d: str) -> None:
    pool = HostPool(8)
    path = f"{d}/mla.img"
    keys = keys_for(2)
    for p in (0, 1):
        pool.fill(p, 7 + p)
    want = [pool.page_bytes(0), pool.page_bytes(1)]
    reader = mla_attach(pool, path, writer=False)
    try:
        assert not reader.is_writer
        assert reader.batch_set_v1(keys, pool.indices([0, 1])) == [True, True]
        assert reader.stats()["chunks"] == 0 and reader.stats()["puts"] == 0
        assert reader.batch_exists(keys) == 0
    finally:
        reader.close()
    writer = mla_attach(pool, path, writer=True)
    try:
        assert writer.is_writer
        assert writer.batch_set_v1(keys, pool.indices([0, 1])) == [True, True]
        assert writer.stats()["chunks"] == 2
    finally:
        writer.close()
    # MLA pages are the same on every TP rank: the reader finds the writer's
    reader = mla_attach(pool, path, writer=False)
    try:
        assert reader.batch_exists(keys) == 2
        assert reader.batch_get_v1(keys, pool.indices([4, 5])) == [True, True]
        assert [pool.page_bytes(4), pool.page_bytes(5)] == want
    finally:
        reader.close()
    # a non-MLA model's ranks never share keys
    other = mla_attach(pool, path, writer=True, mla=False)
    try:
        assert other.batch_exists(keys) == 0
    finally:
        other.close()


def check_corrupt_chunk_is_false(d: str) -> None:
    pool = HostPool(8)
    path = f"{d}/corrupt.img"
    keys = keys_for(2)
    for p in (0, 1):
        pool.fill(p, 50 + p)
    b = attach(pool, extra_for(path))
    try:
        assert b.batch_set_v1(keys, pool.indices([0, 1])) == [True, True]
        entry = b._store._entries[f"{b._page_prefix}/{keys[1]}".encode()]
        off, length = entry.off, entry.length
    finally:
        b.close()
    with open(path, "r+b") as f:  # flip a byte in the V half of the second page
        f.seek(off + length - 100)
        x = f.read(1)
        f.seek(off + length - 100)
        f.write(bytes([x[0] ^ 0x5A]))
    b = attach(pool, extra_for(path))
    try:
        want0 = pool.page_bytes(0)
        assert b.batch_get_v1(keys, pool.indices([4, 5])) == [True, False]
        assert pool.page_bytes(4) == want0
        assert b.stats()["corruptions"] == 1
        assert b.batch_exists(keys) == 1  # dropped, never served again
    finally:
        b.close()


def check_bad_config(d: str) -> None:
    pool = HostPool(2)
    cases = [
        (dict(extra_for(f"{d}/bad.img"), devices=""), "extra_config.devices"),
        (dict(extra_for(f"{d}/bad.img"), devicez="x"), "extra_config.devicez"),
        (dict(extra_for(f"{d}/bad.img"), size="lots"), "extra_config.size"),
        (dict(extra_for(f"{d}/bad.img"), queue_depth="-3"), "extra_config.queue_depth"),
        # 'always' would format a live shared pool at every start: refused at parse time
        (dict(extra_for(f"{d}/bad.img"), create="always", shared_index="redis://127.0.0.1:1/0"),
         "extra_config.create"),
    ]
    for extra, needle in cases:
        try:
            attach(pool, extra).close()
        except BackendConfigError as exc:
            assert needle in str(exc), (needle, str(exc))
        else:
            raise AssertionError(f"no error for {needle}")
    assert not os.path.exists(f"{d}/bad.img")  # refused before anything was made
    # strings, as a JSON config carries them, are read as the plugin reads them
    b = attach(pool, extra_for(f"{d}/strings.img", queue_depth="8", direct="false",
                               max_io="1M", capacity="32M"))
    try:
        assert b.settings.queue_depth == 8 and b.settings.direct is False
        assert b.settings.max_io == 1 << 20 and b.settings.capacity == 32 << 20
    finally:
        b.close()


def check_close_and_recreate(d: str) -> None:
    """detach_storage_backend closes it; attach builds a new one on the same file."""
    pool = HostPool(8)
    path = f"{d}/again.img"
    keys = keys_for(3)
    for p in range(3):
        pool.fill(p, 300 + p)
    want = [pool.page_bytes(p) for p in range(3)]
    for round_ in range(3):
        b = attach(pool, extra_for(path))
        try:
            if round_ == 0:
                assert b.batch_set_v1(keys, pool.indices([0, 1, 2])) == [True] * 3
            assert b.batch_exists(keys) == 3
            assert b.batch_get_v1(keys, pool.indices([5, 6, 7])) == [True] * 3
            assert [pool.page_bytes(p) for p in (5, 6, 7)] == want
        finally:
            b.close()
        b.close()  # twice is harmless
    assert b.batch_get_v1(keys, pool.indices([5, 6, 7])) == [False] * 3  # closed: misses


def check_tensor_api(d: str) -> None:
    pool = HostPool(2)
    b = attach(pool, extra_for(f"{d}/flat.img", interface_v1=0))
    try:
        page = torch.arange(4096, dtype=torch.int32).to(torch.bfloat16)
        assert b.set("t1", page) and b.batch_set(["t2", "t3"], [page * 2, page * 3])
        out = torch.zeros_like(page)
        assert b.get("t1", out) is out and torch.equal(out, page)
        res = b.batch_get(["t2", "none", "t3"], [torch.zeros_like(page) for _ in range(3)])
        assert torch.equal(res[0], page * 2) and res[1] is None and torch.equal(res[2], page * 3)
        assert b.get("t1", torch.zeros(10, dtype=torch.bfloat16)) is None  # other size: miss
        assert b.batch_exists(["t1", "t2", "x", "t3"]) == 2
        b.clear()
        assert b.batch_exists(["t1"]) == 0 and b.stats()["chunks"] == 0
    finally:
        b.close()


def restart_write(d: str) -> None:
    pool = HostPool(16)
    for p in range(6):
        pool.fill(p, 900 + p)
    b = attach(pool, extra_for(f"{d}/restart.img"))
    try:
        assert b.batch_set_v1(keys_for(6, "r"), pool.indices(list(range(6)))) == [True] * 6
    finally:
        b.close()
    with open(f"{d}/restart.json", "w") as f:
        json.dump([pool.page_bytes(p).hex() for p in range(6)], f)


def reopen(d: str) -> None:
    pool = HostPool(16)
    b = attach(pool, extra_for(f"{d}/restart.img"))
    try:
        keys = keys_for(6, "r")
        assert b.batch_exists(keys + ["missing" * 8]) == 6
        assert b.batch_get_v1(keys, pool.indices(list(range(10, 16)))) == [True] * 6
        with open(f"{d}/restart.json") as f:
            want = [bytes.fromhex(h) for h in json.load(f)]
        assert [pool.page_bytes(p) for p in range(10, 16)] == want
    finally:
        b.close()


class DirectPool(HostPool):
    """SGLang's MHA page_first_direct pool: kv_buffer (2, pages, layers, page_size, heads,
    dim); a page's K is layers x tokens, where page_first's is tokens x layers."""

    def __init__(self, pages: int) -> None:
        super().__init__(pages, "page_first")
        self.layout = "page_first_direct"
        self.kv_buffer = self.kv_buffer.view(2, pages, LAYERS, self.page_size, HEADS, DIM)


def check_page_first_direct_not_aliased(d: str) -> None:
    """A page written from a page_first pool is never read into a page_first_direct one:
    the same bytes mean other (token, layer) cells there."""
    a = HostPool(8, "page_first")
    for p in range(2):
        a.fill(p, 500 + p)
    path = f"{d}/direct.img"
    keys = keys_for(2, "dir")
    b = attach(a, extra_for(path))
    try:
        assert b.batch_set_v1(keys, a.indices([0, 1])) == [True, True]
    finally:
        b.close()
    pool = DirectPool(8)
    b = attach(pool, extra_for(path))
    try:
        assert b.batch_exists(keys) == 0
        assert b.batch_get_v1(keys, pool.indices([3, 4])) == [False, False]
        # its own pages round-trip
        pool.fill(5, 9)
        want = pool.page_bytes(5)
        assert b.batch_set_v1(keys[:1], pool.indices([5])) == [True]
        assert b.batch_get_v1(keys[:1], pool.indices([6])) == [True]
        assert pool.page_bytes(6) == want
    finally:
        b.close()


class WidePool(HostPool):
    """Same bytes per page as HostPool, other geometry: 4 heads of 32 dims."""

    def __init__(self, pages: int) -> None:
        super().__init__(pages, "page_first")
        self.head_num, self.head_dim = 4, 32


def check_keys_scoped_by_name_geometry_namespace(d: str) -> None:
    """Keys never collide between model names that differ only by '/' vs '-', between
    pools of other geometry with the same page size in bytes, or namespaces."""
    pool = HostPool(8)
    pool.fill(0, 77)
    path = f"{d}/scope.img"
    keys = keys_for(1, "scope")
    b = attach(pool, extra_for(path), model="org/model-x")
    try:
        assert b.batch_set_v1(keys, pool.indices([0])) == [True]
        assert b.batch_exists(keys) == 1
    finally:
        b.close()
    cases = [(HostPool(8), {}, "org-model/x"), (WidePool(8), {}, "org/model-x"),
             (HostPool(8), {"namespace": "v2"}, "org/model-x")]
    for other, more, model in cases:
        b = attach(other, extra_for(path, **more), model=model)
        try:
            assert b.batch_exists(keys) == 0, (model, more, type(other).__name__)
            assert b.batch_get_v1(keys, other.indices([1])) == [False]
        finally:
            b.close()
    b = attach(HostPool(8), extra_for(path), model="org/model-x")  # the same: found
    try:
        assert b.batch_exists(keys) == 1
    finally:
        b.close()


def check_interface_v1_string(d: str) -> None:
    """SGLang reads interface_v1 as bool(value): the string "0" means zero copy there,
    so batch_exists must answer for the page keys batch_set_v1 wrote."""
    pool = HostPool(8)
    for value in ("0", "false", 1):
        extra = extra_for(f"{d}/iv1-{value}.img", interface_v1=value)
        assert bool(extra.get("interface_v1", 0))  # as cache_controller reads it
        b = attach(pool, extra)
        try:
            keys = keys_for(2, f"iv{value}")
            pool.fill(0, 1)
            pool.fill(1, 2)
            assert b.batch_set_v1(keys, pool.indices([0, 1])) == [True, True]
            assert b.batch_exists(keys) == 2, value
        finally:
            b.close()


def check_close_with_call_in_flight(d: str) -> None:
    """close() while a call waits on the store: both return (the call with misses),
    and calls after close miss at once."""
    import asyncio

    pool = HostPool(8)
    keys = keys_for(2, "cl")
    b = attach(pool, extra_for(f"{d}/closerace.img", timeout_s="1"))
    assert b.batch_set_v1(keys, pool.indices([0, 1])) == [True, True]
    entered = threading.Event()
    gate = asyncio.Event()
    orig = b._store.batch_get

    async def held(k, bufs, **kw):
        entered.set()
        await gate.wait()  # never set: a call that does not end by itself
        return await orig(k, bufs, **kw)

    b._store.batch_get = held
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("r", b.batch_get_v1(
        keys, pool.indices([4, 5]))), daemon=True)
    t.start()
    assert entered.wait(60)
    c = threading.Thread(target=b.close, daemon=True)
    c.start()
    c.join(120)
    t.join(120)
    assert not c.is_alive(), "close() hung"
    assert not t.is_alive(), "the call in flight never returned"
    assert out["r"] == [False, False]
    assert b.batch_get_v1(keys, pool.indices([4, 5])) == [False, False]
    assert b.batch_exists(keys) == 0


def check_priorities_passed(d: str) -> None:
    """SGLang's backups reach the device as stores, its prefetches (every read of
    SGLang's comes from its prefetch thread) at prefetch_priority's class, load
    by default (docs/sglang.md); counted by the queue of the backend's loop thread,
    which issues every piece."""
    for setting in (None, "background"):
        pool = HostPool(8)
        keys = keys_for(4, f"prio{setting}")
        more = {} if setting is None else {"prefetch_priority": setting}
        b = attach(pool, extra_for(f"{d}/prio{setting}.img", **more))

        def pieces(b=b) -> dict:  # this round's backend
            async def stats() -> list:
                return [m.dev.queue_stats() for m in b._store._members]

            out = {"pieces_load": 0, "pieces_store": 0, "pieces_background": 0}
            for s in b._runner.call(stats(), 30):
                for k in out:
                    out[k] += s[k]
            return out

        try:
            for p in range(4):
                pool.fill(p, 40 + p)
            want = [pool.page_bytes(p) for p in range(4)]
            p0 = pieces()
            assert b.batch_set_v1(keys, pool.indices([0, 1, 2, 3])) == [True] * 4
            p1 = pieces()
            assert b.batch_get_v1(keys, pool.indices([4, 5, 6, 7])) == [True] * 4
            p2 = pieces()
            assert [pool.page_bytes(p) for p in (4, 5, 6, 7)] == want
            stored = {k: p1[k] - p0[k] for k in p0}
            read = {k: p2[k] - p1[k] for k in p0}
            assert stored["pieces_store"] > 0 and sum(stored.values()) == stored["pieces_store"], \
                stored
            cls = "pieces_background" if setting == "background" else "pieces_load"
            assert read[cls] > 0 and sum(read.values()) == read[cls], (setting, read)
        finally:
            b.close()


def check_timeout_bounds_calls(d: str) -> None:
    """timeout_s bounds a lookup or a backup whose store call never ends (a miss /
    False), and becomes io_timeout_ms of fabric devices."""
    import asyncio

    pool = HostPool(8)
    b = attach(pool, extra_for(f"{d}/to.img", timeout_s="0.5"))
    try:
        async def never(*a, **k):
            await asyncio.Event().wait()

        b._store.batch_exists = never
        b._sizes = never
        out: dict = {}
        t = threading.Thread(target=lambda: out.update(
            e=b.batch_exists(["x"]), s=b.batch_set_v1(keys_for(1), pool.indices([0]))),
            daemon=True)
        t.start()
        t.join(120)
        assert not t.is_alive(), "a call without end was not bounded by timeout_s"
        assert out == {"e": 0, "s": [False]}, out
    finally:
        b.close()
    from fx100io.contrib.sglang import _with_io_timeout

    assert _with_io_timeout("nvme+tcp://h:4420/nqn", 2.5) == "nvme+tcp://h:4420/nqn?io_timeout_ms=2500"
    assert _with_io_timeout("nvme+rdma://h:4420/nqn?ns=2", 1) == (
        "nvme+rdma://h:4420/nqn?ns=2&io_timeout_ms=1000")
    assert _with_io_timeout("nvme+tcp://h/n?io_timeout_ms=5", 1) == "nvme+tcp://h/n?io_timeout_ms=5"
    assert _with_io_timeout("file:///x", 1) == "file:///x"


def check_metrics_bounded(d: str) -> None:
    """Without enable_storage_metrics nothing is kept per call."""
    pool = HostPool(8)
    keys = keys_for(2, "m")
    b = attach(pool, extra_for(f"{d}/metrics.img"))
    try:
        assert b.batch_set_v1(keys, pool.indices([0, 1])) == [True, True]
        for _ in range(50):
            assert b.batch_get_v1(keys, pool.indices([4, 5])) == [True, True]
        assert sum(len(v) for v in b._metrics.values()) == 0
    finally:
        b.close()


def check_page_meta_checked(d: str) -> None:
    """host_indices of more pages than keys, or page pieces outside the pool, are
    refused (False), never stored or read."""
    pool = HostPool(16)
    for p in range(4):
        pool.fill(p, 40 + p)
    b = attach(pool, extra_for(f"{d}/meta.img"))
    try:
        keys = keys_for(2, "mis")
        assert b.batch_set_v1(keys, pool.indices([0, 1, 2, 3])) == [False, False]
        assert b.stats()["chunks"] == 0
        assert b.batch_get_v1(keys, pool.indices([0, 1, 2, 3])) == [False, False]
        other = np.full(1 << 16, 7, np.uint8)
        orig = pool.get_page_buffer_meta
        half = PAGE * LAYERS * HEADS * DIM * 2
        pool.get_page_buffer_meta = lambda idx: (
            [other.ctypes.data, other.ctypes.data + half], [half, half])
        try:
            assert b.batch_set_v1(keys[:1], pool.indices([0])) == [False]
            assert b.stats()["chunks"] == 0
        finally:
            pool.get_page_buffer_meta = orig
    finally:
        b.close()


def check_wrong_size_chunk_replaced(d: str) -> None:
    """A chunk of another size under a page key is not a hit, and a backup replaces it."""
    pool = HostPool(8)
    keys = keys_for(1, "ws")
    b = attach(pool, extra_for(f"{d}/wrongsize.img"))
    try:
        name = b._page_key(keys[0])
        b._runner.call(b._store.batch_put([name], [b"x" * 4096]), wait_s=60)
        assert b.batch_exists(keys) == 0
        pool.fill(0, 3)
        want = pool.page_bytes(0)
        assert b.batch_set_v1(keys, pool.indices([0])) == [True]
        assert b.batch_exists(keys) == 1
        assert b.batch_get_v1(keys, pool.indices([2])) == [True]
        assert pool.page_bytes(2) == want
    finally:
        b.close()


def check_hybrid_refused(d: str) -> None:
    """An extra host pool (Mamba/SWA/DSA, the v2 interface) is refused at attach."""
    pool = HostPool(8)
    b = attach(pool, extra_for(f"{d}/hybrid.img"))
    try:
        try:
            b.register_mem_host_pool_v2(HostPool(2), "mamba")
        except NotImplementedError as exc:
            assert "v2" in str(exc) and "mamba" in str(exc)
        else:
            raise AssertionError("an extra host pool was accepted")
    finally:
        b.close()


def check_breaker_device_errors_only(d: str) -> None:
    """No space or a bad argument fails that call only; an I/O error trips the breaker."""
    import errno

    from fx100io.errors import DeviceFullError

    pool = HostPool(8)
    b = attach(pool, extra_for(f"{d}/breaker.img", retry_after_s="600"))
    try:
        b._fail("batch_set_v1", DeviceFullError(errno.ENOSPC, "full"))
        b._fail("batch_set_v1", OSError(errno.EINVAL, "bad"))
        assert b._breaker.trips == 0 and b._usable()
        b._fail("batch_get_v1", OSError(errno.EIO, "io"))
        assert b._breaker.trips == 1 and not b._usable()
        from fx100io.contrib._runtime import is_device_error
        from fx100io.errors import (
            BufferTooSmallError,
            DeviceClosedError,
            FxConnectionError,
            FxTimeoutError,
            InvalidArgumentError,
        )
        assert all(is_device_error(e) for e in (
            FxTimeoutError(errno.ETIMEDOUT, "t"), FxConnectionError(errno.ECONNRESET, "c"),
            DeviceClosedError(errno.EBADF, "closed")))
        assert not any(is_device_error(e) for e in (
            InvalidArgumentError(errno.EINVAL, "a"), BufferTooSmallError(errno.EINVAL, "b"),
            DeviceFullError(errno.ENOSPC, "f"), ValueError("v")))
        assert b._runner._own_thread is not None
        assert b._runner._own_thread.name == "fx100io-sglang-loop"
    finally:
        b.close()


def check_clear_own_scope_off_loop(d: str) -> None:
    """clear() deletes this rank's chunks only, listing keys with akeys where the store
    has it (a shared pool: never its blocking keys() on the loop thread)."""
    pool = HostPool(8)
    path = f"{d}/clear.img"
    keys = keys_for(3, "clr")
    b = attach(pool, extra_for(path))
    try:
        assert b.batch_set_v1(keys, pool.indices([0, 1, 2])) == [True] * 3
        b._runner.call(b._store.batch_put([b"not-ours"], [b"y" * 4096]), wait_s=60)
        store = b._store
        real_keys = store.keys

        async def akeys():
            return real_keys()

        def blocking_keys():
            raise AssertionError("keys() called where akeys() exists")

        store.akeys = akeys
        store.keys = blocking_keys
        b.clear()
        del store.keys
        assert b.batch_exists(keys) == 0
        assert store.chunk_size("not-ours") == 4096
    finally:
        b.close()


def check_store_bounce_on_whole_block_device(d: str) -> None:
    """On a device that moves whole blocks only, pages whose pieces are not whole blocks
    (3-token pages: 3 KiB pieces) go through ChunkStore's own bounce buffer (not the
    backend's gather): byte-exact into other pages."""
    from fx100io.device import Device

    prop = Device.aligned_only
    Device.aligned_only = property(lambda self: True)  # type: ignore[assignment]
    try:
        pool = HostPool(16, "page_first", page=3)
        b = attach(pool, extra_for(f"{d}/bounce.img"))
        try:
            assert not b._gather
            keys = keys_for(4, "bn")
            for p in range(4):
                pool.fill(p, 90 + p)
            want = [pool.page_bytes(p) for p in range(4)]
            assert b.batch_set_v1(keys, pool.indices([0, 1, 2, 3])) == [True] * 4
            assert b.batch_get_v1(keys, pool.indices([9, 8, 11, 10])) == [True] * 4
            assert [pool.page_bytes(p) for p in (9, 8, 11, 10)] == want
        finally:
            b.close()
    finally:
        Device.aligned_only = prop


def check_world_size_counts_dp(d: str) -> None:
    """{world_size} counts every DP attention group when dp_size is given."""
    from fx100io.contrib.sglang import worker_index

    cfg = config({})
    cfg.tp_size, cfg.tp_rank, cfg.dp_rank = 2, 1, 3
    assert worker_index(cfg, dp_size=4) == (7, 8)
    assert worker_index(cfg)[1] >= 8  # without dp_size, at least up to this rank's group


def check_cancelled_read_never_lands_after_return(d: str) -> None:
    """close() at random moments of a read still landing in SGLang's pages: once
    batch_get_v1 returned, no byte of those pages changes (the pieces a cancelled
    read had already sent land before it returns, never after)."""
    import random
    import time

    from adapter_cancel import LandingStore, watch_unchanged

    from fx100io.contrib.sglang import _byte_view

    rng = random.Random(25)
    late = 0
    for trial in range(6):
        pool = HostPool(8)
        keys = keys_for(2, f"cancel{trial}")
        # timeout_s: how long close() lets a call run before it cancels it
        b = attach(pool, extra_for(f"{d}/cancel-{trial}.img", timeout_s="0.05"))
        pool.fill(0, 1)
        pool.fill(1, 2)
        assert b.batch_set_v1(keys, pool.indices([0, 1])) == [True, True]
        landing = LandingStore(b._store, piece=2048)
        b._store = landing
        out: dict = {}
        t = threading.Thread(target=lambda b=b, keys=keys, pool=pool, out=out: out.setdefault(
            "r", b.batch_get_v1(keys, pool.indices([4, 5]))), daemon=True)
        t.start()
        assert landing.landing.wait(60)
        time.sleep(rng.uniform(0, 0.08))
        closer = threading.Thread(target=b.close, daemon=True)
        closer.start()
        t.join(120)
        assert not t.is_alive(), "batch_get_v1 never returned"
        ptrs, sizes = pool.get_page_buffer_meta(pool.indices([4, 5]))
        problem = watch_unchanged([_byte_view(int(p), int(n)) for p, n in zip(ptrs, sizes)])
        closer.join(120)
        assert not closer.is_alive(), "close() hung"
        assert problem is None, f"trial {trial}: {problem} (returned {out.get('r')})"
        late += landing.late_pieces
    assert late > 0, "no close came while a read was landing: the check proved nothing"


CHECKS = {
    "round_trip_page_first": lambda d: check_round_trip_other_pages(d, "page_first"),
    "round_trip_layer_first": lambda d: check_round_trip_other_pages(d, "layer_first"),
    "round_trip_bounced": lambda d: check_round_trip_other_pages(d, "page_first", True),
    "leading_hits": check_leading_hits,
    "concurrent_backup_and_prefetch": check_concurrent_backup_and_prefetch,
    "mla_non_writer_does_not_write": check_mla_non_writer_does_not_write,
    "corrupt_chunk_is_false": check_corrupt_chunk_is_false,
    "bad_config": check_bad_config,
    "close_and_recreate": check_close_and_recreate,
    "tensor_api": check_tensor_api,
    "restart_write": restart_write,
    "mla_tp_needs_shared_index": check_mla_tp_needs_shared_index,
    "page_first_direct_not_aliased": check_page_first_direct_not_aliased,
    "keys_scoped_by_name_geometry_namespace": check_keys_scoped_by_name_geometry_namespace,
    "interface_v1_string": check_interface_v1_string,
    "close_with_call_in_flight": check_close_with_call_in_flight,
    "timeout_bounds_calls": check_timeout_bounds_calls,
    "priorities_passed": check_priorities_passed,
    "metrics_bounded": check_metrics_bounded,
    "page_meta_checked": check_page_meta_checked,
    "wrong_size_chunk_replaced": check_wrong_size_chunk_replaced,
    "hybrid_refused": check_hybrid_refused,
    "breaker_device_errors_only": check_breaker_device_errors_only,
    "world_size_counts_dp": check_world_size_counts_dp,
    "clear_own_scope_off_loop": check_clear_own_scope_off_loop,
    "store_bounce_on_whole_block_device": check_store_bounce_on_whole_block_device,
    "cancelled_read_never_lands_after_return": check_cancelled_read_never_lands_after_return,
}


def fabric(uri: str) -> None:
    """Over NVMe/TCP (a device that moves whole blocks only): pages whose K and V are
    whole blocks move in place; 3-token pages (3 KiB pieces) go through a bounce
    buffer. Byte-exact both ways, and again after a re-open."""
    for page, layout in ((PAGE, "page_first"), (PAGE, "layer_first"), (3, "page_first")):
        pool = HostPool(16, layout, page=page)
        keys = keys_for(4, f"{layout}{page}")
        for p in range(4):
            pool.fill(p, 70 + p)
        want = [pool.page_bytes(p) for p in range(4)]
        extra = dict(extra_for("unused"), devices=uri)
        del extra["size"]
        b = attach(pool, extra)
        try:
            assert b.batch_set_v1(keys, pool.indices([0, 1, 2, 3])) == [True] * 4
            assert b.batch_get_v1(keys, pool.indices([9, 8, 11, 10])) == [True] * 4
            assert [pool.page_bytes(p) for p in (9, 8, 11, 10)] == want
        finally:
            b.close()
        b = attach(pool, extra)
        try:
            assert b.batch_exists(keys) == 4
            assert b.batch_get_v1(keys, pool.indices([12, 13, 14, 15])) == [True] * 4
            assert [pool.page_bytes(p) for p in (12, 13, 14, 15)] == want
        finally:
            b.close()


def main() -> int:
    mode, d = sys.argv[1], sys.argv[2]
    assert os.path.dirname(fx100io.__file__).startswith(os.environ.get("FX100IO_EXPECT", "/"))
    if mode == "fabric":
        fabric(d)
        print(json.dumps({"fabric": "ok"}))
        return 0
    if mode == "reopen":
        reopen(d)
        print(json.dumps({"reopen": "ok"}))
        return 0
    results: dict[str, str] = {}
    only = set(sys.argv[3:])
    for name, fn in CHECKS.items():
        if only and name not in only:
            continue

        def one(name: str = name, fn=fn) -> None:
            try:
                fn(d)
                results[name] = "ok"
            except Exception:  # noqa: BLE001 - reported per check
                results[name] = traceback.format_exc()
        # a check that hangs fails alone (and the rest still run), not the whole suite
        t = threading.Thread(target=one, name=name, daemon=True)
        t.start()
        t.join(CHECK_TIMEOUT_S)
        if t.is_alive():
            results[name] = f"hung: no answer within {CHECK_TIMEOUT_S} s"
            print(json.dumps(results))
            sys.stdout.flush()
            os._exit(0)  # its thread still holds the backend: leave at once
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""LMCache's side of fx100io's L2 adapters for LMCache's multi-process server, as the
tests drive them (tests/contrib): an arena of memory objects like LMCache's L1, keys and
adapter specs, the adapter built by LMCache's own loader, and store/lookup/load that wait
on the adapter's event fds the way LMCache's server does.  Importing it skips the importing
module where lmcache or torch is missing."""

from __future__ import annotations

import argparse
import json
import os
import select
import threading
import time

import pytest

lmcache = pytest.importorskip(
    "lmcache", reason="the real lmcache package is needed: run tools/install_lmcache.sh")
torch = pytest.importorskip("torch")

from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey  # noqa: E402
from lmcache.v1.distributed.internal_api import L1MemoryDesc  # noqa: E402
from lmcache.v1.distributed.l2_adapters import create_l2_adapter  # noqa: E402
from lmcache.v1.distributed.l2_adapters.config import (  # noqa: E402
    parse_args_to_l2_adapters_config,
)
from lmcache.v1.memory_management import (  # noqa: E402
    MemoryFormat,
    MemoryObjMetadata,
    TensorMemoryObj,
)

MODULE = "fx100io.contrib.lmcache_mp"
WAIT_S = 60.0  # a generous bound for a hung adapter; never a timing assertion


# ------------------------------------------------------------------ LMCache's side


class Arena:
    """LMCache's L1: one aligned CPU buffer; every MemoryObj is a slice of it."""

    def __init__(self, nbytes: int, align: int = 4096) -> None:
        backing = torch.zeros(nbytes + align, dtype=torch.uint8)
        off = (-backing.data_ptr()) % align
        self.buf = backing[off:off + nbytes]
        self._backing = backing
        self.align = align
        self.next = 0

    @property
    def desc(self) -> L1MemoryDesc:
        # pinned up front, as LMCache's L1 manager exposes an eager arena
        return L1MemoryDesc(ptr=self.buf.data_ptr(), size=self.buf.numel(), align_bytes=self.align,
                            stable_registration_size=self.buf.numel())

    def obj(self, numel: int, dtype: torch.dtype = torch.uint8) -> TensorMemoryObj:
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        phys = -(-nbytes // self.align) * self.align  # padded like LMCache's allocator
        start = self.next
        assert start + phys <= self.buf.numel(), "arena too small for the test"
        self.next += phys
        raw = self.buf[start:start + nbytes].view(dtype)
        meta = MemoryObjMetadata(shape=torch.Size([numel]), dtype=dtype, address=start,
                                 phy_size=phys, fmt=MemoryFormat.KV_2LTD, ref_count=1)
        return TensorMemoryObj(raw_data=raw, metadata=meta, parent_allocator=None)

    def padding_after(self, obj: TensorMemoryObj) -> torch.Tensor:
        start = obj.meta.address + obj.get_size()
        return self.buf[start:obj.meta.address + obj.get_physical_size()]


class ShmArena(Arena):
    """LMCache's L1 as an MP server with shm_name makes it: one POSIX shared-memory
    file mapped whole, for which LMCache's desc gives no stable_registration_size."""

    def __init__(self, nbytes: int, align: int = 4096) -> None:
        import mmap
        import uuid

        name = f"/dev/shm/fx100io-test-l1-{uuid.uuid4().hex}"
        fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            self._map = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
            os.unlink(name)  # the mapping keeps it; nothing is left behind
        self.buf = torch.frombuffer(self._map, dtype=torch.uint8)
        self._backing = self.buf
        self.align = align
        self.next = 0

    @property
    def desc(self) -> L1MemoryDesc:
        return L1MemoryDesc(ptr=self.buf.data_ptr(), size=self.buf.numel(), align_bytes=self.align,
                            stable_registration_size=None)


def fill(obj: TensorMemoryObj, seed: int) -> bytes:
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (obj.get_size(),), dtype=torch.uint8, generator=gen)
    obj.raw_data.view(torch.uint8).copy_(data)
    return bytes(data.numpy())


def content(obj: TensorMemoryObj) -> bytes:
    return bytes(obj.raw_data.view(torch.uint8).numpy())


def key(i: int, model: str = "org/model-7b", rank: int = 0, group: int = 0, salt: str = "") -> ObjectKey:
    return ObjectKey(chunk_hash=i.to_bytes(32, "big"), model_name=model, kv_rank=rank,
                     object_group_id=group, cache_salt=salt)


def spec(device: str, kind: str = "plugin", **params: object) -> str:
    cls = "FX100ioL2Adapter" if kind == "plugin" else "FX100ioNativeClient"
    return json.dumps({"type": kind, "module_path": MODULE, "class_name": cls,
                       "adapter_params": {"devices": device, "size": "64M", **params}})


def load_adapter(json_spec: str, arena: Arena | None):
    """What `lmcache server --l2-adapter JSON` does to build an adapter."""
    cfg = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[json_spec]))
    return create_l2_adapter(cfg.adapters[0], l1_memory_desc=None if arena is None else arena.desc)


def wait_fd(fd: int) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    assert poller.poll(WAIT_S * 1000), "event fd never fired"
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass


# Helpers are strict by default: one task in flight per event fd, so once the fd fires
# and is read, the task's result must be there (an adapter that signals before its result
# is visible would lose LMCache's wake-up). Threads sharing an adapter (as LMCache's
# controllers would not) set _lenient.on and poll again instead.
_lenient = threading.local()


def _strict() -> bool:
    return not getattr(_lenient, "on", False)


def _drain(fd: int) -> None:
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass


def _fired(fd: int, what: str) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    assert poller.poll(WAIT_S * 1000), f"{what}: the event fd never fired"
    os.eventfd_read(fd)


def wait_query(adapter, fd: int, query, task_id: int):
    if _strict():
        _fired(fd, f"task {task_id}")
        result = query(task_id)
        assert result is not None, f"task {task_id}: its event fd fired before its result"
        return result
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        result = query(task_id)
        if result is not None:
            return result
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if poller.poll(100):
            _drain(fd)
    raise AssertionError(f"task {task_id} never completed")


_store_results: dict = {}
_store_lock = threading.Lock()


def store(adapter, keys, objs) -> bool:
    """pop_completed_store_tasks pops every finished task, so threads that share an
    adapter (as LMCache's store controller would not) share what they popped."""
    if _strict():
        fd = adapter.get_store_event_fd()
        _drain(fd)
        assert adapter.pop_completed_store_tasks() == {}
        tid = adapter.submit_store_task(keys, objs)
        _fired(fd, "store")
        done = adapter.pop_completed_store_tasks()
        assert list(done) == [tid], f"store: the event fd fired, its result is {done}"
        return done[tid].is_successful()
    tid = adapter.submit_store_task(keys, objs)
    deadline = time.monotonic() + WAIT_S
    while True:
        with _store_lock:
            _store_results.update({(id(adapter), t): r
                                   for t, r in adapter.pop_completed_store_tasks().items()})
            result = _store_results.pop((id(adapter), tid), None)
        if result is not None:
            return result.is_successful()
        assert time.monotonic() < deadline, "store never completed"
        poller = select.poll()
        poller.register(adapter.get_store_event_fd(), select.POLLIN)
        if poller.poll(100):
            _drain(adapter.get_store_event_fd())


def lookup(adapter, keys, layouts: bool = True) -> list[bool]:
    if _strict():
        _drain(adapter.get_lookup_and_lock_event_fd())
    if layouts:
        tid = adapter.submit_lookup_and_lock_task(keys, {0: MemoryLayoutDesc(shapes=[], dtypes=[])})
    else:
        tid = adapter.submit_lookup_and_lock_task(keys)
    bm = wait_query(adapter, adapter.get_lookup_and_lock_event_fd(),
                    adapter.query_lookup_and_lock_result, tid)
    return [bm.test(i) for i in range(len(keys))]


def load(adapter, keys, objs) -> list[bool]:
    if _strict():
        _drain(adapter.get_load_event_fd())
    tid = adapter.submit_load_task(keys, objs)
    bm = wait_query(adapter, adapter.get_load_event_fd(), adapter.query_load_result, tid)
    return [bm.test(i) for i in range(len(keys))]

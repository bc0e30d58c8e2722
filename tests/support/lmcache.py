"""Shared pieces of the LMCache plugin tests (no tests of its own).

Everything here drives the real lmcache package; the tests skip, with the reason,
only when lmcache itself cannot be imported (install it with
tools/install_lmcache.sh).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

lmcache = pytest.importorskip(
    "lmcache.v1.cache_engine",
    reason="lmcache is not installed: run tools/install_lmcache.sh (CPU-only recipe)",
)

import torch
from lmcache.utils import CacheEngineKey, LayerCacheEngineKey
from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.event_manager import EventManager
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.storage_manager import StorageManager

PLUGIN = "fx100io"
MODEL = "fx/test-model"

# A small model: 4 layers, 16-token chunks, 3 KV heads of 8 -> 6 KiB per bf16 chunk,
# deliberately not a multiple of 4 KiB so O_DIRECT tails are exercised.
NUM_LAYERS = 4
CHUNK = 16
HEADS = 3
HEAD_SIZE = 8
HIDDEN = HEADS * HEAD_SIZE

__all__ = [
    "CacheEngineKey",
    "CpuConnector",
    "LayerCacheEngineKey",
    "LogCapture",
    "LookupRecorder",
    "MemoryFormat",
    "destroy_engine",
    "fill_obj",
    "make_config",
    "make_engine",
    "make_metadata",
    "make_storage_manager",
    "plugin_of",
    "wait_until",
]


def plugin_extra(devices: str | None, **opts: Any) -> dict:
    extra = {
        f"storage_plugin.{PLUGIN}.module_path": "fx100io.contrib.lmcache",
        f"storage_plugin.{PLUGIN}.class_name": "FX100ioBackend",
        f"storage_plugin.{PLUGIN}.devices": devices,
        f"storage_plugin.{PLUGIN}.size": "64M",
    }
    opts.setdefault("devices", devices)
    for key, value in opts.items():
        if value is None:
            extra.pop(f"storage_plugin.{PLUGIN}.{key}", None)
        else:
            extra[f"storage_plugin.{PLUGIN}.{key}"] = value
    return extra


def make_config(
    devices: str | None,
    *,
    async_loading: bool = False,
    layerwise: bool = False,
    cpu_gb: float = 0.05,
    **opts: Any,
) -> Any:
    return LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK,
        # Keep the short last chunk too: its own shape must survive the round trip.
        save_unfull_chunk=True,
        local_cpu=True,
        max_local_cpu_size=cpu_gb,
        storage_plugins=[PLUGIN],
        enable_async_loading=async_loading,
        use_layerwise=layerwise,
        extra_config=plugin_extra(devices, **opts),
    )


def make_metadata(worker_id: int = 0, world_size: int = 1, dtype: torch.dtype = torch.bfloat16) -> Any:
    return LMCacheMetadata(
        model_name=MODEL,
        world_size=world_size,
        local_world_size=world_size,
        worker_id=worker_id,
        local_worker_id=worker_id,
        kv_dtype=dtype,
        kv_shape=(NUM_LAYERS, 2, CHUNK, HEADS, HEAD_SIZE),
        chunk_size=CHUNK,
    )


def make_storage_manager(config: Any, metadata: Any | None = None) -> Any:
    return StorageManager(config, metadata or make_metadata(), EventManager())


def plugin_of(storage_manager: Any) -> Any:
    backend = storage_manager.storage_backends.get(PLUGIN)
    assert backend is not None, (
        f"LMCache did not load the plugin; backends: {list(storage_manager.storage_backends)}"
    )
    return backend


def fill_obj(obj: Any, seed: int) -> torch.Tensor:
    """Deterministic, seed-distinct bytes in a MemoryObj; returns a copy to compare."""
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (obj.get_size(),), dtype=torch.uint8, generator=gen)
    memoryview(obj.byte_array).cast("B")[:] = data.numpy().tobytes()
    return data


def obj_bytes(obj: Any) -> torch.Tensor:
    """A copy of a MemoryObj's bytes (byte_array is what the plugin reads into)."""
    return torch.frombuffer(bytearray(obj.byte_array), dtype=torch.uint8)


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class CpuConnector(GPUConnectorInterface):
    """Stands in for vLLM's paged GPU KV cache with one CPU tensor per sequence.

    ``kvcaches`` is a [2, layers, tokens, hidden] tensor (LMCache's KV_2LTD layout for
    the whole token sequence); from_gpu copies a token range into a MemoryObj and
    to_gpu copies it back, so a retrieve can be compared byte for byte.
    """

    def __init__(self) -> None:
        self.kvcaches = None

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, NUM_LAYERS, num_tokens, HIDDEN])

    def _kv(self, kwargs: dict) -> torch.Tensor:
        kv = kwargs.get("kvcaches", self.kvcaches)
        assert kv is not None, "CpuConnector needs kvcaches="
        return kv

    def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        memory_obj.tensor.copy_(self._kv(kwargs)[:, :, start:end, :])

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        self._kv(kwargs)[:, :, start:end, :].copy_(memory_obj.tensor)

    def batched_from_gpu(self, memory_objs: Any, starts: Any, ends: Any, **kwargs: Any) -> None:
        for obj, start, end in zip(memory_objs, starts, ends):
            self.from_gpu(obj, start, end, **kwargs)

    def batched_to_gpu(
        self, memory_objs: Any = None, starts: Any = None, ends: Any = None, **kwargs: Any
    ) -> None:
        for obj, start, end in zip(memory_objs, starts, ends):
            self.to_gpu(obj, start, end, **kwargs)


class LookupRecorder:
    """Receives what the async lookup server would send to vLLM's scheduler over ZMQ."""

    def __init__(self) -> None:
        self.responses: dict[str, int] = {}
        self._cond = threading.Condition()

    def send_response_to_scheduler(self, lookup_id: str, num_hit_tokens: int) -> None:
        with self._cond:
            self.responses[lookup_id] = int(num_hit_tokens)
            self._cond.notify_all()

    def wait(self, lookup_id: str, timeout: float = 20.0) -> int:
        with self._cond:
            if not self._cond.wait_for(lambda: lookup_id in self.responses, timeout):
                raise AssertionError(f"no lookup response for {lookup_id}")
            return self.responses[lookup_id]


_engine_ids = iter(range(1_000_000))


def make_engine(config: Any, metadata: Any | None = None, **post_init: Any) -> Any:
    instance_id = f"fx100io-test-{next(_engine_ids)}"
    engine = LMCacheEngineBuilder.get_or_create(
        instance_id,
        config,
        metadata or make_metadata(),
        CpuConnector(),
        broadcast_fn=lambda tensor, rank: None,
        broadcast_object_fn=lambda obj, rank: obj,
    )
    engine.post_init(**post_init)
    engine._fx100io_test_id = instance_id
    return engine


def destroy_engine(engine: Any) -> None:
    LMCacheEngineBuilder.destroy(engine._fx100io_test_id)


def random_kv(num_tokens: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, NUM_LAYERS, num_tokens, HIDDEN, generator=gen).to(dtype)


def cold_cpu_tier(storage_manager: Any) -> None:
    """Empty LMCache's CPU tier so the next retrieve must come from fx100io.

    Puts still in flight hold references that make LocalCPUBackend.clear() skip their
    chunks, so wait for them first, then check nothing is left.
    """
    assert plugin_of(storage_manager).flush(timeout=30), "puts did not finish"
    cpu = storage_manager.storage_backends["LocalCPUBackend"]
    storage_manager.clear(locations=["LocalCPUBackend"])
    assert cpu.get_keys() == [], f"CPU tier still holds {len(cpu.get_keys())} chunks"


class LogCapture(logging.Handler):
    """Collects the plugin's log records (it logs to 'fx100io.contrib.lmcache')."""

    def __init__(self, name: str = "fx100io.contrib.lmcache") -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._logger = logging.getLogger(name)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> LogCapture:  # noqa: PYI034 - py3.10 has no typing.Self
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)

    def text(self, min_level: int = logging.DEBUG) -> str:
        return "\n".join(r.getMessage() for r in self.records if r.levelno >= min_level)


def keys_for(hashes, worker_id=0, world_size=1, dtype=torch.bfloat16):
    return [CacheEngineKey(MODEL, world_size, worker_id, h, dtype) for h in hashes]


def put_chunks(manager, keys, seed0=0, num_tokens=CHUNK):
    """Allocate, fill and put one chunk per key; returns the expected bytes."""
    meta = manager.storage_backends["LocalCPUBackend"].metadata
    objs, expected = [], []
    for i, _ in enumerate(keys):
        obj = manager.allocate(meta.get_shapes(num_tokens), meta.get_dtypes())
        assert obj is not None
        expected.append(fill_obj(obj, seed0 + i))
        objs.append(obj)
    manager.batched_put(keys, objs)
    return expected

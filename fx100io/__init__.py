"""fx100io: io_uring and NVMe-oF I/O engine and KV-cache chunk store."""

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from fx100io import errors

if TYPE_CHECKING:  # the names below are imported on first use (see __getattr__)
    from fx100io.device import OP_CRC32C, OP_FLUSH, OP_READ, OP_WRITE, Device, open_device
    from fx100io.fabric_uri import discover, host_identity
    from fx100io.pool import BufferPool, RegisteredMemory, register_memory
    from fx100io.priority import Priority
    from fx100io.store import ChunkStore
    from fx100io.store.shared import SharedChunkStore  # noqa: F401 - in __all__ only where redis is installed

# Each public name and the module it lives in.  They are imported on first
# use, not here: a command such as `python -m fx100io bench` needs neither
# numpy nor asyncio, and importing them would cost it more CPU than a short
# job's I/O (house rule: the benchmark's start-up counts against it).
_LAZY = {
    "Device": "fx100io.device",
    "open_device": "fx100io.device",
    "OP_READ": "fx100io.device",
    "OP_WRITE": "fx100io.device",
    "OP_FLUSH": "fx100io.device",
    "OP_CRC32C": "fx100io.device",
    "discover": "fx100io.fabric_uri",
    "host_identity": "fx100io.fabric_uri",
    "BufferPool": "fx100io.pool",
    "RegisteredMemory": "fx100io.pool",
    "register_memory": "fx100io.pool",
    "Priority": "fx100io.priority",
    "ChunkStore": "fx100io.store",
    # only the shared pool needs the redis package
    "SharedChunkStore": "fx100io.store.shared",
}

__all__ = ["BufferPool", "ChunkStore", "RegisteredMemory", "register_memory", "Device", "discover",
           "host_identity", "open_device", "errors", "OP_READ", "OP_WRITE", "OP_FLUSH", "OP_CRC32C", "Priority"]
if importlib.util.find_spec("redis") is not None:  # `import *` must work without it
    __all__.insert(2, "SharedChunkStore")
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fx100io' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except AttributeError as exc:
        # An AttributeError from inside the import (a stale _core that lacks a
        # symbol, say) would be read by `from fx100io import X` and hasattr()
        # as "no such name" and its cause lost: report it as the failed import.
        raise ImportError(f"importing {module} (for fx100io.{name}) failed: {exc}") from exc
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    # __all__, not _LAZY: SharedChunkStore is listed only where redis is
    # installed, so help() and inspect.getmembers() never import what fails.
    return sorted(set(globals()) | set(__all__))

"""fx100io: io_uring and NVMe-oF I/O engine and KV-cache chunk store."""

import importlib.util
from typing import Any

from fx100io import errors
from fx100io.device import Device, open_device
from fx100io.fabric_uri import discover, host_identity
from fx100io.pool import BufferPool, RegisteredMemory, register_memory
from fx100io.store import ChunkStore

__all__ = ["BufferPool", "ChunkStore", "RegisteredMemory", "register_memory", "Device", "discover", "host_identity", "open_device", "errors"]
if importlib.util.find_spec("redis") is not None:  # `import *` must work without it
    __all__.insert(2, "SharedChunkStore")
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Imported on first use: only the shared pool needs the redis package.
    if name == "SharedChunkStore":
        from fx100io.shared import SharedChunkStore
        return SharedChunkStore
    raise AttributeError(f"module 'fx100io' has no attribute {name!r}")

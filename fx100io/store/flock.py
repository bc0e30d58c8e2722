"""One ChunkStore per device: an advisory lock held while a store is open."""

from __future__ import annotations

from fx100io import locks
from fx100io.device import Device
from fx100io.errors import DeviceBusyError


def lock_device(d: Device) -> locks.FileLock | None:
    """Lock a local device for this store; returns the lock (release it to unlock), or
    None where the device is not local.

    The index lives in the owning process's memory, so a second writer would
    corrupt it.  The lock (fx100io.locks) is released by the kernel when the process
    dies, so a crash never leaves a device locked; an adapter's claim on the device
    (fx100io.contrib) lets this process's one store in."""
    if d.transport not in ("file", "psync"):
        return None  # remote namespaces: the target owns exclusivity
    held = locks.lock(d.target, inside_claim=True)
    if held is None:
        raise DeviceBusyError(16, "device is in use by another ChunkStore (close it first, "
                              "or give each process its own device)", d.uri)
    return held


def unlock(held: list[locks.FileLock]) -> None:
    locks.release_all(held)

"""One ChunkStore per device: an advisory lock held while a store is open."""

from __future__ import annotations

import fcntl
import os

from fx100io.device import Device
from fx100io.errors import DeviceBusyError


def lock_device(d: Device) -> int | None:
    """Lock a local device for this process; returns the fd that holds the
    lock (close it to unlock), or None where the device is not local.

    The index lives in the owning process's memory, so a second writer would
    corrupt it.  flock() is released by the kernel when the process dies,
    so a crash never leaves a device locked."""
    if d.transport not in ("file", "psync"):
        return None  # remote namespaces: the target owns exclusivity
    fd = os.open(d.target, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise DeviceBusyError(16, "device is in use by another ChunkStore (close it first, "
                              "or give each process its own device)", d.uri) from None
    return fd


def unlock(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)  # closing drops the flock
    fds.clear()

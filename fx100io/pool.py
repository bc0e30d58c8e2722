"""BufferPool: pinned, io_uring-registered host memory handed out as numpy views."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from fx100io import _core
from fx100io.errors import DeviceFullError, InvalidArgumentError, PinnedMemoryError

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("fx100io")

#: Every allocation starts on this boundary: enough for O_DIRECT on any
#: device and for huge-page friendly DMA.
ALIGNMENT = 4096

_warned_unpinned = False


class BufferPool:
    """Pinned host memory registered with io_uring as fixed buffers.

    ``alloc(n)`` returns a writable ``numpy.uint8`` array of ``n`` bytes,
    aligned to 4 KiB, with zero copies: reads into it go straight from the
    device (O_DIRECT, READ_FIXED).  The memory returns to the pool when the
    array and every view of it are gone.

    If the memory cannot be locked (``RLIMIT_MEMLOCK``, 8 MiB for ordinary
    users, and no ``CAP_IPC_LOCK``), the pool still works, unpinned, and logs
    that once; ``require_pinned=True`` makes it a :class:`PinnedMemoryError`.
    """

    def __init__(self, nbytes: int, *, require_pinned: bool = False, huge_pages: bool = True):
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise InvalidArgumentError(22, f"BufferPool size must be a positive int, got {nbytes!r}")
        try:
            self._pool = _core.Pool(nbytes, require_pinned, huge_pages)
        except OSError as e:
            if require_pinned:
                raise PinnedMemoryError(
                    e.errno or 12,
                    f"cannot pin {nbytes} bytes ({e.strerror}); raise RLIMIT_MEMLOCK "
                    "(ulimit -l) or grant CAP_IPC_LOCK",
                ) from e
            raise
        global _warned_unpinned
        if not self._pool.pinned and not _warned_unpinned:
            _warned_unpinned = True
            log.warning(
                "fx100io: could not lock %d bytes of buffer pool memory (RLIMIT_MEMLOCK); "
                "working unpinned and unregistered, which is slower. Raise `ulimit -l` or "
                "grant CAP_IPC_LOCK.",
                nbytes,
            )
        self._lock = threading.Lock()
        self._alloc = _core.Allocator(0, self._pool.size - self._pool.size % ALIGNMENT, ALIGNMENT)
        self._closed = False

    @property
    def size(self) -> int:
        return int(self._pool.size)

    @property
    def pinned(self) -> bool:
        """True if the memory is locked (and so registrable with io_uring)."""
        return bool(self._pool.pinned)

    @property
    def huge_pages(self) -> bool:
        return bool(self._pool.huge)

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return int(self._alloc.free_bytes)

    def alloc(self, n: int) -> np.ndarray:
        """A writable uint8 array of n bytes from the pool (4 KiB aligned)."""
        import numpy as np

        # Region exports the buffer protocol; numpy's stubs only list builtins.
        return np.frombuffer(self.alloc_view(n), dtype=np.uint8)  # type: ignore[call-overload]

    def alloc_view(self, n: int) -> memoryview:
        """The same as alloc(), as a plain memoryview (no numpy needed):
        what a caller that only hands buffers to the engine takes."""
        if self._closed:
            raise InvalidArgumentError(22, "BufferPool is closed")
        if not isinstance(n, int) or n <= 0:
            raise InvalidArgumentError(22, f"allocation size must be a positive int, got {n!r}")
        with self._lock:
            off = self._alloc.alloc(n)
        if off is None:
            raise DeviceFullError(
                28, f"BufferPool of {self.size} bytes has no free extent of {n} bytes "
                f"({self.free_bytes} bytes free)"
            )
        # Region exports the buffer protocol; the stubs cannot say so.
        return memoryview(_core.Region(self._pool, off, n, self._release))  # type: ignore[arg-type]

    def _release(self, off: int, n: int) -> None:
        with self._lock:
            self._alloc.free(off, n)

    def close(self) -> None:
        """No more allocations; the memory is unmapped once the last array
        made from it is gone."""
        self._closed = True

    def __enter__(self) -> BufferPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"BufferPool(size={self.size}, pinned={self.pinned}, "
                f"huge_pages={self.huge_pages}, free={self.free_bytes})")


class RegisteredMemory:
    """Handle of :func:`register_memory`.  The registration lasts as long as
    the handle: ``close()`` it (or drop it) before the memory's owner frees
    the memory, or queues would keep using the old pages."""

    def __init__(self, reg: _core.Registration):
        self._reg = reg

    @property
    def size(self) -> int:
        return int(self._reg.size)

    def close(self) -> None:
        self._reg.close()

    def __enter__(self) -> RegisteredMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def register_memory(buf: Any) -> RegisteredMemory:
    """Register memory fx100io did not allocate (for example LMCache's
    pinned CPU pool) so that reads and writes into any part of it use
    io_uring fixed buffers.  Python references to buf are held while
    registered, but memory freed by other means (a C allocator) must be
    unregistered first: keep the returned handle and ``close()`` it before
    the owner frees the memory, and after your I/O on it has finished (over
    NVMe/RDMA, closing drops the memory's registration: a command still
    using it fails, and takes its connection down with it).  Ranges outside
    registered memory keep working, unregistered."""
    try:
        reg = _core.Registration(buf)
    except BufferError:
        raise InvalidArgumentError(22, "register_memory needs a writable contiguous buffer") from None
    return RegisteredMemory(reg)


def aligned_array(n: int, alignment: int = ALIGNMENT) -> np.ndarray:
    """A zeroed uint8 array of n bytes whose address is aligned, for small
    metadata I/O that should take the O_DIRECT path without a pool."""
    import numpy as np

    raw = np.zeros(n + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + n]

"""The exception hierarchy (docs/architecture.md rule 3).

Every error fx100io raises is an :class:`Fx100ioError`, which is an
``OSError`` carrying ``errno``.  Where a builtin says the same thing, the
class inherits it too, so ``except FileNotFoundError`` and
``except PermissionError`` keep working.  C return codes become exceptions in
one place: :func:`error_from_errno`.
"""

from __future__ import annotations

import errno as _errno
import os


class Fx100ioError(OSError):
    """Base class of everything fx100io raises."""

    def __init__(self, err: int, message: str, target: str | None = None):
        super().__init__(err, message)
        self.target = target

    def __str__(self) -> str:
        where = f": {self.target}" if self.target else ""
        return f"{self.strerror}{where}"


class DeviceNotFoundError(Fx100ioError, FileNotFoundError):
    """The device, file or directory does not exist."""


class DevicePermissionError(Fx100ioError, PermissionError):
    """Not allowed to open or write the device."""


class DeviceFullError(Fx100ioError):
    """No space left: on the device, in the store's capacity, or in its index."""


class DeviceBusyError(Fx100ioError):
    """The device is in use by another ChunkStore (in this or another process)."""


class DeviceIOError(Fx100ioError):
    """The device failed an I/O (EIO and friends)."""


class DeviceClosedError(Fx100ioError, ValueError):
    """The device or store was closed."""


class StoreClosedError(DeviceClosedError):
    """The ChunkStore was closed."""


class BufferStillInUseError(DeviceClosedError):
    """The device was closed while the kernel still held this request's I/O
    and it did not come back within the close's bound: the kernel may still
    write (or read) the request's buffer, so the caller must never reuse it
    (fx100io keeps it referenced for the life of the process).  A plain
    DeviceClosedError from a request means its buffer is free again."""


class InvalidArgumentError(Fx100ioError, ValueError):
    """An argument is out of range or malformed."""


class Fx100ioMessageError(Fx100ioError):
    """An error raised with a message only, as a builtin exception is
    (``raise BenchError("--size: ...")``); its errno is the class's ``ERRNO``.  The
    base of the package's errors that began as RuntimeErrors and the like: each also
    inherits that builtin, so ``except RuntimeError`` keeps catching it."""

    ERRNO = _errno.EIO

    def __init__(self, *args: object) -> None:
        # The arguments mean what a builtin's mean, whatever their types: none gives an
        # empty message, one its str(), more the str() of their tuple; no argument is ever
        # taken for an errno (that is the class's).  args stays what was passed, so a
        # pickled one is rebuilt by calling the class with it again.
        if len(args) == 1:
            message = str(args[0])
        else:
            message = str(args) if args else ""
        super().__init__(self.ERRNO, message)
        self.args = args


class Fx100ioValueError(Fx100ioMessageError, ValueError):
    """A value fx100io cannot use, raised with a message only, as a ValueError is
    (``raise BackendConfigError("size: ...")``); its errno is EINVAL.  The base of
    the package's own ValueErrors, so ``except ValueError`` keeps catching them."""

    ERRNO = _errno.EINVAL


class KeyTooLongError(InvalidArgumentError):
    """A key is empty or longer than 1 KiB."""


class BufferTooSmallError(InvalidArgumentError):
    """An output buffer is smaller than the chunk to read into it."""


class ReadOnlyBufferError(Fx100ioError, BufferError):
    """An output buffer is not writable."""


class DirectIONotSupportedError(Fx100ioError):
    """The filesystem does not support O_DIRECT."""


class PinnedMemoryError(Fx100ioError, MemoryError):
    """Memory could not be locked (RLIMIT_MEMLOCK, no CAP_IPC_LOCK)."""


class IoUringUnavailableError(Fx100ioError, PermissionError):
    """io_uring is disabled (sysctl kernel.io_uring_disabled, seccomp)."""


class NotAStoreError(Fx100ioError):
    """The device holds no fx100io store, or a different one."""


class UnsupportedTransportError(InvalidArgumentError):
    """The URI names a transport this build does not have."""


class BlockingCallInLoopError(Fx100ioError, RuntimeError):
    """A *_blocking method was called from a running event loop."""


class FxTimeoutError(Fx100ioError, TimeoutError):
    """An operation did not finish in time."""


class FxConnectionError(Fx100ioError, ConnectionResetError):
    """A fabric connection dropped."""


class FxProtocolError(Fx100ioError):
    """The peer broke the protocol: a malformed PDU or a digest mismatch.
    The connection was closed; the next request reconnects."""


class PathMismatchError(Fx100ioError, ValueError):
    """A path to an NVMe-oF namespace shows another namespace than the one
    the device was opened on (other NGUID, EUI-64, UUID, size or block
    size): it is refused, never written to."""


class KernelSupportError(Fx100ioError):
    """The kernel path (fx100io.kernel) misses something of the kernel's: a module
    (nvme-fabrics, nvme-tcp, nvme-rdma) that is not loaded, or NVMe in-band
    authentication (CONFIG_NVME_AUTH) that it was built without."""


class NvmeCliNotFoundError(KernelSupportError, FileNotFoundError):
    """nvme-cli (the `nvme` command, Debian package nvme-cli) is not installed."""


class NvmeStatusError(Fx100ioError):
    """An NVMe command completed with an error status."""

    def __init__(self, status: int, message: str, target: str | None = None):
        super().__init__(_errno.EIO, message, target)
        self.status = status
        self.sc = status & 0xFF
        self.sct = (status >> 8) & 0x7
        self.dnr = bool(status & 0x4000)


_BY_ERRNO: dict[int, type[Fx100ioError]] = {
    _errno.ENOENT: DeviceNotFoundError,
    _errno.ENODEV: DeviceNotFoundError,
    _errno.ENXIO: DeviceNotFoundError,
    _errno.EACCES: DevicePermissionError,
    _errno.EROFS: DevicePermissionError,
    _errno.ENOSPC: DeviceFullError,
    _errno.EDQUOT: DeviceFullError,
    _errno.EFBIG: DeviceFullError,
    _errno.EIO: DeviceIOError,
    _errno.EBUSY: DeviceBusyError,
    _errno.EBADF: DeviceClosedError,
    _errno.EINVAL: InvalidArgumentError,
    _errno.EISDIR: InvalidArgumentError,
    _errno.EFAULT: InvalidArgumentError,
    _errno.ENOTSUP: DirectIONotSupportedError,
    _errno.ETIMEDOUT: FxTimeoutError,
    _errno.ETIME: FxTimeoutError,
    _errno.ECONNRESET: FxConnectionError,
    _errno.EPIPE: FxConnectionError,
    _errno.ECONNREFUSED: FxConnectionError,
    _errno.ECONNABORTED: FxConnectionError,
    _errno.ENOTCONN: FxConnectionError,
    _errno.EHOSTUNREACH: FxConnectionError,
    _errno.ENETUNREACH: FxConnectionError,
    _errno.EPROTO: FxProtocolError,
    _errno.EBADMSG: FxProtocolError,
}


def error_from_errno(err: int, what: str | None = None) -> Fx100ioError:
    """The exception for a C return code -err (one table, docs/architecture.md rule 3)."""
    cls = _BY_ERRNO.get(err, Fx100ioError)
    return cls(err, os.strerror(err), what)


def error_from_status(status: int, what: str | None = None) -> NvmeStatusError:
    sct, sc = (status >> 8) & 0x7, status & 0xFF
    return NvmeStatusError(status, f"NVMe status SCT {sct:#x} SC {sc:#04x}", what)

"""open_device(uri) -> Device: the same API for files, block devices
(kernel-attached NVMe-oF namespaces included) and NVMe/TCP namespaces reached
from userspace."""

from __future__ import annotations

import errno
import logging
import os
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from fx100io import _core, fabric_uri
from fx100io import priority as prio
from fx100io.aio import Completion, QueueDriver, Request, close_in_thread
from fx100io.errors import (
    DeviceClosedError,
    DirectIONotSupportedError,
    InvalidArgumentError,
    IoUringUnavailableError,
    PathMismatchError,
    ReadOnlyBufferError,
    UnsupportedTransportError,
    error_from_errno,
    error_from_status,
)

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("fx100io")

ENGINES = ("io_uring", "psync", "auto")
PATHS = ("user", "kernel")
DEFAULT_QUEUE_DEPTH = 64
DEFAULT_MAX_IO = 1 << 20

# The request op codes of Device.submit / start / submit_blocking: public
# here so that callers need not reach into the C extension for them.
OP_READ: int = _core.OP_READ
OP_WRITE: int = _core.OP_WRITE
OP_FLUSH: int = _core.OP_FLUSH
#: OR into OP_READ / OP_WRITE: the completion also carries the bytes' CRC32C
OP_CRC32C: int = _core.OP_CRC32C


def parse_uri(uri: str) -> tuple[str, str]:
    """(scheme, target) of a device URI; plain paths are files.  For
    NVMe-oF schemes the target is the C transport's key=value form (without
    the URI's secrets: fabric_uri.to_transport has those apart)."""
    if not isinstance(uri, str) or not uri:
        raise InvalidArgumentError(22, "device URI must be a non-empty str, got "
                                   f"{fabric_uri.redact(uri)!r}")
    if "://" not in uri:
        return "file", uri
    parts = urlsplit(uri)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidArgumentError(22, "file:// URIs name a local path (file:///path)", uri)
        return "file", unquote(parts.path)
    if parts.scheme in fabric_uri.SCHEMES:
        return parts.scheme, fabric_uri.to_transport_target(uri)
    raise UnsupportedTransportError(
        22, f"unknown device scheme {parts.scheme!r} (use file:///path, /path, /dev/..., "
        "nvme+tcp://host:port/subnqn or nvme+rdma://host:port/subnqn)", fabric_uri.redact(uri))


def io_uring_refusal_reason() -> str:
    """Why io_uring_setup was refused, in words a user can act on."""
    try:
        with open("/proc/sys/kernel/io_uring_disabled") as f:
            level = int(f.read().strip() or 0)
    except (OSError, ValueError):
        level = 0
    if level:
        return (f"io_uring is disabled by sysctl kernel.io_uring_disabled={level}; "
                "set it to 0, or open the device with engine='psync' (or 'auto')")
    return ("io_uring_setup was refused, most likely by a seccomp filter (Docker's default "
            "profile blocks io_uring); allow io_uring_setup/enter/register, or open the device "
            "with engine='psync' (or 'auto')")


class Device:
    """A block-addressable device.  Use :func:`open_device`.

    Every async method has a ``_blocking`` twin callable from any thread.
    Each thread gets its own queue (io_uring rings are single-issuer), made
    on first use.
    """

    def __init__(self, uri: str, *, direct: bool | str = "auto", readonly: bool = False,
                 create: bool = False, size: int | None = None, engine: str = "io_uring",
                 queue_depth: int = DEFAULT_QUEUE_DEPTH, max_io: int = DEFAULT_MAX_IO,
                 slots: int = 4096, path: str = "user",
                 write_depth: int = prio.WRITE_DEPTH_DEFAULT, io_priority: bool = True):
        if path not in PATHS:
            raise InvalidArgumentError(22, f"path must be 'user' (fx100io's own NVMe-oF "
                                       f"initiator) or 'kernel' (attach with nvme-cli), got {path!r}")
        kernel_path = path == "kernel" and isinstance(uri, str) and \
            uri.split("://", 1)[0].lower() in fabric_uri.SCHEMES and "://" in uri
        # the kernel path checks its URI itself (fx100io.kernel.target_of)
        scheme, target = ("file", uri) if kernel_path else parse_uri(uri)
        if engine not in ENGINES:
            raise InvalidArgumentError(22, f"engine must be one of {ENGINES}, got {engine!r}")
        if direct not in (True, False, "auto"):
            raise InvalidArgumentError(22, f"direct must be True, False or 'auto', got {direct!r}")
        for name, v in (("queue_depth", queue_depth), ("max_io", max_io), ("slots", slots),
                        ("write_depth", write_depth)):
            if not isinstance(v, int) or v <= 0:
                raise InvalidArgumentError(22, f"{name} must be a positive int, got {v!r}")
        if size is not None and (not isinstance(size, int) or size < 0):
            raise InvalidArgumentError(22, f"size must be a non-negative int, got {size!r}")
        if not isinstance(io_priority, bool):
            raise InvalidArgumentError(22, f"io_priority must be True or False, got {io_priority!r}")
        self._ioprio = io_priority
        # what the URI says shown with its secrets hidden (repr, errors, the
        # store and bench print it); the secrets go to C alone, at open
        self.uri = fabric_uri.redact(uri)
        self.target = target
        secrets = fabric_uri.to_transport(uri)[1] if scheme in fabric_uri.SCHEMES else ""
        self._qopts = (queue_depth, max_io, slots, write_depth)
        self._local = threading.local()
        self._drivers: weakref.WeakSet[QueueDriver] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False
        self.path = path
        self.kernel_attachment: Any = None  # fx100io.kernel.Attachment on the kernel path
        if kernel_path:
            from fx100io import kernel

            self.kernel_attachment = kernel.attach(uri)
            scheme, target = "file", self.kernel_attachment.path
            self.target = target
            self.uri = kernel.redact(uri)  # no secrets in reprs, stats and messages
        try:
            self._open_and_probe(scheme, target, direct, readonly, create, size, engine, secrets)
        except BaseException:
            if self.kernel_attachment is not None:
                self.kernel_attachment.release()
            raise

    def _open_and_probe(self, scheme: str, target: str, direct: bool | str, readonly: bool,
                        create: bool, size: int | None, engine: str, secrets: str = "") -> None:
        if scheme == "file":
            transport = "psync" if engine == "psync" else "file"
        elif engine == "psync":
            raise InvalidArgumentError(22, f"engine='psync' is for files and block devices, not {scheme}")
        else:
            transport = scheme
        self._dev = self._open(transport, target, direct, readonly, create, size or 0, secrets,
                               self._ioprio)
        self.engine = "psync" if transport == "psync" else "io_uring"
        self.transport = transport
        try:
            self._driver()  # surface io_uring trouble at open, not at first I/O
        except IoUringUnavailableError:
            if engine != "auto":
                self._dev.close()
                raise
            log.warning("fx100io: %s; falling back to the psync engine for %s",
                        io_uring_refusal_reason(), target)
            self._dev.close()
            self._dev = self._open("psync", target, direct, readonly, False, 0, "", self._ioprio)
            self.engine = "psync"
            self._driver()

    @staticmethod
    def _open(transport: str, target: str, direct: bool | str, readonly: bool,
              create: bool, size: int, secrets: str = "", ioprio: bool = True) -> _core.Dev:
        if transport in fabric_uri.SCHEMES:
            return fabric_uri.open_fabric_dev(transport, target, readonly, secrets)
        try:
            return _core.Dev(transport, target, direct is not False, readonly, create, size,
                             ioprio=ioprio)
        except DirectIONotSupportedError:
            if direct is True:
                raise DirectIONotSupportedError(
                    95, "the filesystem does not support O_DIRECT; use direct=False or 'auto'",
                    target) from None
            log.warning("fx100io: %s does not support O_DIRECT; using the page cache", target)
            return _core.Dev(transport, target, False, readonly, create, size, ioprio=ioprio)

    # -- properties ------------------------------------------------------
    @property
    def size(self) -> int:
        return int(self._dev.size)

    @property
    def block_size(self) -> int:
        """Alignment (offset, length, address) of the zero-copy O_DIRECT path."""
        return int(self._dev.block_size)

    @property
    def direct(self) -> bool:
        return bool(self._dev.caps & 0x1)

    @property
    def is_block_device(self) -> bool:
        return bool(self._dev.caps & 0x4)

    @property
    def aligned_only(self) -> bool:
        """Offsets and lengths must be multiples of block_size (NVMe-oF)."""
        return bool(self._dev.caps & 0x10)

    @property
    def io_priority(self) -> bool:
        """Load reads carry the realtime I/O priority class to the kernel:
        the block device under the file orders requests by class
        (mq-deadline, bfq).  False where it would be ignored (scheduler
        "none", tmpfs, NVMe-oF from userspace) and where the device was
        opened with io_priority=False; turns False once the kernel refuses
        the class (no CAP_SYS_NICE): loads then go first in fx100io's queue
        only."""
        return bool(self._dev.caps & 0x40)

    @property
    def closed(self) -> bool:
        return self._closed

    def queue_stats(self) -> dict[str, int]:
        """Counters of the calling thread's queue: ios, bytes, fixed_ios
        (registered buffers used), bytes_direct / bytes_copied (where
        received bytes went), reconnects, conn_errors, and for NVMe/RDMA
        remote_invalidations / local_invalidations (how command keys ended),
        pieces_load / pieces_store / pieces_background and prio_shares (the
        priority classes), ioprio_ios (reads the kernel ran with the
        realtime I/O priority; a refused try, retried without it, is not
        counted), and for NVMe/TCP with queues >= 2 conn_fallbacks /
        load_conn_writes (docs/architecture.md, "Priority and write admission"),
        with TLS ktls_conns / tls_user_conns (I/O connections made on the
        kernel's record layer, or on ours: docs/nvme-tcp.md, "kTLS")."""
        return dict(self._driver().queue.stats())

    def features(self) -> list[str]:
        """io_uring features the calling thread's queue ended up with."""
        return list(self._driver().queue.features)

    # -- queues ------------------------------------------------------------
    # A thread's queue is made for how its completions will be waited for:
    # by an event loop sleeping on the queue's fd (asyncio), or in C
    # (fx_queue_wait: the blocking twins, fx100io bench's C loop).  The
    # kernel wakes an fd waiter late on a ring set up for C waits
    # (FX_QUEUE_FD_WAKE in fx100io.h: 10-40 ms per wake-up), so the async
    # calls use an fd-wake queue, made the first time this thread asks; the
    # blocking calls use whichever queue the thread has.
    def _driver(self, fd_wake: bool | None = None) -> QueueDriver:
        """This thread's queue.  fd_wake None: any (a new one is made for
        an event loop if this thread runs one now); True: one whose
        completions wake an event loop at once, replacing an idle queue made
        for C waits."""
        d = getattr(self._local, "driver", None)
        if d is not None:
            if not fd_wake or d.fd_wake or not d.idle or d.raw:
                return d
            self._drop_driver(d)  # idle, made for C waits: replaced below
        if self._closed:
            raise DeviceClosedError(9, "device is closed", self.target)
        if fd_wake is None:
            fd_wake = _loop_running()
        return self._install(self._new_queue(fd_wake), fd_wake)

    def _new_queue(self, fd_wake: bool, defer_enable: bool = False) -> _core.Queue:
        depth, max_io, slots, write_depth = self._qopts
        try:
            return _core.Queue(self._dev, depth, max_io, slots, fd_wake, write_depth,
                               defer_enable)
        except OSError as e:
            if e.errno in (1, 38):  # EPERM, ENOSYS from io_uring_setup
                raise IoUringUnavailableError(e.errno, io_uring_refusal_reason(), self.target) from e
            raise

    def _install(self, q: _core.Queue, fd_wake: bool) -> QueueDriver:
        """Make q this thread's queue."""
        d = QueueDriver(q, fd_wake)
        self._local.driver = d
        with self._lock:
            self._drivers.add(d)
        return d

    # An event loop never makes a queue on an NVMe-oF device itself: that is
    # a connect (TCP, ICReq, Fabrics Connect, maybe a controller re-open), up
    # to connect_timeout_ms (docs/architecture.md rule 14).  A thread of its
    # own makes it with its ring disabled, and the loop's thread enables it
    # (FX_QUEUE_DEFER_ENABLE: the enabling thread becomes the ring's single
    # issuer).  Requests of the loop wait for it without blocking the loop.
    def _loop_ready(self) -> QueueDriver | None:
        """This event loop thread's queue when it has one to use now."""
        d = getattr(self._local, "driver", None)
        if d is not None and (d.fd_wake or not d.idle or d.raw):
            return d
        return None

    async def _loop_driver(self, guard: Any = None) -> QueueDriver | None:
        """This event loop thread's queue, made off the loop when it has
        none.  guard (multipath): (lock, wanted) held and asked by the
        making thread; None when wanted() said no.  Cancelled, the making
        goes on, for this thread's next request."""
        d = self._loop_ready()
        if d is not None:
            return d
        if self._closed:
            raise DeviceClosedError(9, "device is closed", self.target)
        if self.transport not in fabric_uri.SCHEMES:
            return self._driver(True)  # a file's queue waits on nothing
        import asyncio

        making = self._start_loop_queue(asyncio.get_running_loop(), guard)
        return await asyncio.shield(making)  # type: ignore[no-any-return]

    def _start_loop_queue(self, loop: asyncio.AbstractEventLoop, guard: Any = None) -> Any:
        """Start making this event loop thread's queue (once: later callers
        get the same future); a future of the QueueDriver (None: guard did
        not want it), resolved on the loop."""
        making = getattr(self._local, "making", None)
        if making is not None and making.get_loop() is loop:
            return making  # (one of a loop closed meanwhile is left behind: asyncio.run twice)
        making = self._local.making = loop.create_future()
        local = self._local

        def deliver(q: _core.Queue | None, err: BaseException | None) -> None:
            if local.making is making:
                local.making = None
            if self._closed or self._local is not local:  # whatever the making met
                if q is not None:
                    q.close()
                q, err = None, DeviceClosedError(9, "device closed while its queue was made",
                                                 self.target)
            if err is None and q is not None:
                try:
                    q.enable()  # no network: a register call that ties the ring to this thread
                except BaseException as e:
                    q.close()
                    err = e
            if err is not None:
                if not making.done():
                    making.set_exception(err)
                    making.exception()  # a caller cancelled meanwhile: seen
                return
            d = None
            if q is not None:
                old = getattr(local, "driver", None)
                if old is not None and self._loop_ready() is old:
                    q.close()  # this thread got one meanwhile (a raw or busy queue)
                    d = old
                else:
                    if old is not None:
                        self._drop_driver(old)  # idle, made for C waits
                    d = self._install(q, True)
            if not making.done():
                making.set_result(d)

        def work() -> None:
            q, err = None, None
            try:
                if guard is None:
                    q = self._new_queue(True, defer_enable=True)
                else:
                    lock, wanted = guard
                    with lock:
                        if wanted():
                            q = self._new_queue(True, defer_enable=True)
            except BaseException as e:
                err = e
            try:
                loop.call_soon_threadsafe(deliver, q, err)
            except RuntimeError:  # the loop closed meanwhile: nobody wants it
                if q is not None:
                    q.close()

        threading.Thread(target=work, daemon=True, name="fx100io-queue-connect").start()
        return making

    def _drop_driver(self, d: QueueDriver) -> None:
        """Close this thread's idle queue d (nothing in flight or waiting)."""
        self._local.driver = None
        with self._lock:
            self._drivers.discard(d)
        d.detach()
        d.queue.close()

    def _request(self, op: int, offset: int, buf: Any, priority: Any = None,
                 stream: int = 0) -> Request:
        """One request for the queue.  priority None: a read is a load,
        a write or flush a store (fx100io.priority)."""
        if not isinstance(offset, int) or offset < 0:
            raise InvalidArgumentError(22, f"offset must be a non-negative int, got {offset!r}")
        if not isinstance(op, int) or op & ~0xFFFF:
            raise InvalidArgumentError(22, f"op must be OP_READ, OP_WRITE or OP_FLUSH, or'ed "
                                       f"with OP_CRC32C, got {op!r}")
        base_op = op & 0xFF
        p = prio.parse(priority, prio.LOAD if base_op == _core.OP_READ else prio.STORE)
        op = prio.tagged(op, p, stream)
        if base_op == _core.OP_FLUSH:
            return (op, None, 0, 0, 0)
        try:
            mv = memoryview(buf)
        except TypeError:
            raise InvalidArgumentError(
                22, f"expected a buffer (bytes-like, numpy array), got {type(buf).__name__}") from None
        if base_op == _core.OP_READ and mv.readonly:
            raise ReadOnlyBufferError(30, "cannot read into a read-only buffer", self.target)
        if not mv.contiguous:
            raise InvalidArgumentError(22, "buffer must be contiguous", self.target)
        addr, n = _core.buffer_address(mv, base_op == _core.OP_READ)
        if self.aligned_only and (offset | n) % self.block_size:
            raise InvalidArgumentError(
                22, f"{self.transport} moves whole blocks: offset {offset} and length {n} must be "
                f"multiples of {self.block_size}", self.uri)
        return (op, mv, addr, n, offset)

    def _check(self, req: Request, done: Completion) -> int:
        res, status = done[0], done[1]
        if status:
            raise error_from_status(status, f"{self.target} offset {req[4]}")
        if res < 0:
            if -res == errno.ESTALE and self.transport not in ("file", "psync"):
                # the C fabric device's re-open found another namespace behind
                # the name (on a file, ESTALE is NFS's stale handle: left as is)
                raise PathMismatchError(errno.ESTALE, "the controller came back onto another "
                                        "namespace", f"{self.target} offset {req[4]}")
            raise error_from_errno(-res, f"{self.target} offset {req[4]}")
        return res

    # -- async API ---------------------------------------------------------
    # Every I/O call takes priority= (fx100io.Priority or its name; None: a
    # read is a load, a write or a flush a store) and the batch calls a
    # stream= (fx100io.priority.new_stream(); None: one of their own): the
    # order in which the queue issues pieces (docs/architecture.md,
    # "Priority and write admission").
    def _requests(self, reqs: list[tuple[int, int, Any]], priority: Any,
                  stream: int | None) -> list[Request]:
        sid = prio.stream_or_new(stream)
        return [self._request(op, off, buf, priority, sid) for op, off, buf in reqs]

    async def _drv(self) -> QueueDriver:
        d = self._loop_ready()
        if d is None:
            d = await self._loop_driver()
            assert d is not None
        return d

    async def submit(self, reqs: list[tuple[int, int, Any]], *, priority: Any = None,
                     stream: int | None = None) -> list[Completion]:
        """Run [(op, offset, buf), ...] concurrently; (res, status) each, in order."""
        rs = self._requests(reqs, priority, stream)
        futs = (await self._drv()).submit(rs)
        return [await f for f in futs]

    def start(self, reqs: list[tuple[int, int, Any]], *, priority: Any = None,
              stream: int | None = None) -> list[asyncio.Future]:
        """Submit [(op, offset, buf), ...] now; one future of (res, status)
        each, (res, status, crc32c) for an op or'ed with OP_CRC32C.  Lets a
        caller overlap its own work with the I/O.  Where this loop has no
        queue on an NVMe-oF device yet, each future is a task that waits for
        the queue (made off the loop) and, cancelled, for its request to
        stop touching the buffer."""
        rs = self._requests(reqs, priority, stream)
        d = self._loop_ready()
        if d is None and self.transport in fabric_uri.SCHEMES:
            import asyncio

            loop = asyncio.get_running_loop()
            return [loop.create_task(self._later(r)) for r in rs]
        return (d or self._driver(True)).submit(rs)

    async def _later(self, r: Request) -> Completion:
        drv = await self._drv()
        (f,) = drv.submit([r])
        return await _io_done(drv, f)  # type: ignore[no-any-return]

    async def read_into(self, offset: int, buf: Any, *, priority: Any = None) -> int:
        """Read len(buf) bytes at offset into buf; returns bytes read (short at
        end).  Cancelled, it returns only once the read stopped touching buf."""
        r = self._request(_core.OP_READ, offset, buf, priority, prio.new_stream())
        drv = self._loop_ready() or await self._drv()
        (f,) = drv.submit([r])
        return self._check(r, await _io_done(drv, f))

    async def write_from(self, offset: int, buf: Any, *, priority: Any = None) -> int:
        """Write buf at offset.  Cancelled, it returns only once the write
        stopped reading buf (it may or may not have landed)."""
        r = self._request(_core.OP_WRITE, offset, buf, priority, prio.new_stream())
        drv = self._loop_ready() or await self._drv()
        (f,) = drv.submit([r])
        return self._check(r, await _io_done(drv, f))

    async def flush(self, *, priority: Any = None) -> None:
        """Make completed writes durable (fdatasync)."""
        r = self._request(_core.OP_FLUSH, 0, None, priority)
        (f,) = (self._loop_ready() or await self._drv()).submit([r])
        self._check(r, await f)

    def raw_queue(self) -> _core.Queue:
        """The calling thread's C queue, for a caller that drives submission
        and completion itself and cannot pay for a future per I/O (``fx100io
        bench`` at small block sizes).  ``submit([(op, addr, len, off, tag),
        ...])`` returns how many it accepted, ``wait(n, ms)`` blocks without the
        GIL, ``reap()`` returns ``[(tag, res, status, crc32c), ...]``.  Keep each
        buffer alive until its completion is reaped, and use no other I/O call
        of this device on this thread while such requests are outstanding: it
        would reap their completions.  The queue stays this thread's for good
        (an async call later on this thread uses it too, rather than replace
        it under the caller)."""
        d = self._driver()
        d.raw = True
        return d.queue

    # -- blocking twins ------------------------------------------------------
    def submit_blocking(self, reqs: list[tuple[int, int, Any]], *, priority: Any = None,
                        stream: int | None = None) -> list[Completion]:
        return self._driver().run_blocking(self._requests(reqs, priority, stream))

    def read_into_blocking(self, offset: int, buf: Any, *, priority: Any = None) -> int:
        r = self._request(_core.OP_READ, offset, buf, priority, prio.new_stream())
        return self._check(r, self._driver().run_blocking([r])[0])

    def write_from_blocking(self, offset: int, buf: Any, *, priority: Any = None) -> int:
        r = self._request(_core.OP_WRITE, offset, buf, priority, prio.new_stream())
        return self._check(r, self._driver().run_blocking([r])[0])

    def flush_blocking(self, *, priority: Any = None) -> None:
        r = self._request(_core.OP_FLUSH, 0, None, priority)
        self._check(r, self._driver().run_blocking([r])[0])

    # -- lifetime ------------------------------------------------------------
    def close(self) -> None:
        """Close every thread's queue, then the device.  Requests not yet
        sent (waiting for a reconnect, or for a free slot) fail with
        DeviceClosedError.  A thread blocked in a blocking call gets
        DeviceClosedError once the I/Os the kernel holds for it are back,
        with no time limit (one between two calls: from its next call, after
        the same wait); this waits up to 5 s (FX_QUEUE_DRAIN_MS) for all of
        them together, then leaves the rest of the close to those threads
        (on an event loop's thread it does not wait for them at all).  A
        request nobody's call waits for (an event loop's) still with the
        kernel after those 5 s is logged, fails with BufferStillInUseError,
        and its buffer is kept for good (fx100io.aio.left_with_kernel()).
        A reconnect in progress is cancelled.  Against a target that
        stopped answering, closing its controller waits up to 2 s for the
        shutdown handshake."""
        if self._closed:
            return
        self._closed = True
        self._close_queues_and_device()

    def _close_queues_and_device(self) -> None:
        with self._lock:
            drivers = list(self._drivers)
        # Every queue is marked first: the threads blocked on them all start
        # waiting for their own I/Os at once, and one deadline bounds this
        # close as a whole, not each queue in turn.
        for d in drivers:
            d.detach()
            d.queue.begin_close()
        deadline = time.monotonic() + _core.QUEUE_DRAIN_MS / 1000
        # A thread blocked in a call waits for its own I/Os and finishes its
        # queue's close itself: not waited for one queue at a time (the
        # queues nobody is inside get the whole time), and on an event loop
        # not at all (the loop must not stall on other threads' I/O).
        # An event loop's queue is only ever inside a short reap or submit
        # (its thread does not block in C): waited for, so that its thread
        # is not left to finish the close and stall its loop.
        on_loop = _loop_running()
        inside = []
        for d in drivers:
            users_ms = (100 if on_loop else -1) if d.fd_wake else 0
            if d.queue.close(max(int((deadline - time.monotonic()) * 1000), 0), users_ms):
                inside.append(d.queue)
            d.abandon(lambda: DeviceClosedError(
                9, "device closed before the request completed", self.target))
        if not on_loop:
            while any(not q.destroyed for q in inside) and time.monotonic() < deadline:
                time.sleep(0.002)
        self._local = threading.local()
        try:
            self._dev.close()
        finally:
            if self.kernel_attachment is not None:
                self.kernel_attachment.release()  # detaches only what this device attached

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Device:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """close(), off the event loop (what ``async with`` calls): waiting
        for this loop's own I/O (up to 5 s) or a controller's shutdown must
        not stall the loop.  The device is closed to new requests at once;
        cancelled, the close still ends in its thread."""
        import asyncio

        if self._closed:
            return
        self._closed = True  # new requests fail from now on
        loop = asyncio.get_running_loop()
        with self._lock:
            drivers = list(self._drivers)
        for d in drivers:
            if d._loop is loop:
                d.detach()  # (on its loop's thread: add/remove_reader are not thread-safe)
        await close_in_thread(self._close_queues_and_device, "fx100io-device-close")

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"size={self.size}, block_size={self.block_size}"
        return f"Device({self.uri!r}, engine={self.engine}, {state})"


def _loop_running() -> bool:
    """Whether this thread runs an asyncio event loop now (without importing
    asyncio where nothing did: a program using only blocking calls never
    pays for it)."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def open_device(uri: str, **opts: Any) -> Device:
    """Open a device by URI: ``file:///path``, ``/path``, ``/dev/loop3``.

    Options: direct ("auto": O_DIRECT when the filesystem has it; True:
    require it; False: page cache), readonly, create and size (create or grow
    a file), engine ("io_uring", "psync", or "auto": io_uring, else psync
    with a warning), queue_depth (pieces in flight per thread, 64), max_io
    (bytes per piece, 1 MiB), slots (requests queued per thread, 4096),
    write_depth (store and background writes in flight per thread while a
    load read waits, 4: see fx100io.priority), io_priority (True: load reads
    carry the realtime I/O priority where the disk's scheduler orders by
    class; False: never, so other processes' I/O on that disk is not held
    back by our loads; Device.io_priority says what is in effect),
    path ("user": nvme+tcp:// and nvme+rdma:// through fx100io's own initiator;
    "kernel": the kernel attaches the namespace with nvme-cli (fx100io.kernel)
    and the device runs on its /dev/nvmeXnY with io_uring and O_DIRECT like any
    block device; closing detaches the controller if this device attached it.
    Files and block devices are opened as they are with either).

    An NVMe-oF URI naming several paths to one subsystem
    (``nvme+tcp://A:4420,B:4420/NQN``) or ``paths=discover`` gives a
    :class:`fx100io.multipath.MultipathDevice`: the same calls, each request
    moved to another live path when its path fails (docs/nvme-tcp.md).
    """
    uri = os.fspath(uri) if isinstance(uri, os.PathLike) else uri
    if isinstance(uri, str) and opts.get("path", "user") == "user" and \
            uri.split("://", 1)[0].lower() in fabric_uri.SCHEMES and fabric_uri.is_multipath(uri):
        from fx100io.multipath import MultipathDevice

        return MultipathDevice(uri, **opts)  # type: ignore[return-value]
    return Device(uri, **opts)


async def _io_done(drv: QueueDriver, f: Any) -> Any:
    """Await one request's future.  If the caller is cancelled, the cancel
    goes on only once the request is back from C (a read still lands in the
    caller's buffer until then, a write still reads it); one not yet handed
    to C is simply taken back.  A plain await costs nothing more on the way
    that is not cancelled."""
    try:
        return await f
    except BaseException:
        if f.cancelled():
            import asyncio

            fresh = drv.withdraw(f)
            while fresh is not None and not fresh.done():
                try:
                    await asyncio.wait([fresh])
                except asyncio.CancelledError:
                    pass  # cancelled again: the request still has to come back
            if fresh is not None and not fresh.cancelled():
                fresh.exception()  # seen: the caller is being cancelled
        raise

# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin binding of the C core: convert arguments, call C without the GIL,
raise from the return code.  No policy lives here."""

from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE,
                             PyBUF_WRITABLE, PyBUF_ANY_CONTIGUOUS)
from libc.stdlib cimport malloc, free
from posix.unistd cimport usleep

cdef enum:
    CLOSE_POLL_MS = 100  # how soon a blocked wait notices another thread closing its queue
from libc.string cimport memset
from libc.stdint cimport uintptr_t

import logging as _logging
import sys as _sys
import time as _time

from fx100io.errors import error_from_errno

OP_READ = FX_OP_READ
#: how long a queue's close waits for the I/Os the kernel holds (ms)
QUEUE_DRAIN_MS = FX_QUEUE_DRAIN_MS
OP_WRITE = FX_OP_WRITE
OP_FLUSH = FX_OP_FLUSH
#: OR into OP_READ / OP_WRITE: the completion also carries the CRC32C of the
#: request's bytes, computed piece by piece as the pieces land (FX_REQ_CRC32C).
OP_CRC32C = FX_REQ_CRC32C << 8
#: A request's priority class (enum fx_prio) sits in bits 16-23 of its op,
#: its stream id (load requests of one stream take one turn of the round
#: robin) in bits 32-63: op | prio << PRIO_SHIFT | stream << STREAM_SHIFT.
PRIO_SHIFT = 16
STREAM_SHIFT = 32
PRIO_LOAD = FX_PRIO_LOAD
PRIO_STORE = FX_PRIO_STORE
PRIO_BACKGROUND = FX_PRIO_BACKGROUND
PRIO_SHARE = FX_PRIO_SHARE
WRITE_DEPTH_DEFAULT = FX_WRITE_DEPTH_DEFAULT
REC_PUT = FX_REC_PUT
REC_DEL = FX_REC_DEL
KEY_MAX = FX_KEY_MAX
SEG_HDR_SIZE = FX_SEG_HDR_SIZE

RING_FEATURES = {
    0x1: "single_issuer", 0x2: "defer_taskrun", 0x4: "coop_taskrun",
    0x10: "fixed_files", 0x20: "fixed_buffers",
}

cdef int check(long long rc, str what) except -1:
    if rc < 0:
        raise error_from_errno(<int>-rc, what)
    return 0


def buffer_address(obj, bint writable):
    """(address, nbytes) of a contiguous buffer.  The caller keeps obj (a
    memoryview, which holds the export) alive while the address is used."""
    cdef Py_buffer view
    cdef int flags = PyBUF_ANY_CONTIGUOUS | (PyBUF_WRITABLE if writable else PyBUF_SIMPLE)
    PyObject_GetBuffer(obj, &view, flags)
    addr = <uintptr_t>view.buf
    n = view.len
    PyBuffer_Release(&view)
    return addr, n


def crc32c(obj, unsigned int crc=0):
    """CRC32C of any contiguous buffer, chained from crc; the GIL is
    released for the computation."""
    cdef Py_buffer view
    cdef uint32_t out
    PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE | PyBUF_ANY_CONTIGUOUS)
    try:
        with nogil:
            out = fx_crc32c(crc, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return out


def crc32c_combine(unsigned int crc1, unsigned int crc2, unsigned long long len2):
    """CRC32C of a followed by b, from crc32c(a), crc32c(b) and len(b)."""
    return fx_crc32c_combine(crc1, crc2, len2)


cdef class Allocator:
    """Extent allocator (csrc/alloc.c)."""
    cdef fx_alloc *a

    def __cinit__(self, uint64_t base, uint64_t size, uint32_t align):
        check(fx_alloc_create(base, size, align, &self.a), "allocator")

    def __dealloc__(self):
        if self.a != NULL:
            fx_alloc_destroy(self.a)

    def alloc(self, uint64_t length):
        """Offset of a new extent, or None when no free extent fits."""
        cdef uint64_t off = 0
        rc = fx_alloc_alloc(self.a, length, &off)
        if rc == -28:  # ENOSPC: the caller decides whether to evict
            return None
        check(rc, "allocate extent")
        return off

    def free(self, uint64_t off, uint64_t length):
        check(fx_alloc_free(self.a, off, length), "free extent")

    def reserve(self, uint64_t off, uint64_t length):
        check(fx_alloc_reserve(self.a, off, length), "reserve extent")

    @property
    def free_bytes(self):
        return fx_alloc_free_bytes(self.a)

    @property
    def largest_free(self):
        return fx_alloc_largest_free(self.a)

    @property
    def free_extents(self):
        return fx_alloc_free_extents(self.a)


def encode_segment(uint64_t generation, uint64_t seq, list recs):
    """Encode index records [(type, key, dev, off, len, crc), ...] as one
    segment; returns bytes."""
    cdef unsigned n = len(recs)
    cdef fx_index_rec *c = <fx_index_rec *>malloc(max(n, 1) * sizeof(fx_index_rec))
    cdef size_t cap = FX_SEG_HDR_SIZE
    cdef bytes out
    cdef int64_t rc
    if c == NULL:
        raise MemoryError()
    keys = []
    try:
        for i, (typ, key, dev, off, length, crc) in enumerate(recs):
            if not isinstance(key, bytes):
                raise TypeError("index keys are bytes")
            keys.append(key)
            c[i].type = typ
            c[i].flags = 0
            c[i].key_len = len(key) if len(key) <= 0xffff else 0
            c[i].data_crc = crc
            c[i].off = off
            c[i].len = length
            c[i].dev = dev
            c[i].key = <const uint8_t *>(<char *>key)
            cap += fx_index_rec_size(len(key))
        out = bytes(cap)
        rc = fx_index_seg_encode(generation, seq, c, n, <char *>out, cap)
        check(rc, "encode index segment")
        return out[:rc]
    finally:
        free(c)


def decode_segment(buf, size_t offset, uint64_t generation):
    """Decode the segment at buf[offset:].  Returns (size, seq, records)
    with size 0 at the end of the log (or a torn segment: size -1)."""
    cdef Py_buffer view
    cdef uint64_t seq = 0
    cdef unsigned nrecs = 0
    cdef unsigned cap = 4096
    cdef fx_index_rec *c
    cdef int64_t rc
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE | PyBUF_ANY_CONTIGUOUS)
    try:
        if offset >= <size_t>view.len:
            return 0, 0, []
        while True:
            c = <fx_index_rec *>malloc(cap * sizeof(fx_index_rec))
            if c == NULL:
                raise MemoryError()
            try:
                rc = fx_index_seg_decode(<char *>view.buf + offset, view.len - offset,
                                         generation, &seq, c, cap, &nrecs)
                if rc == -28:  # more records than cap: retry bigger
                    cap *= 4
                    continue
                if rc == -74:  # EBADMSG: torn or corrupt segment
                    return -1, 0, []
                check(rc, "decode index segment")
                recs = [(c[i].type, (<char *>c[i].key)[:c[i].key_len], c[i].dev,
                         c[i].off, c[i].len, c[i].data_crc) for i in range(nrecs)]
                return rc, seq, recs
            finally:
                free(c)
    finally:
        PyBuffer_Release(&view)


cdef int _export_bytes(Py_buffer *view, object owner, void *buf, Py_ssize_t n,
                       Py_ssize_t *shape, Py_ssize_t *strides) except -1:
    """Fill view as a writable 1-D uint8 buffer of n bytes at buf; shape and
    strides are the owner's storage (they must outlive the view)."""
    shape[0] = n
    strides[0] = 1
    view.buf = buf
    view.obj = owner
    view.len = n
    view.readonly = 0
    view.itemsize = 1
    view.format = "B"
    view.ndim = 1
    view.shape = shape
    view.strides = strides
    view.suboffsets = NULL
    view.internal = NULL
    return 0


cdef class Pool:
    """Pinned memory (csrc/bufpool.c).  Exposes the whole mapping through
    the buffer protocol; sub-allocation happens in Python."""
    cdef fx_pool *p
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __cinit__(self, uint64_t size, bint require_pinned=False, bint huge=True):
        cdef unsigned flags = (FX_POOL_REQUIRE_PINNED if require_pinned else 0) | \
            (0 if huge else FX_POOL_NO_HUGE)
        cdef int rc
        with nogil:
            rc = fx_pool_create(size, flags, &self.p)
        check(rc, "pin buffer pool")

    def __dealloc__(self):
        if self.p != NULL:
            fx_pool_destroy(self.p)

    @property
    def address(self):
        return <uintptr_t>fx_pool_base(self.p)

    @property
    def size(self):
        return fx_pool_size(self.p)

    @property
    def pinned(self):
        return bool(fx_pool_pinned(self.p))

    @property
    def huge(self):
        return bool(fx_pool_huge(self.p))

    def __getbuffer__(self, Py_buffer *view, int flags):
        _export_bytes(view, self, fx_pool_base(self.p), <Py_ssize_t>fx_pool_size(self.p),
                      self.shape, self.strides)

    def __releasebuffer__(self, Py_buffer *view):
        pass


cdef class Registration:
    """Outside memory published as fixed buffers (fx_pool_wrap).  Holds the
    buffer export so the memory cannot go away while registered."""
    cdef fx_pool *p
    cdef object view

    def __cinit__(self, obj):
        cdef Py_buffer b
        PyObject_GetBuffer(obj, &b, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS)
        try:
            check(fx_pool_wrap(b.buf, <uint64_t>b.len, &self.p), "register memory")
        finally:
            PyBuffer_Release(&b)
        self.view = memoryview(obj)

    def close(self):
        if self.p != NULL:
            fx_pool_destroy(self.p)
            self.p = NULL
        self.view = None

    def __dealloc__(self):
        if self.p != NULL:
            fx_pool_destroy(self.p)

    @property
    def address(self):
        return <uintptr_t>fx_pool_base(self.p) if self.p != NULL else 0

    @property
    def size(self):
        return fx_pool_size(self.p) if self.p != NULL else 0


cdef class Region:
    """A slice of a Pool that owns its extent: numpy arrays made from it
    keep it (and the pool) alive, and the extent returns to the pool's
    allocator when the last view is gone."""
    cdef object pool
    cdef object release
    cdef uintptr_t addr
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]
    cdef uint64_t off
    cdef uint64_t length

    def __cinit__(self, Pool pool, uint64_t off, uint64_t length, release):
        self.pool = pool
        self.release = release
        self.off = off
        self.length = length
        self.addr = <uintptr_t>fx_pool_base(pool.p) + off

    def __dealloc__(self):
        if self.release is not None:
            self.release(self.off, self.length)

    def __getbuffer__(self, Py_buffer *view, int flags):
        _export_bytes(view, self, <void *>self.addr, <Py_ssize_t>self.length,
                      self.shape, self.strides)

    def __releasebuffer__(self, Py_buffer *view):
        pass


cdef class Dev:
    """An open device (csrc/transport.c)."""
    cdef fx_dev *d
    cdef readonly str transport
    cdef readonly str target
    # Threads inside C on this device without the GIL (a queue being made:
    # a connect, for NVMe-oF; an ANA read).  close() from another thread
    # must not free the device under them: it marks it closing, and the
    # last of them to leave closes it (fx_dev_close: "all its queues must
    # be destroyed first").
    cdef int users
    cdef bint closing

    def __cinit__(self, str transport, str target, bint direct=True,
                  bint readonly=False, bint create=False, uint64_t size=0,
                  str secrets="", bint ioprio=True):
        # secrets: key=value lines (dhchap_secret=...) read by the C
        # transport only; never kept here, so target (in every message
        # and repr) holds none.
        cdef fx_dev_opts o
        cdef int rc
        memset(&o, 0, sizeof(o))
        o.direct = direct
        o.readonly = readonly
        o.create = create
        o.size = size
        o.no_ioprio = not ioprio
        t = transport.encode()
        p = (target + "\n" + secrets if secrets else target).encode()
        cdef const char *tp = t
        cdef const char *pp = p
        with nogil:
            rc = fx_dev_open(tp, pp, &o, &self.d)
        self.transport = transport
        self.target = target
        check(rc, target)

    def close(self):
        # Without the GIL: closing a fabric controller may wait (bounded)
        # for a target that stopped answering.
        cdef fx_dev *d = self.d
        self.closing = True
        if d != NULL and self.users == 0:
            self.d = NULL
            with nogil:
                fx_dev_close(d)

    cdef int _enter(self) except -1:
        if self.d == NULL or self.closing:
            raise error_from_errno(9, self.target)  # EBADF: closed
        self.users += 1
        return 0

    cdef void _leave(self):
        self.users -= 1
        if self.closing and self.users == 0:
            self.close()  # closed while this thread was inside: its close is ours

    def __dealloc__(self):
        self.close()

    cdef fx_dev_info info(self):
        cdef fx_dev_info i
        if self.d == NULL:
            raise error_from_errno(9, self.target)  # EBADF: closed
        fx_dev_get_info(self.d, &i)
        return i

    @property
    def size(self):
        return self.info().size

    @property
    def block_size(self):
        return self.info().block_size

    @property
    def caps(self):
        return self.info().caps

    def ana_state(self):
        """(ANA group id, state) of an NVMe-oF namespace, read from its
        controller's ANA log page now (blocks on the network, without the
        GIL); OSError (EOPNOTSUPP where there is no ANA reporting)."""
        cdef uint32_t grpid = 0
        cdef uint8_t state = 0
        cdef int rc
        cdef fx_dev *d = self.d
        self._enter()
        try:
            with nogil:
                rc = fx_dev_ana(d, &grpid, &state)
        finally:
            self._leave()
        check(rc, self.target)
        return (grpid, state)

    @property
    def ns_ids(self):
        """(nguid, eui64, uuid) of an NVMe-oF namespace, bytes each (all
        zeroes where the namespace has none, and for files)."""
        cdef fx_dev_info i = self.info()
        return (bytes(i.nguid[:16]), bytes(i.eui64[:8]), bytes(i.uuid[:16]))


cdef class Queue:
    """One submission/completion queue on a device; use from one thread."""
    cdef fx_queue *q
    cdef Dev dev
    cdef fx_cqe *cqes
    cdef unsigned ncqes
    # Calls inside C without the GIL (submit, wait).  close() from another
    # thread must not destroy the queue under them: it marks the queue
    # closing (new calls raise DeviceClosedError, waits return within
    # CLOSE_POLL_MS) and destroys it once the last of them has left.
    cdef int users
    cdef bint closing
    # I/Os its close left with the kernel (not back within
    # FX_QUEUE_DRAIN_MS, or never waited for): their buffers must stay owned
    # for good (QueueDriver.abandon, _kept_for_kernel)
    cdef readonly int left_with_kernel
    # Closed by another thread while the kernel held I/Os that only the
    # ring's own thread can wait for (DEFER_TASKRUN): that thread finishes
    # the close (settle(), on its next call), or the last reference does.
    # parked: the buffers of its requests handed to C meanwhile.
    cdef readonly bint handoff
    cdef public object parked
    # tags of `parked` whose buffers went to _kept_for_kernel
    cdef readonly frozenset kept_tags
    # made for an event loop: no call of its thread owns a request's buffer
    # (futures do), so finishing a handed-off close there is bounded
    cdef bint fd_wake
    # a live C queue keeps its C device: Dev.close() frees it only once
    # every queue made on it is destroyed (one held by no Device yet: being
    # handed to an event loop, or dropped)
    cdef bint holds_dev

    def __cinit__(self, Dev dev, unsigned depth=64, unsigned max_io=1 << 20,
                  unsigned slots=4096, bint fd_wake=False, unsigned write_depth=0,
                  bint defer_enable=False):
        cdef fx_queue_opts o
        cdef int rc
        if dev.d == NULL:
            raise error_from_errno(9, dev.target)
        o.depth = depth
        o.max_io = max_io
        o.slots = slots
        o.write_depth = write_depth  # 0: FX_WRITE_DEPTH_DEFAULT
        # an event loop waits on fd: a ring whose wake-ups it sees at once
        # (FX_QUEUE_FD_WAKE in fx100io.h)
        o.flags = FX_QUEUE_FD_WAKE if fd_wake else 0
        self.fd_wake = fd_wake
        # made here, used by the thread that calls enable() (an event
        # loop's, which must not wait for the connect made here)
        if defer_enable:
            o.flags |= FX_QUEUE_DEFER_ENABLE
        self.ncqes = 256
        self.cqes = <fx_cqe *>malloc(self.ncqes * sizeof(fx_cqe))
        if self.cqes == NULL:
            raise MemoryError()
        cdef fx_dev *d = dev.d
        dev._enter()
        try:
            with nogil:
                rc = fx_queue_create(d, &o, &self.q)
            if dev.closing:  # closed meanwhile: its queues go first; say closed
                if rc == 0:
                    with nogil:
                        fx_queue_destroy(self.q)
                    self.q = NULL
                rc = -9
        finally:
            if rc != 0:
                dev._leave()
        self.dev = dev
        self.holds_dev = rc == 0  # its user count is left at destroy
        check(rc, f"create {dev.transport} queue on {dev.target}")

    def enable(self):
        """Make the calling thread this queue's user (a queue made with
        defer_enable on another thread); does not wait on the network."""
        if self.q == NULL or self.closing:
            raise error_from_errno(9, self.dev.target)
        check(fx_queue_enable(self.q), f"enable {self.dev.transport} queue on {self.dev.target}")

    def begin_close(self):
        """Mark the queue closing (from any thread), waiting for nothing:
        new calls raise DeviceClosedError and a thread blocked in wait()
        starts waiting for its own I/Os.  Device.close() marks all of its
        queues first, so their threads drain at the same time."""
        self.closing = True

    def close(self, int timeout_ms=FX_QUEUE_DRAIN_MS, int users_ms=-1):
        """Close the queue (from any thread), waiting timeout_ms at most.
        A thread blocked in wait() waits, with no limit, for the I/Os the
        kernel holds for it (its buffers), then gets DeviceClosedError; this
        waits up to users_ms (< 0: timeout_ms) for it to leave, and if it
        has not, leaves the close to it (handoff).  Where only the ring's
        own thread can wait for what the kernel holds (DEFER_TASKRUN), and on
        any queue not made for an event loop that holds I/O (a blocking
        caller's, between two calls), that thread finishes the close on its
        next call (settle()).  What the
        kernel still holds when the C queue goes (after timeout_ms here, or
        FX_QUEUE_DRAIN_MS when the last reference goes) is counted in
        left_with_kernel and the buffers in `parked` are kept for good
        (_kept_for_kernel).  Returns True when a thread inside a call
        finishes the close (`destroyed` says when it has)."""
        # Cleared before the GIL is let go: a reap from another thread then
        # sees a closed queue, never one being destroyed.
        cdef fx_queue *q
        cdef int held = 0, left, rc
        cdef double deadline = _time.monotonic() + max(timeout_ms, 0) / 1000.0
        cdef double users_deadline = deadline if users_ms < 0 else min(
            deadline, _time.monotonic() + users_ms / 1000.0)
        self.closing = True
        while self.users > 0 and _time.monotonic() < users_deadline:
            with nogil:
                usleep(1000)
        if self.users > 0:
            # A thread inside a call (the ring's own when it waits) may be
            # waiting for I/O the kernel holds in its buffers: it finishes
            # the close as it leaves (wait()); this closer is not held up.
            # (Decided with the GIL, as the user's leaving is: no window.)
            self.handoff = True
            return True
        if self.handoff:
            # closed again: on the ring's thread this finishes it
            self.settle(max(int((deadline - _time.monotonic()) * 1000), 1))
            return False
        q = self.q
        if q == NULL:
            self._let_go()
            return False
        # (with the GIL: the ring's own thread cannot settle meanwhile; a
        # look, it does not wait)
        rc = fx_queue_quiesce(q, 0)
        if rc == -17 or (rc > 0 and not self.fd_wake):
            # EEXIST: only the ring's thread can wait.  And a blocking
            # caller's queue (its thread between two calls) is its thread's
            # to finish in any case: it waits for its own buffers with no
            # limit, where this closer would give up after its bound and
            # the caller could meet the closed queue first and reuse them.
            self.handoff = True
            return False
        self.q = NULL
        # at least 1 ms: a wait that ran out keeps destroy from waiting again
        left = max(int((deadline - _time.monotonic()) * 1000), 1)
        with nogil:
            held = fx_queue_quiesce(q, left)
        self._destroy(q, held)
        return False

    def settle(self, int timeout_ms=-1):
        """Finish a close handed to this queue's ring thread (handoff): wait
        for what the kernel holds (with no limit by default: on the ring's
        thread, whose calls own the buffers), then destroy the queue.  Does
        nothing on a thread that cannot wait on the ring, without a
        handoff, or while a call is inside."""
        cdef fx_queue *q = self.q
        cdef int held
        if q == NULL or not self.handoff or self.users > 0:
            return
        if fx_queue_quiesce(q, 0) == -17:
            return  # not the ring's thread
        self.q = NULL
        with nogil:
            held = fx_queue_quiesce(q, timeout_ms)
        self._destroy(q, held)

    cdef void _destroy(self, fx_queue *q, int held):
        """Destroy q (taken off self.q already) after a quiesce that left
        held I/Os with the kernel (-EEXIST: some, none could be waited for
        from this thread).  Requests it completed meanwhile are not the
        kernel's any more; the buffers of the others are kept for good."""
        cdef int n
        cdef set done = set()
        if held != 0:
            # (a reap on a stopping queue issues nothing: it only reports)
            while True:
                n = fx_queue_reap(q, self.cqes, self.ncqes)
                if n <= 0:
                    break
                for i in range(n):
                    done.add(self.cqes[i].tag)
                if <unsigned>n < self.ncqes:
                    break
        with nogil:
            fx_queue_destroy(q)
        self._done_parked(held, done)
        self._let_go()

    cdef void _done_parked(self, int held, set done):
        parked = self.parked
        self.parked = None
        if held == 0:
            return
        self.left_with_kernel = held if held > 0 else 1  # -EEXIST: some
        if parked and _kept_for_kernel is not None and _keep_for_kernel is not None:  # (at exit)
            kept = {t: b for t, b in parked.items() if t not in done}
            self.kept_tags = frozenset(kept)
            _keep_for_kernel(list(kept.values()))

    cdef void _let_go(self):
        if self.holds_dev:
            self.holds_dev = False
            self.dev._leave()  # the device's close, if it waited for this queue

    cdef int _owner_ms(self):
        """How long the calling thread, finishing a handed-off close,
        waits for the kernel: a blocking caller owns those buffers and waits
        for them (no limit); an event loop's thread must not stall."""
        if self.fd_wake:
            return FX_QUEUE_DRAIN_MS
        aio_mod = _sys.modules.get("asyncio")  # (not imported: no loop runs)
        if aio_mod is not None and aio_mod._get_running_loop() is not None:
            return FX_QUEUE_DRAIN_MS  # a queue made for C waits, used by a loop
        return -1

    cdef int _enter(self) except -1:
        if self.q == NULL or self.closing:
            self.settle(self._owner_ms())  # the ring's thread back after a handoff
            raise error_from_errno(9, self.dev.target)
        self.users += 1
        return 0

    cdef void _leave(self):
        self.users -= 1
        if self.handoff and self.users == 0:
            # the closer did not wait for this call to leave: finish it here
            self.settle(self._owner_ms())

    def __dealloc__(self):
        # Without the GIL: a transport may wait for its connector thread or
        # the kernel to let go of buffers, FX_QUEUE_DRAIN_MS at most for an
        # io_uring file queue (not at all from a thread that cannot wait on
        # its ring); what is left then is logged and counted in C, and the
        # buffers of the requests it held are kept (parked: the driver's).
        cdef int held = 0
        cdef fx_queue *q = self.q
        if q != NULL:
            self.q = NULL
            with nogil:
                held = fx_queue_quiesce(q, FX_QUEUE_DRAIN_MS)
            self._destroy(q, held)
        if self.dev is not None:
            self._let_go()
        free(self.cqes)

    @property
    def destroyed(self):
        """The C queue is gone (closed, or its handed-off close finished)."""
        return self.q == NULL

    @property
    def fd(self):
        if self.q == NULL:
            raise error_from_errno(9, self.dev.target)
        return fx_queue_fd(self.q)

    @property
    def pending(self):
        return fx_queue_pending(self.q) if self.q != NULL else 0

    @property
    def features(self):
        if self.q == NULL:
            raise error_from_errno(9, self.dev.target)
        cdef unsigned f = fx_queue_features(self.q)
        return [name for bit, name in RING_FEATURES.items() if f & bit]

    def stats(self):
        """Counters of this queue (see struct fx_queue_stats)."""
        cdef fx_queue_stats s
        if self.q == NULL:
            return {}
        fx_queue_get_stats(self.q, &s)
        return dict(ios=s.ios, bytes=s.bytes, fixed_ios=s.fixed_ios, bytes_direct=s.bytes_direct,
                    bytes_copied=s.bytes_copied, reconnects=s.reconnects,
                    conn_errors=s.conn_errors, remote_invalidations=s.remote_invalidations,
                    local_invalidations=s.local_invalidations, pieces_load=s.prio_pieces[0],
                    pieces_store=s.prio_pieces[1], pieces_background=s.prio_pieces[2],
                    prio_shares=s.prio_shares, conn_fallbacks=s.conn_fallbacks,
                    load_conn_writes=s.load_conn_writes, ioprio_ios=s.ioprio_ios,
                    ktls_conns=s.ktls_conns, tls_user_conns=s.tls_user_conns)

    def submit(self, list reqs):
        """Queue [(op, addr, len, off, tag), ...]; returns how many were
        accepted (fewer when the request slots are full).  op may carry
        OP_CRC32C, a priority class (<< PRIO_SHIFT) and a stream id
        (<< STREAM_SHIFT)."""
        cdef unsigned n = len(reqs)
        cdef fx_req *c
        cdef int rc
        if n == 0:
            return 0
        self._enter()
        c = <fx_req *>malloc(n * sizeof(fx_req))
        if c == NULL:
            self._leave()  # (a user left counted would hold a close up)
            raise MemoryError()
        try:
            for i, (op, addr, length, off, tag) in enumerate(reqs):
                c[i].op = op & 0xff
                c[i].flags = (op >> 8) & 0xff
                c[i].prio = (op >> PRIO_SHIFT) & 0xff
                c[i].stream = (op >> STREAM_SHIFT) & 0xffffffff
                c[i].addr = <void *><uintptr_t>addr
                c[i].len = length
                c[i].off = off
                c[i].tag = tag
            with nogil:
                rc = fx_queue_submit(self.q, c, n)
            if rc == -17:  # EEXIST: the kernel ties the ring to one thread
                raise error_from_errno(17, f"submit to {self.dev.target}: this queue's io_uring "
                                       "ring belongs to another thread (single issuer)")
            check(rc, f"submit to {self.dev.target}")
            return rc
        finally:
            free(c)
            self._leave()

    def reap(self):
        """Finished requests as [(tag, res, status, crc32c), ...]; never
        blocks.  crc32c is 0 unless the request asked for it (OP_CRC32C)."""
        cdef int n
        cdef fx_queue *q = self.q
        cdef fx_cqe *cqes = self.cqes
        cdef unsigned ncqes = self.ncqes
        out = []
        if q == NULL or self.closing:
            return out
        # Without the GIL (reaping may issue queued work, and an RDMA queue
        # may register a pool's memory on first use), so counted as a user:
        # a close from another thread waits for it.
        self.users += 1
        try:
            while True:
                with nogil:
                    n = fx_queue_reap(q, cqes, ncqes)
                check(n, f"reap {self.dev.target}")
                for i in range(n):
                    out.append((cqes[i].tag, cqes[i].res, cqes[i].status, cqes[i].crc32c))
                if <unsigned>n < ncqes:
                    return out
        finally:
            self._leave()

    def wait(self, unsigned min_done=1, int timeout_ms=-1):
        """Block (without the GIL) until min_done requests are ready to
        reap; returns False on timeout.  Raises DeviceClosedError once
        another thread is closing the queue (a wait with no timeout polls
        for that every CLOSE_POLL_MS)."""
        cdef int rc, step, held
        cdef int left = timeout_ms
        cdef fx_queue *q = self.q
        self._enter()
        try:
            while True:
                step = CLOSE_POLL_MS if left < 0 or left > CLOSE_POLL_MS else left
                with nogil:
                    rc = fx_queue_wait(q, min_done, step)
                if rc != -62 or self.closing:
                    break
                if left >= 0:
                    left -= step
                    if left <= 0:
                        break
            if self.closing:
                # Closed from another thread.  This thread's caller owns the
                # buffers the kernel may still be writing (and on a
                # DEFER_TASKRUN ring only this thread can see the kernel
                # finish): it gets them back, with the error, only once the
                # kernel is done with them, however long that takes.  The
                # closer does not wait past its own bound (handoff).
                with nogil:
                    held = fx_queue_quiesce(q, -1)
        finally:
            self.users -= 1
        if self.closing:
            if self.handoff and self.users == 0:
                self.settle()  # the closer left the close to this thread
            raise error_from_errno(9, self.dev.target)
        if rc == -62:  # ETIME
            return False
        if rc == -17:  # EEXIST
            raise error_from_errno(17, f"wait for {self.dev.target}: this queue's io_uring "
                                   "ring belongs to another thread (single issuer)")
        check(rc, f"wait for {self.dev.target}")
        return True


#: Buffers of requests whose queue was destroyed while the kernel still
#: held some of their I/Os (Queue.left_with_kernel): it may still write into
#: them, so they are kept for the life of the process rather than handed
#: back to the allocator (the ring that would tell when it is done is gone).
_kept_for_kernel = []
_kept_bytes = 0
#: Past these, each further keep is logged as an error: memory the process
#: cannot get back, which a device that keeps failing this way grows.  Not a
#: hard cap: dropping a buffer the kernel may write is never the answer.
KEEP_WARN_BUFFERS = 4096
KEEP_WARN_BYTES = 1 << 30


def _keep_for_kernel(list bufs):
    global _kept_bytes
    cdef Py_ssize_t nbytes = 0
    for b in bufs:
        nbytes += memoryview(b).nbytes
    _kept_for_kernel.extend(bufs)
    _kept_bytes += nbytes
    if len(_kept_for_kernel) > KEEP_WARN_BUFFERS or _kept_bytes > KEEP_WARN_BYTES:
        _logging.getLogger("fx100io").error(
            "fx100io: %d buffer(s), %d bytes, kept for good for I/Os queue closes left with "
            "the kernel (over %d buffers or %d bytes): a device keeps failing to complete "
            "I/O at close", len(_kept_for_kernel), _kept_bytes, KEEP_WARN_BUFFERS,
            KEEP_WARN_BYTES)


def leaked_ios():
    """I/Os that queue closes left with the kernel in this process
    (fx_queue_leaked_ios): each one's buffer was kept for good."""
    return fx_queue_leaked_ios()


include "_fabric.pxi"
include "_target.pxi"
include "_bench.pxi"

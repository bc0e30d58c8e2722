# Binding of the benchmark's C I/O loop (csrc/bench_loop.c); included by _core.pyx.

cimport cython
from cpython.pythread cimport PyThread_get_thread_ident
from libc.errno cimport EAGAIN, ENODATA, ETIMEDOUT

import errno

from fx100io.errors import Fx100ioMessageError, error_from_status

cdef extern from "bench_loop.h" nogil:
    enum:
        FX_BL_NBUCKETS
        FX_BL_MAX_DEPTH_HIST
        FX_BL_MAX_DEPTH
        FX_BL_SQPOLL
        FX_BL_REGFILES
        FX_BL_FIXEDBUFS
        FX_BL_REGRING
        FX_BL_STAMP
        FX_BL_DEFER_TASKRUN
        FX_BL_COOP_TASKRUN
        FX_BL_SINGLE_ISSUER
        FX_BL_BACKEND_URING
        FX_BL_BACKEND_QUEUE
    struct fx_bl_dir:
        uint64_t ios
        uint64_t bytes
        uint64_t short_ios
        uint64_t min_ns
        uint64_t max_ns
        uint64_t sum_ns
        double sumsq
        uint64_t counts[1]
    struct fx_bl_params:
        int fd
        uint32_t bs
        uint32_t depth
        uint64_t start
        uint64_t nblocks
        uint64_t passes
        uint64_t ios
        uint64_t end_ns
        uint64_t seed
        double read_fraction
        int random
        int random_map
        unsigned flags
        void **bufs
        uint32_t batch_submit
        fx_queue *queue
        uint64_t stall_ns
    struct fx_bl:
        pass
    int fx_bl_create(const fx_bl_params *p, fx_bl **out)
    unsigned fx_bl_features(const fx_bl *b)
    int fx_bl_backend(const fx_bl *b)
    unsigned fx_bl_error_status(const fx_bl *b)
    unsigned fx_bl_refused(const fx_bl *b, int *errnos)
    int fx_bl_run(fx_bl *b, uint64_t slice_end_ns)
    void fx_bl_stop(fx_bl *b)
    void fx_bl_error(const fx_bl *b, int *err, uint64_t *off, int *is_read)
    int fx_bl_ring_failed(const fx_bl *b)
    uint64_t fx_bl_stall_ns(const fx_bl *b)
    const fx_bl_dir *fx_bl_stats(const fx_bl *b, int is_read)
    const uint64_t *fx_bl_depths(const fx_bl *b)
    uint64_t fx_bl_inflight(const fx_bl *b)
    int fx_bl_destroy(fx_bl *b)
    int fx_bl_destroy_within(fx_bl *b, uint64_t limit_ns)
    uint32_t fx_bl_bucket(uint64_t ns)
    uint64_t fx_bl_percentile(const fx_bl_dir *d, double pct)

BL_SQPOLL = FX_BL_SQPOLL
BL_REGFILES = FX_BL_REGFILES
BL_FIXEDBUFS = FX_BL_FIXEDBUFS
BL_REGRING = FX_BL_REGRING
BL_STAMP = FX_BL_STAMP
BL_NBUCKETS = FX_BL_NBUCKETS
BL_MAX_DEPTH = FX_BL_MAX_DEPTH
#: How long close() waits for I/O still in flight by default (ns).
BL_DRAIN_LIMIT_NS = 30_000_000_000
#: Buffers of loops that gave up on I/O still in flight: the kernel may
#: still write into them, so they are kept (leaked) for the process's life.
_bench_leaked = []
BL_FEATURES = {
    FX_BL_SQPOLL: "sqpoll", FX_BL_REGFILES: "registerfiles", FX_BL_FIXEDBUFS: "fixedbufs",
    FX_BL_REGRING: "registered ring fd", FX_BL_DEFER_TASKRUN: "defer_taskrun",
    FX_BL_COOP_TASKRUN: "coop_taskrun", FX_BL_SINGLE_ISSUER: "single_issuer",
}


def bench_bucket(uint64_t ns):
    """Histogram bucket of a latency, as the C loop files it."""
    return fx_bl_bucket(ns)


class BenchLoopThreadError(Fx100ioMessageError, RuntimeError):
    """A BenchLoop used from a thread other than the one that made it."""

    ERRNO = errno.EPERM


@cython.no_gc_clear
cdef class BenchLoop:
    """The C I/O loop of `fx100io bench` (csrc/bench_loop.c) over one fd
    (``target`` an int: its own io_uring) or over a device's C queue
    (``target`` a Queue, e.g. ``device.raw_queue()``: NVMe/TCP, NVMe/RDMA,
    any transport; the io_uring flags do not apply there, only BL_STAMP).
    A queue is used from the loop's thread only, and nothing else may
    submit to or reap from it while the loop has I/O on it.

    ``bufs`` are writable buffers of at least ``bs`` bytes each, one per I/O
    in flight; the loop keeps references to them until close() (for good
    if close() gave up on I/O still in flight).  run() works for one time
    slice with the GIL released; an I/O that fails ends the run as an
    OSError (EOFError for one that moved 0 bytes) whose ``offset`` and
    ``is_read`` attributes say which; a failure of the ring itself is an
    OSError with ``offset`` None.

    run() and close() work only in the thread that created the loop (its
    ring is registered to that thread); elsewhere they raise
    BenchLoopThreadError.  close() is refused while run() is in progress.
    """
    cdef fx_bl *b
    cdef void **addrs
    cdef object keep
    cdef readonly int fd
    # the queue of the fx_queue backend (None for the io_uring one) and the
    # fx_queue it was when the loop was made
    cdef readonly Queue queue
    cdef fx_queue *q
    cdef unsigned long owner
    cdef bint running

    def __cinit__(self, target, uint64_t start, uint64_t nblocks, uint32_t bs, bufs, *,
                  bint random=False, bint random_map=True, double read_fraction=1.0,
                  uint64_t seed=0, uint64_t passes=1, uint64_t ios=0, uint64_t end_ns=0,
                  unsigned flags=0,
                  uint32_t batch_submit=0, double stall_s=0.0):
        cdef fx_bl_params p
        cdef int rc
        cdef Py_ssize_t i, n
        self.b = NULL
        self.q = NULL
        self.queue = None
        if isinstance(target, Queue):
            self.queue = <Queue>target
            if self.queue.q == NULL or self.queue.closing:
                raise error_from_errno(9, self.queue.dev.target)
            self.q = self.queue.q
            self.fd = -1
        else:
            self.fd = target
        self.owner = PyThread_get_thread_ident()
        self.running = False
        self.keep = [memoryview(x) for x in bufs]
        n = len(self.keep)
        if n == 0:
            raise ValueError("BenchLoop needs at least one buffer")
        self.addrs = <void **>malloc(n * sizeof(void *))
        if self.addrs == NULL:
            raise MemoryError()
        for i in range(n):
            addr, size = buffer_address(self.keep[i], True)
            if size < bs:
                raise ValueError(f"buffer {i} has {size} bytes, fewer than bs={bs}")
            self.addrs[i] = <void *><uintptr_t>addr
        memset(&p, 0, sizeof(p))
        p.fd = self.fd
        p.bs = bs
        p.depth = <uint32_t>n
        p.start = start
        p.nblocks = nblocks
        p.passes = passes
        p.ios = ios
        p.end_ns = end_ns
        p.seed = seed
        p.read_fraction = read_fraction
        p.random = random
        p.random_map = random_map
        p.flags = flags
        p.bufs = self.addrs
        p.batch_submit = batch_submit
        p.queue = self.q
        if stall_s < 0:
            raise ValueError(f"stall_s must be >= 0 (0: the default), got {stall_s}")
        p.stall_ns = <uint64_t>(stall_s * 1e9)
        with nogil:
            rc = fx_bl_create(&p, &self.b)
        check(rc, "set up the I/O loop")

    def __dealloc__(self):
        cdef int rc = 0
        if self.b != NULL:
            if PyThread_get_thread_ident() != self.owner and (
                    fx_bl_inflight(self.b) or fx_bl_features(self.b) & FX_BL_REGRING):
                # The ring cannot be drained or unregistered from here:
                # leave it, and keep the buffers the kernel may still use.
                _bench_leaked.append(self.keep)
                self.b = NULL
                return
            rc = self._destroy(BL_DRAIN_LIMIT_NS)
            if rc < 0:
                _bench_leaked.append(self.keep)
        if self.addrs != NULL:
            free(self.addrs)
            self.addrs = NULL

    cdef int _destroy(self, uint64_t limit_ns) noexcept:
        # A queue closed under the loop cannot be waited on: give up at once
        # (the buffers are then kept if anything was in flight).
        cdef int rc
        cdef bint entered = False
        # taken out of self first: another thread's stop() or counters()
        # during the destroy then finds the loop closed, not freed memory
        cdef fx_bl *b = self.b
        self.b = NULL
        if self.queue is not None:
            if self.queue.q != self.q or self.queue.closing:
                limit_ns = 0
            else:
                self.queue.users += 1
                entered = True
        with nogil:
            rc = fx_bl_destroy_within(b, limit_ns)
        if entered:
            self.queue.users -= 1
        return rc

    cdef fx_bl *_live(self) except NULL:
        if self.b == NULL:
            raise ValueError("BenchLoop is closed")
        return self.b

    cdef int _own(self) except -1:
        cdef unsigned long me = PyThread_get_thread_ident()
        if me != self.owner:
            raise BenchLoopThreadError(
                f"BenchLoop used from thread {me}, but it works only in thread {self.owner}, "
                "which created it (its io_uring is registered to that thread)")
        return 0

    def close(self, uint64_t limit_ns=BL_DRAIN_LIMIT_NS):
        """Wait (at most limit_ns) for what is in flight, then free the ring
        (idempotent).  True when everything came back; False when it gave
        up: the buffers are then kept for good (the kernel may still write
        into them)."""
        cdef int rc = 0
        if self.b != NULL:
            self._own()
            if self.running:
                raise RuntimeError("BenchLoop.close() while run() is in progress")
            rc = self._destroy(limit_ns)
        if rc < 0:
            _bench_leaked.append(self.keep)
        self.keep = None
        return rc == 0

    @property
    def backend(self):
        """Which backend the loop runs on: "io_uring" (its own, over fd) or
        "queue" (the device's C queue)."""
        return "queue" if fx_bl_backend(self._live()) == FX_BL_BACKEND_QUEUE else "io_uring"

    @property
    def features(self):
        """Names of what the loop runs with (setup flags, registrations)."""
        cdef unsigned f = fx_bl_features(self._live())
        return [name for bit, name in BL_FEATURES.items() if f & bit]

    @property
    def refused(self):
        """{option name: errno} for options asked for that the kernel refused."""
        cdef int errs[4]
        cdef unsigned r = fx_bl_refused(self._live(), errs)
        out = {}
        for k, (bit, name) in enumerate(((FX_BL_SQPOLL, "sqpoll"), (FX_BL_REGFILES, "registerfiles"),
                                         (FX_BL_FIXEDBUFS, "fixedbufs"),
                                         (FX_BL_REGRING, "registered ring fd"))):
            if r & bit:
                out[name] = errs[k]
        return out

    def run(self, uint64_t slice_end_ns):
        """Work until a completion seen at or after slice_end_ns (False) or
        until every I/O is done (True).  A failed I/O raises OSError (EOFError
        for 0 bytes moved) after the rest drained."""
        cdef fx_bl *b = self._live()
        cdef int rc, err, is_read
        cdef unsigned status
        cdef uint64_t off
        cdef Queue queue = self.queue
        self._own()
        if self.running:
            raise RuntimeError("BenchLoop.run() is already in progress")
        if queue is not None:
            # the queue closed (by another thread) under the loop
            if queue.q != self.q or queue.closing:
                e = error_from_errno(9, queue.dev.target)
                e.offset = None  # the queue's failure, no I/O's (as the ring's)
                e.is_read = None
                raise e
            queue.users += 1
        self.running = True
        try:
            with nogil:
                rc = fx_bl_run(b, slice_end_ns)
        finally:
            self.running = False
            if queue is not None:
                queue.users -= 1
        if rc >= 0:
            return rc == 1
        err = fx_bl_ring_failed(b)
        if err:
            if queue is None and err == ETIMEDOUT:
                e = error_from_errno(err, f"the kernel posted no completion on the I/O loop's ring "
                                          f"for {fx_bl_stall_ns(b) / 1e9:g} s with "
                                          f"{fx_bl_inflight(b)} I/Os in flight "
                                          f"(ring features: {', '.join(self.features) or 'none'})")
            elif queue is None:
                e = error_from_errno(err, "io_uring_enter on the I/O loop's ring")
            elif err == EAGAIN:
                e = error_from_errno(err, f"the queue of {queue.dev.target} took no I/O with none in flight")
            else:
                e = error_from_errno(err, f"waiting on the queue of {queue.dev.target}")
            e.offset = None
            e.is_read = None
            raise e
        fx_bl_error(b, &err, &off, &is_read)
        status = fx_bl_error_status(b)
        if err == 0:
            err = -rc
        what = "read" if is_read else "write"
        if status:
            e = error_from_status(status, f"{what} at offset {off}")
        elif err == ENODATA:  # the I/O moved no bytes
            e = EOFError(f"{what} at offset {off} returned 0 bytes (end of the target?)")
        else:
            e = error_from_errno(err, f"{what} at offset {off}")
        e.offset = off
        e.is_read = bool(is_read)
        raise e

    def stop(self):
        """Submit nothing more; the next run() drains and returns True.
        (Any thread may ask.)"""
        fx_bl_stop(self._live())

    @property
    def inflight(self):
        return fx_bl_inflight(self._live())

    def counters(self):
        """(read ios, read bytes, write ios, write bytes) so far."""
        cdef const fx_bl_dir *r = fx_bl_stats(self._live(), 1)
        cdef const fx_bl_dir *w = fx_bl_stats(self.b, 0)
        return r.ios, r.bytes, w.ios, w.bytes

    def stats(self, bint is_read):
        """One direction's counters and histogram: a dict with ios, bytes,
        short_ios, min_ns, max_ns, sum_ns, sumsq and counts (bytes of
        BL_NBUCKETS native uint64)."""
        cdef const fx_bl_dir *d = fx_bl_stats(self._live(), is_read)
        return {
            "ios": d.ios, "bytes": d.bytes, "short_ios": d.short_ios,
            "min_ns": d.min_ns if d.ios else 0, "max_ns": d.max_ns, "sum_ns": d.sum_ns,
            "sumsq": d.sumsq,
            "counts": (<const char *>&d.counts[0])[:FX_BL_NBUCKETS * sizeof(uint64_t)],
        }

    def percentile(self, bint is_read, double pct):
        """Nearest-rank percentile of one direction's latencies (ns), from the C histogram."""
        return fx_bl_percentile(fx_bl_stats(self._live(), is_read), pct)

    def depths(self):
        """Submitted I/Os counted at the depth their batch brought the queue to,
        index = depth (the last entry holds every depth from its index up)."""
        cdef const uint64_t *d = fx_bl_depths(self._live())
        return [d[i] for i in range(FX_BL_MAX_DEPTH_HIST + 1)]

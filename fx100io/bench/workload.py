"""The block workload of one job instance: fio's read/write/rand*/rw/randrw.

Concurrency model: a job instance is one process (see runner.py) that keeps
``iodepth`` I/Os outstanding, one per pinned buffer, as fio's iodepth means.
Without --verify, jobs run in a C loop (csrc/bench_loop.c): it generates
the access pattern, submits (on files and block devices each I/O as soon as
its slot is free, on NVMe-oF queues a whole refill per send, unless
--iodepth_batch_submit says otherwise), reaps and accounts a whole batch per
wakeup and comes back to Python once per 100 ms tick, so Python does nothing
per I/O.
Files and block devices through io_uring go down its own io_uring over an fd
of the target; NVMe/TCP and NVMe/RDMA targets go down the device's C queue
(the same connection the job opened, fx_queue_submit/_wait/_reap).  What the
C loop cannot take (an iodepth past its limit, a file that refuses the
O_DIRECT open) uses a plain Python loop over the device's C queue (submit,
wait without the GIL, reap): no future or task per I/O.  With --verify, ``iodepth`` asyncio tasks
each own one buffer, so a read can wait for a write of the same block.  The
psync engine is synchronous (as fio's sync engines are): it runs one blocking
I/O at a time and iodepth has no effect.

Latency is taken from just before submission to the completion being seen;
it is fio's "lat" (slat + clat).  The core does not expose the submit
instant separately, so we report that number as clat too and leave slat
empty (N = 0).
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from . import verify as verifymod
from .errors import BenchError
from .options import Job
from .pattern import AccessPattern
from .progress import DONE, RAMP, RUNNING, SETUP, VERIFYING, NullSlot
from .results import DEPTH_BOUNDS, JobResult, depth_bucket
from .stats import DirStats, Rusage, Series
from .targets import Target, drop_page_cache, open_target
from .verify import VerifyLog

if TYPE_CHECKING:
    import asyncio

    import numpy as np

TICK_NS = 100_000_000
# Engines whose targets the C loop drives through the device's C queue.
QUEUE_ENGINES = ("nvme+tcp", "nvme+rdma")
# How long a loop waits for I/O still in flight after it stopped or failed
# before it gives up (then the buffers are kept, not freed).
DRAIN_LIMIT_NS = 30_000_000_000


def clone_seed(seed: int, clone: int) -> int:
    """The access pattern's seed of one clone of a numjobs job: clone 0 keeps
    --randseed, the others mix in their number so they do not all issue the
    same offsets (fio gives each job its own random state too)."""
    if clone == 0:
        return seed
    return (seed ^ (clone * 0x9E3779B97F4A7C15)) & ((1 << 64) - 1)


class Phase:
    """Counters one run of the I/O loop fills (measured, ramp or verify)."""

    def __init__(self) -> None:
        self.read = DirStats()
        self.write = DirStats()
        self.series = Series(TICK_NS)
        self.depth_counts = [0] * len(DEPTH_BOUNDS)
        self.start_ns = 0
        self.end_ns = 0


class IoLoop:
    """Drives one target through an access pattern, async or blocking."""

    def __init__(
        self,
        job: Job,
        target: Target,
        bufs: list[np.ndarray],
        progress: Any,
        c_fd: int | None = None,
        clone: int = 0,
        c_queue: bool = False,
    ) -> None:
        self.job = job
        self.clone = clone  # which numjobs clone: only clone 0 logs
        # fd of the target for the C loop's io_uring; or c_queue: the C loop
        # drives the device's C queue; neither: the job runs in Python
        self.c_fd = c_fd
        self.c_queue = c_queue
        self.c_features: list[str] = []
        self.c_refused: dict[str, int] = {}
        # which loop the last run() took: "c", "python" or "psync"
        self.last_loop = ""
        self.target = target
        self.dev = target.device
        self.bufs = bufs
        self.progress = progress
        self.bs = job.bs
        self.verify_log = VerifyLog() if job.verify else None
        # Verify bookkeeping: which blocks this job wrote (checked on read in
        # mixed jobs and read back at the end), and which are in flight so a
        # read never races a write of the same block.
        self.written: bytearray | None = None
        if job.verify and job.writes:
            self.written = bytearray((target.region_len // job.bs + 7) // 8)
        self.busy: dict[int, asyncio.Event] = {}
        self.seq = 0
        self.check_all_reads = job.rw in ("read", "randread")

    # ------------------------------------------------------------ helpers

    def _mark_written(self, off: int) -> None:
        if self.written is None:
            return
        i = (off - self.target.region_start) // self.bs
        self.written[i >> 3] |= 1 << (i & 7)

    def _was_written(self, off: int) -> bool:
        if self.written is None:
            return False
        i = (off - self.target.region_start) // self.bs
        return bool(self.written[i >> 3] & (1 << (i & 7)))

    def written_offsets(self) -> Iterator[tuple[int, bool]]:
        """(offset, True) for every block written, in offset order."""
        if self.written is None:
            return iter(())
        import numpy as np

        bits = np.unpackbits(np.frombuffer(bytes(self.written), dtype=np.uint8), bitorder="little")
        idx = np.nonzero(bits)[0]
        offs = (idx.astype(np.int64) * self.bs + self.target.region_start).tolist()
        return ((o, True) for o in offs)

    def _io_error(self, what: str, off: int, err: BaseException) -> BenchError:
        return BenchError(
            f"job {self.job.name!r}: {what} of {self.bs} bytes at offset {off} on {self.target.uri} failed: {err}"
        )

    # ------------------------------------------------------------ async

    def run_async(
        self,
        ios: Iterable[tuple[int, bool]],
        phase: Phase,
        duration_ns: int | None,
        verify_only: bool = False,
    ) -> None:
        import asyncio  # (here: a job on the C loop never pays for its import)

        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._run_async(iter(ios), phase, duration_ns, verify_only))
        finally:
            loop.close()

    async def _run_async(
        self, it: Iterator[tuple[int, bool]], phase: Phase, duration_ns: int | None, verify_only: bool
    ) -> None:
        import asyncio

        dev = self.dev
        bs = self.bs
        clock = time.monotonic_ns
        rstats, wstats = phase.read, phase.write
        depth_counts = phase.depth_counts
        # Bucket of each possible depth, looked up rather than computed per I/O.
        bucket_of = [depth_bucket(d) for d in range(len(self.bufs) + 2)]
        vlog = self.verify_log
        verify_on = vlog is not None
        progress = self.progress
        state = {"inflight": 0, "stop": False, "next_tick": 0}
        phase.start_ns = start = clock()
        end_ns = start + duration_ns if duration_ns else None
        state["next_tick"] = start + TICK_NS
        phase.series.sample(0, rstats, wstats)

        def tick(now: int) -> None:
            phase.series.sample(now - start, rstats, wstats)
            progress.update(rstats.bytes, wstats.bytes, rstats.ios, wstats.ios, (now - start) // 1_000_000)
            state["next_tick"] = now + TICK_NS
            if progress.stop_requested:
                state["stop"] = True

        async def worker(buf: np.ndarray) -> None:
            for off, is_read in it:
                if state["stop"]:
                    return
                if verify_on:
                    # Never let two I/Os to one block overlap: a read could
                    # see half a write and report a false corruption.
                    while off in self.busy:
                        await self.busy[off].wait()
                    ev = self.busy[off] = asyncio.Event()
                    if not is_read:
                        self.seq += 1
                        verifymod.stamp(buf, off, bs, self.seq)
                depth = state["inflight"] = state["inflight"] + 1
                depth_counts[bucket_of[depth]] += 1
                t0 = clock()
                try:
                    if is_read:
                        n = await dev.read_into(off, buf)
                    else:
                        n = await dev.write_from(off, buf)
                except OSError as e:
                    raise self._io_error("read" if is_read else "write", off, e) from None
                t1 = clock()
                state["inflight"] -= 1
                if n is None:
                    n = bs
                if n <= 0:
                    raise self._io_error("read" if is_read else "write", off, EOFError(f"returned {n}"))
                stats = rstats if is_read else wstats
                stats.add(t1 - t0, n)
                if n != bs:
                    stats.short_ios += 1
                if verify_on:
                    assert vlog is not None
                    if is_read:
                        if verify_only or self.check_all_reads or self._was_written(off):
                            vlog.record(off, bs, verifymod.check(buf, off, bs))
                    else:
                        self._mark_written(off)
                    del self.busy[off]
                    ev.set()
                if t1 >= state["next_tick"]:
                    tick(t1)
                if end_ns is not None and t1 >= end_ns:
                    state["stop"] = True
                    return

        tasks = [asyncio.ensure_future(worker(b)) for b in self.bufs]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            phase.end_ns = clock()
            tick(phase.end_ns)

    # ------------------------------------------------------------ direct

    def run_direct(self, ios: Iterable[tuple[int, bool]], phase: Phase, duration_ns: int | None) -> None:
        """Keep one I/O per buffer in flight through the raw C queue (no
        verify bookkeeping: jobs with --verify take the async path)."""
        from fx100io import _core
        from fx100io.errors import error_from_errno, error_from_status

        q = self.dev.raw_queue()
        bs = self.bs
        clock = time.monotonic_ns
        rstats, wstats = phase.read, phase.write
        depth_counts = phase.depth_counts
        bucket_of = [depth_bucket(d) for d in range(len(self.bufs) + 2)]
        addrs = [_core.buffer_address(b, True)[0] for b in self.bufs]
        free = list(range(len(self.bufs)))
        inflight: dict[int, tuple[int, bool, int, int]] = {}  # tag -> (t0, is_read, buf, off)
        carry: list[tuple[int, bool]] = []  # I/Os the queue did not take yet
        it = iter(ios)
        tag = 0
        progress = self.progress
        phase.start_ns = start = clock()
        end_ns = start + duration_ns if duration_ns else None
        next_tick = start + TICK_NS
        phase.series.sample(0, rstats, wstats)
        stop = exhausted = False
        READ, WRITE = _core.OP_READ, _core.OP_WRITE
        submit, wait, reap = q.submit, q.wait, q.reap
        try:
            while True:
                batch = []
                ops = []  # (is_read, buf, off) per batch entry
                while free and not stop and not exhausted:
                    if carry:
                        off, is_read = carry.pop()
                    else:
                        nxt = next(it, None)
                        if nxt is None:
                            exhausted = True
                            break
                        off, is_read = nxt
                    b = free.pop()
                    tag += 1
                    batch.append((READ if is_read else WRITE, addrs[b], bs, off, tag))
                    ops.append((is_read, b, off))
                if batch:
                    t0 = clock()  # one instant for the batch: it goes down in one call
                    taken = submit(batch)
                    for (_op, _a, _n, _o, t), (is_read, b, off) in zip(batch[:taken], ops):
                        inflight[t] = (t0, is_read, b, off)
                    for is_read, b, off in reversed(ops[taken:]):
                        free.append(b)
                        carry.append((off, is_read))
                    # as fio counts: a submitted batch at the depth it brings the queue to
                    depth_counts[bucket_of[len(inflight)]] += taken
                if not inflight:
                    if carry:  # an idle queue that takes nothing: cannot happen, never spin
                        raise BenchError(f"job {self.job.name!r}: {self.target.uri} accepted no I/O")
                    break
                wait(1, 1000)
                done = reap()
                t1 = clock()  # when this batch of completions was seen
                for t, res, status, _crc in done:
                    t0, is_read, b, off = inflight.pop(t)
                    free.append(b)
                    if status or res <= 0:
                        what = "read" if is_read else "write"
                        if status:
                            raise self._io_error(what, off, error_from_status(status)) from None
                        err = error_from_errno(-res) if res < 0 else EOFError(f"returned {res}")
                        raise self._io_error(what, off, err) from None
                    if is_read:
                        rstats.add(t1 - t0, res)
                        if res != bs:
                            rstats.short_ios += 1
                    else:
                        wstats.add(t1 - t0, res)
                        if res != bs:
                            wstats.short_ios += 1
                if t1 >= next_tick:
                    phase.series.sample(t1 - start, rstats, wstats)
                    progress.update(rstats.bytes, wstats.bytes, rstats.ios, wstats.ios, (t1 - start) // 1_000_000)
                    next_tick = t1 + TICK_NS
                    stop = stop or progress.stop_requested
                if end_ns is not None and t1 >= end_ns:
                    stop = True
        finally:
            # The kernel may still be writing into the buffers: let every
            # outstanding I/O finish before they can be freed.
            deadline = clock() + DRAIN_LIMIT_NS
            while inflight and clock() < deadline:
                q.wait(1, 1000)
                for t, *_ in q.reap():
                    inflight.pop(t, None)
            phase.end_ns = clock()
            phase.series.sample(phase.end_ns - start, rstats, wstats)
            progress.update(
                rstats.bytes, wstats.bytes, rstats.ios, wstats.ios, (phase.end_ns - start) // 1_000_000
            )

    # ------------------------------------------------------------ C loop

    def c_flags(self) -> int:
        from fx100io import _core

        job = self.job
        flags = _core.BL_REGRING
        if job.sqpoll:
            flags |= _core.BL_SQPOLL
        if job.registerfiles:
            flags |= _core.BL_REGFILES
        if job.fixedbufs:
            flags |= _core.BL_FIXEDBUFS
        return flags

    def run_c(self, pat: AccessPattern, phase: Phase, duration_ns: int | None) -> None:
        """The whole pattern in the C loop; Python wakes once per tick."""
        from fx100io import _core

        assert self.c_fd is not None or self.c_queue
        clock = time.monotonic_ns
        rstats, wstats = phase.read, phase.write
        progress = self.progress
        phase.start_ns = start = clock()
        on_queue = self.c_fd is None
        what = "the C I/O loop" if on_queue else "io_uring"
        try:
            # the same connection and queue the Python loop would use
            source: Any = self.dev.raw_queue() if on_queue else self.c_fd
            bl = _core.BenchLoop(
                source,
                pat.start,
                pat.nblocks,
                pat.bs,
                self.bufs,
                random=pat.random,
                random_map=pat.random_map,
                read_fraction=pat.read_fraction,
                seed=pat.seed & ((1 << 64) - 1),
                passes=pat.passes or 0,
                ios=pat.limit or 0,
                end_ns=start + duration_ns if duration_ns else 0,
                flags=0 if on_queue else self.c_flags(),
                # fio's default on files and block devices: each I/O as soon
                # as it is ready; on a queue, one send for all that are
                batch_submit=(0 if on_queue else 1) if self.job.batch_submit is None
                else self.job.batch_submit,
            )
        except OSError as e:
            raise BenchError(f"job {self.job.name!r}: cannot set up {what} on {self.target.uri}: {e}") from None
        if not self.c_features:
            self.c_features = bl.features
            self.c_refused = bl.refused
            for name, err in self.c_refused.items() if self.clone == 0 else ():
                log(self.job, f"the kernel refused {name} ({errno.errorcode.get(err, err)}: "
                    f"{os.strerror(err)}); running without it")
        next_tick = start + TICK_NS
        phase.series.sample(0, rstats, wstats)
        try:
            while True:
                try:
                    done = bl.run(next_tick)
                except _core.BenchLoopThreadError:
                    raise  # an OSError too, but a bug here, not the target's: keep its traceback
                except OSError as e:
                    # the loop's own I/O errors carry offset (None: its ring failed)
                    if getattr(e, "offset", None) is None:
                        which = "queue" if on_queue else "io_uring"
                        raise BenchError(
                            f"job {self.job.name!r}: the I/O loop's {which} failed on {self.target.uri}: {e}"
                        ) from None
                    raise self._io_error("read" if e.is_read else "write", e.offset, e) from None  # type: ignore[attr-defined]
                except EOFError as e:
                    raise self._io_error("read" if e.is_read else "write", e.offset, e) from None  # type: ignore[attr-defined]
                now = clock()
                rstats.ios, rstats.bytes, wstats.ios, wstats.bytes = bl.counters()
                if done:
                    break
                if now >= next_tick:
                    phase.series.sample(now - start, rstats, wstats)
                    progress.update(rstats.bytes, wstats.bytes, rstats.ios, wstats.ios, (now - start) // 1_000_000)
                    next_tick = now + TICK_NS
                    if progress.stop_requested:
                        bl.stop()
        finally:
            # Anything still in flight (we got here through an exception in
            # Python) finishes before the buffers can go; I/O stuck past the
            # drain limit is given up on (close() then keeps the buffers).
            if bl.inflight:
                bl.stop()
                deadline = clock() + DRAIN_LIMIT_NS
                try:
                    while clock() < deadline and not bl.run(min(clock() + TICK_NS, deadline)):
                        pass
                except _core.BenchLoopThreadError:
                    raise  # a bug, never dropped as one more failed I/O
                except (OSError, EOFError):
                    pass
            phase.end_ns = clock()
            for stats, is_read in ((rstats, True), (wstats, False)):
                d = bl.stats(is_read)
                stats.load(
                    d["ios"], d["bytes"], d["short_ios"], d["counts"],
                    d["min_ns"], d["max_ns"], d["sum_ns"], d["sumsq"],
                )
            for depth, count in enumerate(bl.depths()):
                if depth and count:
                    phase.depth_counts[depth_bucket(depth)] += count
            stuck = bl.inflight
            closed_ok = bl.close(limit_ns=0) if stuck else bl.close()
            if not closed_ok:
                log(self.job, f"{stuck} I/O still in flight after {DRAIN_LIMIT_NS / 1e9:g} s of draining; "
                    "gave up on them, their buffers are left allocated")
            phase.series.sample(phase.end_ns - start, rstats, wstats)
            progress.update(
                rstats.bytes, wstats.bytes, rstats.ios, wstats.ios, (phase.end_ns - start) // 1_000_000
            )

    # ------------------------------------------------------------ blocking

    def run_blocking(
        self,
        ios: Iterable[tuple[int, bool]],
        phase: Phase,
        duration_ns: int | None,
        verify_only: bool = False,
    ) -> None:
        dev = self.dev
        bs = self.bs
        buf = self.bufs[0]
        clock = time.monotonic_ns
        rstats, wstats = phase.read, phase.write
        vlog = self.verify_log
        verify_on = vlog is not None
        progress = self.progress
        phase.start_ns = start = clock()
        end_ns = start + duration_ns if duration_ns else None
        next_tick = start + TICK_NS
        phase.series.sample(0, rstats, wstats)
        read, write = dev.read_into_blocking, dev.write_from_blocking
        try:
            for off, is_read in ios:
                if verify_on and not is_read:
                    self.seq += 1
                    verifymod.stamp(buf, off, bs, self.seq)
                phase.depth_counts[0] += 1
                t0 = clock()
                try:
                    n = read(off, buf) if is_read else write(off, buf)
                except OSError as e:
                    raise self._io_error("read" if is_read else "write", off, e) from None
                t1 = clock()
                if n is None:
                    n = bs
                if n <= 0:
                    raise self._io_error("read" if is_read else "write", off, EOFError(f"returned {n}"))
                stats = rstats if is_read else wstats
                stats.add(t1 - t0, n)
                if n != bs:
                    stats.short_ios += 1
                if verify_on:
                    assert vlog is not None
                    if is_read:
                        if verify_only or self.check_all_reads or self._was_written(off):
                            vlog.record(off, bs, verifymod.check(buf, off, bs))
                    else:
                        self._mark_written(off)
                if t1 >= next_tick:
                    phase.series.sample(t1 - start, rstats, wstats)
                    progress.update(
                        rstats.bytes, wstats.bytes, rstats.ios, wstats.ios, (t1 - start) // 1_000_000
                    )
                    next_tick = t1 + TICK_NS
                    if progress.stop_requested:
                        break
                if end_ns is not None and t1 >= end_ns:
                    break
        finally:
            phase.end_ns = clock()
            phase.series.sample(phase.end_ns - start, rstats, wstats)
            progress.update(
                rstats.bytes, wstats.bytes, rstats.ios, wstats.ios, (phase.end_ns - start) // 1_000_000
            )

    def run(
        self,
        ios: Iterable[tuple[int, bool]],
        phase: Phase,
        duration_ns: int | None,
        verify_only: bool = False,
    ) -> None:
        """Issue ``ios`` until they run out or ``duration_ns`` has passed."""
        c_loop = self.c_fd is not None or self.c_queue
        if c_loop and isinstance(ios, AccessPattern) and not verify_only and self.verify_log is None:
            self.last_loop = "c"
            self.run_c(ios, phase, duration_ns)
        elif self.job.ioengine == "psync":
            self.last_loop = "psync"
            self.run_blocking(ios, phase, duration_ns, verify_only)
        elif self.verify_log is None and not is_multipath(self.target):
            self.last_loop = "python"
            self.run_direct(ios, phase, duration_ns)
        else:
            self.last_loop = "python"
            self.run_async(ios, phase, duration_ns, verify_only)


# ---------------------------------------------------------------- the job


def log(job: Job, msg: str) -> None:
    """One line on stderr about how a job runs (not part of the report)."""
    print(f"fx100io bench: job {job.name!r}: {msg}", file=sys.stderr, flush=True)


def c_loop_refusal(job: Job, target: Target) -> str | None:
    """Why the job cannot run in the C I/O loop, or None when it can (over
    its own io_uring for a local file or block device, over the device's C
    queue for an NVMe/TCP or NVMe/RDMA target)."""
    if job.ioengine in QUEUE_ENGINES:
        if target.path is not None:
            return f"ioengine={job.ioengine} on a local path"
    elif job.ioengine != "io_uring":
        return f"ioengine={job.ioengine}"
    elif target.path is None:
        return "the target is not a local file or block device"
    if job.verify:
        return "--verify checks blocks in Python"
    if is_multipath(target):
        return "several paths: each request may move to another path, in Python"
    from fx100io import _core

    most = getattr(_core, "BL_MAX_DEPTH", 32768)
    if job.iodepth > most:
        return f"iodepth={job.iodepth} is more than the C loop's {most}"
    return None


def is_multipath(target: Target) -> bool:
    """The target is several paths to one namespace (a MultipathDevice)."""
    return callable(getattr(getattr(target, "device", None), "path_stats", None))


def c_loop_on_queue(job: Job, target: Target) -> bool:
    """The job runs in the C loop over the device's C queue (no fd)."""
    return target.path is None and c_loop_refusal(job, target) is None


def open_c_loop_fd(job: Job, target: Target, clone: int) -> int | None:
    """An fd of the target for the C loop, or None: when the job takes the
    C loop over the device's queue (c_loop_on_queue), or the Python I/O loop
    (with a log line that says why)."""
    why = c_loop_refusal(job, target)
    if why is None and target.path is None:
        return None  # the C loop over the device's queue
    if why is None:
        assert target.path is not None
        flags = (os.O_RDWR if job.writes or target.created else os.O_RDONLY) | os.O_CLOEXEC
        if job.direct:
            flags |= os.O_DIRECT
        try:
            return os.open(target.path, flags)
        except OSError as e:
            if e.errno == errno.EINVAL and job.direct:
                why = f"cannot open {target.path} with O_DIRECT (direct=1): its filesystem does not support it"
            else:
                why = f"cannot open {target.path} for it: {e.strerror}"
    if job.ioengine != "psync" and clone == 0:
        log(job, f"runs on the Python I/O loop, not the C loop ({why})")
    return None


def _buffers(job: Job, count: int) -> tuple[Any, list[Any]]:
    """The job's buffers: plain memoryviews for a job that only reads (no
    numpy to import before it starts), numpy arrays for one that writes or
    verifies."""
    import fx100io

    pool = fx100io.BufferPool(job.bs * count)
    if not (job.writes or job.verify):
        return pool, [pool.alloc_view(job.bs) for _ in range(count)]
    import numpy as np

    bufs = [pool.alloc(job.bs) for _ in range(count)]
    # Random payload, made once: fio also fills write buffers with random
    # data by default, so compressing or deduplicating devices are not
    # flattered by zeros.
    rng = np.random.default_rng(job.seed)
    for b in bufs:
        b[:] = rng.integers(0, 256, size=job.bs, dtype=np.uint8)
    return pool, bufs


def layout(loop: IoLoop, job: Job, target: Target) -> None:
    """Write the region once before a read job on a new or grown file (fio's
    "Laying out IO file"), with verify headers when --verify is on."""
    nblocks = target.region_len // job.bs
    ios = AccessPattern(target.region_start, nblocks, job.bs, False, True, 0.0, job.seed, 1)
    # Layout blocks are not "written by the job": keep them out of the
    # verify read-back so it covers only what the measured phase wrote.
    saved_written, loop.written = loop.written, None
    try:
        loop.run(ios, Phase(), None)
    finally:
        loop.written = saved_written


def run_block_job(
    job: Job, clone: int, progress: Any = None, start_gate: Callable[[], None] | None = None
) -> JobResult:
    """Run one instance of a block job and return its measurements.

    ``start_gate`` is called once setup (open, buffers, layout) is done, so
    every job of a run starts its clock together; it blocks on the runner's
    barrier.  Raises BenchError for setup problems (nothing measured yet);
    an I/O error during the run comes back as JobResult.error.
    """
    progress = progress or NullSlot()
    progress.set_state(SETUP)
    depth = 1 if job.ioengine == "psync" else job.iodepth
    result = JobResult(job, clone, os.getpid())
    if job.ioengine == "psync" and job.iodepth > 1:
        result.engine_note = f"psync is synchronous: one I/O at a time (iodepth={job.iodepth} has no effect)"
    target = open_target(job, queue_depth=max(depth, 1))
    c_fd: int | None = None
    try:
        result.target_uri = target.uri
        result.target_size = target.size
        result.block_size = target.block_size
        result.region = (target.region_start, target.region_len)
        pool, bufs = _buffers(job, depth)
        c_fd = open_c_loop_fd(job, target, clone)
        loop = IoLoop(job, target, bufs, progress, c_fd, clone, c_queue=c_loop_on_queue(job, target))
        if target.created and job.reads:
            layout(loop, job, target)
        if target.path and not job.direct and job.invalidate:
            drop_page_cache(target.path)
        if start_gate is not None:
            start_gate()
        nblocks = target.region_len // job.bs

        def pattern(passes: int | None, seed_offset: int = 0, limit: int | None = None) -> AccessPattern:
            return AccessPattern(
                target.region_start,
                nblocks,
                job.bs,
                job.is_random,
                job.random_map,
                job.read_fraction,
                clone_seed(job.seed, clone) + seed_offset,
                passes,
                limit,
            )

        ru0 = Rusage.now()
        try:
            if job.ramp_ns:
                progress.set_state(RAMP)
                # Ramp I/O is real but unrecorded; it wraps so a short region
                # does not end the ramp early.
                loop.run(pattern(None, 1), Phase(), job.ramp_ns)
            progress.set_state(RUNNING)
            phase = Phase()
            passes = None if job.time_based else job.loops
            try:
                loop.run(pattern(passes, limit=job.io_count(target.region_len)), phase, job.runtime_ns)
            finally:
                result.io_loop = loop.last_loop
                if loop.last_loop == "c" and loop.c_fd is None:
                    result.io_loop_backend = f"{job.ioengine} queue"
                elif loop.last_loop == "c":
                    result.io_loop_backend = "io_uring"
                    result.io_uring_features = list(loop.c_features)
                    result.io_uring_refused = {
                        name: errno.errorcode.get(err, str(err)) for name, err in loop.c_refused.items()
                    }
                result.read, result.write = phase.read, phase.write
                result.series = [phase.series]
                result.runtime_ns = max(phase.end_ns - phase.start_ns, 1)
                result.depth_counts = phase.depth_counts
            result.rusage = Rusage.now() - ru0
            if job.verify:
                progress.set_state(VERIFYING)
                if loop.written is not None:
                    loop.run(loop.written_offsets(), Phase(), None, verify_only=True)
                result.verify = loop.verify_log
                if loop.verify_log is not None and loop.verify_log.errors:
                    result.error = 84  # EILSEQ, what fio reports for verify failures
                    result.error_msg = (
                        f"verify failed: {loop.verify_log.errors} of {loop.verify_log.blocks} blocks bad; first: "
                        + loop.verify_log.failures[0]
                    )
        except BenchError as e:
            result.rusage = Rusage.now() - ru0
            result.error = 5  # EIO
            result.error_msg = str(e)
            result.verify = loop.verify_log
        if is_multipath(target):
            result.paths = target.device.path_stats()
        del bufs
        pool.close()
    finally:
        if c_fd is not None:
            os.close(c_fd)
        target.close()
        progress.set_state(DONE)
    result.end_time = time.time()
    return result

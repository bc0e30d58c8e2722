"""Runs all jobs of a bench invocation concurrently and collects results.

Like fio (without stonewall), every job section and every numjobs clone runs
at the same time.  Each instance is its own process (forked, so the parsed
Job needs no re-parsing) because the GIL would otherwise make clones share
one core; a run with a single instance stays in this process, which keeps
tracebacks and profiling simple.  A barrier makes all instances start their
clocks together, after the slow parts (opening, laying out files) are done.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .diskstats import DiskUtil, disks_of, diskutil_between, read_diskstats
from .errors import BenchError
from .options import Job
from .progress import SharedProgress
from .results import JobResult
from .stats import SystemCpu, read_proc_stat


@dataclass
class RunOutcome:
    results: list[JobResult]
    system_cpu: SystemCpu
    started: float  # wall clock when the jobs were released
    elapsed_s: float
    disk_util: list[DiskUtil] = field(default_factory=list)


def run_one(job: Job, clone: int, slot: Any, gate: Callable[[], None] | None) -> JobResult:
    """Dispatch on the workload kind."""
    if job.kv is not None:
        from .kv import run_kv_job

        return run_kv_job(job, clone, slot, gate)
    from .workload import run_block_job

    return run_block_job(job, clone, slot, gate)


def _child(job: Job, clone: int, index: int, progress: SharedProgress, barrier: Any, conn: Any) -> None:
    # Ctrl-C goes to the whole process group; the parent turns it into the
    # shared stop flag so that children finish and still report.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = run_one(job, clone, progress.slot(index), barrier.wait)
        conn.send(("ok", result))
    except threading.BrokenBarrierError:
        conn.send(("aborted", None))
    except BenchError as e:
        barrier.abort()
        conn.send(("error", str(e)))
    except BaseException:  # noqa: BLE001 - report any crash to the parent, then exit
        barrier.abort()
        conn.send(("crash", f"job {job.name!r} crashed:\n{traceback.format_exc()}"))
    finally:
        conn.close()


class _StopOnSigint:
    """First Ctrl-C: ask jobs to stop and report; a second one aborts."""

    def __init__(self, progress: SharedProgress) -> None:
        self.progress = progress
        self.old: Any = None

    def __enter__(self) -> _StopOnSigint:
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum: int, frame: Any) -> None:
        if self.progress.stop_requested:
            raise KeyboardInterrupt
        self.progress.request_stop()

    def __exit__(self, *exc: object) -> None:
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)


def run_jobs(
    jobs: list[Job], on_start: Callable[[SharedProgress, list[tuple[Job, int]]], Any] | None = None
) -> RunOutcome:
    """Run every (job, clone) instance; ``on_start`` starts the status line
    once the jobs are released and returns an object with ``stop()``."""
    instances = [(job, clone) for job in jobs for clone in range(job.numjobs)]
    ctx = multiprocessing.get_context("fork")
    progress = SharedProgress(len(instances), ctx)
    marks: dict[str, Any] = {}

    def released() -> None:
        # Targets exist by now (setup created them), so their disks are known.
        marks["disks"] = disks_of([job.filename for job in jobs])
        marks["disk0"] = read_diskstats()
        marks["stat0"] = read_proc_stat()
        marks["t0"] = time.monotonic()
        marks["wall0"] = time.time()
        marks["status"] = on_start(progress, instances) if on_start else None

    with _StopOnSigint(progress):
        try:
            if len(instances) == 1:
                job, clone = instances[0]
                results = [run_one(job, clone, progress.slot(0), released)]
            else:
                results = _run_processes(ctx, instances, progress, released)
        finally:
            status = marks.get("status")
            if status is not None:
                status.stop()
    stat1 = read_proc_stat()
    disk1 = read_diskstats()
    elapsed = time.monotonic() - marks.get("t0", time.monotonic())
    syscpu = SystemCpu.between(marks.get("stat0", {}), stat1)
    disks = diskutil_between(marks.get("disks", []), marks.get("disk0", {}), disk1, elapsed * 1000)
    for r in results:
        r.system_cpu = syscpu
    return RunOutcome(results, syscpu, marks.get("wall0", time.time()), elapsed, disks)


def _run_processes(
    ctx: Any, instances: list[tuple[Job, int]], progress: SharedProgress, released: Callable[[], None]
) -> list[JobResult]:
    barrier = ctx.Barrier(len(instances) + 1)
    procs = []
    conns = []
    for i, (job, clone) in enumerate(instances):
        parent_end, child_end = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_child,
            args=(job, clone, i, progress, barrier, child_end),
            name=f"fx100io-bench-{job.name}.{clone}",
        )
        p.start()
        child_end.close()
        procs.append(p)
        conns.append(parent_end)

    replies: dict[int, tuple[str, Any]] = {}

    def collect(block: bool) -> None:
        pending = {c: i for i, c in enumerate(conns) if i not in replies}
        sentinels = {procs[i].sentinel: i for i in pending.values()}
        if not pending:
            return
        ready = multiprocessing.connection.wait(list(pending) + list(sentinels), timeout=None if block else 0)
        for r in ready:
            if r in pending:
                i = pending[r]
                try:
                    replies[i] = conns[i].recv()
                except EOFError:
                    replies[i] = ("crash", f"job {instances[i][0].name!r} exited without a result")
            elif r in sentinels:
                i = sentinels[r]
                if i not in replies and not conns[i].poll():
                    code = procs[i].exitcode
                    replies[i] = (
                        "crash",
                        f"job {instances[i][0].name!r} died (exit code {code}) without a result",
                    )

    try:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            # Someone failed during setup; gather the reasons.
            while len(replies) < len(instances):
                collect(True)
            raise BenchError(_first_failure(replies) or "a job failed during setup") from None
        released()
        while len(replies) < len(instances):
            collect(True)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    failure = _first_failure(replies)
    if failure:
        raise BenchError(failure)
    return [replies[i][1] for i in range(len(instances))]


def _first_failure(replies: dict[int, tuple[str, Any]]) -> str | None:
    for kind in ("error", "crash"):
        for i in sorted(replies):
            if replies[i][0] == kind:
                return str(replies[i][1])
    return None

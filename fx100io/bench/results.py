"""What a finished job hands back to the reports (picklable across processes)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .options import Job
from .stats import DirStats, Rusage, Series, SystemCpu
from .verify import VerifyLog

# fio's "IO depths" buckets: each covers depths from its value up to below the
# next one (16 = 16..31), the last is ">=64".
DEPTH_BOUNDS = (1, 2, 4, 8, 16, 32, 64)
DEPTH_KEYS = ("1", "2", "4", "8", "16", "32", ">=64")


def depth_bucket(d: int) -> int:
    return min(max(d, 1).bit_length() - 1, len(DEPTH_BOUNDS) - 1)


@dataclass
class JobResult:
    job: Job
    clone: int  # 0..numjobs-1
    pid: int
    read: DirStats = field(default_factory=DirStats)
    write: DirStats = field(default_factory=DirStats)
    runtime_ns: int = 0  # measured phase, from its start to its last completion
    rusage: Rusage = field(default_factory=lambda: Rusage(0.0, 0.0, 0, 0, 0))
    depth_counts: list[int] = field(default_factory=lambda: [0] * len(DEPTH_BOUNDS))
    series: list[Series] = field(default_factory=list)  # one per merged instance
    verify: VerifyLog | None = None
    error: int = 0  # errno-style code, 0 = fine (fio's "err=")
    error_msg: str = ""
    end_time: float = field(default_factory=time.time)
    engine_note: str = ""  # e.g. "psync runs one I/O at a time"
    # The I/O loop the measured phase ran on ("c", "python", "psync"; "" for
    # workloads without one) and, for the C loop, the io_uring features it
    # ran with and the options the kernel refused (name -> errno name).
    io_loop: str = ""
    # The C loop's I/O backend: "io_uring" (its own ring over the file) or
    # "<ioengine> queue" (the device's C queue: NVMe/TCP, NVMe/RDMA).
    io_loop_backend: str = ""
    io_uring_features: list[str] = field(default_factory=list)
    io_uring_refused: dict[str, str] = field(default_factory=dict)
    target_uri: str = ""
    target_size: int = 0
    block_size: int = 0
    region: tuple[int, int] = (0, 0)
    kv: dict[str, Any] | None = None  # the KV-cache workload's extra numbers
    kv_load: DirStats | None = None  # per-prompt prefix-load times
    system_cpu: SystemCpu | None = None  # filled in by the runner for the whole run
    jobs_merged: int = 1
    cpu_runtime_ns: int = 0  # job time CPU percentages divide by (0: runtime_ns)
    # Phases with their own clocks (the KV workload stores, then loads):
    # bandwidth of a direction divides by its phase, not the whole job.
    dir_runtime_ns: dict[str, int] = field(default_factory=dict)
    # A multipath target: one dict per path (MultipathDevice.path_stats(),
    # counted over the whole job, layout and ramp included), in its order.
    paths: list[dict[str, Any]] = field(default_factory=list)

    def runtime_for(self, which: str) -> int:
        return self.dir_runtime_ns.get(which, self.runtime_ns)

    @property
    def name(self) -> str:
        return self.job.name


def group_results(results: list[JobResult]) -> list[JobResult]:
    """fio's group_reporting: all jobs of the run (fio's group 0) reported as
    one, named after the first; without it every instance stands alone."""
    if not results or not any(r.job.group_reporting for r in results):
        return results
    first = results[0]
    merged = JobResult(first.job, 0, first.pid)
    merged.series = []
    merged.jobs_merged = 0
    merged.rusage = Rusage(0.0, 0.0, 0, 0, 0)
    cpu_runtime_ns = 0
    for r in results:
        merged.read.merge(r.read)
        merged.write.merge(r.write)
        # Group bandwidth is total bytes over the longest job, as in fio.
        merged.runtime_ns = max(merged.runtime_ns, r.runtime_ns)
        for which, ns in r.dir_runtime_ns.items():
            merged.dir_runtime_ns[which] = max(merged.dir_runtime_ns.get(which, 0), ns)
        cpu_runtime_ns += r.runtime_ns
        ru = r.rusage
        merged.rusage = Rusage(
            merged.rusage.utime + ru.utime,
            merged.rusage.stime + ru.stime,
            merged.rusage.ctx + ru.ctx,
            merged.rusage.majf + ru.majf,
            merged.rusage.minf + ru.minf,
        )
        merged.depth_counts = [a + b for a, b in zip(merged.depth_counts, r.depth_counts)]
        merged.series.extend(r.series)
        if r.verify is not None:
            if merged.verify is None:
                merged.verify = VerifyLog()
            merged.verify.merge(r.verify)
        if r.error and not merged.error:
            merged.error, merged.error_msg = r.error, r.error_msg
        if r.kv_load is not None:
            if merged.kv_load is None:
                merged.kv_load = DirStats()
            merged.kv_load.merge(r.kv_load)
        merged.engine_note = merged.engine_note or r.engine_note
        if r.io_loop and r.io_loop != merged.io_loop:
            merged.io_loop = r.io_loop if not merged.io_loop else "mixed"
        if r.io_loop_backend and r.io_loop_backend != merged.io_loop_backend:
            merged.io_loop_backend = r.io_loop_backend if not merged.io_loop_backend else "mixed"
        for name in r.io_uring_features:
            if name not in merged.io_uring_features:
                merged.io_uring_features.append(name)
        merged.io_uring_refused.update(r.io_uring_refused)
        merged.paths = merge_paths(merged.paths, r.paths)
        merged.jobs_merged += 1
        merged.end_time = max(merged.end_time, r.end_time)
    merged.kv = _merge_kv([r.kv for r in results if r.kv is not None], merged.runtime_ns)
    merged.target_uri, merged.target_size, merged.block_size = (
        first.target_uri,
        first.target_size,
        first.block_size,
    )
    merged.region = first.region
    merged.system_cpu = first.system_cpu
    # CPU percentages stay "per job" (total CPU time over total job time),
    # which is how fio averages them in a group.
    merged.cpu_runtime_ns = cpu_runtime_ns
    return [merged]


PATH_COUNTERS = ("commands", "bytes", "errors", "failovers")


def merge_paths(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-path stats of two instances summed path by path (matched by the
    path's URI); the state and ANA state are the later instance's."""
    out = [dict(p) for p in a]
    at = {p["path"]: p for p in out}
    for p in b:
        mine = at.get(p["path"])
        if mine is None:
            out.append(dict(p))
            continue
        for k in PATH_COUNTERS:
            mine[k] = mine.get(k, 0) + p.get(k, 0)
        mine["state"], mine["ana_state"] = p.get("state", ""), p.get("ana_state", "")
    return out


def _merge_kv(kvs: list[dict[str, Any]], runtime_ns: int) -> dict[str, Any] | None:
    if not kvs:
        return None
    out = dict(kvs[0])
    for key in ("chunks_stored", "bytes_stored", "chunks_loaded", "bytes_loaded", "prompts_loaded", "misses"):
        if key in out:
            out[key] = sum(k.get(key, 0) for k in kvs)
    for phase in ("store", "load"):
        secs = max((k.get(f"{phase}_seconds", 0.0) for k in kvs), default=0.0)
        out[f"{phase}_seconds"] = secs
        nbytes = out.get("bytes_stored" if phase == "store" else "bytes_loaded", 0)
        out[f"{phase}_GBps"] = nbytes / secs / 1e9 if secs else 0.0
    return out

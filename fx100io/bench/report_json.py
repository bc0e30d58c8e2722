"""The report in fio's JSON layout (--output-format=json).

Field names and units are fio's, so programs written for fio's JSON read
ours: bw in KiB/s, bw_bytes in B/s, runtime in ms, latencies in ns,
percentile keys formatted "%f".  What fio has and we do not measure is
present with zeros and N = 0 (slat, trim, sync) rather than invented.
Our additions live in fields fio does not use: "system_cpu" (machine-wide
CPU from /proc/stat, which sees io_uring's kernel workers) and "fx100io".
"""

from __future__ import annotations

import json
import time
from typing import Any

from fx100io.uri_redact import redact

from .results import DEPTH_KEYS, JobResult
from .runner import RunOutcome
from .stats import DirStats, Series, summary

BW_WINDOW_NS = 500_000_000  # fio's default bwavgtime / iopsavgtime

# fio's latency distribution buckets (upper bounds in each unit).
LAT_NS_BOUNDS = (2, 4, 10, 20, 50, 100, 250, 500, 750, 1000)
LAT_US_BOUNDS = LAT_NS_BOUNDS
LAT_MS_BOUNDS = (2, 4, 10, 20, 50, 100, 250, 500, 750, 1000, 2000)


def version() -> str:
    # the package's own constant: importlib.metadata would scan the installed
    # distributions on every run (about 30 ms of start-up)
    from fx100io import __version__

    return __version__


def _lat_block(d: DirStats) -> dict[str, Any]:
    return {"min": d.min_ns, "max": d.max_ns, "mean": d.mean_ns, "stddev": d.stdev_ns, "N": d.n}


def _empty_lat() -> dict[str, Any]:
    return {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0}


def bw_windows(series: list[Series], which: str) -> tuple[list[float], list[float]]:
    bw: list[float] = []
    iops: list[float] = []
    for s in series:
        b, i = s.windows(BW_WINDOW_NS, which)
        bw += b
        iops += i
    return bw, iops


def dir_json(r: JobResult, which: str, group_bw_kib: float | None = None) -> dict[str, Any]:
    d: DirStats = r.read if which == "read" else r.write
    runtime_ms = r.runtime_for(which) // 1_000_000 if d.ios else 0
    # fio divides by whole milliseconds; a sub-millisecond run still moved
    # bytes, so count it as 1 ms rather than report nothing.
    div = max(runtime_ms, 1) if d.ios else 0
    bw_bytes = d.bytes * 1000 // div if div else 0
    bw_s, iops_s = bw_windows(r.series, which) if d.ios else ([], [])
    bws, iopss = summary(bw_s), summary(iops_s)
    agg = 100.0 * bws["mean"] / group_bw_kib if group_bw_kib and bws["samples"] else 0.0
    out: dict[str, Any] = {
        "io_bytes": d.bytes,
        "io_kbytes": d.bytes // 1024,
        "bw_bytes": bw_bytes,
        "bw": bw_bytes // 1024,
        "iops": d.ios * 1000 / div if div else 0.0,
        "runtime": runtime_ms,
        "total_ios": d.ios,
        "short_ios": d.short_ios,
        "drop_ios": 0,
        "slat_ns": _empty_lat(),
        "clat_ns": dict(
            _lat_block(d), percentile={f"{p:f}": v for p, v in d.percentiles(r.job.percentiles).items()}
        ),
        "lat_ns": _lat_block(d),
        "bw_min": int(bws["min"]),
        "bw_max": int(bws["max"]),
        "bw_agg": agg,
        "bw_mean": bws["mean"],
        "bw_dev": bws["dev"],
        "bw_samples": bws["samples"],
        "iops_min": int(iopss["min"]),
        "iops_max": int(iopss["max"]),
        "iops_mean": iopss["mean"],
        "iops_stddev": iopss["dev"],
        "iops_samples": iopss["samples"],
    }
    if d.n == 0:
        out["clat_ns"] = _empty_lat()
    return out


def _empty_dir() -> dict[str, Any]:
    return {
        "io_bytes": 0, "io_kbytes": 0, "bw_bytes": 0, "bw": 0, "iops": 0.0, "runtime": 0,
        "total_ios": 0, "short_ios": 0, "drop_ios": 0,
        "slat_ns": _empty_lat(), "clat_ns": _empty_lat(), "lat_ns": _empty_lat(),
        "bw_min": 0, "bw_max": 0, "bw_agg": 0.0, "bw_mean": 0.0, "bw_dev": 0.0, "bw_samples": 0,
        "iops_min": 0, "iops_max": 0, "iops_mean": 0.0, "iops_stddev": 0.0, "iops_samples": 0,
    }  # fmt: skip


def cpu_percent(r: JobResult) -> tuple[float, float]:
    denom = (r.cpu_runtime_ns or r.runtime_ns) / 1e9
    if denom <= 0:
        return 0.0, 0.0
    return 100.0 * r.rusage.utime / denom, 100.0 * r.rusage.stime / denom


def combined(r: JobResult) -> DirStats:
    both = DirStats()
    both.merge(r.read)
    both.merge(r.write)
    return both


def latency_buckets(d: DirStats) -> dict[str, dict[str, float]]:
    ns = d.fraction_below(list(LAT_NS_BOUNDS))
    us = d.fraction_below([b * 1000 for b in LAT_US_BOUNDS])
    ms = d.fraction_below([b * 1_000_000 for b in LAT_MS_BOUNDS] + [1 << 62])
    # fraction_below counts from zero each time; the us and ms tables start
    # where the previous one ended, so drop what the earlier table held.
    us[0] -= sum(ns)
    ms[0] -= sum(ns) + sum(us)
    out_ms = {str(b): v for b, v in zip(LAT_MS_BOUNDS, ms)}
    out_ms[">=2000"] = ms[-1]
    return {
        "latency_ns": {str(b): v for b, v in zip(LAT_NS_BOUNDS, ns)},
        "latency_us": {str(b): v for b, v in zip(LAT_US_BOUNDS, us)},
        "latency_ms": out_ms,
    }


def job_json(r: JobResult, group_bw_kib: dict[str, float]) -> dict[str, Any]:
    usr, sys = cpu_percent(r)
    total_depth = sum(r.depth_counts) or 1
    both = combined(r)
    lat = latency_buckets(both) if both.n else latency_buckets(DirStats())
    job = r.job
    out: dict[str, Any] = {
        "jobname": job.name,
        "groupid": 0,
        "error": r.error,
        "eta": 0,
        "elapsed": max(1, round(r.runtime_ns / 1e9)),
        "job options": {k: ("" if v is None else v) for k, v in job.shown.items()},
        "read": dir_json(r, "read", group_bw_kib.get("read")) if r.read.ios else _empty_dir(),
        "write": dir_json(r, "write", group_bw_kib.get("write")) if r.write.ios else _empty_dir(),
        "trim": _empty_dir(),
        "sync": {"total_ios": 0, "lat_ns": _empty_lat()},
        "job_runtime": r.runtime_ns // 1_000_000,
        "usr_cpu": usr,
        "sys_cpu": sys,
        "ctx": r.rusage.ctx,
        "majf": r.rusage.majf,
        "minf": r.rusage.minf,
        "iodepth_level": {k: 100.0 * c / total_depth for k, c in zip(DEPTH_KEYS, r.depth_counts)},
        **lat,
        "latency_depth": job.iodepth,
        "latency_target": 0,
        "latency_percentile": 100.0,
        "latency_window": 0,
        "system_cpu": r.system_cpu.as_dict() if r.system_cpu else {},
        "fx100io": fx_extras(r),
    }
    return out


def fx_extras(r: JobResult) -> dict[str, Any]:
    job = r.job
    extra: dict[str, Any] = {
        "ioengine": job.ioengine,
        "filename": redact(job.filename),
        "target_bytes": r.target_size,
        "block_size": r.block_size,
        "region_offset": r.region[0],
        "region_bytes": r.region[1],
        "jobs": r.jobs_merged,
        "latency_note": "clat_ns is measured from submission to completion (fio's lat); slat is not separated",
    }
    if r.engine_note:
        extra["engine_note"] = r.engine_note
    if r.io_loop:
        extra["io_loop"] = r.io_loop
    if r.io_loop_backend:
        extra["io_loop_backend"] = r.io_loop_backend
    if r.io_loop == "c" and not r.io_loop_backend.endswith(" queue"):
        extra["io_uring_features"] = list(r.io_uring_features)
        extra["io_uring_refused"] = dict(r.io_uring_refused)
    if r.error_msg:
        extra["error_message"] = r.error_msg
    if r.paths:
        extra["paths"] = [
            {k: p.get(k) for k in ("path", "state", "why", "ana_group", "ana_state", "commands", "bytes",
                                   "errors", "failovers")}
            for p in r.paths
        ]
    if r.verify is not None:
        extra["verify"] = {
            "method": "crc32c",
            "blocks": r.verify.blocks,
            "bytes": r.verify.bytes,
            "errors": r.verify.errors,
            "failures": r.verify.failures,
        }
    if r.kv is not None:
        extra["kv"] = dict(r.kv)
        if r.kv_load is not None and r.kv_load.n:
            pcts = r.kv_load.percentiles(r.job.percentiles)
            extra["kv"]["prefix_load_ns"] = dict(
                _lat_block(r.kv_load), percentile={f"{p:f}": v for p, v in pcts.items()}
            )
    return extra


def group_bandwidths(results: list[JobResult]) -> dict[str, float]:
    """Aggregate KiB/s per direction, for fio's bw_agg (share of the group)."""
    out = {}
    for which in ("read", "write"):
        total = sum(getattr(r, which).bytes for r in results)
        longest = max((r.runtime_for(which) for r in results if getattr(r, which).ios), default=0)
        out[which] = total / 1024 / (longest / 1e9) if longest else 0.0
    return out


def build(outcome: RunOutcome, results: list[JobResult]) -> dict[str, Any]:
    now = outcome.started
    gbw = group_bandwidths(results)
    return {
        "fio version": f"fx100io-{version()}",
        "timestamp": int(now),
        "timestamp_ms": int(now * 1000),
        "time": time.ctime(now),
        "jobs": [job_json(r, gbw) for r in results],
        "disk_util": [d.as_dict() for d in outcome.disk_util],
        "system_cpu": outcome.system_cpu.as_dict(),
        "fx100io": {"version": version(), "elapsed_s": outcome.elapsed_s},
    }


def render(outcome: RunOutcome, results: list[JobResult]) -> str:
    return json.dumps(build(outcome, results), indent=2) + "\n"

"""The human report (--output-format=normal), laid out like fio's summary so
eyes trained on fio find IOPS, BW, clat percentiles and cpu where they expect.
"""

from __future__ import annotations

import time

from .options import Job
from .report_json import bw_windows, combined, cpu_percent, latency_buckets, version
from .results import DEPTH_KEYS, JobResult
from .runner import RunOutcome
from .sizes import fmt_bytes_bin, fmt_bytes_dec, fmt_count
from .stats import DirStats, summary


def header(jobs: list[Job]) -> str:
    """What fio prints before the run: one line per job, then the version."""
    lines = []
    for job in jobs:
        if job.kv is not None:
            kv = job.kv
            chunk = kv.model.chunk_bytes(kv.chunk_tokens)
            lines.append(
                f"{job.name}: (g=0): kv-model={kv.model.name}, chunk={kv.chunk_tokens} tokens "
                f"({fmt_bytes_bin(chunk)}), prompt={kv.prompt_tokens} tokens, ioengine={job.ioengine}, "
                f"kv-concurrency={kv.concurrency}"
            )
            continue
        b = f"{job.bs}B-{job.bs}B"
        lines.append(
            f"{job.name}: (g=0): rw={job.rw}, bs=(R) {b}, (W) {b}, (T) {b}, ioengine={job.ioengine}, iodepth={job.iodepth}"
        )
    lines.append(f"fx100io-{version()} bench")
    n = sum(j.numjobs for j in jobs)
    lines.append(f"Starting {n} process{'es' if n != 1 else ''}")
    return "\n".join(lines) + "\n"


def _unit_for(values_ns: list[float]) -> tuple[str, int]:
    """nsec/usec/msec so the smallest number still has a whole digit."""
    low = min(values_ns) if values_ns else 0
    if low >= 1_000_000:
        return "msec", 1_000_000
    if low >= 1000:
        return "usec", 1000
    return "nsec", 1


def _num(v: float) -> str:
    return f"{v:.2f}" if v != int(v) else str(int(v))


def _lat_line(label: str, d: DirStats) -> str:
    unit, div = _unit_for([d.min_ns])
    return (
        f"    {label} ({unit}): min={_num(round(d.min_ns / div))}, max={_num(round(d.max_ns / div))}, "
        f"avg={d.mean_ns / div:.2f}, stdev={d.stdev_ns / div:.2f}"
    )


def _percentile_lines(d: DirStats, pcts: tuple[float, ...], label: str = "clat percentiles") -> list[str]:
    values = d.percentiles(pcts)
    top = max(values.values()) if values else 0
    unit, div = "nsec", 1
    # The smallest unit in which the largest value fits the 5-digit column.
    for name, factor in (("usec", 1000), ("msec", 1_000_000)):
        if top / div >= 100_000:
            unit, div = name, factor
    cells = [f"{p:5.2f}th=[{round(v / div):5d}]" for p, v in values.items()]
    lines = [f"    {label} ({unit}):"]
    for i in range(0, len(cells), 4):
        row = ", ".join(cells[i : i + 4])
        end = "," if i + 4 < len(cells) else ""
        lines.append(f"     | {row}{end}")
    return lines


def _dir_block(r: JobResult, which: str) -> list[str]:
    d = r.read if which == "read" else r.write
    runtime_ms = max(r.runtime_for(which) // 1_000_000, 1)
    bw = d.bytes * 1000 / runtime_ms
    iops = d.ios * 1000 / runtime_ms
    lines = [
        f"  {which:>5}: IOPS={fmt_count(iops)}, BW={fmt_bytes_bin(bw)}/s ({fmt_bytes_dec(bw)}/s)"
        f"({fmt_bytes_bin(d.bytes)}/{runtime_ms}msec)"
    ]
    if d.n:
        lines.append(_lat_line("clat", d))
        lines += _percentile_lines(d, r.job.percentiles)
    bw_samples, iops_samples = bw_windows(r.series, which)
    bws, iopss = summary(bw_samples), summary(iops_samples)
    if bws["samples"]:
        lines.append(
            f"   bw (  KiB/s): min={int(bws['min'])}, max={int(bws['max'])}, avg={bws['mean']:.2f}, "
            f"stdev={bws['dev']:.2f}, samples={bws['samples']}"
        )
        lines.append(
            f"   iops        : min={int(iopss['min'])}, max={int(iopss['max'])}, avg={iopss['mean']:.2f}, "
            f"stdev={iopss['dev']:.2f}, samples={iopss['samples']}"
        )
    return lines


def _lat_dist_lines(d: DirStats) -> list[str]:
    b = latency_buckets(d)
    lines = []
    for unit, key in (("nsec", "latency_ns"), ("usec", "latency_us"), ("msec", "latency_ms")):
        parts = [f"{k}={v:.2f}%" for k, v in b[key].items() if v >= 0.01]
        if parts:
            lines.append(f"  lat ({unit})   : " + ", ".join(parts))
    return lines


def _kv_lines(r: JobResult) -> list[str]:
    kv = r.kv or {}
    lines = [
        f"  kv-cache     : model={kv.get('model')}, chunk={kv.get('chunk_tokens')} tokens = "
        f"{fmt_bytes_bin(kv.get('chunk_bytes', 0))}, prompt={kv.get('prompt_tokens')} tokens = "
        f"{kv.get('chunks_per_prompt')} chunks ({fmt_bytes_bin(kv.get('prompt_bytes', 0))}), "
        f"concurrency={kv.get('concurrency')}",
        f"     store     : {kv.get('chunks_stored', 0)} chunks, {fmt_bytes_bin(kv.get('bytes_stored', 0))} in "
        f"{kv.get('store_seconds', 0):.3f}s = {kv.get('store_GBps', 0):.2f} GB/s",
        f"     load      : {kv.get('chunks_loaded', 0)} chunks, {fmt_bytes_bin(kv.get('bytes_loaded', 0))} in "
        f"{kv.get('load_seconds', 0):.3f}s = {kv.get('load_GBps', 0):.2f} GB/s, misses={kv.get('misses', 0)}",
    ]
    if kv.get("store_writers"):
        lines.append(
            f"     storm     : {kv['store_writers']} writers stored {kv.get('storm_chunks', 0)} chunks, "
            f"{fmt_bytes_bin(kv.get('storm_bytes', 0))} during the load = "
            f"{kv.get('storm_GBps', 0):.2f} GB/s; loads as {kv.get('load_priority')}")
    if r.kv_load is not None and r.kv_load.n:
        tokens = kv.get("prompt_tokens", 0)
        label = f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)
        lines += _percentile_lines(r.kv_load, r.job.percentiles, f"time to load a {label}-token prefix")
    return lines


def _path_lines(r: JobResult) -> list[str]:
    """A multipath target's paths: what each carried over the whole job."""
    if not r.paths:
        return []
    rows = [("address", "state", "ana", "commands", "bytes", "errors", "failovers")]
    for p in r.paths:
        label = str(p.get("path", ""))
        address = label.split("://", 1)[-1].split("/", 1)[0]  # host:port; secrets are redacted anyway
        rows.append((address, str(p.get("state", "")), str(p.get("ana_state", "")), str(p.get("commands", 0)),
                     fmt_bytes_bin(int(p.get("bytes", 0))), str(p.get("errors", 0)), str(p.get("failovers", 0))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"  paths        : {len(r.paths)} (commands and bytes completed on each; failovers: requests that left it)"]
    for row in rows:
        lines.append("     " + "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in
                                          enumerate(zip(row, widths))))
    return lines


def job_block(r: JobResult) -> str:
    job = r.job
    when = time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(r.end_time))
    lines = [f"{job.name}: (groupid=0, jobs={r.jobs_merged}): err={r.error:2d}: pid={r.pid}: {when}"]
    if job.description:
        lines.append(f"  Description  : [{job.description}]")
    if r.error_msg:
        lines.append(f"  error        : {r.error_msg}")
    if r.engine_note:
        lines.append(f"  note         : {r.engine_note}")
    if r.io_loop:
        loop = {"c": "C", "python": "Python", "psync": "Python, blocking (psync)"}.get(r.io_loop, r.io_loop)
        if r.io_loop == "c" and r.io_loop_backend.endswith(" queue"):
            loop += f" ({r.io_loop_backend})"
        elif r.io_loop == "c":
            loop += " (io_uring: " + (", ".join(r.io_uring_features) or "no options") + ")"
            if r.io_uring_refused:
                loop += "; refused: " + ", ".join(f"{k} ({v})" for k, v in r.io_uring_refused.items())
        lines.append(f"  I/O loop     : {loop}")
    for which in ("read", "write"):
        if getattr(r, which).ios:
            lines += _dir_block(r, which)
    if r.kv is not None:
        lines += _kv_lines(r)
    both = combined(r)
    if both.n:
        lines += _lat_dist_lines(both)
    lines += _path_lines(r)
    usr, sys = cpu_percent(r)
    lines.append(
        f"  cpu          : usr={usr:.2f}%, sys={sys:.2f}%, ctx={r.rusage.ctx}, majf={r.rusage.majf}, minf={r.rusage.minf}"
    )
    if r.system_cpu is not None:
        s = r.system_cpu
        lines.append(
            f"  system cpu   : usr={s.usr:.2f}%, sys={s.sys:.2f}%, irq={s.irq:.2f}%, softirq={s.softirq:.2f}%, "
            f"iowait={s.iowait:.2f}% of {s.cpus} CPUs ({s.busy_cpus:.2f} CPUs busy, whole machine)"
        )
    total = sum(r.depth_counts)
    if total:
        lines.append(
            "  IO depths    : "
            + ", ".join(f"{k}={100.0 * c / total:.1f}%" for k, c in zip(DEPTH_KEYS, r.depth_counts))
        )
    lines.append(
        f"     issued rwts: total={r.read.ios},{r.write.ios},0,0 short={r.read.short_ios},{r.write.short_ios},0,0 "
        "dropped=0,0,0,0"
    )
    if r.verify is not None:
        v = r.verify
        lines.append(
            f"  verify       : crc32c, {v.blocks} blocks ({fmt_bytes_bin(v.bytes)}) checked, {v.errors} bad"
        )
        for f in v.failures:
            lines.append(f"     bad block : {f}")
    return "\n".join(lines) + "\n"


def group_block(results: list[JobResult]) -> str:
    lines = ["Run status group 0 (all jobs):"]
    for which, label in (("read", "READ"), ("write", "WRITE")):
        rs = [r for r in results if getattr(r, which).ios]
        if not rs:
            continue
        total = sum(getattr(r, which).bytes for r in rs)
        runs = [max(r.runtime_for(which) // 1_000_000, 1) for r in rs]
        per = [getattr(r, which).bytes * 1000 / rt for r, rt in zip(rs, runs)]
        agg = total * 1000 / max(runs)
        lines.append(
            f"{label:>7}: bw={fmt_bytes_bin(agg)}/s ({fmt_bytes_dec(agg)}/s), "
            f"{fmt_bytes_bin(min(per))}/s-{fmt_bytes_bin(max(per))}/s "
            f"({fmt_bytes_dec(min(per))}/s-{fmt_bytes_dec(max(per))}/s), "
            f"io={fmt_bytes_bin(total)} ({fmt_bytes_dec(total)}), run={min(runs)}-{max(runs)}msec"
        )
    return "\n".join(lines) + "\n"


def render(outcome: RunOutcome, results: list[JobResult], jobs: list[Job]) -> str:
    parts = [header(jobs)]
    for r in results:
        parts.append(job_block(r))
    parts.append(group_block(outcome.results))
    if outcome.disk_util:
        lines = ["Disk stats (read/write):"]
        for d in outcome.disk_util:
            lines.append(
                f"  {d.name}: ios={d.read_ios}/{d.write_ios}, merge={d.read_merges}/{d.write_merges}, "
                f"ticks={d.read_ticks}/{d.write_ticks}, in_queue={d.in_queue}, util={d.util:.2f}%"
            )
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)

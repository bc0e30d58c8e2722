#!/usr/bin/env python3
"""fx100io against fio's io_uring engine on the same file or block device.

Interleaved rounds, O_DIRECT everywhere, the peer measured in the same run:
  fio       io_uring, fixedbufs, registerfiles, 1 MiB reads, iodepth 32
  device    fx100io Device.read_into, 1 MiB reads, 32 in flight (BufferPool)
  fio-32m   io_uring, fixedbufs, registerfiles, 32 MiB reads, iodepth 32
  store     ChunkStore.batch_get, 32 MiB chunks, 32 per batch (CRC checked)
  device-32m  fx100io Device, 32 MiB reads, 32 in flight, with and without the CRC32C
            computed as the pieces land (OP_CRC32C): the check's own CPU in the same run
  fio-w     io_uring, registerfiles, 32 MiB writes, iodepth 32, to a file of the same
            size next to the target (files only); once as fio runs by default (fixedbufs
            too; a disk with a write-back cache then counts writes into its cache) and
            once with end_fsync (an fsync after the last write, in fio's time): durable
            when its clock stops, as a put is when it returns.  The durable run goes
            without fixedbufs: with them, this job (32 MiB writes, iodepth 32, 1 GiB)
            under fio 3.33 sent no flush to the disk in any of our runs.  A durable
            case during which /proc/diskstats counted no flush at the disk is named in
            a warning at the end (where the disk's flushes can be counted)
  put       ChunkStore.batch_put, 32 MiB chunks, 32 per batch (CRC computed as they
            leave), into a second store file next to the target (files only); its
            blocks, and fio's file's, are written once before the rounds (untimed): both
            overwrite;
  put-new   the same into a store created just before (untimed): its blocks were never
            written, so the filesystem converts each extent on its first write (ext4's
            unwritten extents, committed by the flush): what a new store pays once
The durable writes (fio-w with end_fsync, put, put-new) each run after an untimed
fsync of both write files (so a flush pays for its own case's writes only), taking
turns going first.
Prints GB/s per round, medians, and the ratios to fio, and CPU seconds (user+sys) per GB
for each path: fio's own account of its job, and for fx100io the process's rusage over
the timed part (io_uring's kernel workers are threads of the process, so they count).
First it prints the floors of CPU per byte on this machine: crc32c alone and memcpy alone
(GB/s per core and CPU s/GB), on a buffer that fits in the cache and on one that does not.

  python3 tools/bench_vs_fio.py [--target PATH_OR_DEV] [--gib 2] [--rounds 5]

The target is formatted as a ChunkStore (its contents are destroyed).
Default: a 2.5 GiB file under /var/tmp (the machine's disk, not tmpfs).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import functools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import _checkout  # noqa: F401 - first: this checkout's fx100io where it is built (tools/_checkout.py)
import numpy as np
from fio_peer import fio_read_cpu  # tools/, this script's folder

import fx100io
from fx100io import _core
from fx100io.bench.diskstats import disk_of

MiB = 1 << 20
CHUNK = 32 * MiB


# (GB/s, CPU seconds per GB) of one measured path
Result = tuple[float, float]


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _thread_cpu_rate(fn: Callable[[], object], nbytes: int, seconds: float = 0.3) -> tuple[float, float]:
    """(GB/s by the wall clock, GB/s by this thread's CPU time) of fn, best of 3 tries:
    the CPU figure holds on a busy machine, the wall figure only on a quiet one."""
    best_wall = best_cpu = 0.0
    for _ in range(3):
        n, t, c = 0, time.perf_counter(), time.thread_time()
        while time.perf_counter() - t < seconds:
            fn()
            n += 1
        wall, cpu = time.perf_counter() - t, time.thread_time() - c
        best_wall = max(best_wall, n * nbytes / wall / 1e9)
        best_cpu = max(best_cpu, n * nbytes / max(cpu, 1e-9) / 1e9)
    return best_wall, best_cpu


def floors() -> dict[str, tuple[float, float]]:
    """crc32c and memcpy alone, hot (4 MiB, in cache) and cold (256 MiB, from memory)."""
    out = {}
    for label, size in (("hot 4 MiB", 4 * MiB), ("cold 256 MiB", 256 * MiB)):
        src = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
        dst = np.empty_like(src)
        out[f"crc32c {label}"] = _thread_cpu_rate(functools.partial(_core.crc32c, src), size)
        out[f"memcpy {label}"] = _thread_cpu_rate(functools.partial(np.copyto, dst, src), size)
    return out


def fio_write_gbs(path: str, size: int, bs: int, iodepth: int, durable: bool = False) -> Result:
    """fio's sequential O_DIRECT writes, registered buffers and file, by its own account.
    durable: an fsync once every write has completed, inside the job's time
    (end_fsync), so the data is on the media when fio's clock stops, as a put's is
    when it returns.  Without it a disk with a write-back cache counts writes into
    that cache.  (fio's fdatasync=N would not do: with an async engine its sync is
    issued beside the writes still in flight, so it is no durability point.)"""
    cmd = ["fio", "--name=peer-w", f"--filename={path}", "--rw=write", f"--bs={bs}",
           f"--iodepth={iodepth}", "--ioengine=io_uring", "--registerfiles",
           "--direct=1", f"--size={size}", "--output-format=json"]
    if durable:
        # Not with --fixedbufs: with them this job under fio 3.33 sent no flush
        # to the disk in our runs (/proc/diskstats), so its "durable" figure
        # was writes into the disk's cache.  flushes_during checks that this
        # one's reached the disk.
        cmd.append("--end_fsync=1")
    else:
        cmd.append("--fixedbufs")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip() or p.stdout.strip()}")
    job = json.loads(p.stdout)["jobs"][0]
    cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * job["job_runtime"] / 1000.0
    moved = job["write"]["io_bytes"]
    return job["write"]["bw_bytes"] / 1e9, cpu / (moved / 1e9)


def drain_write_cache(paths: list[str]) -> None:
    """Untimed: make what earlier cases wrote durable, so that no timed flush
    pays for another case's writes."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def flush_check_off(path: str) -> str | None:
    """Why the flushes reaching the disk under path cannot be counted, or None
    when they can: the disk must be a whole disk of its own that keeps a
    write-back cache (a write-through disk is sent no flush; device-mapper
    and md pass theirs on to the disks below, where they are counted)."""
    disk = disk_of(path)
    if disk is None:
        return f"{path} is on no disk of its own (tmpfs, overlay, btrfs?)"
    try:
        if os.listdir(f"/sys/block/{disk}/slaves"):
            return f"{disk} is built on other disks (device-mapper, md)"
        with open(f"/sys/block/{disk}/queue/write_cache") as f:
            if f.read().strip() != "write back":
                return f"{disk} has no write-back cache (a flush is not sent to it)"
    except OSError as e:
        return f"{disk}: {e.strerror}"
    if disk_flushes(path) is None:
        return "this kernel's /proc/diskstats has no flush counts (5.5+)"
    return None


def disk_flushes(path: str) -> int | None:
    """Flush requests the disk under path has completed (/proc/diskstats,
    kernels 5.5+), or None where that is unknown (no disk, older kernel)."""
    disk = disk_of(path)
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                parts = line.split()
                if disk and len(parts) >= 20 and parts[2] == disk:
                    return int(parts[18])  # field 16: flush requests completed
    except OSError:
        pass
    return None


def flushes_during(path: str, run: Callable[[], Result]) -> tuple[Result, int | None]:
    """run(), and how many flushes reached the disk under path meanwhile."""
    before = disk_flushes(path)
    res = run()
    after = disk_flushes(path)
    return res, None if before is None or after is None else after - before


def device_read_crc(target: str, offset: int, bufs: list[np.ndarray], crc: bool) -> Result:
    """32 MiB reads, all in flight at once, with or without OP_CRC32C."""
    op = fx100io.OP_READ | (fx100io.OP_CRC32C if crc else 0)

    async def run() -> Result:
        with fx100io.open_device(target, queue_depth=64) as dev:
            t, cpu = time.perf_counter(), _cpu_seconds()
            futs = dev.start([(op, offset + i * CHUNK, b) for i, b in enumerate(bufs)])
            done = [await f for f in futs]
            dt, cpu = time.perf_counter() - t, _cpu_seconds() - cpu
            assert all(d[0] == CHUNK for d in done), done
            if crc:  # the check is real: spot-check one against crc32c()
                assert done[-1][2] == _core.crc32c(bufs[-1])
            gb = len(bufs) * CHUNK / 1e9
            return gb / dt, cpu / gb

    return asyncio.run(run())


def store_put(target: str, keys: list[str], bufs: list[np.ndarray]) -> Result:
    """batch_put of one batch into its own store, timed; then deleted, untimed."""
    async def run() -> Result:
        with fx100io.ChunkStore(target, queue_depth=64) as st:
            t, cpu = time.perf_counter(), _cpu_seconds()
            await st.batch_put(keys, bufs)
            dt, cpu = time.perf_counter() - t, _cpu_seconds() - cpu
            for k in keys:
                await st.delete(k)
            gb = len(keys) * CHUNK / 1e9
            return gb / dt, cpu / gb

    return asyncio.run(run())


def store_put_new(target: str, keys: list[str], bufs: list[np.ndarray]) -> Result:
    """batch_put into a store created just before (untimed); removed after.
    (A file left by a killed run goes first: one already large enough would
    not be preallocated again, and its blocks would be written ones.)"""
    if os.path.exists(target):
        os.unlink(target)
    try:
        fx100io.ChunkStore(target, create=True, size=len(keys) * CHUNK + 512 * MiB).close()
        return store_put(target, keys, bufs)
    finally:
        if os.path.exists(target):
            os.unlink(target)


def fio_gbs(target: str, offset: int, size: int, bs: int, iodepth: int) -> Result:
    moved, rate, cpu = fio_read_cpu(target, size, bs, iodepth, offset)
    return rate / 1e9, cpu / (moved / 1e9)


def device_read(target: str, offset: int, size: int, bs: int, inflight: int) -> Result:
    async def run() -> Result:
        with fx100io.open_device(target, queue_depth=inflight) as dev:
            pool = fx100io.BufferPool(bs * inflight)
            bufs = [pool.alloc(bs) for _ in range(inflight)]
            nblocks = size // bs
            next_block = 0

            async def worker(buf: np.ndarray) -> int:
                nonlocal next_block
                moved = 0
                while next_block < nblocks:
                    i = next_block
                    next_block += 1
                    moved += await dev.read_into(offset + i * bs, buf)
                return moved

            t, cpu = time.perf_counter(), _cpu_seconds()
            moved = sum(await asyncio.gather(*(worker(b) for b in bufs)))
            dt, cpu = time.perf_counter() - t, _cpu_seconds() - cpu
            assert moved == nblocks * bs
            return moved / dt / 1e9, cpu / (moved / 1e9)

    return asyncio.run(run())


def store_get(target: str, keys: list[str], bufs: list[np.ndarray], batch: int) -> Result:
    async def run() -> Result:
        with fx100io.ChunkStore(target, queue_depth=64) as st:
            t, cpu = time.perf_counter(), _cpu_seconds()
            for i in range(0, len(keys), batch):
                hits = await st.batch_get(keys[i:i + batch], bufs[:batch])
                assert all(hits), "benchmark chunks missing"
            dt, cpu = time.perf_counter() - t, _cpu_seconds() - cpu
            gb = len(keys) * CHUNK / 1e9
            return gb / dt, cpu / gb

    return asyncio.run(run())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="/var/tmp/fx100io-bench.img",
                    help="file or block device (destroyed)")
    ap.add_argument("--gib", type=float, default=2.0, help="GiB of chunks to read per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if shutil.which("fio") is None:
        sys.exit("fio is not installed: apt-get install fio")

    nchunks = max(32, int(args.gib * 1024) // 32 // 32 * 32)
    size = nchunks * CHUNK
    is_blk = args.target.startswith("/dev/")
    print(f"target {args.target}: {nchunks} chunks of 32 MiB ({size / 2**30:.1f} GiB), "
          f"{args.rounds} interleaved rounds", flush=True)
    fl = floors()
    print("floors on this machine (one core; GB/s by the clock / by this thread's CPU; "
          "CPU s/GB = 1 / the second):")
    for k, (wall, cpu_rate) in fl.items():
        print(f"  {k}: {wall:.1f} / {cpu_rate:.1f} GB/s, {1 / cpu_rate:.4f} CPU s/GB")
    put_target = None if is_blk else args.target + ".put"
    fio_w_target = None if is_blk else args.target + ".fio-w"

    def remove_files() -> None:  # also when the run fails half way
        for path in (args.target, put_target, fio_w_target):
            if path is not None and not is_blk and os.path.exists(path):
                os.unlink(path)

    atexit.register(remove_files)
    if is_blk:
        print("writes (fio write, store batch_put) are measured on files only: skipped")
    st = fx100io.ChunkStore(args.target, create=True,
                            size=None if is_blk else size + 512 * MiB)
    pool = fx100io.BufferPool(32 * CHUNK)
    bufs = [pool.alloc(CHUNK) for _ in range(32)]
    keys = [f"bench-{i}" for i in range(nchunks)]
    rng = np.random.default_rng(0)
    for i in range(0, nchunks, 32):
        for b in bufs:
            b[:] = rng.integers(0, 256, CHUNK, dtype=np.uint8)
        st.batch_put_blocking(keys[i:i + 32], bufs)
    data_off = min(e.off for e in st._entries.values())
    st.close()
    put_keys = [f"put-{i}" for i in range(32)]
    if put_target is not None and fio_w_target is not None:
        # Both write peers overwrite blocks written once before (untimed): a new
        # file's or store's blocks are unwritten extents, converted on their first
        # write (the new-store row measures that).  In a store emptied again, the
        # best-fit allocator cuts every chunk from the start of its one free
        # extent, so each round's put lands on these same blocks.
        fio_write_gbs(fio_w_target, 32 * CHUNK, CHUNK, 32)
        fx100io.ChunkStore(put_target, create=True, size=32 * CHUNK + 512 * MiB).close()
        store_put(put_target, put_keys, bufs)

    results: dict[str, list[Result]] = {"fio 1M qd32": [], "device 1M x32": [],
                                        "fio 32M qd32": [], "store batch_get 32M x32": [],
                                        "device 32M x32": [], "device 32M x32 +crc": []}
    if put_target is not None:
        results.update({"fio write 32M qd32": [], "fio write+fsync 32M qd32": [],
                        "store batch_put 32M x32": [], "store batch_put new store": []})
    unflushed: set[str] = set()  # durable writes no flush of which reached the disk
    no_flush_check = None if put_target is None else flush_check_off(put_target)
    if no_flush_check:
        print(f"not checked whether the durable writes' flushes reach the disk: {no_flush_check}")
    for r in range(args.rounds):
        row = {
            "fio 1M qd32": fio_gbs(args.target, data_off, size, MiB, 32),
            "device 1M x32": device_read(args.target, data_off, size, MiB, 32),
            "fio 32M qd32": fio_gbs(args.target, data_off, size, CHUNK, 32),
            "store batch_get 32M x32": store_get(args.target, keys, bufs, 32),
            "device 32M x32": device_read_crc(args.target, data_off, bufs, False),
            "device 32M x32 +crc": device_read_crc(args.target, data_off, bufs, True),
        }
        if put_target is not None and fio_w_target is not None:
            row["fio write 32M qd32"] = fio_write_gbs(fio_w_target, 32 * CHUNK, CHUNK, 32)
            writes: list[tuple[str, Callable[[], Result]]] = [
                ("fio write+fsync 32M qd32",
                 lambda: fio_write_gbs(fio_w_target, 32 * CHUNK, CHUNK, 32, True)),
                ("store batch_put 32M x32", lambda: store_put(put_target, put_keys, bufs)),
                ("store batch_put new store",
                 lambda: store_put_new(put_target + ".new", put_keys, bufs)),
            ]
            # Each durable write starts with the disk's cache drained (so its flush
            # pays for its own writes only), and they take turns going first.
            for name, run in writes[r % 3:] + writes[:r % 3]:
                drain_write_cache([fio_w_target, put_target])
                row[name], flushed = flushes_during(fio_w_target, run)
                if flushed == 0 and not no_flush_check:
                    unflushed.add(name)
        for k, v in row.items():
            results[k].append(v)
        print(f"round {r + 1}: " + "  ".join(f"{k} {v[0]:.2f} GB/s {v[1]:.3f} CPU s/GB"
                                             for k, v in row.items()), flush=True)

    med = {k: statistics.median(v[0] for v in rows) for k, rows in results.items()}
    cpu = {k: statistics.median(v[1] for v in rows) for k, rows in results.items()}
    fio_best = max(med["fio 1M qd32"], med["fio 32M qd32"])
    fio_best_cpu = min(cpu["fio 1M qd32"], cpu["fio 32M qd32"])

    def cpu_cells(name: str, peer: float, peer_name: str) -> str:
        return f"{cpu[name]:.3f} | {cpu[name] / peer:.2f}x {peer_name} |"

    print("\n| path | median GB/s | ratio | CPU s/GB (user+sys) | CPU ratio |")
    print("|---|---|---|---|---|")
    print(f"| fio io_uring 1 MiB, qd32 | {med['fio 1M qd32']:.2f} | 1.00 | "
          f"{cpu['fio 1M qd32']:.3f} | 1.00 |")
    print(f"| fx100io device 1 MiB, 32 in flight | {med['device 1M x32']:.2f} | "
          f"{med['device 1M x32'] / med['fio 1M qd32']:.2f}x fio 1M | "
          + cpu_cells("device 1M x32", cpu["fio 1M qd32"], "fio 1M"))
    print(f"| fio io_uring 32 MiB, qd32 | {med['fio 32M qd32']:.2f} | "
          f"{med['fio 32M qd32'] / med['fio 1M qd32']:.2f} | {cpu['fio 32M qd32']:.3f} | "
          f"{cpu['fio 32M qd32'] / cpu['fio 1M qd32']:.2f} |")
    print(f"| fx100io ChunkStore.batch_get 32 MiB x32 | {med['store batch_get 32M x32']:.2f} | "
          f"{med['store batch_get 32M x32'] / fio_best:.2f}x best fio | "
          + cpu_cells("store batch_get 32M x32", fio_best_cpu, "best fio"))
    d0, d1 = cpu["device 32M x32"], cpu["device 32M x32 +crc"]
    print(f"| fx100io device 32 MiB, 32 in flight | {med['device 32M x32']:.2f} | "
          f"{med['device 32M x32'] / fio_best:.2f}x best fio | "
          + cpu_cells("device 32M x32", fio_best_cpu, "best fio"))
    print(f"| fx100io device 32 MiB, 32 in flight, CRC32C on landing | "
          f"{med['device 32M x32 +crc']:.2f} | {med['device 32M x32 +crc'] / fio_best:.2f}x best fio | "
          + cpu_cells("device 32M x32 +crc", fio_best_cpu, "best fio"))
    if put_target is not None:
        print(f"| fio io_uring write 32 MiB, qd32 | {med['fio write 32M qd32']:.2f} | 1.00 | "
              f"{cpu['fio write 32M qd32']:.3f} | 1.00 |")
        print(f"| fio io_uring write 32 MiB, qd32, end_fsync (durable) | "
              f"{med['fio write+fsync 32M qd32']:.2f} | "
              f"{med['fio write+fsync 32M qd32'] / med['fio write 32M qd32']:.2f} | "
              f"{cpu['fio write+fsync 32M qd32']:.3f} | "
              f"{cpu['fio write+fsync 32M qd32'] / cpu['fio write 32M qd32']:.2f} |")
        put, durable = med["store batch_put 32M x32"], med["fio write+fsync 32M qd32"]
        print(f"| fx100io ChunkStore.batch_put 32 MiB x32 (durable on return) | {put:.2f} | "
              f"{put / med['fio write 32M qd32']:.2f}x fio write, {put / durable:.2f}x fio write+fsync | "
              + cpu_cells("store batch_put 32M x32", cpu["fio write+fsync 32M qd32"],
                          "fio write+fsync"))
        new = med["store batch_put new store"]
        print(f"| the same into a new store (blocks never written before) | {new:.2f} | "
              f"{new / put:.2f}x the put above | "
              + cpu_cells("store batch_put new store", cpu["fio write+fsync 32M qd32"],
                          "fio write+fsync"))
    for name in sorted(unflushed):
        print(f"\nWARNING: {name}: no flush reached the disk in at least one round, so that "
              "figure is not durable (writes into the disk's cache)")
    hot = 1 / fl["crc32c hot 4 MiB"][1]
    cold = 1 / fl["crc32c cold 256 MiB"][1]
    print(f"\nThe check's share: CRC32C on landing costs {d1 - d0:.4f} CPU s/GB here (device reads "
          f"with it less without it); crc32c alone costs {hot:.4f} s/GB on data in the cache and "
          f"{cold:.4f} s/GB from memory. The store's batch_get without its check would cost about "
          f"{cpu['store batch_get 32M x32'] - (d1 - d0):.4f} s/GB "
          f"({(cpu['store batch_get 32M x32'] - (d1 - d0)) / fio_best_cpu:.2f}x best fio).")
    return 0


if __name__ == "__main__":
    sys.exit(main())

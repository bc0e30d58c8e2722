#!/usr/bin/env python3
"""fx100io against fio's io_uring engine on the same file or block device.

Interleaved rounds, O_DIRECT everywhere, the peer measured in the same run:
  fio       io_uring, fixedbufs, registerfiles, 1 MiB reads, iodepth 32
  device    fx100io Device.read_into, 1 MiB reads, 32 in flight (BufferPool)
  fio-32m   io_uring, fixedbufs, registerfiles, 32 MiB reads, iodepth 32
  store     ChunkStore.batch_get, 32 MiB chunks, 32 per batch (CRC checked)
Prints GB/s per round, medians, and the ratios to fio, and CPU seconds (user+sys) per GB
read for each path: fio's own account of its job, and for fx100io the process's rusage over
the timed part (io_uring's kernel workers are threads of the process, so they count).

  python3 tools/bench_vs_fio.py [--target PATH_OR_DEV] [--gib 2] [--rounds 5]

The target is formatted as a ChunkStore (its contents are destroyed).
Default: a 2.5 GiB file under /var/tmp (the machine's disk, not tmpfs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import sys
import time

import numpy as np
from fio_peer import fio_read_cpu  # tools/, this script's folder

import fx100io

MiB = 1 << 20
CHUNK = 32 * MiB


# (GB/s, CPU seconds per GB) of one measured path
Result = tuple[float, float]


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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

    results: dict[str, list[Result]] = {"fio 1M qd32": [], "device 1M x32": [],
                                        "fio 32M qd32": [], "store batch_get 32M x32": []}
    for r in range(args.rounds):
        row = {
            "fio 1M qd32": fio_gbs(args.target, data_off, size, MiB, 32),
            "device 1M x32": device_read(args.target, data_off, size, MiB, 32),
            "fio 32M qd32": fio_gbs(args.target, data_off, size, CHUNK, 32),
            "store batch_get 32M x32": store_get(args.target, keys, bufs, 32),
        }
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
    if not is_blk and os.path.exists(args.target):
        os.unlink(args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())

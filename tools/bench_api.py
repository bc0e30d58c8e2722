#!/usr/bin/env python3
"""The APIs users call, next to the C loop, on one NVMe/TCP target in one run.

`fx100io bench --ioengine=nvme+tcp` keeps its I/Os in flight from C; the store,
the adapters and user code go through Device (asyncio, or the blocking twins)
and ChunkStore.  This script starts our target (`fx100io target`) serving a
file on /dev/shm over loopback, one I/O queue, and measures each path in turn,
--rounds times:

  C loop            fx100io bench --ioengine=nvme+tcp --bs=1m --iodepth=32
  asyncio 32 x 1M   Device.read_into from 32 coroutines, 1 MiB each
  asyncio 8 x 8M    Device.read_into of 8 MiB, 8 in flight
  asyncio 1 x 1M    Device.read_into, one 1 MiB read at a time
  blocking 8 thr    Device.read_into_blocking from 8 threads, 1 MiB each
  store batch_get   ChunkStore.batch_get of 16 chunks of 32 MiB (put once)

Prints each as GB/s (median over rounds), its ratio to the C loop's median,
and for the Python paths the CPU seconds the process used per GB (a path
that waits instead of working shows as low GB/s at low CPU).
Goal: every asyncio row >= 0.9x the C loop.

The same measurement (api_rows) runs against any nvme+tcp:// or nvme+rdma://
URI; tools/bench_nvme_rdma.py --lab uses it inside the lab guest.

  python3 tools/bench_api.py [--gib 1] [--rounds 3] [--only asyncio-32,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import _checkout  # noqa: F401 - first: this checkout's fx100io where it is built (tools/_checkout.py)
import numpy as np

import fx100io

MiB = 1 << 20


def c_loop(uri: str, size: int, transport: str = "nvme+tcp") -> float:
    """GB/s of the C loop, 1 MiB reads at queue depth 32 over [0, size)."""
    p = subprocess.run([sys.executable, "-m", "fx100io", "bench", "--name=c", f"--ioengine={transport}",
                        f"--filename={uri}", "--rw=read", "--bs=1m", "--iodepth=32",
                        f"--size={size}", "--output-format=json"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"fx100io bench failed ({p.returncode}): {p.stderr[-2000:]}")
    job = json.loads(p.stdout[p.stdout.index("{"):])["jobs"][0]
    return float(job["read"]["bw_bytes"]) / 1e9


def timed(fn: Callable[[], int]) -> tuple[float, float]:
    """(GB/s, CPU s/GB) of fn(), which returns the bytes it moved."""
    c0, t0 = time.process_time(), time.perf_counter()
    moved = fn()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return moved / dt / 1e9, cpu / (moved / 1e9)


def asyncio_reads(uri: str, size: int, bs: int, inflight: int) -> tuple[float, float]:
    """Device.read_into of bs bytes from `inflight` coroutines over [0, size)."""
    async def run() -> tuple[float, float]:
        with fx100io.open_device(uri) as dev:
            pool = fx100io.BufferPool(bs * inflight)
            bufs = [pool.alloc(bs) for _ in range(inflight)]
            n = size // bs
            nxt = 0

            async def worker(b: np.ndarray) -> int:
                nonlocal nxt
                moved = 0
                while nxt < n:
                    i = nxt
                    nxt += 1
                    moved += await dev.read_into(i * bs, b)
                return moved

            async def all_of() -> int:
                return sum(await asyncio.gather(*(worker(b) for b in bufs)))

            await dev.read_into(0, bufs[0])  # the queue is made before the clock starts
            c0, t0 = time.process_time(), time.perf_counter()
            moved = await all_of()
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            if moved != n * bs:
                raise SystemExit(f"{uri}: read {moved} of {n * bs} bytes")
            return moved / dt / 1e9, cpu / (moved / 1e9)

    return asyncio.run(run())


def blocking_reads(uri: str, size: int, bs: int, threads: int) -> tuple[float, float]:
    """Device.read_into_blocking of bs bytes from `threads` threads over [0, size)
    (this thread, which opened the device and so has a queue already, and
    threads - 1 more: with ?queues=1 a controller grants 8 I/O queues)."""
    with fx100io.open_device(uri) as dev:
        pool = fx100io.BufferPool(bs * threads)
        bufs = [pool.alloc(bs) for _ in range(threads)]
        n = size // bs
        lock = threading.Lock()
        nxt = [0]
        moved = [0] * threads
        ready = threading.Barrier(threads)

        def worker(k: int) -> None:
            dev.read_into_blocking(0, bufs[k])  # this thread's queue, before the clock
            ready.wait()
            run(k)

        def worker0() -> None:
            run(0)

        def run(k: int) -> None:
            while True:
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                if i >= n:
                    return
                moved[k] += dev.read_into_blocking(i * bs, bufs[k])

        ts = [threading.Thread(target=worker, args=(k,)) for k in range(1, threads)]
        for t in ts:
            t.start()
        dev.read_into_blocking(0, bufs[0])
        ready.wait()

        def go() -> int:
            worker0()
            for t in ts:
                t.join()
            return sum(moved)

        gbs, cpu = timed(go)
        if sum(moved) != n * bs:
            raise SystemExit(f"{uri}: read {sum(moved)} of {n * bs} bytes")
        return gbs, cpu


class StoreBench:
    """A ChunkStore formatted on the namespace, `chunks` chunks of chunk_bytes put once."""

    def __init__(self, uri: str, chunks: int, chunk_bytes: int):
        self.uri, self.chunks, self.chunk_bytes = uri, chunks, chunk_bytes
        self.keys = [f"bench-api-{i}".encode() for i in range(chunks)]

    def put(self) -> None:
        async def run() -> None:
            with fx100io.ChunkStore(self.uri, create=True) as st:
                pool = fx100io.BufferPool(self.chunk_bytes)
                buf = pool.alloc(self.chunk_bytes)
                for i, k in enumerate(self.keys):
                    buf[:] = i & 0xFF
                    await st.batch_put([k], [buf])
        asyncio.run(run())

    def get(self) -> tuple[float, float]:
        async def run() -> tuple[float, float]:
            with fx100io.ChunkStore(self.uri) as st:
                pool = fx100io.BufferPool(self.chunks * self.chunk_bytes)
                bufs = [pool.alloc(self.chunk_bytes) for _ in self.keys]
                await st.batch_get(self.keys[:1], bufs[:1])  # queues made before the clock
                c0, t0 = time.process_time(), time.perf_counter()
                hits = await st.batch_get(self.keys, bufs)
                dt, cpu = time.perf_counter() - t0, time.process_time() - c0
                if not all(hits):
                    raise SystemExit(f"store: {hits.count(False)} of {len(hits)} chunks missing")
                for i, b in enumerate(bufs):
                    if b[0] != (i & 0xFF) or b[-1] != (i & 0xFF):
                        raise SystemExit(f"store: chunk {i} read back wrong")
                moved = self.chunks * self.chunk_bytes
                return moved / dt / 1e9, cpu / (moved / 1e9)
        return asyncio.run(run())


ROWS = ["C loop", "asyncio 32 x 1M", "asyncio 8 x 8M", "asyncio 1 x 1M", "blocking 8 thr x 1M",
        "store batch_get 16 x 32M"]


def api_rows(uri: str, size: int, transport: str, only: set[str] | None = None,
             store: StoreBench | None = None, qd1_bytes: int = 256 * MiB) -> dict[str, tuple[float, float]]:
    """One round: {row: (GB/s, CPU s/GB of this process, nan for the C loop)}."""
    out: dict[str, tuple[float, float]] = {}

    def want(name: str) -> bool:
        return only is None or name in only

    if want("C loop"):
        out["C loop"] = (c_loop(uri, size, transport), float("nan"))
    if want("asyncio 32 x 1M"):
        out["asyncio 32 x 1M"] = asyncio_reads(uri, size, MiB, 32)
    if want("asyncio 8 x 8M"):
        out["asyncio 8 x 8M"] = asyncio_reads(uri, size, 8 * MiB, 8)
    if want("asyncio 1 x 1M"):
        out["asyncio 1 x 1M"] = asyncio_reads(uri, min(size, qd1_bytes), MiB, 1)
    if want("blocking 8 thr x 1M"):
        out["blocking 8 thr x 1M"] = blocking_reads(uri, size, MiB, 8)
    if store is not None and want("store batch_get 16 x 32M"):
        out["store batch_get 16 x 32M"] = store.get()
    return out


def report(rows: dict[str, list[tuple[float, float]]], title: str) -> None:
    med = {k: statistics.median(g for g, _ in v) for k, v in rows.items()}
    base = med.get("C loop")
    print(f"\n{title}\n")
    print("| path | GB/s (median) | vs C loop | process CPU s/GB | rounds (GB/s) |")
    print("|---|---|---|---|---|")
    for k in ROWS:
        if k not in rows:
            continue
        cpu = statistics.median(c for _, c in rows[k])
        ratio = f"{med[k] / base:.2f}x" if base else ""
        cpus = "" if cpu != cpu else f"{cpu:.2f}"  # nan: not measured (the C loop's own process)
        runs = " ".join(f"{g:.2f}" for g, _ in rows[k])
        print(f"| {k} | {med[k]:.2f} | {ratio} | {cpus} | {runs} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="namespace size (GiB)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--file", default="/dev/shm/fx100io-bench-api.img")
    ap.add_argument("--only", help="comma-separated rows (names as printed)")
    a = ap.parse_args()
    # the loopback target and file come from bench_nvme_tcp, so both measure alike
    from bench_nvme_tcp import NQN, free_port, start_target

    size = int(a.gib * 1024) * MiB
    only = set(a.only.split(",")) if a.only else None
    with open(a.file, "wb") as f:  # real bytes: tmpfs holes would read unrealistically fast
        block = np.random.default_rng(0).integers(0, 256, 64 * MiB, dtype=np.uint8).tobytes()
        for _ in range(size // len(block)):
            f.write(block)
    port = free_port()
    tgt = start_target(a.file, port)
    uri = f"nvme+tcp://127.0.0.1:{port}/{NQN}?queues=1"
    rows: dict[str, list[tuple[float, float]]] = {}
    try:
        store = None
        if only is None or "store batch_get 16 x 32M" in only:
            store = StoreBench(uri, 16, 32 * MiB)
            store.put()
        for r in range(a.rounds):
            cur = api_rows(uri, size, "nvme+tcp", only, store)
            for k, v in cur.items():
                rows.setdefault(k, []).append(v)
            print(f"round {r + 1}: " + "  ".join(f"{k} {g:.2f}" for k, (g, _) in cur.items()),
                  flush=True)
    finally:
        tgt.terminate()
        tgt.wait(timeout=20)
        os.unlink(a.file)
    report(rows, f"our target on /dev/shm over loopback, {a.gib:g} GiB, one I/O queue, "
                 f"median of {a.rounds} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""SharedChunkStore against the single-host ChunkStore on the same
namespaces, measured in one run.

  ChunkStore       one process reads every chunk, cold (O_DIRECT: no page
                   cache), in batches
  SharedChunkStore 1, 2 and 3 host processes read every chunk each (their
                   own order), started together; aggregate GB/s is all the
                   bytes read over the wall time of the slowest
  index overhead   the Redis round trip on a get's path (look up + pin) per
                   chunk, in microseconds and as a share of one chunk's load
                   time; the unpin that follows, off the get's path, apart

Prints GB/s and ratios (goals: 1 host >= 0.95x ChunkStore; index overhead
under 2% of a 32 MiB chunk's load time).  Starts its own redis-server
(appendfsync always) unless --index names one.

  python3 tools/bench_shared.py [--namespace PATH_OR_URI ...] [--chunks 24]
      [--chunk-mib 32] [--batch 4] [--hosts 1,2,3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import fx100io  # noqa: E402
from fx100io.store.shared import SharedChunkStore  # noqa: E402

MiB = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(workdir: str, fsync: str) -> tuple[subprocess.Popen, str]:
    import redis
    exe = shutil.which("redis-server")
    if exe is None:
        sys.exit("bench_shared: redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    p = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir,
                          "--appendonly", "yes", "--appendfsync", fsync, "--save", "",
                          "--logfile", "redis.log"], stdout=subprocess.DEVNULL)
    for _ in range(200):
        try:
            redis.Redis(port=port, socket_timeout=0.5).ping()
            return p, f"redis://127.0.0.1:{port}/0"
        except redis.RedisError:
            time.sleep(0.05)
    p.kill()
    sys.exit("bench_shared: redis-server did not start")


def keys_of(n: int) -> list[str]:
    return [f"bench-{i:05d}" for i in range(n)]


def fill(store: object, n: int, size: int, batch: int) -> None:
    data = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    keys = keys_of(n)
    for i in range(0, n, batch):
        ks = keys[i:i + batch]
        store.batch_put_blocking(ks, [data] * len(ks))  # type: ignore[attr-defined]


def read_all(store: object, n: int, size: int, batch: int, rounds: int,
             order_seed: int) -> tuple[int, float]:
    """Cold reads through the async API (as a serving engine calls it)."""
    return asyncio.run(_read_all(store, n, size, batch, rounds, order_seed))


async def _read_all(store: object, n: int, size: int, batch: int, rounds: int,
                    order_seed: int) -> tuple[int, float]:
    pool = fx100io.BufferPool(batch * size)  # pinned, registered: the store's fast path
    bufs = [pool.alloc(size) for _ in range(batch)]
    keys = keys_of(n)
    order = np.random.default_rng(order_seed).permutation(n)
    total = 0
    t0 = time.perf_counter()
    for _ in range(rounds):
        for i in range(0, n, batch):
            ks = [keys[k] for k in order[i:i + batch]]
            ok = await store.batch_get(ks, bufs[:len(ks)])  # type: ignore[attr-defined]
            if not all(ok):
                raise SystemExit(f"bench_shared: a miss in a cold read ({ok})")
            total += size * len(ks)
    return total, time.perf_counter() - t0


def host_main(uris: list[str], index: str, n: int, size: int, batch: int, rounds: int,
              seed: int, barrier: object, out: object) -> None:
    st = SharedChunkStore(uris, index)
    st.batch_exists_blocking(keys_of(1))  # connect before the start
    barrier.wait()  # type: ignore[attr-defined]
    t_start = time.time()
    nbytes, secs = read_all(st, n, size, batch, rounds, seed)
    # index overhead: the get's Redis round trips alone (pin + unpin), per chunk
    idx = st._index
    keys = [k.encode() for k in keys_of(n)]

    async def index_only() -> float:
        await idx.get_end([h.pin for h in await idx.get_begin("bench", 30000, keys[:1]) if h])
        t = time.perf_counter()
        m = 0
        begin = 0.0
        for _ in range(20):
            for i in range(0, n, batch):
                t1 = time.perf_counter()
                hits = await idx.get_begin("bench", 30000, keys[i:i + batch])
                begin += time.perf_counter() - t1
                await idx.get_end([h.pin for h in hits if h is not None])
                m += len(keys[i:i + batch])
        return (time.perf_counter() - t) / m, begin / m
    per_chunk, critical = asyncio.run(index_only())
    st.close()
    out.put(dict(bytes=nbytes, start=t_start, end=t_start + secs,  # type: ignore[attr-defined]
                 index_us=critical * 1e6, index_total_us=per_chunk * 1e6))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--namespace", action="append", default=[],
                    help="namespace URI (repeat); default: two files in a temp dir")
    ap.add_argument("--dir", default="/var/tmp", help="where the default files go")
    ap.add_argument("--index", help="redis:// URL (default: a redis-server of our own)")
    ap.add_argument("--appendfsync", default="always", choices=["always", "everysec"],
                    help="AOF fsync policy of the redis-server started here")
    ap.add_argument("--chunks", type=int, default=24)
    ap.add_argument("--chunk-mib", type=float, default=32)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--hosts", default="1,2,3")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON too")
    a = ap.parse_args()
    size = int(a.chunk_mib * MiB)
    work = tempfile.mkdtemp(prefix="fx100io-bench-shared-", dir=a.dir)
    uris = a.namespace or [os.path.join(work, f"ns{i}.img") for i in range(2)]
    dev_size = (a.chunks * (size + 8192)) // len(uris) + 64 * MiB
    redis_proc = None
    try:
        index = a.index
        if index is None:
            redis_proc, index = start_redis(work, a.appendfsync)
        # 1. the single-host ChunkStore
        st = fx100io.ChunkStore(uris, create=True, size=dev_size)
        fill(st, a.chunks, size, a.batch)
        st.close()
        st = fx100io.ChunkStore(uris)
        nbytes, secs = read_all(st, a.chunks, size, a.batch, a.rounds, 0)
        st.close()
        single = nbytes / secs / 1e9
        print(f"ChunkStore (1 host):        {single:7.2f} GB/s  "
              f"({a.chunks} x {a.chunk_mib:g} MiB, batch {a.batch}, {a.rounds} rounds)")
        # 2. the shared pool on the same namespaces
        sh = SharedChunkStore(uris, index, create=True, size=dev_size)
        fill(sh, a.chunks, size, a.batch)
        sh.close()
        ctx = mp.get_context("spawn")
        figures: dict[str, object] = dict(chunkstore_gbps=single, chunk_bytes=size)
        for k in [int(x) for x in a.hosts.split(",")]:
            barrier = ctx.Barrier(k)
            q = ctx.Queue()
            ps = [ctx.Process(target=host_main, args=(uris, index, a.chunks, size, a.batch,
                                                      a.rounds, 100 + j, barrier, q))
                  for j in range(k)]
            for p in ps:
                p.start()
            res = [q.get(timeout=600) for _ in ps]
            for p in ps:
                p.join()
            agg = sum(r["bytes"] for r in res) / (max(r["end"] for r in res)
                                                 - min(r["start"] for r in res)) / 1e9
            per_host = agg / k
            us = float(np.mean([r["index_us"] for r in res]))
            us_total = float(np.mean([r["index_total_us"] for r in res]))
            load_us = size / (per_host * 1e9) * 1e6
            print(f"SharedChunkStore ({k} host{'s' if k > 1 else ' '}): {agg:7.2f} GB/s "
                  f"aggregate, {per_host:6.2f} per host = {per_host / single:5.2f}x "
                  f"ChunkStore per host, {agg / single:5.2f}x aggregate; index "
                  f"{us:6.1f} us/chunk on a get's path = {100 * us / load_us:5.2f}% of a chunk's load "
                  f"(+{us_total - us:.1f} us unpinning after it)")
            figures[f"hosts{k}"] = dict(aggregate_gbps=agg, per_host_gbps=per_host,
                                        ratio_per_host=per_host / single,
                                        index_us_per_chunk=us,
                                        index_total_us_per_chunk=us_total,
                                        index_share=us / load_us)
        if a.json:
            print(json.dumps(figures))
    finally:
        if redis_proc is not None:
            redis_proc.kill()
            redis_proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

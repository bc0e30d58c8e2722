"""`fx100io demo`: the main job on the embedded default.

Creates (or reopens) a ChunkStore in a local file, puts KV-cache-sized
chunks (32 MiB: 256 tokens of Llama-3-8B in bf16), loads them back with
parallel batch gets, checks every byte, and prints throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

from fx100io.pool import BufferPool
from fx100io.store import ChunkStore
from fx100io.units import parse_size

MiB = 1 << 20


async def run(path: str, size: int, chunk: int, count: int, batch: int) -> None:
    print(f"fx100io demo: store {path} ({size / 2**30:.1f} GiB), {count} chunks of "
          f"{chunk / MiB:.0f} MiB, batches of {batch}")
    pool = BufferPool(2 * batch * chunk)
    src = [pool.alloc(chunk) for _ in range(batch)]
    dst = [pool.alloc(chunk) for _ in range(batch)]
    keys = [f"demo@llama3-8b@chunk-{i}" for i in range(count)]
    rng = np.random.default_rng(7)
    for b in src:
        b[:] = rng.integers(0, 256, chunk, dtype=np.uint8)
    async with ChunkStore(path, create=True, size=size) as st:
        t = time.perf_counter()
        for i in range(0, count, batch):
            n = min(batch, count - i)
            await st.batch_put(keys[i:i + n], src[:n])
        put_s = time.perf_counter() - t
    # Reopen: the index on the device finds every chunk again.
    async with ChunkStore(path) as st:
        assert await st.batch_exists(keys) == count
        get_s = 0.0
        for i in range(0, count, batch):
            n = min(batch, count - i)
            t = time.perf_counter()
            hits = await st.batch_get(keys[i:i + n], dst[:n])
            get_s += time.perf_counter() - t
            assert all(hits), "chunk missing after reopen"
            for j in range(n):  # outside the timing: the store already checked CRCs
                assert np.array_equal(dst[j], src[j]), keys[i + j]
        stats = st.stats()
    moved = count * chunk
    print(f"put  {moved / put_s / 1e9:6.2f} GB/s  ({count} chunks durable, {put_s:.2f} s)")
    print(f"get  {moved / get_s / 1e9:6.2f} GB/s  ({count} chunks after reopen, CRC-checked and "
          f"compared, {get_s:.2f} s)")
    d = stats["devices"][0]
    print(f"engine {d['engine']}, O_DIRECT {d['direct']}, chunks {stats['chunks']}, "
          f"used {stats['bytes_used'] / 2**30:.2f} GiB, pinned pool {pool.pinned}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="fx100io demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", default="/var/tmp/fx100io-demo.img", help="store file (recreated)")
    ap.add_argument("--size", default="4G", help="store file size (default 4G)")
    ap.add_argument("--chunk", default="32M", help="chunk size (default 32M)")
    ap.add_argument("--count", type=int, default=64, help="chunks to put and get (default 64)")
    ap.add_argument("--batch", type=int, default=16, help="chunks per batch (default 16)")
    a = ap.parse_args(argv)
    size, chunk = parse_size(a.size), parse_size(a.chunk)
    if a.count * chunk > size * 0.9:
        ap.error(f"{a.count} chunks of {a.chunk} do not fit in --size {a.size}")
    asyncio.run(run(a.path, size, chunk, a.count, a.batch))
    return 0

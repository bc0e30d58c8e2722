"""`fx100io demo`: the main job on the embedded default.

Formats a ChunkStore in a local file (its own: a file that holds anything
else is refused unless --force), puts KV-cache-sized chunks (32 MiB: 256
tokens of Llama-3-8B in bf16), reopens the store, loads them back with
parallel batch gets, checks every byte, and prints throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import stat
import time

import numpy as np

from fx100io.errors import Fx100ioError
from fx100io.pool import BufferPool
from fx100io.store import ChunkStore
from fx100io.units import parse_size

MiB = 1 << 20
KEY_PREFIX = "demo@"


def refusal(path: str) -> str | None:
    """Why formatting path would lose someone's data, or None: the demo formats its
    file on every run, so it only ever reformats nothing, an empty file, or a store
    that holds the demo's own chunks alone."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(st.st_mode) and st.st_size == 0:
        return None
    try:
        with ChunkStore(path) as store:
            others = [k for k in store.keys() if not k.startswith(KEY_PREFIX.encode())]
    except Fx100ioError as e:
        return f"it is not a store the demo made ({e})"
    if others:
        return f"it holds a store with {len(others)} chunks that are not the demo's"
    return None


async def run(path: str, size: int, chunk: int, count: int, batch: int) -> None:
    print(f"fx100io demo: store {path} ({size / 2**30:.1f} GiB), {count} chunks of "
          f"{chunk / MiB:.0f} MiB, batches of {batch}")
    pool = BufferPool(2 * batch * chunk)
    src = [pool.alloc(chunk) for _ in range(batch)]
    dst = [pool.alloc(chunk) for _ in range(batch)]
    keys = [f"{KEY_PREFIX}llama3-8b@chunk-{i}" for i in range(count)]
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
    ap.add_argument("--path", default="/var/tmp/fx100io-demo.img",
                    help="store file, formatted on every run (default "
                         "/var/tmp/fx100io-demo.img); one that holds anything but the "
                         "demo's own store is refused unless --force")
    ap.add_argument("--force", action="store_true",
                    help="format --path even if it holds other data (which is lost)")
    ap.add_argument("--size", default="4G", help="store file size (default 4G)")
    ap.add_argument("--chunk", default="32M", help="chunk size (default 32M)")
    ap.add_argument("--count", type=int, default=64, help="chunks to put and get (default 64)")
    ap.add_argument("--batch", type=int, default=16, help="chunks per batch (default 16)")
    a = ap.parse_args(argv)
    try:
        size, chunk = parse_size(a.size), parse_size(a.chunk)
    except ValueError as e:
        ap.error(str(e))
    if a.count < 1 or a.batch < 1 or chunk < 1:
        ap.error("--count, --batch and --chunk must be at least 1")
    if a.count * chunk > size * 0.9:
        ap.error(f"{a.count} chunks of {a.chunk} do not fit in --size {a.size}")
    why = None if a.force else refusal(a.path)
    if why is not None:
        ap.error(f"--path {a.path}: {why}; the demo formats its file, so it leaves this "
                 "one alone (pass --force to erase it, or choose another --path)")
    asyncio.run(run(a.path, size, chunk, a.count, a.batch))
    return 0

#!/usr/bin/env python3
"""A load under a store storm, with and without priority classes (issue 30).

One ChunkStore per target, one event loop (the adapters' shape: all store I/O
of a process on one loop thread, so one queue per device).  A load is one
batch_get of 4 x 32 MiB chunks.  Phases, interleaved round after round:

  alone        loads one after the other, nothing else on the device
  storm        the same loads while two writers keep storing 8 x 32 MiB
               batches (batch_put), loads at their default class (load)
  storm fifo   the same, with the loads put in the stores' class: the first
               come, first served order fx100io had before
  storm bg     the same, with the reads at background (what an adapter's
               prefetch_priority: background gives its engine's prefetch reads)
  storm alone  the two writers by themselves, as long as a storm phase

Prints, per target, the loads' median and p99 latency per phase, the ratio
of each to "alone" (goal: <= 1.5x under the storm), and the writers' GB/s
during the storm over their GB/s alone (goal: >= 0.5x).  Targets: a file on
the disk under /var/tmp, ext4 on a loop device over /dev/shm (a fast
device), and NVMe/TCP to our own target over loopback (a file on /dev/shm).

  python3 tools/bench_priority.py [--rounds 5] [--loads 20] [--gap-ms 100]
                                  [--targets file,shm-ext4,nvme-tcp] [--write-depth 4]
                                  [--dir /var/tmp] [--nvme-queues 1]

A load is followed by a pause (--gap-ms): a serving engine loads a hit per
request, not back to back.  With no pause the loads keep the device busy
and the stores get their guaranteed share only (one piece in 8).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import _checkout  # noqa: F401 - first: this checkout's fx100io where it is built
import numpy as np

import fx100io
from fx100io.priority import WRITE_DEPTH_DEFAULT

MiB, GiB = 1 << 20, 1 << 30
CHUNK = 32 * MiB
LOAD_CHUNKS, STORM_CHUNKS, WRITERS = 4, 8, 2
NQN = "nqn.2026-11.io.fx100:prio"
STORE_SIZE = 3 * GiB


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


# the storm phases: the measured reads' class is load, store (first come, first
# served) and background (an adapter's prefetch_priority: background)
PHASES = ("storm", "storm fifo", "storm bg")

class Bench:
    def __init__(self, uri: str, write_depth: int, loads: int, gap_s: float):
        self.uri = uri
        self.loads = loads
        self.gap_s = gap_s
        self.st = fx100io.ChunkStore(uri, create=True, size=STORE_SIZE, write_depth=write_depth)
        self.pool = fx100io.BufferPool(LOAD_CHUNKS * CHUNK + WRITERS * STORM_CHUNKS * CHUNK)
        self.dst = [self.pool.alloc(CHUNK) for _ in range(LOAD_CHUNKS)]
        self.src = [[self.pool.alloc(CHUNK) for _ in range(STORM_CHUNKS)] for _ in range(WRITERS)]
        rng = np.random.default_rng(30)
        for w in self.src:
            for b in w:
                b[:] = rng.integers(0, 256, CHUNK, dtype=np.uint8)
        self.hit = [f"hit{i}" for i in range(LOAD_CHUNKS)]
        self.want = [rng.integers(0, 256, CHUNK, dtype=np.uint8) for _ in self.hit]

    async def setup(self) -> None:
        await self.st.batch_put(self.hit, self.want)

    async def load(self, priority: str) -> float:
        t = time.perf_counter()
        hits = await self.st.batch_get(self.hit, self.dst, priority=priority)
        dt = time.perf_counter() - t
        if hits != [True] * LOAD_CHUNKS:
            raise SystemExit(f"{self.uri}: a load missed: {hits}")
        return dt

    async def writer(self, w: int, stop: asyncio.Event, moved: list[int]) -> None:
        keys = [f"w{w}-{i}" for i in range(STORM_CHUNKS)]
        while not stop.is_set():
            await self.st.batch_put(keys, self.src[w])
            moved[0] += STORM_CHUNKS * CHUNK

    def moved(self) -> int:
        """Bytes this thread's queue of the device moved so far (every
        load and store of this loop; index commits run on another thread)."""
        return self.st._members[0].dev.queue_stats()["bytes"]

    async def loads_paced(self, priority: str) -> list[float]:
        lat = []
        for _ in range(self.loads):
            lat.append(await self.load(priority))
            await asyncio.sleep(self.gap_s)
        return lat

    async def storm(self, priority: str | None, seconds: float = 0.0
                    ) -> tuple[list[float], float]:
        """(load latencies, writers' GB/s) with the writers running; no
        loads (for `seconds`) when priority is None."""
        stop, moved = asyncio.Event(), [0]
        ws = [asyncio.ensure_future(self.writer(w, stop, moved)) for w in range(WRITERS)]
        await asyncio.sleep(0.2)  # the storm is going
        b0, t0 = self.moved(), time.perf_counter()
        lat: list[float] = []
        if priority is None:
            await asyncio.sleep(seconds)
        else:
            lat = await self.loads_paced(priority)
        # what the writers moved in the timed part: all bytes less the loads'
        written = self.moved() - b0 - len(lat) * LOAD_CHUNKS * CHUNK
        gbs = written / (time.perf_counter() - t0) / 1e9
        stop.set()
        await asyncio.gather(*ws)
        return lat, gbs

    async def rounds(self, n: int) -> dict[str, list]:
        out: dict[str, list] = {k: [] for k in PHASES + ("alone", "storm alone")}
        gbs: dict[str, list[float]] = {k: [] for k in PHASES + ("storm alone",)}
        for r in range(n):
            out["alone"] += await self.loads_paced("load")
            t = time.perf_counter()
            lat, g = await self.storm("load")
            out["storm"] += lat
            gbs["storm"].append(g)
            lat, g = await self.storm("store")  # the loads queue with the stores
            out["storm fifo"] += lat
            gbs["storm fifo"].append(g)
            lat, g = await self.storm("background")  # behind every store
            out["storm bg"] += lat
            gbs["storm bg"].append(g)
            _, g = await self.storm(None, seconds=max(1.0, time.perf_counter() - t) / 2)
            gbs["storm alone"].append(g)
            print(f"  round {r + 1}/{n}: alone {statistics.median(out['alone']) * 1e3:.0f} ms, "
                  f"storm {statistics.median(out['storm']) * 1e3:.0f} ms, storm fifo "
                  f"{statistics.median(out['storm fifo']) * 1e3:.0f} ms, storm bg "
                  f"{statistics.median(out['storm bg']) * 1e3:.0f} ms", flush=True)
        return {**out, "gbs": gbs}  # type: ignore[dict-item]

    def close(self) -> None:
        self.st.close()


def report(name: str, res: dict) -> None:
    alone = res["alone"]
    med0, p990 = statistics.median(alone), pct(alone, 99)
    g_alone = statistics.median(res["gbs"]["storm alone"])
    print(f"\n{name}: a load of {LOAD_CHUNKS} x 32 MiB every {res['gap_ms']:.0f} ms after the "
          f"last; {WRITERS} writers storing {STORM_CHUNKS} x 32 MiB batches "
          f"({len(alone)} loads per phase)")
    print(f"  {'phase':<12} {'n':>4} {'median ms':>10} {'p99 ms':>8} {'median x':>9} "
          f"{'p99 x':>7} {'storm GB/s':>11} {'storm x':>8}")
    print(f"  {'alone':<12} {len(alone):>4} {med0 * 1e3:>10.1f} {p990 * 1e3:>8.1f} {1:>9.2f} "
          f"{1:>7.2f}")
    for ph in PHASES:
        lat = res[ph]
        g = statistics.median(res["gbs"][ph])
        print(f"  {ph:<12} {len(lat):>4} {statistics.median(lat) * 1e3:>10.1f} "
              f"{pct(lat, 99) * 1e3:>8.1f} "
              f"{statistics.median(lat) / med0:>9.2f} {pct(lat, 99) / p990:>7.2f} "
              f"{g:>11.2f} {g / g_alone:>8.2f}")
    print(f"  {'storm alone':<12} {'':>4} {'':>10} {'':>8} {'':>9} {'':>7} {g_alone:>11.2f} "
          f"{1:>8.2f}")
    if len(alone) < 100:
        print(f"  (a p99 of {len(alone)} loads is about the worst one: use --rounds and "
              f"--loads for 100 or more)")
    lat = res["storm"]
    ok = (statistics.median(lat) / med0 <= 1.5 and pct(lat, 99) / p990 <= 1.5
          and statistics.median(res["gbs"]["storm"]) / g_alone >= 0.5)
    print(f"  goal (storm <= 1.5x alone at median and p99, storm writes >= 0.5x alone): "
          f"{'met' if ok else 'NOT met'}")
    print("  (storm: reads at load, the adapters' default for every read; storm fifo: at "
          "store; storm bg: at background, prefetch_priority: background)")


def run(name: str, uri: str, args: argparse.Namespace) -> None:
    print(f"{name}: {uri}", flush=True)

    async def go() -> dict:
        b = Bench(uri, args.write_depth, args.loads, args.gap_ms / 1000)
        try:
            await b.setup()
            return {**await b.rounds(args.rounds), "gap_ms": args.gap_ms}
        finally:
            b.close()
    report(name, asyncio.run(go()))


@contextmanager
def shm_ext4() -> Iterator[str]:
    """A file on ext4 on a loop device over /dev/shm."""
    img = tempfile.mktemp(prefix="fx100io-prio-", suffix=".ext4", dir="/dev/shm")
    mnt = tempfile.mkdtemp(prefix="fx100io-prio-mnt-")
    loop = ""
    try:
        with open(img, "wb") as f:
            f.truncate(STORE_SIZE + GiB)
        loop = subprocess.run(["losetup", "-f", "--show", "--direct-io=on", img],
                              capture_output=True, text=True, check=True).stdout.strip()
        subprocess.run(["mkfs.ext4", "-q", "-F", loop], check=True)
        subprocess.run(["mount", loop, mnt], check=True)
        yield os.path.join(mnt, "store.img")
    finally:
        # a ring closed a moment ago may still hold the file (the kernel
        # tears io_uring instances down in the background): retry a while
        for _ in range(50):
            if subprocess.run(["umount", mnt], capture_output=True).returncode == 0 \
                    or not os.path.ismount(mnt):
                break
            time.sleep(0.1)
        if loop:
            subprocess.run(["losetup", "-d", loop], check=False)
        try:
            os.rmdir(mnt)
        except OSError as e:
            print(f"shm-ext4: {mnt} left mounted: {e}", file=sys.stderr)
        os.unlink(img)


@contextmanager
def nvme_tcp(queues: int) -> Iterator[str]:
    """Our target serving a file on /dev/shm on loopback."""
    path = tempfile.mktemp(prefix="fx100io-prio-ns-", dir="/dev/shm")
    with open(path, "wb") as f:
        f.truncate(STORE_SIZE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "fx100io", "target", "--listen",
                          f"127.0.0.1:{port}", "--nqn", NQN, "--namespace", path,
                          "--block-size", "4096", "-q"], stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline() if p.stdout else ""
        if "listening" not in line:
            raise SystemExit(f"target did not start: {line!r}")
        # queues=2: the first connection carries the loads (docs/nvme-tcp.md)
        yield f"nvme+tcp://127.0.0.1:{port}/{NQN}?queues={queues}"
    finally:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
        os.unlink(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--loads", type=int, default=20,
                    help="loads per phase and round (n = rounds x loads per phase: 100 by "
                    "default, so that a p99 is not just the worst load)")
    ap.add_argument("--gap-ms", type=float, default=100.0,
                    help="pause after each load (0: back to back; the stores then get only "
                    "their guaranteed share, one piece in 8)")
    ap.add_argument("--targets", default="file,shm-ext4,nvme-tcp")
    ap.add_argument("--write-depth", type=int, default=WRITE_DEPTH_DEFAULT)
    ap.add_argument("--dir", default="/var/tmp", help="where the file target lives (the disk)")
    ap.add_argument("--nvme-queues", type=int, default=1,
                    help="connections per queue over NVMe/TCP (2: loads on their own)")
    args = ap.parse_args()
    for t in args.targets.split(","):
        if t == "file":
            path = os.path.join(args.dir, "fx100io-prio.img")
            try:
                run("file on the disk", path, args)
            finally:
                if os.path.exists(path):
                    os.unlink(path)
        elif t == "shm-ext4":
            if shutil.which("mkfs.ext4") is None or os.geteuid() != 0:
                print("shm-ext4: skipped (needs root and mkfs.ext4)")
                continue
            with shm_ext4() as path:
                run("ext4 on a loop device over /dev/shm", path, args)
        elif t == "nvme-tcp":
            with nvme_tcp(args.nvme_queues) as uri:
                run(f"NVMe/TCP to our target (loopback, /dev/shm, queues={args.nvme_queues})",
                    uri, args)
        else:
            raise SystemExit(f"unknown target {t!r}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Multipath on loopback: two healthy paths' throughput against one, and the
longest gap with no completion while a path dies under load.

Two `fx100io target` processes serve one backing file on two loopback ports
(they stand in for two ports of one target).  Both paths share this
machine's CPUs, so the goal on loopback is a 2-path/1-path ratio of at least
0.95, not 2.

    python3 tools/bench_multipath.py [--seconds 3] [--rounds 3] [--bs 1M] [--depth 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import fx100io  # noqa: E402
from fx100io.units import parse_size  # noqa: E402

NQN = "nqn.2026-12.io.fx100:bench-multipath"


def start_target(backing: str) -> tuple[subprocess.Popen, int]:
    p = subprocess.Popen([sys.executable, "-m", "fx100io", "target", "--listen", "127.0.0.1:0",
                          "--nqn", NQN, "--namespace", backing, "-q"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    line = p.stdout.readline() if p.stdout else ""
    if "nvme+tcp://" not in line:
        p.kill()
        raise SystemExit(f"target did not start: {line!r}")
    return p, int(line.split("nvme+tcp://", 1)[1].split("/", 1)[0].rpartition(":")[2])


async def load(dev, seconds: float, bs: int, depth: int, size: int, write_pct: int,  # noqa: ANN001
               marks: list[float] | None = None, kill_at: float | None = None,
               victim: subprocess.Popen | None = None) -> tuple[int, int]:
    """depth lanes of bs-sized requests for seconds; (bytes, errors)."""
    pool = fx100io.BufferPool(depth * bs)
    bufs = [pool.alloc(bs) for _ in range(depth)]
    for b in bufs:
        b[:] = np.random.default_rng(1).integers(0, 256, bs, dtype=np.uint8)
    done = 0
    errs = 0
    end = time.monotonic() + seconds
    blocks = size // bs

    async def lane(k: int) -> None:
        nonlocal done, errs
        rng = np.random.default_rng(k)
        while time.monotonic() < end:
            off = int(rng.integers(0, blocks)) * bs
            try:
                if rng.integers(0, 100) < write_pct:
                    await dev.write_from(off, bufs[k])
                else:
                    await dev.read_into(off, bufs[k])
            except OSError:
                errs += 1
                continue
            done += bs
            if marks is not None:
                marks.append(time.monotonic())

    async def killer() -> None:
        if kill_at is not None and victim is not None:
            await asyncio.sleep(kill_at)
            os.kill(victim.pid, signal.SIGKILL)
            if marks is not None:
                marks.append(-time.monotonic())  # the kill, negative

    await asyncio.gather(killer(), *(lane(k) for k in range(depth)))
    return done, errs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bs", default="1M")
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--size", default="256M")
    ap.add_argument("--write-pct", type=int, default=30)
    ap.add_argument("--policy", default="round-robin", choices=("round-robin", "queue-depth"))
    a = ap.parse_args()
    bs, size = parse_size(a.bs), parse_size(a.size)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        backing = os.path.join(tmp, "ns.img")
        with open(backing, "wb") as f:
            f.truncate(size)
        (pa, porta), (pb, portb) = start_target(backing), start_target(backing)
        try:
            one = f"nvme+tcp://127.0.0.1:{porta}/{NQN}"
            two = f"nvme+tcp://127.0.0.1:{porta},127.0.0.1:{portb}/{NQN}?policy={a.policy}"
            runs: dict[str, list[float]] = {"1 path": [], "2 paths": [], "1 path, mp": []}
            # the multipath layer over one path: its own cost, apart from the second path's
            one_mp = f"{one}?paths=discover"
            # interleaved rounds, medians: a shared machine's load drifts within a run
            for r in range(a.rounds):
                for name, uri in (("1 path", one), ("2 paths", two), ("1 path, mp", one_mp)):
                    with fx100io.open_device(uri) as dev:
                        n, errs = asyncio.run(load(dev, a.seconds, bs, a.depth, size,
                                                   a.write_pct))
                    runs[name].append(n / a.seconds / 1e9)
                    print(f"round {r + 1} {name:>10}: {runs[name][-1]:.3f} GB/s ({errs} errors)")
            med = {k: sorted(v)[len(v) // 2] for k, v in runs.items()}
            base = med["1 path"]
            print("medians: " + ", ".join(f"{k} {v:.3f} GB/s" for k, v in med.items()))
            print(f"multipath layer on 1 path / 1 path: {med['1 path, mp'] / base:.3f}")
            print(f"2-path/1-path ratio: {med['2 paths'] / base:.3f} "
                  f"(bs {a.bs}, depth {a.depth}, {a.write_pct}% writes, policy {a.policy})")
            marks: list[float] = []
            # kato_ms=2000: a write in flight on the killed path is re-issued once
            # that controller's keep alive ran out (docs/nvme-tcp.md, "Writes that move")
            with fx100io.open_device(two + "&reconnect_ms=100&kato_ms=2000") as dev:
                n, errs = asyncio.run(load(dev, a.seconds, bs, a.depth, size, a.write_pct,
                                           marks, a.seconds / 2, pb))
                kill = -next(m for m in marks if m < 0)
                # until the load stopped starting requests (the held writes end later)
                stop = kill + a.seconds / 2
                after = sorted(m for m in marks if kill <= m <= stop)
                gaps = [y - x for x, y in zip([kill, *after], after)]
                print(f"failover: {errs} failed requests, longest gap with no completion "
                      f"after the kill {max(gaps) * 1000:.1f} ms, paths "
                      f"{[(s['state'], s['failovers']) for s in dev.path_stats()]}")
        finally:
            for p in (pa, pb):
                if p.poll() is None:
                    p.kill()
                p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())

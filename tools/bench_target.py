#!/usr/bin/env python3
"""Our NVMe/TCP target (`fx100io target`) against the file it serves and
against iperf3, all in the same run on loopback.

Measured, per round (median over rounds):
  direct cold   fx100io reads the file itself (O_DIRECT), page cache dropped
  target cold   fx100io reads the same file through our target, 1 and 4
                queues, page cache dropped before each
  target hot    the same with the file in the page cache
  iperf3        one TCP stream on loopback (the link's single-stream limit)
All reads are --bs (1 MiB) with --inflight (32) in flight.  Prints GB/s and
the ratios the target is held to:
  target cold 1q / direct cold   >= 0.8
  target cold 4q / target cold 1q >= 1.0   (and hot 4q / hot 1q)
  target hot 1q / iperf3 1 stream >= 0.9
Every row also gets the machine's CPUs busy over its timed part (/proc/stat:
every process, the kernel's threads and interrupts; on loopback both ends
share the machine).  For the cold rows it also prints what reached the disk (/proc/diskstats over
each read): requests, their mean size, the mean number in flight at the disk
while it was busy, and the disk's GB/s over its busy time; a cloud volume's
speed swings from minute to minute, and these show whether a slower row was
the disk or the path to it.

Dropping the page cache needs root (echo 3 > /proc/sys/vm/drop_caches);
without it the cold rows are skipped with a message.  The file goes on a
real disk (--dir; not tmpfs, whose pages are never cold).

  sudo python3 tools/bench_target.py [--gib 1] [--rounds 3] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
from collections.abc import Callable

import _checkout  # noqa: F401 - first: this checkout's fx100io where it is built (tools/_checkout.py)
import numpy as np

# the loopback target, the reader and iperf3 are bench_nvme_tcp's, so both measure alike
from bench_nvme_tcp import NQN, free_port, iperf3, read_all, start_target

import fx100io._core  # noqa: F401 - fails early, before any file is written or target started, where it is not built
from fx100io.bench.diskstats import disk_of, read_diskstats

MiB = 1 << 20


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def warm(path: str) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(16 * MiB):
            pass


def cpu_seconds(pid: int) -> float:
    """user + sys CPU seconds of a process, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="file size (GiB)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bs", type=int, default=MiB, help="read size (bytes)")
    ap.add_argument("--inflight", type=int, default=32, help="reads in flight")
    ap.add_argument("--dir", default="/var/tmp", help="where the file goes (a real disk)")
    ap.add_argument("--iperf-seconds", type=int, default=3)
    a = ap.parse_args()
    if shutil.which("iperf3") is None:
        sys.exit("iperf3 is not installed: apt-get install iperf3")
    size = int(a.gib * 1024) * MiB
    size -= size % a.bs
    path = os.path.join(a.dir, f"fx100io-bench-target-{os.getpid()}.img")
    try:  # the file goes again if writing it or starting the target fails
        with open(path, "wb") as f:  # real bytes: holes would read unrealistically fast
            block = np.random.default_rng(0).integers(0, 256, 64 * MiB, dtype=np.uint8).tobytes()
            left = size
            while left:
                f.write(block[:min(left, len(block))])
                left -= min(left, len(block))
            f.flush()
            os.fsync(f.fileno())
        port = free_port()
        tgt = start_target(path, port)
    except BaseException:
        if os.path.exists(path):
            os.unlink(path)
        raise
    cold = drop_caches()
    if not cold:
        print("cannot drop the page cache (not root?): cold rows skipped", file=sys.stderr)
    direct = f"file://{path}"

    def over(queues: int) -> str:
        return f"nvme+tcp://127.0.0.1:{port}/{NQN}?queues={queues}"

    rows: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}  # the target's CPU seconds per GB served
    disk = disk_of(path)
    if disk is None:
        print(f"{a.dir} has no block device of its own (tmpfs, overlay?): no disk figures",
              file=sys.stderr)
    seen: dict[str, list[tuple[float, float, float, float]]] = {}  # what reached the disk

    def on_disk(name: str, read: Callable[[], float]) -> float:
        """read(), and what the disk saw meanwhile: (requests, mean KiB,
        mean in flight while busy, GB/s over busy time)."""
        before = read_diskstats().get(disk or "")
        gbs = read()
        after = read_diskstats().get(disk or "")
        if before and after:
            # fields: reads, merges, sectors read, ms reading, ..., ms busy, weighted ms;
            # the kernel keeps some as 32-bit counters, hence the modulo
            d = [(y - x) % (1 << 32) for x, y in zip(before, after)]
            busy_ms = max(d[9], 1)
            seen.setdefault(name, []).append(
                (d[0], d[2] * 512 / 1024 / max(d[0], 1), d[10] / busy_ms, d[2] * 512 / busy_ms / 1e6))
        return gbs

    busy: dict[str, list[float]] = {}  # the machine's CPUs busy (all processes, kernel too)

    def through(name: str, queues: int) -> float:
        c0 = cpu_seconds(tgt.pid)
        gbs = read_all(over(queues), size, a.bs, a.inflight, busy.setdefault(name, []))
        cpu.setdefault(name, []).append((cpu_seconds(tgt.pid) - c0) / (size / 1e9))
        return gbs

    try:
        for r in range(a.rounds):
            cur: dict[str, float] = {}
            if cold:
                drop_caches()
                cur["direct cold"] = on_disk("direct cold", functools.partial(
                    read_all, direct, size, a.bs, a.inflight, busy.setdefault("direct cold", [])))
                for q in (1, 4):
                    drop_caches()
                    name = f"target cold {q}q"
                    cur[name] = on_disk(name, functools.partial(through, name, q))
            warm(path)
            for q in (1, 4):
                cur[f"target hot {q}q"] = through(f"target hot {q}q", q)
            cur["iperf3 1 stream"] = iperf3(1, a.iperf_seconds, busy.setdefault("iperf3 1 stream", []))
            for k, v in cur.items():
                rows.setdefault(k, []).append(v)
            print(f"round {r + 1}: " + "  ".join(f"{k} {v:.2f}" for k, v in cur.items()),
                  flush=True)
    finally:
        tgt.terminate()
        tgt.wait(timeout=20)
        os.unlink(path)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\n{a.gib:g} GiB file in {a.dir}, {a.bs // 1024} KiB reads x{a.inflight} in flight, "
          f"median of {a.rounds} rounds\n")
    ncpu = os.cpu_count() or 1
    print(f"| path | GB/s | target CPU s/GB | machine CPUs busy (of {ncpu}) |")
    print("|---|---|---|---|")
    for k, v in med.items():
        c = f"{statistics.median(cpu[k]):.3f}" if k in cpu else ""
        print(f"| {k} | {v:.2f} | {c} | {statistics.median(busy[k]):.2f} |")
    if seen:
        print(f"\nWhat reached the disk ({disk}) during the cold reads, medians:\n")
        print("| path | requests | mean KiB | mean in flight | disk GB/s while busy |")
        print("|---|---|---|---|---|")
        for k, v in seen.items():
            r, kib, depth, busy = (statistics.median(x) for x in zip(*v))
            print(f"| {k} | {r:.0f} | {kib:.0f} | {depth:.1f} | {busy:.2f} |")
    print("\n| ratio | value | goal |")
    print("|---|---|---|")
    if cold:
        print(f"| target cold 1q / direct cold | {med['target cold 1q'] / med['direct cold']:.2f}x"
              " | >= 0.8 |")
        print(f"| target cold 4q / target cold 1q | "
              f"{med['target cold 4q'] / med['target cold 1q']:.2f}x | >= 1.0 |")
    print(f"| target hot 4q / target hot 1q | {med['target hot 4q'] / med['target hot 1q']:.2f}x"
          " | >= 1.0 |")
    print(f"| target hot 1q / iperf3 1 stream | "
          f"{med['target hot 1q'] / med['iperf3 1 stream']:.2f}x | >= 0.9 |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""fx100io's NVMe/TCP initiator against iperf3 on the same loopback.

One run, everything measured here:
  iperf3       loopback TCP, 1 and 4 streams (the link's limit)
  fx100io      our initiator reading a 1 GiB file on /dev/shm served by our
               target (`fx100io target`), 1 MiB and 32 MiB reads, 1/2/4 queues
Prints GB/s and ratios to iperf3 (goal: >= 0.85x iperf3 with one queue).

With --lab (the fabric lab running, run inside its namespace with
`lab.py exec -- python3 tools/bench_nvme_tcp.py --lab`) it also reads the lab's
Linux target (nvmet-tcp over the tap; the guest is TCG-emulated, so this is
a correctness-grade figure) and asks the guest's own kernel initiator for its
figure on the same namespace over the guest's loopback.

  python3 tools/bench_nvme_tcp.py [--gib 1] [--rounds 3] [--lab]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

import _checkout  # noqa: F401 - first: this checkout's fx100io where it is built (tools/_checkout.py)
import numpy as np

import fx100io
from fx100io.bench.stats import SystemCpu, read_proc_stat

MiB = 1 << 20
NQN = "nqn.2026-11.io.fx100:bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def iperf3(streams: int, seconds: int = 3, cpu_busy: list[float] | None = None) -> float:
    """GB/s of iperf3 on loopback; cpu_busy gets the machine's CPUs busy
    while the client ran (/proc/stat)."""
    port = free_port()
    srv = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        s0 = read_proc_stat()
        out = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", str(seconds),
                              "-P", str(streams), "-J"], capture_output=True, text=True, check=True)
        if cpu_busy is not None:
            cpu_busy.append(SystemCpu.between(s0, read_proc_stat()).busy_cpus)
        return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 8 / 1e9
    finally:
        srv.wait(timeout=10)


def start_target(path: str, port: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "fx100io", "target", "--listen",
                          f"127.0.0.1:{port}", "--nqn", NQN, "--namespace", path,
                          "--block-size", "4096", "-q"],
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline() if p.stdout else ""
    if "listening" not in line:
        p.kill()
        raise SystemExit(f"target did not start: {line!r}")
    return p


def read_all(uri: str, size: int, bs: int, inflight: int,
             cpu_busy: list[float] | None = None) -> float:
    """GB/s reading [0, size) in bs pieces, inflight at a time; cpu_busy gets
    the machine's CPUs busy over the same timed part (/proc/stat)."""
    async def run() -> float:
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

            s0, t = read_proc_stat(), time.perf_counter()
            moved = sum(await asyncio.gather(*(worker(b) for b in bufs)))
            dt = time.perf_counter() - t
            if cpu_busy is not None:
                cpu_busy.append(SystemCpu.between(s0, read_proc_stat()).busy_cpus)
            if moved != size:
                raise SystemExit(f"{uri}: read {moved} of {size} bytes")
            return moved / dt / 1e9

    return asyncio.run(run())


def lab_figures(size: int) -> list[tuple[str, float]]:
    """Our initiator vs the guest's kernel initiator on the lab's RAM namespace."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fabric_lab"))
    from fabric_lab import lab_control, lab_state  # noqa: E402

    state = lab_state.read()
    if not state:
        raise SystemExit("--lab: the fabric lab is not running (python3 tools/fabric_lab/lab.py start)")
    host, port = state["host"], state["port"]
    nqn = next(s.nqn for s in lab_control.config_of(state).subsystems if s.allow_any_host)
    size = min(size, 128 * MiB)
    ours = read_all(f"nvme+tcp://{host}:{port}/{nqn}?queues=2", size, MiB, 8)
    # the guest talks to its own target on its own address (nvmet listens there);
    # fabrics controllers left by an earlier run are removed first
    drop = ("for c in /sys/class/nvme/nvme*; do [ \"$(cat $c/transport)\" = tcp ] && "
            "echo 1 > $c/delete_controller; done; ")
    cmd = drop + (f"echo transport=tcp,traddr={host},trsvcid={port},nqn={nqn},"
           f"hostnqn={state['allowed_host_nqn']} > /dev/nvme-fabrics && sleep 1 && "
           "dev=$(ls /dev/nvme*n1 | tail -n 1) && "
           # /proc/uptime: busybox's date has no sub-second format
           "t0=$(cut -d' ' -f1 /proc/uptime) && dd if=$dev of=/dev/null bs=1M count=" +
           str(size // MiB) + " iflag=direct 2>/dev/null && t1=$(cut -d' ' -f1 /proc/uptime) && "
           "echo UPTIME=$t0,$t1; " + drop + "true")
    rc, out = lab_control.guest_command(state, cmd, 300)
    figures = [("fx100io -> lab Linux target (tap, 2 queues, 1 MiB x8)", ours)]
    up = [ln for ln in out.splitlines() if ln.startswith("UPTIME=")]
    if rc == 0 and up:
        t0, t1 = (float(x) for x in up[-1][7:].split(","))
        figures.append(("guest kernel initiator -> same target (inside the guest, dd 1M direct)",
                        size / max(t1 - t0, 0.01) / 1e9))
    else:
        print(f"(guest kernel initiator figure unavailable: rc={rc} {out[-300:]!r})")
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--file", default="/dev/shm/fx100io-bench-target.img")
    ap.add_argument("--lab", action="store_true", help="also measure the fabric lab's Linux target")
    a = ap.parse_args()
    if shutil.which("iperf3") is None:
        sys.exit("iperf3 is not installed: apt-get install iperf3")
    size = int(a.gib * 1024) * MiB
    with open(a.file, "wb") as f:  # real bytes: tmpfs holes would read unrealistically fast
        block = np.random.default_rng(0).integers(0, 256, 64 * MiB, dtype=np.uint8).tobytes()
        for _ in range(size // len(block)):
            f.write(block)
    port = free_port()
    tgt = start_target(a.file, port)
    rows: dict[str, list[float]] = {}
    try:
        for r in range(a.rounds):
            cur = {"iperf3 1 stream": iperf3(1), "iperf3 4 streams": iperf3(4)}
            for queues in (1, 2, 4):
                for bs, inflight in ((MiB, 16), (32 * MiB, 4)):
                    uri = f"nvme+tcp://127.0.0.1:{port}/{NQN}?queues={queues}"
                    cur[f"fx100io {queues}q {bs // MiB}M x{inflight}"] = read_all(uri, size, bs, inflight)
            for k, v in cur.items():
                rows.setdefault(k, []).append(v)
            print(f"round {r + 1}: " + "  ".join(f"{k} {v:.2f}" for k, v in cur.items()), flush=True)
    finally:
        tgt.terminate()
        tgt.wait(timeout=20)
        os.unlink(a.file)
    med = {k: statistics.median(v) for k, v in rows.items()}
    one, four = med["iperf3 1 stream"], med["iperf3 4 streams"]
    print("\n| path | median GB/s | vs iperf3 1 stream | vs iperf3 4 streams |")
    print("|---|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.2f} | {v / one:.2f}x | {v / four:.2f}x |")
    if a.lab:
        print("\n| lab path | GB/s |")
        print("|---|---|")
        for name, v in lab_figures(size):
            print(f"| {name} | {v:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

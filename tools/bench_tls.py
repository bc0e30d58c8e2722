#!/usr/bin/env python3
"""NVMe/TCP over TLS against the same run in clear, on loopback: 1 MiB reads
at queue depth 32 (waves of 32 submitted together) from our initiator to our target (`fx100io target`), one
run with `--tls required` and `tls_key=`, one without, in alternating rounds.

Both ends share this machine's CPUs, so besides GB/s it prints CPU seconds
per GB moved, of the initiator (this process) and of the target (its
/proc/PID/stat), and the TLS/clear ratio of each.  The goal of issue 28: TLS
throughput >= 0.7x clear.

With --ktls a third run per round reads over TLS with the kernel's record layer (kTLS,
ktls=auto: where the kernel has the tls module, e.g. the fabric lab's guest) on the
initiator, the "tls" run then being our userspace record layer (ktls=off); the run checks
from queue_stats() that each took the layer it names.  In these runs the target keeps
our record layer (`--ktls off`).

With --target-ktls two more runs per round put the target on kTLS too (`--ktls auto`):
"t-ktls" (the initiator on our layer, as "tls") and "ktls2" (both ends on kTLS, as
"ktls" with --ktls); the target's control socket (`tls`) says which layer its
connections took, and the run checks it.  Compare the target's CPU per GB of tls with
t-ktls, and of ktls with ktls2.

With --floors it also builds and runs tools/bench_tls_floors.c (a C compiler
and libssl-dev): what each step of a TLS read (a page-cache read, AES-GCM
sealing, a loopback send and receive) costs one thread here, the floor under
the CPU per GB above.  The load average is printed with each round: other work
on the machine takes CPU from both ends, and with it throughput, not CPU per GB.

    python3 tools/bench_tls.py [--seconds 3] [--rounds 3] [--bs 1M] [--depth 32] [--queues 1] [--ktls]
        [--target-ktls] [--floors]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import fx100io  # noqa: E402
from fx100io.target_ctl import control  # noqa: E402
from fx100io.units import parse_size  # noqa: E402

NQN = "nqn.2026-12.io.fx100:bench-tls"
HOST = "nqn.2014-08.org.nvmexpress:uuid:f0100000-0000-4000-8000-00000000b001"
# a fixed test key (libnvme's test/psk.c key): the bench measures, it protects nothing
KEY = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"
TICK = os.sysconf("SC_CLK_TCK")


# mode: (the initiator's URI ktls, the target's --ktls); None: in clear
MODES = {"clear": None, "tls": ("off", "off"), "ktls": ("auto", "off"),
         "t-ktls": ("off", "auto"), "ktls2": ("auto", "auto")}


def start_target(backing: str, target_ktls: str | None,
                 ctl: str) -> tuple[subprocess.Popen, int]:
    extra = ["--tls", "required", "--tls-key", f"{HOST}={KEY}", "--ktls", target_ktls,
             "--control", ctl] if target_ktls else []
    p = subprocess.Popen([sys.executable, "-m", "fx100io", "target", "--listen", "127.0.0.1:0",
                          "--nqn", NQN, "--namespace", backing, "-q", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    line = p.stdout.readline() if p.stdout else ""
    if "nvme+tcp://" not in line:
        p.kill()
        raise SystemExit(f"target did not start: {line!r}")
    return p, int(line.split("nvme+tcp://", 1)[1].split("/", 1)[0].rpartition(":")[2])


def cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def load(dev, seconds: float, bs: int, depth: int, size: int) -> int:  # noqa: ANN001
    """Waves of depth bs-sized reads at random offsets, each wave submitted at
    once and waited for (submit_blocking), for seconds; the bytes read.
    (Waves, not depth asyncio lanes: on this build a lane that submits one
    read per completion ran at ~0.05 GB/s in clear too; see docs/nvme-tcp.md.)"""
    pool = fx100io.BufferPool(depth * bs)
    bufs = [pool.alloc(bs) for _ in range(depth)]
    rng = np.random.default_rng(1)
    blocks = size // bs
    done = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        offs = rng.integers(0, blocks, depth)
        for c in dev.submit_blocking([(fx100io.OP_READ, int(o) * bs, b)
                                      for o, b in zip(offs, bufs)]):
            if c[0] != bs or c[1]:
                raise SystemExit(f"a read returned {c}, not {bs} bytes")
            done += c[0]
    return done


def one_run(backing: str, size: int, mode: str, a: argparse.Namespace) -> dict[str, float]:
    """mode: one of MODES."""
    layers = MODES[mode]
    ctl = os.path.join(os.path.dirname(backing), "ctl.sock")
    proc, port = start_target(backing, layers[1] if layers else None, ctl)
    try:
        q = f"hostnqn={HOST}&queues={a.queues}"
        if layers:
            q += f"&tls_key={KEY}&ktls={layers[0]}"
        with fx100io.open_device(f"nvme+tcp://127.0.0.1:{port}/{NQN}?{q}",
                                 queue_depth=a.depth) as dev:
            load(dev, 0.5, a.bs, a.depth, size)  # warm up
            t_cpu0, h_cpu0, w0 = cpu_of(proc.pid), time.process_time(), time.monotonic()
            n = load(dev, a.seconds, a.bs, a.depth, size)
            wall = time.monotonic() - w0
            h_cpu, t_cpu = time.process_time() - h_cpu0, cpu_of(proc.pid) - t_cpu0
            st = dev.queue_stats()
            if layers and layers[0] == "auto" and not st["ktls_conns"]:
                raise SystemExit("--ktls: this kernel has no kTLS (the tls module): the "
                                 "connections stayed on our record layer")
            if layers and layers[0] == "off" and st["ktls_conns"]:
                raise SystemExit("ktls=off took kTLS")
            if layers:
                words = control(ctl, "tls").split()
                tst = dict(zip(words[::2], map(int, words[1::2])))
                if (tst["ktls_conns"] > 0) != (layers[1] == "auto") or \
                        (tst["tls_user_conns"] > 0) != (layers[1] == "off"):
                    raise SystemExit(f"the target's connections took another layer: {tst} "
                                     "(--target-ktls needs the kernel's tls module)")
    finally:
        proc.terminate()
        proc.wait(10)
    gb = n / 1e9
    return {"gbs": gb / wall, "host": h_cpu / gb, "target": t_cpu / gb}


def floors(backing: str, tmp: str) -> None:
    """Build and run tools/bench_tls_floors.c on the backing file."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        print("--floors: no C compiler")
        return
    exe = os.path.join(tmp, "bench_tls_floors")
    b = subprocess.run([cc, "-O2", "-o", exe, os.path.join(REPO, "tools", "bench_tls_floors.c"),
                        "-lcrypto", "-lpthread"], capture_output=True, text=True)
    if b.returncode:
        print(f"--floors: the build failed: {b.stderr[-500:]}")
        return
    print("\none thread's CPU per GB for each step of a TLS read (tools/bench_tls_floors.c):")
    out = subprocess.run([exe, backing], capture_output=True, text=True, timeout=300)
    print(out.stdout + out.stderr, end="")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bs", default="1M")
    ap.add_argument("--depth", type=int, default=32)
    ap.add_argument("--queues", type=int, default=1)
    ap.add_argument("--size", default="256M", help="backing file (read at random offsets)")
    ap.add_argument("--ktls", action="store_true",
                    help="also a run per round on the kernel's record layer (kTLS)")
    ap.add_argument("--target-ktls", action="store_true",
                    help="also runs with the target on kTLS (t-ktls; ktls2 with --ktls)")
    ap.add_argument("--floors", action="store_true",
                    help="also measure each step's CPU per GB alone (tools/bench_tls_floors.c)")
    a = ap.parse_args()
    a.bs = parse_size(a.bs)
    size = parse_size(a.size)
    with tempfile.TemporaryDirectory() as d:
        backing = os.path.join(d, "ns.img")
        with open(backing, "wb") as f:
            f.write(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
        modes = ["clear", "tls"] + (["ktls"] if a.ktls else []) + \
            (["t-ktls"] if a.target_ktls else []) + \
            (["ktls2"] if a.target_ktls and a.ktls else [])
        res: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
        for r in range(a.rounds):
            for mode in modes:
                x = one_run(backing, size, mode, a)
                res[mode].append(x)
                print(f"round {r + 1} {mode:6}: {x['gbs']:.3f} GB/s, "
                      f"CPU s/GB initiator {x['host']:.3f} target {x['target']:.3f} "
                      f"(load average {os.getloadavg()[0]:.1f})", flush=True)
        if a.floors:
            floors(backing, d)

    def med(mode: str, k: str) -> float:
        return float(np.median([x[k] for x in res[mode]]))

    print(f"\n{a.bs >> 10} KiB reads, QD{a.depth}, {a.queues} queue(s), {a.rounds} rounds "
          f"of {a.seconds:g} s, medians:")
    for mode in modes:
        print(f"  {mode:6}: {med(mode, 'gbs'):.3f} GB/s, CPU s/GB "
              f"initiator {med(mode, 'host'):.3f} target {med(mode, 'target'):.3f}")
    for mode in modes[1:]:
        name = mode
        print(f"  {name}/clear throughput {med(mode, 'gbs') / med('clear', 'gbs'):.3f}x; CPU "
              f"per GB initiator {med(mode, 'host') / med('clear', 'host'):.2f}x, target "
              f"{med(mode, 'target') / med('clear', 'target'):.2f}x")
    for ours, kern in (("tls", "t-ktls"), ("ktls", "ktls2")):
        if ours in modes and kern in modes:
            print(f"  the target on kTLS ({kern}) / on ours ({ours}): CPU per GB target "
                  f"{med(kern, 'target') / med(ours, 'target'):.2f}x, initiator "
                  f"{med(kern, 'host') / med(ours, 'host'):.2f}x")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""fx100io's NVMe/RDMA initiator against the Linux kernel's (nvme-rdma), same target, same run.

This host's kernel has no RDMA, so the comparison runs inside the fabric lab's guest, where
soft-RoCE (rxe) connects both initiators to the guest's own nvmet-rdma port:

  fx100io   `fx100io bench --ioengine=nvme+rdma` on nvme+rdma://GUEST:4421/lab-ram
  kernel    `nvme connect -t rdma` to the same subsystem, then fio (io_uring, O_DIRECT) on
            the block device it makes

Sequential 1 MiB reads and random 4 KiB reads (--cases), queue depth 32 (--iodepth), each case run in turn for
--seconds, --rounds times in a shuffled order; the median of each case is reported: GB/s,
IOPS, and CPU seconds per GB.  CPU is counted twice: the benchmark process's own user+system
time over the job (what the initiator spends where it runs), and the whole guest's busy time
from /proc/stat (the initiator wherever it runs, softirqs and kernel threads included, and
the target, which is the same in both cases).  The guest's busy time is taken over the job's
own seconds only, not the whole command: a sampler reads /proc/stat and rxe's packet
counter every 0.1 s, and the window of the job's runtime that moved the most packets is the
job (the Python initiator's start, about 4 s of CPU under emulation, would otherwise count
against it and not against fio).

What each initiator put on the wire comes from rxe's counters over the same window, per GB:
packets, SENDs (a capsule or a response each), and retransmissions (`duplicate_request`,
`completer_retry_err`).  Both initiators share the one rxe device with the target in the
guest (traffic to the guest's own address never reaches a netdev, so a capture on eth0 sees
nothing); the counters are the device's, both directions.

Everything in the guest runs under QEMU's software emulation (TCG): absolute figures are
meaningless, only the ratios between the two initiators mean anything.

  python3 tools/bench_nvme_rdma.py --lab [--seconds 8] [--rounds 3]
(starts the lab with --rdma if it is not running, and stops it again afterwards)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "tools" / "fabric_lab" / "lab.py"
CASES = [("read", "1m"), ("randread", "4k")]
SIZE = "192m"  # of the 256 MiB RAM namespace


RXE_COUNTERS = ("sent_pkts", "rdma_sends", "duplicate_request", "completer_retry_err")


def busy_jiffies() -> int:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4]  # all but idle and iowait


def rxe_counters() -> dict[str, int]:
    """The RDMA devices' packet counters, summed over devices and ports (0 where absent)."""
    out = dict.fromkeys(RXE_COUNTERS, 0)
    for name in RXE_COUNTERS:
        for f in glob.glob(f"/sys/class/infiniband/*/ports/*/hw_counters/{name}"):
            try:
                out[name] += int(Path(f).read_text())
            except (OSError, ValueError):
                pass
    return out


class Sampler(threading.Thread):
    """(time, busy jiffies, rxe counters) every 0.1 s while a command runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, int, dict[str, int]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while True:
            self.samples.append((time.monotonic(), busy_jiffies(), rxe_counters()))
            if self.stop.wait(0.1):
                self.samples.append((time.monotonic(), busy_jiffies(), rxe_counters()))
                return

    def job_window(self, runtime_s: float) -> tuple[int, dict[str, int]]:
        """Busy jiffies and counter deltas over the runtime_s that moved the most packets;
        the whole run where no counter moves (no rxe)."""
        s = self.samples
        best = (0, s[0][1:], s[-1][1:])
        j = 0
        for i in range(len(s)):
            while j < len(s) - 1 and s[j][0] - s[i][0] < runtime_s:
                j += 1
            moved = s[j][2]["sent_pkts"] - s[i][2]["sent_pkts"]
            if moved > best[0]:
                best = (moved, s[i][1:], s[j][1:])
        (b0, c0), (b1, c1) = best[1], best[2]
        return b1 - b0, {k: c1[k] - c0[k] for k in c0}


def measure(argv: list[str]) -> tuple[dict, float, dict[str, int]]:
    """Run a fio-like command with JSON output: its job, and the guest's busy CPU seconds and
    the rxe counters' deltas over the job's own runtime."""
    hz = os.sysconf("SC_CLK_TCK")
    sampler = Sampler()
    sampler.start()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    finally:
        sampler.stop.set()
        sampler.join()
    if p.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    job = json.loads(p.stdout[p.stdout.index("{"):])["jobs"][0]
    r = job["read"]
    runtime = (r.get("runtime") or job["job_runtime"]) / 1000
    busy, wire = sampler.job_window(runtime)
    return job, busy / hz, wire


def summarize(job: dict, busy: float, wire: dict[str, int]) -> dict:
    r = job["read"]
    secs = r["runtime"] / 1000 if r.get("runtime") else job["job_runtime"] / 1000
    gb = r["io_bytes"] / 1e9
    proc_cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * secs
    return {"gbps": gb / secs, "iops": r["iops"], "proc_cpu_per_gb": proc_cpu / gb,
            "guest_cpu_per_gb": busy / gb, "pkts_per_gb": wire["sent_pkts"] / gb,
            "sends_per_gb": wire["rdma_sends"] / gb,
            "retrans_per_gb": (wire["duplicate_request"] + wire["completer_retry_err"]) / gb}


def common(rw: str, bs: str, seconds: int, iodepth: int) -> list[str]:
    return [f"--rw={rw}", f"--bs={bs}", f"--iodepth={iodepth}", f"--size={SIZE}", "--direct=1",
            "--time_based", f"--runtime={seconds}", "--output-format=json", "--name=r"]


def kernel_device(host: str, port: int, nqn: str, hostnqn: str) -> str:
    subprocess.run(["nvme", "connect", "-t", "rdma", "-a", host, "-s", str(port), "-n", nqn,
                    "-q", hostnqn], check=True, capture_output=True, timeout=60)
    for _ in range(100):
        for sub in glob.glob("/sys/class/nvme-subsystem/*"):
            if Path(sub, "subsysnqn").read_text().strip() == nqn:
                for ns in sorted(glob.glob(f"{sub}/nvme*n*")):
                    name = os.path.basename(ns)
                    if os.path.exists(f"/dev/{name}"):
                        return f"/dev/{name}"
        time.sleep(0.1)
    raise SystemExit("nvme connect -t rdma made no block device")


def in_guest(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(REPO / "tools" / "fabric_lab"))
    from fabric_lab import lab_control, lab_state

    state = lab_state.read()
    config = lab_control.config_of(state)
    host, port = config.guest_ip, config.rdma_port
    sub = next(s for s in config.subsystems if s.nqn.endswith("lab-ram"))
    hostnqn = "nqn.2026-11.io.fx100:lab-host"
    uri = f"nvme+rdma://{host}:{port}/{sub.nqn}?hostnqn={hostnqn}"
    if args.uri_options:
        uri += "&" + args.uri_options
    blk = kernel_device(host, port, sub.nqn, hostnqn)
    try:
        runs: dict[tuple[str, str, str], list[dict]] = {}
        cases = [tuple(c.split(":")) for c in args.cases.split(",")]
        order = [(who, rw, bs) for who in ("fx100io", "kernel") for rw, bs in cases]
        for rnd in range(args.rounds):
            random.Random(rnd).shuffle(order)
            for who, rw, bs in order:
                if who == "fx100io":
                    argv = [sys.executable, "-m", "fx100io", "bench", "--ioengine=nvme+rdma",
                            f"--filename={uri}", *common(rw, bs, args.seconds, args.iodepth)]
                else:
                    argv = ["fio", "--ioengine=io_uring", f"--filename={blk}",
                            *common(rw, bs, args.seconds, args.iodepth)]
                job, busy, wire = measure(argv)
                one = summarize(job, busy, wire)
                runs.setdefault((who, rw, bs), []).append(one)
                print(f"  round {rnd + 1}: {who:8s} {rw:8s} {bs:3s} {one['gbps'] * 1000:8.1f} MB/s"
                      f"  guest CPU {one['guest_cpu_per_gb']:6.1f} s/GB", flush=True)
    finally:
        subprocess.run(["nvme", "disconnect", "-n", sub.nqn], capture_output=True, timeout=60)

    def med(who: str, rw: str, bs: str, k: str) -> float:
        return statistics.median(r[k] for r in runs[(who, rw, bs)])

    print("\nNVMe/RDMA over soft-RoCE in the lab guest (TCG: only the ratios mean anything)")
    print(f"queue depth {args.iodepth}")
    print(f"{'case':14s} {'initiator':9s} {'MB/s':>8s} {'IOPS':>9s} {'proc CPU s/GB':>14s} "
          f"{'guest CPU s/GB':>15s}")
    for rw, bs in cases:
        for who in ("fx100io", "kernel"):
            print(f"{rw + ' ' + bs:14s} {who:9s} {med(who, rw, bs, 'gbps') * 1000:8.1f} "
                  f"{med(who, rw, bs, 'iops'):9.0f} {med(who, rw, bs, 'proc_cpu_per_gb'):14.2f} "
                  f"{med(who, rw, bs, 'guest_cpu_per_gb'):15.2f}")
        t = med("fx100io", rw, bs, "gbps") / med("kernel", rw, bs, "gbps")
        c = med("fx100io", rw, bs, "guest_cpu_per_gb") / med("kernel", rw, bs, "guest_cpu_per_gb")
        print(f"{'':14s} ratio     throughput {t:.2f}x the kernel's (goal >= 1.0), "
              f"guest CPU per GB {c:.2f}x (goal <= 1.0)")
    print("\nOn the wire (rxe counters over the job, both directions, per GB; medians)")
    print(f"{'case':14s} {'initiator':9s} {'packets':>9s} {'SENDs':>9s} {'retransmits':>12s}")
    for rw, bs in cases:
        for who in ("fx100io", "kernel"):
            print(f"{rw + ' ' + bs:14s} {who:9s} {med(who, rw, bs, 'pkts_per_gb'):9.0f} "
                  f"{med(who, rw, bs, 'sends_per_gb'):9.0f} "
                  f"{med(who, rw, bs, 'retrans_per_gb'):12.1f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab", action="store_true", help="run the comparison in the lab guest")
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iodepth", type=int, default=32)
    ap.add_argument("--cases", default=",".join(f"{rw}:{bs}" for rw, bs in CASES),
                    help="comma-separated RW:BS cases (default: read:1m,randread:4k)")
    ap.add_argument("--uri-options", default="",
                    help="URI options for fx100io's side, e.g. queues=2 (default: none)")
    ap.add_argument("--in-guest", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.in_guest:
        return in_guest(args)
    if not args.lab:
        print("bench_nvme_rdma: this host has no RDMA; the comparison runs in the fabric lab's "
              "guest: pass --lab", file=sys.stderr)
        return 2
    status = subprocess.run([sys.executable, str(LAB), "status"], capture_output=True)
    started = status.returncode != 0
    if started:
        subprocess.run([sys.executable, str(LAB), "start", "--rdma"], check=True)
    try:
        timeout = str(args.rounds * len(CASES) * 2 * (args.seconds + 40) + 120)
        return subprocess.run([sys.executable, str(LAB), "guest", "--timeout", timeout, "--",
                               sys.executable, str(Path(__file__).resolve()), "--in-guest",
                               f"--seconds={args.seconds}", f"--rounds={args.rounds}",
                               f"--iodepth={args.iodepth}", f"--cases={args.cases}",
                               f"--uri-options={args.uri_options}"]).returncode
    finally:
        if started:
            subprocess.run([sys.executable, str(LAB), "stop"])


if __name__ == "__main__":
    sys.exit(main())

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
time (what the initiator spends where it runs), and the whole guest's busy time from
/proc/stat (the initiator wherever it runs, softirqs and kernel threads included, and the
target, which is the same in both cases).

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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "tools" / "fabric_lab" / "lab.py"
CASES = [("read", "1m"), ("randread", "4k")]
SIZE = "192m"  # of the 256 MiB RAM namespace


def busy_jiffies() -> int:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4]  # all but idle and iowait


def measure(argv: list[str]) -> tuple[dict, float]:
    """Run a fio-like command with JSON output; its job and the guest's busy CPU seconds."""
    hz = os.sysconf("SC_CLK_TCK")
    j0 = busy_jiffies()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    busy = (busy_jiffies() - j0) / hz
    if p.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout[p.stdout.index("{"):])["jobs"][0], busy


def summarize(job: dict, busy: float) -> dict:
    r = job["read"]
    secs = r["runtime"] / 1000 if r.get("runtime") else job["job_runtime"] / 1000
    gb = r["io_bytes"] / 1e9
    proc_cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * secs
    return {"gbps": gb / secs, "iops": r["iops"], "proc_cpu_per_gb": proc_cpu / gb,
            "guest_cpu_per_gb": busy / gb}


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
                job, busy = measure(argv)
                runs.setdefault((who, rw, bs), []).append(summarize(job, busy))
                print(f"  round {rnd + 1}: {who:8s} {rw:8s} {bs:3s} "
                      f"{runs[(who, rw, bs)][-1]['gbps'] * 1000:8.1f} MB/s", flush=True)
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
                               f"--iodepth={args.iodepth}", f"--cases={args.cases}"]).returncode
    finally:
        if started:
            subprocess.run([sys.executable, str(LAB), "stop"])


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""fx100io's NVMe/TCP initiator next to SPDK's, against the same SPDK target,
and the CPU per byte of our initiator and our target next to iperf3's.

One run, everything measured here:
  1. SPDK's nvmf_tgt (RAM namespace, loopback, its reactor on core 0) is started
     by ../shared/tools/spdk-peer.sh (or $SPDK_PEER); then, interleaved per
     round, spdk_nvme_perf and `fx100io bench --ioengine=nvme+tcp` (both on
     core 1, one queue):
       4 KiB random reads at queue depth 32   goal: fx100io >= 0.8x SPDK's IOPS
       1 MiB sequential reads at depth 32     goal: fx100io >= 1.0x SPDK's GB/s
       4 KiB random reads at queue depth 1    goal: fx100io p99 <= 3x its median
                                              (spdk_nvme_perf's own p99/median,
                                              with -L, printed beside it)
     and the target is stopped at the end.  Skips with a message when SPDK is
     not built (/var/tmp/spdk, see spdk-peer.sh build).
  2. CPU seconds per GB (user+sys, from each process's rusage or /proc) moving
     1 MiB reads from a /dev/shm file over loopback: our initiator
     (`fx100io bench`) and our target (`fx100io target`), next to iperf3's
     single stream (client and server).

  python3 tools/bench_nvme_tcp_spdk.py [--rounds 3] [--seconds 5] [--skip-spdk] [--skip-cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPDK = os.environ.get("SPDK_DIR", "/var/tmp/spdk")
PEER = os.environ.get("SPDK_PEER", os.path.join(ROOT, "..", "shared", "tools", "spdk-peer.sh"))
SPDK_NQN = "nqn.2016-06.io.spdk:cnode1"
OUR_NQN = "nqn.2026-11.io.fx100:cpu"
MiB = 1 << 20
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rusage(cmd: list[str], env: dict[str, str] | None = None,
               timeout: float | None = None) -> tuple[str, float]:
    """Run cmd; its output and the user+sys seconds of it and its children.
    timeout: past it the command is killed (and fails); it is killed too if
    this process is interrupted while waiting, so no run outlives the caller."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    timer = threading.Timer(timeout, p.kill) if timeout else None
    try:
        if timer:
            timer.start()
        out = p.stdout.read() if p.stdout else ""
        _, status, ru = os.wait4(p.pid, 0)
    except BaseException:
        p.kill()
        p.wait()
        raise
    finally:
        if timer:
            timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({p.returncode}"
                         f"{', killed after ' + str(timeout) + ' s' if timeout and p.returncode == -9 else ''}"
                         f"):\n{out[-3000:]}")
    return out, ru.ru_utime + ru.ru_stime


def proc_cpu(pid: int) -> float:
    """user+sys seconds so far of a running process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def fx_bench(uri: str, rw: str, bs: str, depth: int, seconds: int, size: str = "256m") -> tuple[dict, float]:
    cmd = ["taskset", "-c", "1", sys.executable, "-m", "fx100io", "bench", "--name=j",
           "--ioengine=nvme+tcp", f"--filename={uri}", f"--rw={rw}", f"--bs={bs}",
           f"--iodepth={depth}", f"--size={size}", "--time_based=1", f"--runtime={seconds}",
           "--eta=never", "--output-format=json", "--percentile_list=50:99"]
    out, cpu = run_rusage(cmd, timeout=seconds + 120)
    doc = json.loads(out[out.index("{"):])
    job = doc["jobs"][0]
    rd = job["read"]
    pct = rd["clat_ns"]["percentile"]
    # the job's own user+sys over its run (its rusage, as fio reports it): no
    # interpreter start-up in it; `cpu` (whole process tree) is returned too
    run_cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1e3
    return {"iops": rd["iops"], "gbps": rd["bw_bytes"] / 1e9, "bytes": rd["io_bytes"],
            "p50_us": pct["50.000000"] / 1e3, "p99_us": pct["99.000000"] / 1e3,
            "run_cpu": run_cpu}, cpu


def spdk_perf(rw: str, bs: int, depth: int, seconds: int, latency: bool = False) -> dict:
    """latency: -L (software latency tracking), adds p50_us and p99_us; it
    costs the tool a little per I/O, so only the QD1 run asks for it."""
    tr = f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:{SPDK_NQN} ns:1"
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(SPDK, "build", "lib"))
    out, _ = run_rusage([os.path.join(SPDK, "build", "bin", "spdk_nvme_perf"), "-r", tr,
                         "-q", str(depth), "-o", str(bs), "-w", rw, "-t", str(seconds),
                         "-c", "0x2"] + (["-L"] if latency else []), env=env,
                        timeout=seconds + 120)
    total = [ln for ln in out.splitlines() if ln.strip().startswith("Total")]
    if not total:
        raise SystemExit(f"spdk_nvme_perf: no Total line:\n{out[-2000:]}")
    f = total[-1].split(":", 1)[1].split()
    res = {"iops": float(f[0]), "gbps": float(f[1]) * MiB / 1e9, "avg_us": float(f[2])}
    if latency:
        # "Summary latency data ...:" then lines like " 99.00000% :    55.532us"
        for ln in out.splitlines():
            head, _, val = ln.partition("% :")
            if val and head.strip() in ("50.00000", "99.00000") and val.strip().endswith("us"):
                res.setdefault("p50_us" if head.strip() == "50.00000" else "p99_us", float(val.strip()[:-2]))
        if "p50_us" not in res or "p99_us" not in res:
            raise SystemExit(f"spdk_nvme_perf -L: no 50% / 99% latency lines:\n{out[-2000:]}")
    return res


def spdk_section(rounds: int, seconds: int) -> None:
    perf = os.path.join(SPDK, "build", "bin", "spdk_nvme_perf")
    if not (os.access(perf, os.X_OK) and os.access(os.path.join(SPDK, "build", "bin", "nvmf_tgt"), os.X_OK)):
        print(f"SPDK section skipped: SPDK is not built in {SPDK} (see {PEER} build)")
        return
    if not os.path.exists(PEER):
        print(f"SPDK section skipped: {PEER} not found (set SPDK_PEER)")
        return
    if os.path.exists("/var/tmp/spdk-tgt.pid"):
        print("SPDK section skipped: an SPDK target is already running (/var/tmp/spdk-tgt.pid); "
              f"stop it with {PEER} stop")
        return
    uri = f"nvme+tcp://127.0.0.1:4420/{SPDK_NQN}?ns=1&queues=1"
    subprocess.run(["bash", PEER, "start"], check=True, stdout=subprocess.DEVNULL)
    rows: dict[str, list[float]] = {}
    try:
        for r in range(rounds):
            cur: dict[str, float] = {}
            cur["spdk 4k qd32 IOPS"] = spdk_perf("randread", 4096, 32, seconds)["iops"]
            cur["fx 4k qd32 IOPS"] = fx_bench(uri, "randread", "4k", 32, seconds)[0]["iops"]
            cur["spdk 1m qd32 GB/s"] = spdk_perf("read", MiB, 32, seconds)["gbps"]
            cur["fx 1m qd32 GB/s"] = fx_bench(uri, "read", "1m", 32, seconds)[0]["gbps"]
            sq1 = spdk_perf("randread", 4096, 1, seconds, latency=True)
            cur["spdk 4k qd1 IOPS"] = sq1["iops"]
            cur["spdk qd1 p50 us"] = sq1["p50_us"]
            cur["spdk qd1 p99 us"] = sq1["p99_us"]
            q1 = fx_bench(uri, "randread", "4k", 1, seconds)[0]
            cur["fx 4k qd1 IOPS"] = q1["iops"]
            cur["fx qd1 p50 us"] = q1["p50_us"]
            cur["fx qd1 p99 us"] = q1["p99_us"]
            for k, v in cur.items():
                rows.setdefault(k, []).append(v)
            print(f"round {r + 1}: " + "  ".join(f"{k} {v:.4g}" for k, v in cur.items()), flush=True)
    finally:
        subprocess.run(["bash", PEER, "stop"], check=False, stdout=subprocess.DEVNULL)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print("\n| against SPDK nvmf_tgt (RAM ns, loopback, 1 queue) | spdk_nvme_perf | fx100io | ratio | goal |")
    print("|---|---|---|---|---|")
    print(f"| 4 KiB randread QD32, IOPS | {med['spdk 4k qd32 IOPS']:.0f} | {med['fx 4k qd32 IOPS']:.0f} "
          f"| {med['fx 4k qd32 IOPS'] / med['spdk 4k qd32 IOPS']:.2f}x | >= 0.8x |")
    print(f"| 1 MiB read QD32, GB/s | {med['spdk 1m qd32 GB/s']:.2f} | {med['fx 1m qd32 GB/s']:.2f} "
          f"| {med['fx 1m qd32 GB/s'] / med['spdk 1m qd32 GB/s']:.2f}x | >= 1.0x |")
    print(f"| 4 KiB randread QD1, IOPS | {med['spdk 4k qd1 IOPS']:.0f} | {med['fx 4k qd1 IOPS']:.0f} "
          f"| {med['fx 4k qd1 IOPS'] / med['spdk 4k qd1 IOPS']:.2f}x | |")
    print(f"| QD1 p99 / median, us | {med['spdk qd1 p99 us']:.1f} / {med['spdk qd1 p50 us']:.1f} "
          f"({med['spdk qd1 p99 us'] / med['spdk qd1 p50 us']:.2f}x) "
          f"| {med['fx qd1 p99 us']:.1f} / {med['fx qd1 p50 us']:.1f} "
          f"| fx100io {med['fx qd1 p99 us'] / med['fx qd1 p50 us']:.2f}x | fx100io <= 3x |")
    print("(the QD1 spdk_nvme_perf run tracks latency (-L), so its IOPS carry that small cost)")


def iperf3_cpu(seconds: int) -> tuple[float, float, float]:
    """GB/s and CPU s/GB of iperf3's client and server, one stream on loopback."""
    port = free_port()
    srv = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        out, ccpu = run_rusage(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", str(seconds), "-J"])
    finally:
        _, _, ru = os.wait4(srv.pid, 0)
        srv.returncode = 0
    end = json.loads(out)["end"]
    gb = end["sum_received"]["bytes"] / 1e9
    return end["sum_received"]["bits_per_second"] / 8e9, ccpu / gb, (ru.ru_utime + ru.ru_stime) / gb


def cpu_section(rounds: int, seconds: int, path: str) -> None:
    if shutil.which("iperf3") is None:
        print("CPU section skipped: iperf3 is not installed (apt-get install iperf3)")
        return
    size = 1 << 30
    with open(path, "wb") as f:  # real bytes: tmpfs holes would read unrealistically fast
        block = os.urandom(64 * MiB)
        for _ in range(size // len(block)):
            f.write(block)
    port = free_port()
    tgt = subprocess.Popen([sys.executable, "-m", "fx100io", "target", "--listen", f"127.0.0.1:{port}",
                            "--nqn", OUR_NQN, "--namespace", path, "--block-size", "4096", "-q"],
                           stdout=subprocess.PIPE, text=True)
    rows: dict[str, list[float]] = {}
    try:
        line = tgt.stdout.readline() if tgt.stdout else ""
        if "listening" not in line:
            raise SystemExit(f"our target did not start: {line!r}")
        uri = f"nvme+tcp://127.0.0.1:{port}/{OUR_NQN}?queues=1"
        for r in range(rounds):
            gbps, icl, isrv = iperf3_cpu(seconds)
            t0 = proc_cpu(tgt.pid)
            res, _ = fx_bench(uri, "read", "1m", 16, seconds, size="1g")
            icpu = res["run_cpu"]
            tcpu = proc_cpu(tgt.pid) - t0
            gb = res["bytes"] / 1e9
            cur = {"iperf3 GB/s": gbps, "iperf3 client s/GB": icl, "iperf3 server s/GB": isrv,
                   "fx GB/s": res["gbps"], "fx initiator s/GB": icpu / gb, "fx target s/GB": tcpu / gb}
            for k, v in cur.items():
                rows.setdefault(k, []).append(v)
            print(f"cpu round {r + 1}: " + "  ".join(f"{k} {v:.3f}" for k, v in cur.items()), flush=True)
    finally:
        tgt.terminate()
        tgt.wait(timeout=20)
        os.unlink(path)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print("\n| loopback, 1 stream / 1 queue, 1 MiB reads x16 | GB/s | sender CPU s/GB | receiver CPU s/GB |")
    print("|---|---|---|---|")
    print(f"| iperf3 -c (client sends, server receives) | {med['iperf3 GB/s']:.2f} "
          f"| {med['iperf3 client s/GB']:.3f} (client) | {med['iperf3 server s/GB']:.3f} (server) |")
    print(f"| fx100io target -> fx100io initiator | {med['fx GB/s']:.2f} "
          f"| {med['fx target s/GB']:.3f} (target) | {med['fx initiator s/GB']:.3f} (initiator) |")
    print(f"(ratios: initiator {med['fx initiator s/GB'] / med['iperf3 server s/GB']:.2f}x iperf3's receiver, "
          f"target {med['fx target s/GB'] / med['iperf3 client s/GB']:.2f}x iperf3's sender; "
          "user+sys: iperf3's from rusage, the initiator's from its job's rusage over the run, "
          "the target's from /proc over the same run)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--file", default="/dev/shm/fx100io-bench-cpu.img")
    ap.add_argument("--skip-spdk", action="store_true")
    ap.add_argument("--skip-cpu", action="store_true")
    a = ap.parse_args()
    if not a.skip_spdk:
        spdk_section(a.rounds, a.seconds)
    if not a.skip_cpu:
        cpu_section(a.rounds, a.seconds, a.file)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Cold loads of LMCache's multi-process L2 tier: fx100io against LMCache's own adapters.

Every case is run by LMCache's own benchmark, `lmcache bench l2 --l2-adapter JSON`, on the
same device in the same run:

  fx100io         our `plugin` adapter (fx100io.contrib.lmcache_mp.FX100ioL2Adapter) on a file
  fx100io-native  our `native_plugin` client, wrapped by LMCache's NativeConnectorL2Adapter
  fs              LMCache's `fs` adapter (its default: buffered files)
  fs-odirect      LMCache's `fs` adapter with use_odirect
  raw_block       LMCache's `raw_block` adapter (Rust extension, O_DIRECT, io_uring) on a file
  fx100io-tcp     our adapter over nvme+tcp to `fx100io target` serving a file on the device
  fio             fio's sequential O_DIRECT reads, chunk-sized, at iodepth 1, 8 and 32,
                  each depth over its own region of a file written just before (as our
                  store's chunks are: no depth reads bytes another one read already):
                  the best is the device's limit
  fio-same        (with fx100io) the same fio depths on the fx100io case's own store file,
                  all over the extents its load read, before that load in odd repeats and
                  after it in even ones: a diagnostic (the same bytes, the same layout),
                  not the yardstick; its depths re-read the same bytes

Cold, across a restart: for each case one `bench l2 --only store` process writes the chunks
and exits, the page cache is dropped, then one `bench l2 --only load` process (a new
adapter on the same device, as after a server restart) reads each chunk once. A load that
does not find every key is reported as failed, not timed. Each phase starts with one
unmeasured submit (its own keys, also cold) so that one-time set-up (rings, registration)
is not charged to the measured rounds.

With --repeat N every case runs N times (the case order rotated each time, so a device
that slows down weighs on all alike); each figure is then the median over the repeats, and
fio's best depth is the depth with the best median, not the best single run (on a device
that swings 30% between runs, the best of three fio runs against one run of ours reads
high on its own).

Devices: "disk" (a directory on the machine's disk, --dir) and "fast" (ext4 on a loop
device over /dev/shm, built and removed here). Needs root (drop_caches, losetup, mount),
fio, and the venv of tools/install_lmcache_bench.sh (LMCache's raw-block extension).

  tools/bench_lmcache_mp.py [--devices disk,fast] [--chunk-mb 16] [--chunks 16]
                            [--rounds 2] [--cases fx100io,fs,raw_block,...]
                            [--repeat 1] [--set max_io=16M ...]
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from fio_peer import fio_read, write_random_file  # noqa: E402  (tools/, this script's folder)

FIO_DEPTHS = (1, 8, 32)

MiB = 1 << 20
GiB = 1 << 30
MODULE = "fx100io.contrib.lmcache_mp"
CASES = ("fio", "fio-same", "fx100io", "fx100io-native", "fs", "fs-odirect", "raw_block", "fx100io-tcp")


def _bench_lmcache():
    """tools/bench_lmcache's device helpers (disk_dir, fast_dir, drop_caches, Target)."""
    loader = importlib.machinery.SourceFileLoader("bench_lmcache", str(HERE / "bench_lmcache"))
    spec = importlib.util.spec_from_loader("bench_lmcache", loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_lmcache"] = mod  # its dataclasses look their module up
    loader.exec_module(mod)
    return mod


def bench_python() -> str:
    p = subprocess.run(["bash", str(HERE / "install_lmcache_bench.sh")], capture_output=True,
                       text=True)
    if p.returncode != 0:
        sys.exit(f"tools/install_lmcache_bench.sh failed:\n{p.stderr}")
    return p.stdout.strip().splitlines()[-1]


def store_size(payload: int) -> int:
    return int(payload * 1.1) + 64 * MiB


def adapter_json(case: str, d: str, payload: int, chunk: int, target_uri: str | None,
                 extra: dict[str, str] | None = None) -> str:
    ours = {"type": "plugin", "module_path": MODULE, "class_name": "FX100ioL2Adapter"}
    extra = extra or {}
    if case == "fx100io":
        return json.dumps({**ours, "adapter_params": {
            "devices": f"file://{d}/fx100io.img", "size": str(store_size(payload)), **extra}})
    if case == "fx100io-native":
        return json.dumps({"type": "native_plugin", "module_path": MODULE,
                           "class_name": "FX100ioNativeClient", "adapter_params": {
                               "devices": f"file://{d}/fx100io-native.img",
                               "size": str(store_size(payload)), **extra}})
    if case == "fx100io-tcp":
        assert target_uri is not None
        return json.dumps({**ours, "adapter_params": {"devices": target_uri, **extra}})
    if case == "fs":
        return json.dumps({"type": "fs", "base_path": f"{d}/fs"})
    if case == "fs-odirect":
        return json.dumps({"type": "fs", "base_path": f"{d}/fs-odirect", "use_odirect": True})
    if case == "raw_block":
        path = f"{d}/raw_block.img"
        slot = chunk + 4096  # the chunk and its header, 4 KiB aligned
        with open(path, "wb") as f:
            f.truncate(store_size(payload) + 256 * MiB + (payload // chunk + 8) * 4096)
        return json.dumps({"type": "raw_block", "device_path": path, "slot_bytes": slot,
                           "io_engine": "io_uring"})
    raise ValueError(case)


def run_bench(py: str, spec: str, op: str, args: argparse.Namespace, out: str) -> dict:
    env = dict(os.environ, LMCACHE_DISABLE_BANNER="1", LMCACHE_LOG_LEVEL="ERROR",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [py, "-m", "lmcache.cli.main", "bench", "l2", "--l2-adapter", spec,
           "--num-keys", str(args.chunks), "--data-size-kb", str(args.chunk_mb * 1024),
           "--rounds", str(args.rounds), "--warmup-rounds", "1", "--only", op,
           "--l1-align-bytes", "4096", "--format", "json", "--output", out, "-q"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"bench l2 --only {op} failed (rc={p.returncode}):\n"
                           f"{(p.stdout + p.stderr)[-3000:]}")
    with open(out) as f:
        return json.load(f)["metrics"]["op_0"]


def data_area(image: str) -> int:
    """Where a ChunkStore file's chunks start (its superblock's data_off)."""
    sys.path.insert(0, str(REPO))
    from fx100io.store.local.layout import Superblock

    with open(image, "rb") as f:
        return Superblock.decode(f.read(4096), image).data_off


def fio_depths(path: str, size: int, chunk: int, offset: int, into: dict[str, list[float]],
               case: str, fresh: bool = False) -> float:
    """fio at each depth of FIO_DEPTHS; each depth's MB/s appended to into[case@qd].
    fresh: the i-th depth reads the i-th size bytes from offset (bytes nobody read
    yet); otherwise every depth reads the same size bytes at offset."""
    best = 0.0
    for i, qd in enumerate(FIO_DEPTHS):
        at = offset + i * size if fresh else offset
        mbps = fio_read(path, size, chunk, qd, at)[1] / 1e6
        into.setdefault(f"{case}@{qd}", []).append(mbps)
        best = max(best, mbps)
    return best


def measure(args: argparse.Namespace, device: str, d: str, py: str, bl, rep: int,
            results: dict[str, list[float]]) -> None:
    chunk = args.chunk_mb * MiB
    payload = chunk * args.chunks * (args.rounds + 1)  # + the warm-up submit
    cleanup = []
    k = len(args.cases)
    cases = args.cases[rep % k:] + args.cases[:rep % k]
    fio_first = rep % 2 == 1  # fio-same before our load in odd repeats, after in even
    try:
        target_uri = None
        if "fx100io-tcp" in args.cases:
            ns = f"{d}/nvme-ns.img"
            bl.reserve_file(ns, store_size(payload))
            target = bl.Target(ns)
            cleanup.append(target.close)
            target_uri = f"nvme+tcp://127.0.0.1:{target.port}/{bl.NQN}?queues={args.tcp_queues}"
        for case in cases:
            if case == "fio-same":
                continue  # run inside the fx100io case, on its file
            if case == "fio":
                # each depth reads its own region, written just before like our
                # store's chunks, so fio's best is never a re-read of bytes another
                # depth just read (which the virtio disk's host may serve from its
                # cache, and which no load of ours gets)
                path = f"{d}/fio.dat"
                write_random_file(path, payload * len(FIO_DEPTHS))
                best = fio_depths(path, payload, chunk, 0, results, "fio", fresh=True)
                os.unlink(path)
                print(f"  {device:5} {'fio':15} best depth {best:8.0f} MB/s", flush=True)
                continue
            spec = adapter_json(case, d, payload, chunk, target_uri, args.set)
            same = case == "fx100io" and "fio-same" in args.cases
            image = f"{d}/fx100io.img"
            with tempfile.TemporaryDirectory() as t:
                stored = run_bench(py, spec, "store", args, f"{t}/store.json")
                bl.drop_caches()
                if same and fio_first:
                    fio_depths(image, payload, chunk, data_area(image), results, "fio-same")
                loaded = run_bench(py, spec, "load", args, f"{t}/load.json")
                if same and not fio_first:
                    fio_depths(image, payload, chunk, data_area(image), results, "fio-same")
            # the next repeat starts from an empty store, and the fast device has
            # room for fio's file (3 payloads) next to what the cases left
            for img in (image, f"{d}/fx100io-native.img", f"{d}/raw_block.img"):
                if case != "fx100io-tcp" and os.path.exists(img):
                    os.unlink(img)
            if case in ("fs", "fs-odirect"):
                shutil.rmtree(f"{d}/{case}", ignore_errors=True)
            total = loaded["total_keys"]
            if stored["total_success"] != total or loaded["total_success"] != total:
                print(f"  {device:5} {case:15} FAILED: stored {stored['total_success']}/"
                      f"{total}, loaded {loaded['total_success']}/{total}")
                continue
            # bench l2 reports MiB/s per round; MB/s (1e6) here, like fio's figure
            mbps = loaded["throughput_avg_mbps"] * MiB / 1e6
            results.setdefault(case, []).append(mbps)
            print(f"  {device:5} {case:15} cold load {mbps:8.0f} MB/s "
                  f"(store {stored['throughput_avg_mbps'] * MiB / 1e6:6.0f} MB/s)", flush=True)
    finally:
        for fn in cleanup:
            fn()


def medians(runs: dict[str, list[float]]) -> dict[str, float]:
    """Each case's median MB/s over the repeats; a fio case is its depth with the best
    median (fio@8 and fio@32 are runs of one depth each)."""
    out: dict[str, float] = {}
    for key, vals in runs.items():
        case, _, _qd = key.partition("@")
        med = statistics.median(vals)
        out[case] = max(out.get(case, 0.0), med)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default="disk,fast")
    ap.add_argument("--dir", default="/var/tmp", help="where the disk case's files go")
    ap.add_argument("--chunk-mb", type=int, default=16, help="bytes per chunk (MiB)")
    ap.add_argument("--chunks", type=int, default=16, help="chunks per submit (bench l2 --num-keys)")
    ap.add_argument("--rounds", type=int, default=2, help="submits per phase")
    ap.add_argument("--cases", default="fio,fx100io,fx100io-native,fs,fs-odirect,raw_block,fx100io-tcp")
    ap.add_argument("--tcp-queues", type=int, default=4)
    ap.add_argument("--fast-gib", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every case this many times (order rotated); figures are medians")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="another adapter_params setting of our cases (e.g. max_io=16M)")
    args = ap.parse_args()
    bad_set = [kv for kv in args.set if "=" not in kv]
    if bad_set:
        sys.exit(f"--set takes KEY=VALUE, got {bad_set}")
    args.set = dict(kv.split("=", 1) for kv in args.set)
    if {"devices", "size"} & set(args.set):
        sys.exit("--set devices/size: the script sets those itself")
    if args.repeat < 1:
        sys.exit("--repeat must be at least 1")
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if "fio-same" in args.cases and "fx100io" not in args.cases:
        sys.exit("fio-same reads the fx100io case's store: add fx100io to --cases")
    bad = sorted(set(args.cases) - set(CASES))
    if bad:
        sys.exit(f"unknown case(s) {bad}; known: {list(CASES)}")
    if os.geteuid() != 0:
        sys.exit("bench_lmcache_mp needs root: drop_caches (cold reads), losetup and mount")
    py = bench_python()
    bl = _bench_lmcache()
    payload = args.chunk_mb * MiB * args.chunks * args.rounds
    print(f"lmcache bench l2: {args.chunks} chunks of {args.chunk_mb} MiB per submit, "
          f"{args.rounds} submits: {payload / GiB:.2f} GiB per case, cold, after a restart"
          + (f"; our adapters with {args.set}" if args.set else ""))
    summary = {}
    for device in [x.strip() for x in args.devices.split(",") if x.strip()]:
        if device == "disk":
            ctx = bl.disk_dir(args.dir)
        elif device == "fast":
            # room for fio's file (a payload per depth) and one case's files
            need = (len(FIO_DEPTHS) + 1) * args.chunk_mb * MiB * args.chunks * (args.rounds + 1)
            ctx = bl.fast_dir(max(int(args.fast_gib * GiB), need + GiB))
        else:
            sys.exit(f"unknown device {device!r} (disk, fast)")
        runs: dict[str, list[float]] = {}
        with ctx as d:
            for rep in range(args.repeat):
                print(f"  {device}: repeat {rep + 1}/{args.repeat}, load average "
                      f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
                measure(args, device, d, py, bl, rep, runs)
        if args.repeat > 1:
            for key, vals in sorted(runs.items()):
                print(f"  {device} {key:15} " + " ".join(f"{v:6.0f}" for v in vals) + " MB/s")
        summary[device] = medians(runs)
    print("\n| device | case | cold load MB/s | vs fs | vs fs-odirect | vs raw_block "
          "| vs fio-same | vs fio |")
    print("|---|---|---|---|---|---|---|---|")
    for device, res in summary.items():
        for case, mbps in res.items():
            ratios = [f"{mbps / res[p]:.2f}x" if p in res else "-"
                      for p in ("fs", "fs-odirect", "raw_block", "fio-same", "fio")]
            print(f"| {device} | {case} | {mbps:.0f} | " + " | ".join(ratios) + " |")
    for device, res in summary.items():
        if "fx100io" not in res:
            continue
        best_engine = max((res[p] for p in ("fs", "fs-odirect", "raw_block") if p in res), default=None)
        goals = []
        if best_engine:
            goals.append(f">= 1.5x LMCache's best disk tier: {res['fx100io'] / best_engine:.2f}x "
                         f"{'met' if res['fx100io'] >= 1.5 * best_engine else 'NOT met'}")
        for peer in ("fio",):  # fio-same reads bytes read before: a diagnostic only
            if peer in res:
                goals.append(f">= 0.9x {peer}: {res['fx100io'] / res[peer]:.2f}x "
                             f"{'met' if res['fx100io'] >= 0.9 * res[peer] else 'NOT met'}")
        print(f"{device}: " + "; ".join(goals))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The adapters' I/O defaults against fio's best depth, and the settings around them
(issue 30: a plain cold load through an adapter within 0.9x of fio on the same device).

For each setting (the adapters' default, queue_depth 16 x max_io 4 MiB, and the
variants below), runs, in the same run and on the same device:

  vllm     tools/bench_vllm.py with the vLLM venv's python (fx100io's tier, vLLM's fs
           tier, fio at iodepth 1, 8, 32 and 64): fx100io / fio
  lmcache  tools/bench_lmcache_mp.py with the LMCache bench venv's python (LMCache's
           own `lmcache bench l2`, our adapter and fio at iodepth 1, 8, 32): fx100io / fio

and prints, per adapter, each setting's ratio to fio (the best fio of its own run), the
best setting, and whether the default is within 0.9x. Rounds alternate the settings, so
a machine that slows down weighs on all alike; each ratio is the median over rounds.
Needs root (drop_caches, losetup) and the venvs of tools/install_vllm.sh and
tools/install_lmcache_bench.sh.

  python3 tools/bench_adapter_defaults.py [--device fast|disk] [--dir /var/tmp]
      [--rounds 2] [--adapters vllm,lmcache] [--settings "16x4M,32x4M,16x8M,8x16M"]

A setting is QDxMAX_IO: queue_depth pieces of max_io bytes in flight.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
VLLM_PY = "/var/cache/fx100io/venv-vllm/bin/python"
LMCACHE_PY = "/var/cache/fx100io/venv-lmcache-bench/bin/python"
DEFAULT = "16x4M"  # fx100io.contrib._settings: queue_depth 16, max_io 4 MiB


def parse_setting(s: str) -> tuple[int, str]:
    m = re.fullmatch(r"(\d+)x(\d+[KMG])", s.strip())
    if not m:
        raise SystemExit(f"a setting is QDxMAX_IO (16x4M), got {s!r}")
    return int(m.group(1)), m.group(2)


def run(cmd: list[str]) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{(p.stdout + p.stderr)[-2000:]}")
    return p.stdout


def vllm_ratio(setting: str, dirpath: str) -> float:
    qd, max_io = parse_setting(setting)
    out = run([VLLM_PY, os.path.join(HERE, "bench_vllm.py"), "--dir", dirpath, "--chunks", "32",
               "--chunk-mib", "16", "--repeat", "2", "--queue-depth", str(qd),
               "--set", f"max_io={max_io}"])
    m = re.search(r"fx100io / fio\s*=\s*([\d.]+)", out)
    if not m:
        raise SystemExit(f"bench_vllm printed no ratio:\n{out[-1500:]}")
    return float(m.group(1))


def lmcache_ratio(setting: str, device: str, dirpath: str) -> float:
    qd, max_io = parse_setting(setting)
    out = run([LMCACHE_PY, os.path.join(HERE, "bench_lmcache_mp.py"), "--devices", device,
               "--dir", dirpath, "--cases", "fio,fx100io", "--rounds", "2",
               "--set", f"queue_depth={qd}", "--set", f"max_io={max_io}"])
    m = re.search(r"^\| \w+ \| fx100io \| [\d.]+ \| .* \| ([\d.]+)x \|$", out, re.M)
    if not m:
        raise SystemExit(f"bench_lmcache_mp printed no fio ratio:\n{out[-1500:]}")
    return float(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="fast", choices=("fast", "disk"),
                    help="fast: ext4 on a loop device over /dev/shm, made here; disk: --dir")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--adapters", default="vllm,lmcache")
    ap.add_argument("--settings", default="16x4M,32x4M,16x8M,8x16M")
    args = ap.parse_args()
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    for s in settings:
        parse_setting(s)
    adapters = [a.strip() for a in args.adapters.split(",") if a.strip()]
    ratios: dict[tuple[str, str], list[float]] = {}

    def measure(dirpath: str) -> None:
        for r in range(args.rounds):
            order = settings[r % len(settings):] + settings[:r % len(settings)]
            for s in order:
                for a in adapters:
                    if a == "vllm":
                        x = vllm_ratio(s, dirpath)
                    elif a == "lmcache":
                        # bench_lmcache_mp makes its own fast device
                        x = lmcache_ratio(s, args.device, args.dir)
                    else:
                        raise SystemExit(f"unknown adapter {a!r} (vllm, lmcache)")
                    ratios.setdefault((a, s), []).append(x)
                    print(f"  round {r + 1}/{args.rounds} {a} {s}: {x:.2f}x fio", flush=True)

    if args.device == "disk" or "vllm" not in adapters:
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="fx100io-defaults-") as d:
            measure(d)
    else:
        sys.path.insert(0, HERE)
        from bench_priority import shm_ext4  # ext4 on a loop device over /dev/shm

        with shm_ext4() as path:
            measure(os.path.dirname(path))
    print(f"\nA cold load through each adapter over fio's best depth ({args.device}; "
          f"median of {args.rounds} rounds; setting: queue_depth x max_io)")
    for a in adapters:
        row = {s: statistics.median(ratios[(a, s)]) for s in settings}
        best = max(row, key=lambda s: row[s])
        cells = "  ".join(f"{s} {v:.2f}x" for s, v in row.items())
        d = row.get(DEFAULT)
        verdict = "" if d is None else \
            f"; default {DEFAULT} {'within' if d >= 0.9 else 'NOT within'} 0.9x"
        print(f"  {a:<8} {cells}  (best {best}{verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

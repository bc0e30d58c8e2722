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
      [--lmcache-repeat 1]

A setting is QDxMAX_IO: queue_depth pieces of max_io bytes in flight.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
VLLM_PY = "/var/cache/fx100io/venv-vllm/bin/python"
LMCACHE_PY = "/var/cache/fx100io/venv-lmcache-bench/bin/python"
DEFAULT = "16x4M"  # fx100io.contrib._settings: queue_depth 16, max_io 4 MiB
# A child bench's limit: above bench_lmcache_mp's own limit on `lmcache bench l2`
# (1800 s), so the inner one fires first and the child cleans up by itself.
CHILD_TIMEOUT_S = 2400
# After the limit: SIGINT to the child's process group (Python children run their
# finally blocks: a loop device unmounted, fio and lmcache bench stopped), this long to
# end, then SIGKILL to the group.
GRACE_S = 60


class Stopped(Exception):
    """A child bench failed or ran past its limit: the run ends with what it measured."""


def parse_setting(s: str) -> tuple[int, str]:
    m = re.fullmatch(r"(\d+)x(\d+[KMG])", s.strip())
    if not m:
        raise SystemExit(f"a setting is QDxMAX_IO (16x4M), got {s!r}")
    return int(m.group(1)), m.group(2)


def run(cmd: list[str]) -> str:
    # its own session: on a timeout the whole group (fio, lmcache bench) is stopped,
    # not the direct child alone
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop_group(p)
        raise Stopped(f"{' '.join(cmd)} ran past {CHILD_TIMEOUT_S} s; stopped it") from None
    except BaseException:
        stop_group(p)  # our own SIGINT/SIGTERM: the children go too
        raise
    if p.returncode != 0:
        raise Stopped(f"{' '.join(cmd)} failed:\n{(out + err)[-2000:]}")
    return out


def interrupted(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def stop_group(p: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGINT, GRACE_S), (signal.SIGKILL, 10)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            break
        try:
            p.communicate(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue


def vllm_ratio(setting: str, dirpath: str) -> float:
    qd, max_io = parse_setting(setting)
    out = run([VLLM_PY, os.path.join(HERE, "bench_vllm.py"), "--dir", dirpath, "--chunks", "32",
               "--chunk-mib", "16", "--repeat", "2", "--queue-depth", str(qd),
               "--set", f"max_io={max_io}"])
    m = re.search(r"fx100io / fio\s*=\s*([\d.]+)", out)
    if not m:
        raise Stopped(f"bench_vllm printed no ratio:\n{out[-1500:]}")
    return float(m.group(1))


def lmcache_ratio(setting: str, device: str, dirpath: str, repeat: int) -> float:
    qd, max_io = parse_setting(setting)
    out = run([LMCACHE_PY, os.path.join(HERE, "bench_lmcache_mp.py"), "--devices", device,
               "--dir", dirpath, "--cases", "fio,fx100io", "--rounds", "2",
               "--repeat", str(repeat),
               "--set", f"queue_depth={qd}", "--set", f"max_io={max_io}"])
    m = re.search(r"^\| \w+ \| fx100io \| [\d.]+ \| .* \| ([\d.]+)x \|$", out, re.M)
    if not m:
        raise Stopped(f"bench_lmcache_mp printed no fio ratio:\n{out[-1500:]}")
    return float(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="fast", choices=("fast", "disk"),
                    help="fast: ext4 on a loop device over /dev/shm, made here; disk: --dir")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--adapters", default="vllm,lmcache")
    ap.add_argument("--settings", default="16x4M,32x4M,16x8M,8x16M")
    ap.add_argument("--lmcache-repeat", type=int, default=1,
                    help="bench_lmcache_mp's --repeat: its ratio is then of medians")
    args = ap.parse_args()
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    for s in settings:
        parse_setting(s)
    adapters = [a.strip() for a in args.adapters.split(",") if a.strip()]
    for a in adapters:
        if a not in ("vllm", "lmcache"):
            raise SystemExit(f"unknown adapter {a!r} (vllm, lmcache)")
    # SIGTERM ends the run like Ctrl-C: the loop device is unmounted, children stopped
    signal.signal(signal.SIGTERM, interrupted)
    ratios: dict[tuple[str, str], list[float]] = {}

    def measure(dirpath: str) -> None:
        for r in range(args.rounds):
            order = settings[r % len(settings):] + settings[:r % len(settings)]
            for s in order:
                for a in adapters:
                    if a == "vllm":
                        x = vllm_ratio(s, dirpath)
                    else:
                        # bench_lmcache_mp makes its own fast device
                        x = lmcache_ratio(s, args.device, args.dir, args.lmcache_repeat)
                    ratios.setdefault((a, s), []).append(x)
                    print(f"  round {r + 1}/{args.rounds} {a} {s}: {x:.2f}x fio", flush=True)

    stopped = ""
    try:
        if args.device == "disk" or "vllm" not in adapters:
            with tempfile.TemporaryDirectory(dir=args.dir, prefix="fx100io-defaults-") as d:
                measure(d)
        else:
            sys.path.insert(0, HERE)
            from bench_priority import shm_ext4  # ext4 on a loop device over /dev/shm

            with shm_ext4() as path:  # unmounted on every way out
                measure(os.path.dirname(path))
    except (Stopped, KeyboardInterrupt) as exc:
        stopped = str(exc) or type(exc).__name__
        print(f"stopped: {stopped}", file=sys.stderr, flush=True)
    print(f"\nA cold load through each adapter over fio's best depth ({args.device}; "
          f"median of up to {args.rounds} rounds; setting: queue_depth x max_io)"
          + (" -- STOPPED EARLY: only what was measured" if stopped else ""))
    for a in adapters:
        row = {s: statistics.median(ratios[(a, s)]) for s in settings if (a, s) in ratios}
        if not row:
            print(f"  {a:<8} nothing measured")
            continue
        best = max(row, key=lambda s: row[s])
        cells = "  ".join(f"{s} {v:.2f}x" for s, v in row.items())
        d = row.get(DEFAULT)
        verdict = "" if d is None else \
            f"; default {DEFAULT} {d:.3f}x: {'within' if d >= 0.9 else 'NOT within'} 0.9x"
        print(f"  {a:<8} {cells}  (best {best}{verdict})")
    return 1 if stopped else 0


if __name__ == "__main__":
    sys.exit(main())

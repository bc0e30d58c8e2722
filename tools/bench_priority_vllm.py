#!/usr/bin/env python3
"""A load under a store storm through vLLM's tiering contract: fx100io's tier next to
vLLM's fs tier (issue 30).

Run it with the vllm venv's interpreter (tools/install_vllm.sh builds it):

    /var/cache/fx100io/venv-vllm/bin/python tools/bench_priority_vllm.py [--rounds 3]
        [--probes 10] [--gap-ms 100] [--dir /var/tmp] [--tiers fx100io,vllm-fs]

Each tier is made the way vLLM makes a secondary tier (SecondaryTierFactory from a config
entry, at its defaults) over vLLM's primary memory (SharedOffloadRegion), its files in
the same directory. The probe is one load job of 4 chunks of 32 MiB (a request's
promotion), timed from submit_load until get_finished_jobs() reports it, the bytes
checked; before each, the page cache is dropped (the fs tier reads through it). The
storm is two writers, each with one store job of 8 new chunks of 32 MiB in flight,
submitting the next when get_finished_jobs() reports the last (the tiers are driven from
one thread, as vLLM's scheduler drives them). New chunks every time: the fs tier skips a
file that exists; the fs tier's storm files are deleted once stored, fx100io's tier
evicts its oldest (it has room for 4x a probe and both writers' batches).

Phases per tier, round after round: probes alone, probes under the storm. Prints the
median and p99 (with n) of each, their ratio, the storm's GB/s, and the fs tier's storm
latency over fx100io's (goal: fx100io better).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
import uuid
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import numpy as np
from bench_vllm import drop_caches, jobs_for, make_spec  # tools/, on sys.path above
from vllm.v1.kv_offload.base import make_offload_key
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

MiB = 1 << 20
CHUNK = 32 * MiB
PROBE_CHUNKS, STORM_CHUNKS, WRITERS = 4, 8, 2
ROOM = 4
PROBE_LIMIT_S = 120  # a load job that takes longer ends the run
# rows of the primary region: probe source, probe destination, each writer's source
PROBE_SRC, PROBE_DST = 0, PROBE_CHUNKS
STORM_SRC = 2 * PROBE_CHUNKS
ROWS = STORM_SRC + WRITERS * STORM_CHUNKS


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def key(n: int) -> Any:
    return make_offload_key(n.to_bytes(32, "big"), 0)


class Run:
    def __init__(self, name: str, cfg: dict, view: memoryview, arr: np.ndarray, spec: Any,
                 gap_s: float, probes: int) -> None:
        self.name = name
        self.tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
        self.arr = arr
        self.gap_s = gap_s
        self.probes = probes
        self.ids = iter(range(1, 1 << 40))
        self.gen = 1_000_000
        self.probe_keys = [key(i) for i in range(PROBE_CHUNKS)]

    def prepare(self) -> None:
        """Store the probe (apart from __init__: the caller closes a tier it got)."""
        job = jobs_for(self.probe_keys, list(range(PROBE_SRC, PROBE_SRC + PROBE_CHUNKS)),
                       PROBE_CHUNKS, next(self.ids), promotion=False)[0]
        self.tier.submit_store(job)
        self.tier.drain_jobs()
        done = list(self.tier.get_finished_jobs())
        if not done or not all(r.success for r in done):
            raise SystemExit(f"{self.name}: storing the probe failed: {done}")
        self.want = self.arr[PROBE_SRC:PROBE_SRC + PROBE_CHUNKS].copy()

    def _store_job(self, w: int) -> tuple[int, list]:
        keys = [key(self.gen + i) for i in range(STORM_CHUNKS)]
        self.gen += STORM_CHUNKS
        first = STORM_SRC + w * STORM_CHUNKS
        job = jobs_for(keys, list(range(first, first + STORM_CHUNKS)), STORM_CHUNKS,
                       next(self.ids), promotion=False)[0]
        self.tier.submit_store(job)
        return job.job_id, keys

    def _forget(self, keys: list) -> None:
        """The fs tier keeps every file: drop a stored storm batch's files (fx100io's
        tier evicts by itself)."""
        mapper = getattr(self.tier, "file_mapper", None)
        if mapper is not None:
            for k in keys:
                try:
                    os.unlink(mapper.get_file_name(k))
                except FileNotFoundError:
                    pass

    def phase(self, storm: bool) -> tuple[list[float], float]:
        """Probe latencies, and the storm's GB/s (0 without it)."""
        lat: list[float] = []
        inflight: dict[int, tuple[int, list]] = {}  # job id -> (writer, keys)
        if storm:
            for w in range(WRITERS):
                jid, keys = self._store_job(w)
                inflight[jid] = (w, keys)
        stored = 0
        t_start = time.perf_counter()
        probe: tuple[int, float] | None = None
        next_probe = time.perf_counter() + (0.5 if storm else 0.0)  # the storm is going
        timed_from = None
        while len(lat) < self.probes or probe is not None:
            now = time.perf_counter()
            if probe is None and now >= next_probe and len(lat) < self.probes:
                if timed_from is None:
                    timed_from, stored = now, 0
                self.arr[PROBE_DST:PROBE_DST + PROBE_CHUNKS] = 0
                drop_caches()
                job = jobs_for(self.probe_keys, list(range(PROBE_DST, PROBE_DST + PROBE_CHUNKS)),
                               PROBE_CHUNKS, next(self.ids), promotion=True)[0]
                probe = (job.job_id, time.perf_counter())
                self.tier.submit_load(job)
            for r in self.tier.get_finished_jobs():
                if probe is not None and r.job_id == probe[0]:
                    dt = time.perf_counter() - probe[1]
                    if not r.success or not np.array_equal(
                            self.arr[PROBE_DST:PROBE_DST + PROBE_CHUNKS], self.want):
                        raise SystemExit(f"{self.name}: a probe failed or came back wrong")
                    lat.append(dt)
                    probe = None
                    next_probe = time.perf_counter() + self.gap_s
                elif r.job_id in inflight:
                    w, keys = inflight.pop(r.job_id)
                    if not r.success:
                        raise SystemExit(f"{self.name}: a storm store failed")
                    stored += STORM_CHUNKS * CHUNK
                    self._forget(keys)
                    if len(lat) < self.probes:
                        jid, keys = self._store_job(w)
                        inflight[jid] = (w, keys)
            if probe is not None and time.perf_counter() - probe[1] > PROBE_LIMIT_S:
                raise SystemExit(f"{self.name}: a probe did not finish in {PROBE_LIMIT_S} s")
            time.sleep(0.0005)
        elapsed = time.perf_counter() - (timed_from or t_start)
        gbs = stored / elapsed / 1e9 if storm else 0.0
        self.tier.drain_jobs()
        for r in self.tier.get_finished_jobs():
            if r.job_id in inflight:
                self._forget(inflight.pop(r.job_id)[1])
        return lat, gbs

    def close(self) -> None:
        self.tier.shutdown()


def report(results: dict[str, dict]) -> None:
    print(f"\nA load job of {PROBE_CHUNKS} x 32 MiB through vLLM's tier, alone and while "
          f"{WRITERS} writers keep store jobs of {STORM_CHUNKS} x 32 MiB in flight")
    print(f"  {'tier':<10} {'n':>4} {'alone med/p99 ms':>17} {'storm med/p99 ms':>17} "
          f"{'ratio med/p99':>14} {'storm GB/s':>11} {'peer storm / fx100io storm med/p99':>36}")
    fx = results.get("fx100io")
    for name, r in results.items():
        a, s = r["alone"], r["storm"]
        am, ap, sm, sp = statistics.median(a), pct(a, 99), statistics.median(s), pct(s, 99)
        vs = ""
        if fx is not None and name != "fx100io":
            vs = (f"{sm / statistics.median(fx['storm']):.2f}x / "
                  f"{sp / pct(fx['storm'], 99):.2f}x")
        print(f"  {name:<10} {len(s):>4} {am * 1e3:>8.0f} / {ap * 1e3:<6.0f} "
              f"{sm * 1e3:>8.0f} / {sp * 1e3:<6.0f} {sm / am:>6.2f} / {sp / ap:<5.2f} "
              f"{statistics.median(r['gbs']):>11.2f} {vs:>36}")
    n = min((len(r["storm"]) for r in results.values()), default=0)
    if n < 100:
        print(f"  (a p99 of {n} probes is about the worst one: --rounds x --probes of 100 or "
              f"more make it mean more)")
    if fx is not None and "vllm-fs" in results:
        better = statistics.median(results["vllm-fs"]["storm"]) > statistics.median(fx["storm"])
        print(f"  goal (fx100io's median under the storm better than vllm-fs's): "
              f"{'met' if better else 'NOT met'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--probes", type=int, default=10, help="probes per phase and round")
    ap.add_argument("--gap-ms", type=float, default=100.0, help="pause after each probe")
    ap.add_argument("--dir", default="/var/tmp", help="where the tiers' files live")
    ap.add_argument("--tiers", default="fx100io,vllm-fs")
    args = ap.parse_args()
    known = ("fx100io", "vllm-fs")
    tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    for t in tiers:
        if t not in known:
            raise SystemExit(f"unknown tier {t!r} in --tiers; known: {', '.join(known)}")
    if not drop_caches():
        print("needs root: the page cache must be dropped before each probe")
        return 2
    work = os.path.join(args.dir, f"fx100io-bench-prio-vllm-{uuid.uuid4().hex[:8]}")
    os.makedirs(work)
    spec = make_spec(CHUNK)
    region = SharedOffloadRegion(engine_id=f"fx100io-prio-{uuid.uuid4().hex[:8]}",
                                 num_chunks=ROWS, rank=None, kv_bytes_per_chunk=CHUNK,
                                 cpu_page_size=4096)
    view = region.create_kv_memoryview()
    arr = np.asarray(view)
    results: dict[str, dict] = {}
    rows_busy = False  # a tier refused to shut down: its jobs may still use the rows
    try:
        rng = np.random.default_rng(30)
        arr[:] = rng.integers(-128, 128, size=arr.shape, dtype=np.int8)
        room = ROOM * (PROBE_CHUNKS + WRITERS * STORM_CHUNKS) * CHUNK
        cfgs = {
            # its defaults (queue_depth, max_io, ...): only where and how big
            "fx100io": {"type": "FX100ioTier", "module_path": "fx100io.contrib.vllm",
                        "devices": f"file://{work}/fx100io.img",
                        "size": str(room + room // 8 + (256 << 20)), "create": "always"},
            "vllm-fs": {"type": "fs", "root_dir": os.path.join(work, "fs")},
        }
        for name in tiers:
            run = None
            ended = False
            try:
                run = Run(name, cfgs[name], view, arr, spec, args.gap_ms / 1000, args.probes)
                run.prepare()
                res = results.setdefault(name, {"alone": [], "storm": [], "gbs": []})
                for r in range(args.rounds):
                    res["alone"] += run.phase(False)[0]
                    lat, gbs = run.phase(True)
                    res["storm"] += lat
                    res["gbs"].append(gbs)
                    print(f"  round {r + 1}/{args.rounds} {name}: alone "
                          f"{statistics.median(res['alone']) * 1e3:.0f} ms, storm "
                          f"{statistics.median(res['storm']) * 1e3:.0f} ms, storm "
                          f"{gbs:.2f} GB/s", flush=True)
                ended = True
            finally:
                # a shutdown that refuses (jobs still on the rows after a probe ran
                # past its limit) must not hide why the run stopped, nor let the
                # rows be unmapped under the device's I/O
                try:
                    if run is not None:
                        run.close()
                        run = None  # its views of the rows go: the region can be unmapped
                except Exception as exc:  # noqa: BLE001 - reported, rows kept
                    rows_busy = True
                    print(f"{name}: the tier did not shut down ({exc}); its rows stay "
                          "mapped until the process ends", file=sys.stderr, flush=True)
                    if ended:
                        raise SystemExit(f"{name}: the tier did not shut down") from exc
        report(results)
    finally:
        del arr
        view.release()
        if not rows_busy:
            region.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

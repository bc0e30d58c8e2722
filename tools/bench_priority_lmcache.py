#!/usr/bin/env python3
"""A load under a store storm through LMCache's in-process engine: fx100io next to
LMCache's own disk tiers (issue 30).

One LMCacheEngine per case (tools/bench_lmcache's engine glue: a CPU tensor stands in
for vLLM's KV cache, Llama-3-8B geometry, 256-token chunks of 32 MiB), whose only tier
below the CPU is the backend under test:

  fx100io           fx100io's plugin on a file (its defaults: O_DIRECT, io_uring); the
                    probe's retrieve reads at load (async loading, whose class is
                    prefetch_priority, is not measured here: tools/bench_priority.py's
                    storm bg phase is what background costs)
  raw_block uring   the lmcache-rust-raw-block-io plugin, io_engine io_uring, O_DIRECT
  raw_block posix   the same plugin, io_engine posix (the engines this LMCache has:
                    RAW_BLOCK_IO_ENGINES)
  LocalDisk         LMCache's LocalDiskBackend (its defaults)

The probe is a cold load of a 4-chunk prefix (4 x 32 MiB): LMCacheEngine.lookup then
retrieve, as vLLM calls them, after the prefix's chunks were dropped from the CPU tier (and, for LocalDisk's buffered
files, from the page cache), compared byte for byte with what was stored. The storm is
two writers storing 8-chunk prefixes (8 x 32 MiB) through LMCacheEngine.store, each
waiting for its batch to be on the backend before storing the next, always a prefix not
stored before; once stored, a batch is removed from the backend (raw_block does not
evict), except from LocalDisk (a removal there while it wrote crashed LMCache), which
gets room for all of a run's batches (it evicts the probe first when full). Engine calls take one lock
(LMCache's engine is driven by one thread in vLLM); a probe's time starts once it holds
it, so it measures the retrieve alone, while the storm's puts run in the backend.

Phases per case, round after round: probes alone, probes under the storm. Prints per
case the median and p99 (with n) alone and under the storm, their ratio, the storm's
GB/s, and each peer's storm latency over fx100io's (goal: fx100io better than each).
Needs root (drop_caches for LocalDisk) and the lmcache-rust-raw-block-io plugin for the
raw_block cases (skipped with a line when missing).

  python3 tools/bench_priority_lmcache.py [--rounds 3] [--probes 10] [--gap-ms 100]
                                          [--cases fx100io,raw_block-uring,...] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import sys
import threading
import time
from importlib.machinery import SourceFileLoader
from pathlib import Path
from typing import Any

import _checkout  # noqa: F401 - first: this checkout's fx100io where it is built

os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")


def _load_bench_lmcache() -> Any:
    path = Path(__file__).with_name("bench_lmcache")
    loader = SourceFileLoader("bench_lmcache", str(path))
    spec = importlib.util.spec_from_loader("bench_lmcache", loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_lmcache"] = mod  # its dataclasses look their module up
    loader.exec_module(mod)
    return mod


bl = _load_bench_lmcache()
torch = bl.torch
MiB, GiB = bl.MiB, bl.GiB
MODEL = bl.MODELS["llama3-8b"]  # 32 MiB chunks
PROBE_CHUNKS, STORM_CHUNKS, WRITERS = 4, 8, 2
# each backend holds this many times the probe and one batch per writer: the storm
# writes new prefixes all the time and the backends evict the oldest
ROOM = 4
CASES = ("fx100io", "raw_block-uring", "raw_block-posix", "LocalDisk")
# A probe (lookup + retrieve) that takes longer ends the run: a blocking engine call
# cannot be interrupted, so the watchdog says why and exits (each finished case's
# table is already printed).
PROBE_LIMIT_S = 120


@contextlib.contextmanager
def watchdog(what: str) -> Any:
    def stuck() -> None:
        print(f"{what}: did not finish in {PROBE_LIMIT_S} s; ending the run", file=sys.stderr,
              flush=True)
        os._exit(3)
    t = threading.Timer(PROBE_LIMIT_S, stuck)
    t.daemon = True
    t.start()
    try:
        yield
    finally:
        t.cancel()


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def make_case(name: str, d: str, payload: int) -> Any:
    if name == "fx100io":  # its plugin's defaults
        return bl.EngineCase("fx100io", "fx100io", MODEL, payload, {"storage_plugins": ["fx100io"]},
                             bl.fx100io_extra(f"file://{d}/fx100io.img",
                                              bl.store_bytes(ROOM * payload)))
    if name == "LocalDisk":
        path = os.path.join(d, "localdisk") + "/"
        os.makedirs(path, exist_ok=True)
        return bl.EngineCase("LocalDisk", "LocalDiskBackend", MODEL, payload,
                             {"local_disk": f"file://{path}",
                              # it evicts the probe first when full: room for
                              # every storm batch of a run (a few GB are written)
                              "max_local_disk_size": 64 * payload / GiB}, {})
    if name.startswith("raw_block-"):
        engine = "io_uring" if name.endswith("uring") else "posix"
        from lmcache.v1.storage_backend.raw_block import RAW_BLOCK_IO_ENGINES

        if engine not in RAW_BLOCK_IO_ENGINES:
            raise LookupError(f"this LMCache's raw_block has no {engine} engine "
                              f"({sorted(RAW_BLOCK_IO_ENGINES)})")
        return raw_block_case(payload, d, engine)
    raise SystemExit(f"unknown case {name!r}; known: {', '.join(CASES)}")


def raw_block_case(payload: int, d: str, io_engine: str) -> Any:
    """tools/bench_lmcache's raw_block case with the io_engine chosen."""
    path = os.path.join(d, f"raw_block-{io_engine}.img")
    slot = 4096 + MODEL.chunk_bytes()
    bl.reserve_file(path, 128 * MiB + (ROOM * payload // MODEL.chunk_bytes() + 4) * slot)
    extra = {
        "storage_plugin.raw_block.module_path": bl.RAW_BLOCK_MODULE,
        "storage_plugin.raw_block.class_name": "RustRawBlockBackend",
        "rust_raw_block.device_path": path,
        "rust_raw_block.io_engine": io_engine,
        "rust_raw_block.use_odirect": True,
        "rust_raw_block.enable_zero_copy": True,
    }
    return bl.EngineCase(f"raw_block {io_engine}", "raw_block", MODEL, payload,
                         {"storage_plugins": ["raw_block"]}, extra)


class Run:
    def __init__(self, case: Any, probes: int, gap_s: float, base: int) -> None:
        self.case = case
        self.probes = probes
        self.gap_s = gap_s
        self.lock = threading.Lock()  # one thread in the engine at a time
        tok = PROBE_CHUNKS * bl.CHUNK_TOKENS
        # tokens of each case its own (LMCache keeps some state per process)
        self.probe_tokens = torch.arange(tok, dtype=torch.long) + base
        self.probe_kv = bl.make_kv(MODEL, tok, 30)
        self.out = torch.zeros_like(self.probe_kv)
        stok = STORM_CHUNKS * bl.CHUNK_TOKENS
        self.storm_tokens = [torch.arange(stok, dtype=torch.long) + base + 4096 * (w + 1)
                             for w in range(WRITERS)]
        self.storm_kv = [bl.make_kv(MODEL, stok, 31 + w) for w in range(WRITERS)]
        case.store(self.probe_tokens, self.probe_kv)  # on the backend, CPU tier emptied
        self.probe_keys = case.keys(self.probe_tokens)
        self.gen = 0
        self.pending: list = []
        self.buffered = case.name == "LocalDisk"
        self.tier: list[float] = []  # per probe: the storage tier's part of it

    def cold(self) -> None:
        """The probe's chunks out of the CPU tier (and the page cache, for LocalDisk)."""
        sm = self.case.sm
        cpu = sm.storage_backends["LocalCPUBackend"]
        with self.lock:
            if self.buffered:
                # clearing the CPU tier while LocalDisk still wrote from it
                # crashed LMCache (a segfault in the next store): only the
                # probe's chunks, and only those nothing else holds
                for k in self.probe_keys:
                    cpu.remove(k, force=False)
            else:
                sm.clear(locations=["LocalCPUBackend"])
        if any(cpu.contains(k) for k in self.probe_keys):
            raise bl.NotCold(f"{self.case.name}: the probe is still in the CPU tier")
        if self.buffered:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")  # clean pages only: the probe's files were synced at setup

    def probe(self) -> float:
        """One probe's time; its storage tier's share (StorageManager.batched_get,
        which wraps the backend's reads) goes to self.tier."""
        self.cold()
        self.out.zero_()
        with self.lock, watchdog(f"{self.case.name}: a probe"):
            t = time.perf_counter()
            g = self.case.get_s
            # as vLLM does it: the scheduler's lookup, then the worker's retrieve
            # (LocalDisk serves nothing without the lookup); timed together
            self.case.engine.lookup(self.probe_tokens)
            mask = self.case.engine.retrieve(self.probe_tokens, kvcaches=self.out)
            dt = time.perf_counter() - t
            self.tier.append(self.case.get_s - g)
        if int(mask.sum()) != len(self.probe_tokens) or not torch.equal(
                self.out.view(torch.uint8), self.probe_kv.view(torch.uint8)):
            raise SystemExit(f"{self.case.name}: a probe came back wrong "
                             f"({int(mask.sum())} of {len(self.probe_tokens)} tokens)")
        return dt

    def probes_paced(self) -> list[float]:
        lat = []
        for _ in range(self.probes):
            lat.append(self.probe())
            time.sleep(self.gap_s)
        return lat

    def _stored(self, keys: list) -> bool:
        backend = self.case.sm.storage_backends[self.case.backend]
        return not any(backend.exists_in_put_tasks(k) for k in keys) and \
            backend.batched_contains(keys) == len(keys)

    def _store_new(self, w: int) -> list:
        """Writer w stores a prefix never stored before (new tokens: new keys, so
        every chunk is written; removing chunks by key while LMCache's LocalDisk
        still wrote them crashed it here).  The CPU tier is emptied first, the way
        LMCache clears it (chunks whose puts are in flight stay)."""
        self.gen += 1
        tokens = self.storm_tokens[w] + 1_000_000 * self.gen
        if not self.buffered:  # LocalDisk: LMCache's own LRU empties the CPU tier
            self.case.sm.clear(locations=["LocalCPUBackend"])
        self.case.engine.store(tokens, kvcaches=self.storm_kv[w])
        return self.case.keys(tokens)

    def _drop(self, keys: list) -> None:
        """A stored storm batch off the backend: raw_block has a fixed number of
        slots and does not evict.  Not LocalDisk's (it evicts by itself, and a
        removal there while it wrote crashed it)."""
        if self.case.backend != "LocalDiskBackend":
            self.case.sm.batched_remove(keys, locations=[self.case.backend])

    def storm(self, stop: threading.Event, moved: list[int], errors: list[str]) -> None:
        """Two writers' batches in flight at the backend: each writer stores its
        next batch once its last one is on the backend."""
        try:
            pending = []
            for w in range(WRITERS):
                with self.lock:
                    pending.append(self._store_new(w))
            while not stop.is_set():
                progressed = False
                for w in range(WRITERS):
                    if stop.is_set() or not self._stored(pending[w]):
                        continue
                    moved[0] += STORM_CHUNKS * MODEL.chunk_bytes()
                    with self.lock:
                        self._drop(pending[w])
                        pending[w] = self._store_new(w)
                    progressed = True
                if not progressed:
                    time.sleep(0.002)
            self.pending = pending
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            errors.append(f"{type(exc).__name__}: {exc}")

    def storm_phase(self) -> tuple[list[float], float]:
        stop, moved, errors = threading.Event(), [0], []
        t = threading.Thread(target=self.storm, args=(stop, moved, errors), daemon=True)
        t.start()
        time.sleep(0.5)  # the storm is going
        m0, t0 = moved[0], time.perf_counter()
        lat = self.probes_paced()
        gbs = (moved[0] - m0) / (time.perf_counter() - t0) / 1e9
        stop.set()
        t.join(120)
        if t.is_alive() or errors:
            raise SystemExit(f"{self.case.name}: the storm failed: {errors or 'did not stop'}")
        deadline = time.monotonic() + 120
        while not all(self._stored(k) for k in self.pending):
            if time.monotonic() > deadline:
                raise SystemExit(f"{self.case.name}: the storm's last puts did not finish")
            time.sleep(0.02)
        with self.lock:
            for keys in self.pending:
                self._drop(keys)
        return lat, gbs


def report(results: dict[str, dict]) -> None:
    print("\nA cold load (lookup + retrieve) of 4 x 32 MiB through LMCacheEngine, alone and while two writers "
          "store 8 x 32 MiB prefixes through LMCacheEngine.store (fx100io's retrieve reads at "
          "load; its async loading, at prefetch_priority, is not measured here)")
    print(f"  {'case':<16} {'n':>4} {'alone med/p99 ms':>17} {'storm med/p99 ms':>17} "
          f"{'ratio med/p99':>14} {'storm GB/s':>11} {'peer storm / fx100io storm med/p99':>36}")
    fx = results.get("fx100io")
    for name, r in results.items():
        a, s = r["alone"], r["storm"]
        am, ap, sm_, sp = statistics.median(a), pct(a, 99), statistics.median(s), pct(s, 99)
        vs = ""
        if fx is not None and name != "fx100io":
            fm, fp = statistics.median(fx["storm"]), pct(fx["storm"], 99)
            vs = f"{sm_ / fm:.2f}x / {sp / fp:.2f}x"
        print(f"  {name:<16} {len(s):>4} {am * 1e3:>8.0f} / {ap * 1e3:<6.0f} "
              f"{sm_ * 1e3:>8.0f} / {sp * 1e3:<6.0f} {sm_ / am:>6.2f} / {sp / ap:<5.2f} "
              f"{statistics.median(r['gbs']):>11.2f} {vs:>36}")
    # where a probe's time goes: the storage tier (the backend's reads) and the
    # rest (LMCache's lookup and its copy into the KV cache, which every case pays)
    print("  the storage tier's share of a probe (StorageManager.batched_get), medians:")
    for name, r in results.items():
        if not r["alone_tier"] or not r["storm_tier"]:
            continue
        at, st = statistics.median(r["alone_tier"]), statistics.median(r["storm_tier"])
        am, sm_ = statistics.median(r["alone"]), statistics.median(r["storm"])
        print(f"  {name:<16} alone: tier {at * 1e3:.0f} ms, rest {(am - at) * 1e3:.0f} ms; "
              f"storm: tier {st * 1e3:.0f} ms, rest {(sm_ - st) * 1e3:.0f} ms")
    n = min((len(r["storm"]) for r in results.values()), default=0)
    if n < 100:
        print(f"  (a p99 of {n} probes is about the worst one: --rounds x --probes of 100 or "
              f"more make it mean more)")
    if fx is not None:
        fm = statistics.median(fx["storm"])
        peers = [n for n in results if n != "fx100io"]
        better = all(statistics.median(results[n]["storm"]) > fm for n in peers)
        print(f"  goal (fx100io's median under the storm better than each peer's): "
              f"{'met' if better and peers else 'NOT met' if peers else 'no peer ran'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--probes", type=int, default=10, help="probes per phase and round")
    ap.add_argument("--gap-ms", type=float, default=100.0, help="pause after each probe")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--dir", default="/var/tmp", help="where the backends' files live")
    args = ap.parse_args()
    names = args.cases.split(",")
    payload = (PROBE_CHUNKS + WRITERS * STORM_CHUNKS) * MODEL.chunk_bytes()
    results: dict[str, dict] = {}
    # one case at a time (each pins a CPU tier of about the payload), its phases
    # interleaved round after round
    for i, n in enumerate(names):
        with bl.disk_dir(args.dir) as d:
            try:
                case = make_case(n, d, payload)
            except (LookupError, RuntimeError, ImportError) as exc:
                print(f"{n}: skipped ({exc})", flush=True)
                continue
            # the engine is built: closed on every way out, a skip included (its
            # pinned CPU tier and threads would skew the next cases)
            try:
                try:
                    run = Run(case, args.probes, args.gap_ms / 1000, 1 + 20_000 * i)
                except (LookupError, RuntimeError, ImportError) as exc:
                    print(f"{n}: skipped ({exc})", flush=True)
                    continue
                res = results.setdefault(n, {"alone": [], "storm": [], "gbs": [],
                                             "alone_tier": [], "storm_tier": []})
                for r in range(args.rounds):
                    res["alone"] += run.probes_paced()
                    res["alone_tier"] += run.tier
                    run.tier = []
                    lat, gbs = run.storm_phase()
                    res["storm"] += lat
                    res["storm_tier"] += run.tier
                    run.tier = []
                    res["gbs"].append(gbs)
                    print(f"  round {r + 1}/{args.rounds} {n}: alone "
                          f"{statistics.median(res['alone']) * 1e3:.0f} ms, storm "
                          f"{statistics.median(res['storm']) * 1e3:.0f} ms, storm "
                          f"{gbs:.2f} GB/s", flush=True)
                report({n: res})  # each case's line as soon as it has one
            except BaseException as exc:
                # say why before closing: LMCache's LocalDisk has crashed the
                # process at close after a failed round
                print(f"{n}: stopped: {type(exc).__name__}: {exc}", flush=True)
                raise
            finally:
                with contextlib.suppress(Exception):
                    case.close()
    report(results)


if __name__ == "__main__":
    sys.exit(main())

"""Cold loads through vLLM's tiering contract: fx100io's tier vs vLLM's built-in fs tier.

Run it with the vllm venv's interpreter (tools/install_vllm.sh builds it), from the
checkout (this script puts the checkout on sys.path):

    /var/cache/fx100io/venv-vllm/bin/python tools/bench_vllm.py --dir /mnt/nvme/bench \
        --chunks 64 --chunk-mib 16

Both tiers are loaded the way vLLM loads a secondary tier (SecondaryTierFactory from a
config entry) over the same primary memory (vLLM's SharedOffloadRegion), with their
files in the same directory, so on the same device. Each stores the same chunks; then
the page cache is dropped (cold), the primary rows are cleared, and the tier loads every
chunk back the way vLLM promotes them: one load job per request of --chunks-per-job
chunks, all submitted at once, timed until drain_jobs() returns. The bytes are checked.
fio (O_DIRECT, io_uring, chunk-sized reads up to 8 MiB at iodepth 1, 8, 32 and 64, the
best counting) is the peer that says what the device can do: each round writes a file of
its own next to the tiers' and each depth reads its own region of it, written just
before, as the tiers read what they stored (re-reading one region at every depth let the
later depths read bytes the first had just fetched, which a cache below the guest may
serve and no load of ours gets). --fio-same reads the bytes of fx100io's own file instead,
as a diagnostic. --repeat rounds interleave the three (order turning);
prints the best GB/s of each and the ratios, the ratios only if every run was cold.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import uuid
from types import SimpleNamespace
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import numpy as np
from fio_peer import fio_read, write_random_file  # tools/ is on sys.path above
from vllm.v1.kv_offload.base import OffloadingKVEventsConfig, ReqContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

FIO_DEPTHS = (1, 8, 32, 64)  # fio's depths, chunk-sized reads (up to 8 MiB)


def make_spec(chunk_bytes: int) -> Any:
    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layers",), group_id=0),),
        worker_kv_bytes_per_block=chunk_bytes,
        enable_kv_cache_events=False,
        extra_config={},
        engine_id="fx100io-bench",
        model=OffloadingModelConfig(name="bench/model", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )
    return SimpleNamespace(
        config=config, blocks_per_chunk=1,
        kv_events_config=OffloadingKVEventsConfig(enable_kv_cache_events=False,
                                                  self_describing_kv_events=False),
    )


def drop_caches() -> bool:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def jobs_for(keys: list[Any], chunk_ids: list[int], per_job: int, first_id: int,
             promotion: bool) -> list[TransferJob]:
    out = []
    for n, i in enumerate(range(0, len(keys), per_job)):
        out.append(TransferJob(
            job_id=first_id + n, keys=keys[i:i + per_job],
            chunk_ids=np.array(chunk_ids[i:i + per_job], dtype=np.int32),
            is_promotion=promotion, req_context=ReqContext(req_id=f"r{first_id + n}"),
        ))
    return out


def chunk_span(tier: Any) -> tuple[int, int] | None:
    """(first byte, end) of the chunks fx100io's tier wrote, for fio to read the same
    bytes. Reads the store's index (private: this is a measuring tool, not a client)."""
    entries = getattr(getattr(tier, "store", None), "_entries", None)
    if not entries:
        return None
    offs = [(e.off, e.off + e.length) for e in entries.values()]
    return min(o for o, _ in offs), max(e for _, e in offs)


class Tier:
    """One tier under test: stored once, then loaded cold once per round."""

    def __init__(self, name: str, cfg: dict[str, Any], view: memoryview, spec: Any,
                 nchunks: int, per_job: int) -> None:
        self.name = name
        self.tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
        self.nchunks = nchunks
        self.per_job = per_job
        self.keys = [make_offload_key(i.to_bytes(32, "big"), 0) for i in range(nchunks)]
        self.best = 0.0

    def store(self, arr: np.ndarray) -> None:
        # Stores read the lower half of the primary; loads land in the upper half.
        t0 = time.perf_counter()
        for j in jobs_for(self.keys, list(range(self.nchunks)), self.per_job, 1, promotion=False):
            self.tier.submit_store(j)
        self.tier.drain_jobs()
        stored = list(self.tier.get_finished_jobs())
        t = time.perf_counter() - t0
        assert stored and all(r.success for r in stored), f"{self.name}: a store failed: {stored}"
        print(f"  {self.name:8s} store: {self.nchunks * arr.shape[1] / t / 1e9:6.2f} GB/s",
              flush=True)

    def load(self, arr: np.ndarray, expected: np.ndarray, rnd: int) -> bool:
        n = self.nchunks
        arr[n:] = 0
        cold = drop_caches()
        loads = jobs_for(self.keys, list(range(n, 2 * n)), self.per_job, 1000 * (rnd + 1),
                         promotion=True)
        t0 = time.perf_counter()
        for j in loads:
            self.tier.submit_load(j)
        self.tier.drain_jobs()
        t = time.perf_counter() - t0
        done = list(self.tier.get_finished_jobs())
        assert len(done) == len(loads) and all(r.success for r in done), (
            f"{self.name}: a load failed: {done}")
        if not np.array_equal(arr[n:], expected):
            raise SystemExit(f"{self.name}: loaded bytes differ from what was stored")
        rate = n * arr.shape[1] / t
        self.best = max(self.best, rate)
        print(f"  {self.name:8s} load {rnd + 1}: {rate / 1e9:6.2f} GB/s "
              f"({'cold' if cold else 'page cache NOT dropped (not root?)'})", flush=True)
        return cold


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="directory on the device under test")
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--chunk-mib", type=float, default=16.0)
    ap.add_argument("--chunks-per-job", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--queue-depth", type=int, default=16,
                    help="the tier's queue_depth (its default, 16)")
    ap.add_argument("--fs-threads", type=int, default=16, help="the fs tier's read/write threads")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="another setting of fx100io's tier entry (e.g. max_io=4M)")
    ap.add_argument("--keep", action="store_true", help="keep the files afterwards")
    ap.add_argument("--fio-same", action="store_true",
                    help="fio re-reads fx100io's own chunks at every depth (a diagnostic) "
                         "instead of a freshly written region per depth")
    args = ap.parse_args()

    chunk_bytes = int(args.chunk_mib * (1 << 20)) // 4096 * 4096
    n = args.chunks
    total = n * chunk_bytes
    work = os.path.join(args.dir, f"fx100io-bench-vllm-{uuid.uuid4().hex[:8]}")
    os.makedirs(work)
    img = os.path.join(work, "fx100io.img")
    spec = make_spec(chunk_bytes)
    region = SharedOffloadRegion(engine_id=f"fx100io-bench-{uuid.uuid4().hex[:8]}",
                                 num_chunks=2 * n, rank=None, kv_bytes_per_chunk=chunk_bytes,
                                 cpu_page_size=4096)
    view = region.create_kv_memoryview()
    arr = np.asarray(view)
    try:
        rng = np.random.default_rng(7)
        arr[:n] = rng.integers(-128, 128, size=(n, chunk_bytes), dtype=np.int8)
        expected = arr[:n].copy()
        print(f"vLLM tiering, cold loads of {n} chunks x {chunk_bytes / (1 << 20):.1f} MiB "
              f"= {total / 1e9:.2f} GB, {args.chunks_per_job} chunks per load job, in {work}")
        ours = Tier(
            "fx100io",
            {"type": "FX100ioTier", "module_path": "fx100io.contrib.vllm",
             "devices": f"file://{img}", "size": str(total + total // 4 + (256 << 20)),
             "create": "always", "queue_depth": str(args.queue_depth),
             **dict(kv.split("=", 1) for kv in args.set)},
            view, spec, n, args.chunks_per_job)
        tiers = [ours]
        try:
            tiers.append(Tier(
                "vllm-fs",
                {"type": "fs", "root_dir": os.path.join(work, "fs"),
                 "n_read_threads": args.fs_threads, "n_write_threads": args.fs_threads},
                view, spec, n, args.chunks_per_job))
            for t in tiers:
                t.store(arr)
            # fio: the bytes fx100io's chunks occupy in its file (the store packs a fresh
            # store's chunks one after another), O_DIRECT through io_uring.
            span = chunk_span(ours.tier)
            assert span is not None and span[1] - span[0] == total, span
            # Rounds interleave the tiers and fio (the order turning each round), so a
            # machine that slows down or speeds up weighs on all three alike; best of each.
            all_cold = True
            fio_best = 0.0
            runs = [*tiers, None]
            for rnd in range(args.repeat):
                order = runs[rnd % len(runs):] + runs[:rnd % len(runs)]
                for t in order:
                    if t is None:
                        # fio at its best of several depths: the device's limit, not
                        # one setting's
                        fio_file, at = img, [span[0]] * len(FIO_DEPTHS)
                        if not args.fio_same:
                            fio_file = os.path.join(work, "fio.dat")
                            write_random_file(fio_file, total * len(FIO_DEPTHS))
                            at = [i * total for i in range(len(FIO_DEPTHS))]
                        for qd, off in zip(FIO_DEPTHS, at):
                            all_cold &= drop_caches()
                            fio_bytes, fio_rate = fio_read(fio_file, total,
                                                           min(chunk_bytes, 8 << 20), qd, off)
                            fio_best = max(fio_best, fio_rate)
                            print(f"  fio      read {rnd + 1}: {fio_rate / 1e9:6.2f} GB/s "
                                  f"({fio_bytes} bytes, O_DIRECT io_uring, iodepth {qd}, "
                                  f"{'fx100io' if args.fio_same else 'its own'} file)",
                                  flush=True)
                        if fio_file != img:
                            os.unlink(fio_file)
                    else:
                        all_cold &= t.load(arr, expected, rnd)
        finally:
            for t in tiers:
                t.tier.shutdown()
        fs = tiers[1].best
        print(f"best of {args.repeat}: fx100io {ours.best / 1e9:.2f} GB/s, vllm-fs "
              f"{fs / 1e9:.2f} GB/s, fio {fio_best / 1e9:.2f} GB/s")
        if not all_cold:
            print("no ratios: the page cache could not be dropped (run as root), so the "
                  "loads were not cold")
            return 2
        print(f"fx100io / vllm-fs = {ours.best / fs:.2f}x  (goal >= 1.5x)")
        print(f"fx100io / fio     = {ours.best / fio_best:.2f}   (goal >= 0.90)")
    finally:
        del arr
        view.release()
        region.cleanup()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

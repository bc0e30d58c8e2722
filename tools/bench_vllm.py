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
fio then reads the same number of bytes of fx100io's file (O_DIRECT, io_uring) as the
peer that says what the device can do. Prints GB/s for each and the ratios.
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
from fio_peer import fio_read  # tools/ is on sys.path above
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


def run_tier(name: str, cfg: dict[str, Any], view: memoryview, arr: np.ndarray, spec: Any,
             nchunks: int, per_job: int, expected: np.ndarray, repeat: int) -> tuple[float, Any]:
    tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
    try:
        keys = [make_offload_key(i.to_bytes(32, "big"), 0) for i in range(nchunks)]
        # Stores read the lower half of the primary; loads land in the upper half.
        t0 = time.perf_counter()
        for j in jobs_for(keys, list(range(nchunks)), per_job, 1, promotion=False):
            tier.submit_store(j)
        tier.drain_jobs()
        stored = list(tier.get_finished_jobs())
        t_store = time.perf_counter() - t0
        assert stored and all(r.success for r in stored), f"{name}: a store failed: {stored}"
        best = 0.0
        for rep in range(repeat):
            arr[nchunks:] = 0
            cold = drop_caches()
            loads = jobs_for(keys, list(range(nchunks, 2 * nchunks)), per_job, 1000 * (rep + 1),
                             promotion=True)
            t0 = time.perf_counter()
            for j in loads:
                tier.submit_load(j)
            tier.drain_jobs()
            t = time.perf_counter() - t0
            done = list(tier.get_finished_jobs())
            assert len(done) == len(loads) and all(r.success for r in done), (
                f"{name}: a load failed: {done}")
            if not np.array_equal(arr[nchunks:], expected):
                raise SystemExit(f"{name}: loaded bytes differ from what was stored")
            rate = nchunks * arr.shape[1] / t
            best = max(best, rate)
            print(f"  {name:8s} load {rep + 1}: {rate / 1e9:6.2f} GB/s "
                  f"({'cold' if cold else 'page cache NOT dropped (not root?)'})", flush=True)
        print(f"  {name:8s} store: {nchunks * arr.shape[1] / t_store / 1e9:6.2f} GB/s", flush=True)
        return best, chunk_span(tier)
    finally:
        tier.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="directory on the device under test")
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--chunk-mib", type=float, default=16.0)
    ap.add_argument("--chunks-per-job", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--queue-depth", type=int, default=64)
    ap.add_argument("--fs-threads", type=int, default=16, help="the fs tier's read/write threads")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="another setting of fx100io's tier entry (e.g. max_io=4M)")
    ap.add_argument("--keep", action="store_true", help="keep the files afterwards")
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
        ours, span = run_tier(
            "fx100io",
            {"type": "FX100ioTier", "module_path": "fx100io.contrib.vllm",
             "devices": f"file://{img}", "size": str(total + total // 4 + (256 << 20)),
             "create": "always", "queue_depth": str(args.queue_depth),
             **dict(kv.split("=", 1) for kv in args.set)},
            view, arr, spec, n, args.chunks_per_job, expected, args.repeat)
        fs, _ = run_tier(
            "vllm-fs",
            {"type": "fs", "root_dir": os.path.join(work, "fs"),
             "n_read_threads": args.fs_threads, "n_write_threads": args.fs_threads},
            view, arr, spec, n, args.chunks_per_job, expected, args.repeat)
        # fio: the bytes fx100io's chunks occupy in its file (the store packs a fresh
        # store's chunks one after another), O_DIRECT through io_uring.
        assert span is not None and span[1] - span[0] == total, span
        drop_caches()
        fio_bytes, fio_rate = fio_read(img, total, min(chunk_bytes, 8 << 20), args.queue_depth,
                                       span[0])
        print(f"  fio      read: {fio_rate / 1e9:6.2f} GB/s ({fio_bytes} bytes, O_DIRECT io_uring)")
        print(f"fx100io / vllm-fs = {ours / fs:.2f}x  (goal >= 1.5x)")
        print(f"fx100io / fio     = {ours / fio_rate:.2f}   (goal >= 0.90)")
    finally:
        del arr
        view.release()
        region.cleanup()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

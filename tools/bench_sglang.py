#!/usr/bin/env python3
"""fx100io's SGLang HiCache backend against SGLang's built-in ``file`` backend
(HiCacheFile) and fio, on the same device, the same pages, in the same run.

Both backends are built by SGLang's own StorageBackendFactory and driven the way
SGLang's cache controller drives them: batches of up to 128 pages (STORAGE_BATCH_SIZE);
fx100io through the zero-copy pair (``interface_v1``: batch_set_v1 / batch_get_v1 on
the host pool's pages), HiCacheFile through the tensor API (flat data pages, copied
into the host pool, as _generic_page_get does). The host pool is shaped like SGLang's
page_first MHA pool (K and V of a page apart). Each round writes every page with both
backends, drops the page cache (sync; drop_caches), then loads every page back into
other host pages, cold, and checks the bytes. fio reads the same number of bytes from
fx100io's image (O_DIRECT, io_uring, registered buffers: tools/fio_peer.py).

Prints GB/s per round and the medians' ratios (goals: fx100io >= 1.5x HiCacheFile and
>= 0.9x fio). Needs root for drop_caches (without it, reads are warm and it says so).
Runs under tools/install_sglang.sh's venv; started with another python, it re-runs
itself there.

  tools/bench_sglang.py [--dir /var/tmp] [--pages 64] [--layers 32] [--heads 8]
                        [--head-dim 128] [--page-tokens 64] [--rounds 3]
                        [--queue-depth 16]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_PY = Path(os.environ.get("FX100IO_SGLANG_VENV", "/var/cache/fx100io/venv-sglang")) / "bin" / "python"
BATCH = 128

try:
    import sglang  # noqa: F401
except ImportError:
    if os.environ.get("FX100IO_BENCH_REEXEC"):
        raise
    if not VENV_PY.exists():
        subprocess.run([str(ROOT / "tools" / "install_sglang.sh")], check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ, FX100IO_BENCH_REEXEC="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    os.execve(str(VENV_PY), [str(VENV_PY), __file__, *sys.argv[1:]], env)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
from fio_peer import fio_read  # noqa: E402


class HostPool:
    """A page_first host KV pool ([2, tokens, layers, heads, dim], bf16) in page-aligned
    memory, with the calls SGLang's controller makes on its pool for either backend."""

    def __init__(self, pages: int, page: int, layers: int, heads: int, dim: int) -> None:
        self.page_size, self.layout, self.dtype = page, "page_first", torch.bfloat16
        self.size = pages * page
        self.tok = layers * heads * dim * 2  # bytes of K (or V) per token, all layers
        n = 2 * self.size * self.tok
        raw = np.zeros(n + 4096, dtype=np.uint8)
        start = (-raw.ctypes.data) % 4096
        self.raw = raw[start:start + n]
        self.kv_buffer = torch.from_numpy(self.raw).view(torch.bfloat16).view(
            2, self.size, layers, heads, dim)
        self.half = n // 2
        self.page_half = page * self.tok

    def indices(self, pages: list[int]) -> torch.Tensor:
        return torch.cat([torch.arange(p * self.page_size, (p + 1) * self.page_size) for p in pages])

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        base, idx = self.kv_buffer.data_ptr(), indices.tolist()
        ptrs: list[int] = []
        for i in range(0, len(idx), self.page_size):
            k = base + idx[i] * self.tok
            ptrs += [k, k + self.half]
        return ptrs, [self.page_half] * len(ptrs)

    def _spans(self, index: int) -> tuple[slice, slice]:
        k = int(index) * self.tok
        return slice(k, k + self.page_half), slice(self.half + k, self.half + k + self.page_half)

    # the tensor-API path (HiCacheFile): one flat tensor per page, copied in and out
    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        k, v = self._spans(index)
        return torch.from_numpy(np.concatenate([self.raw[k], self.raw[v]]))

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.empty(2 * self.page_half, dtype=torch.uint8)

    def set_from_flat_data_page(self, index: int, data: torch.Tensor) -> None:
        k, v = self._spans(index)
        src = data.view(torch.uint8).numpy()
        self.raw[k] = src[:self.page_half]
        self.raw[v] = src[self.page_half:]

    def page_bytes(self, page: int) -> bytes:
        k, v = self._spans(page * self.page_size)
        return self.raw[k].tobytes() + self.raw[v].tobytes()


def config(extra: dict) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="bench/model", extra_config=extra)


def drop_caches() -> bool:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def batches(n: int) -> list[list[int]]:
    return [list(range(i, min(i + BATCH, n))) for i in range(0, n, BATCH)]


def run_round(args: argparse.Namespace, pool: HostPool, workdir: Path, r: int) -> dict[str, float]:
    n = args.pages
    keys = [f"{r:02d}-{i:06d}" + "c" * 56 for i in range(n)]
    page_bytes = 2 * pool.page_half
    total = n * page_bytes
    image = workdir / "fx100io.img"
    filedir = workdir / "hicache-file"
    for p in (image,):
        p.unlink(missing_ok=True)
    shutil.rmtree(filedir, ignore_errors=True)
    ours = StorageBackendFactory.create_backend("dynamic", config({
        "backend_name": "fx100io", "module_path": "fx100io.contrib.sglang",
        "class_name": "FX100ioHiCacheStorage", "interface_v1": 1,
        "devices": f"file://{image}", "size": str(total + total // 8 + (64 << 20)),
        "queue_depth": str(args.queue_depth)}), pool)
    ours.register_mem_pool_host(pool)
    theirs = StorageBackendFactory.create_backend(
        "file", config({"file_storage_path": str(filedir)}), pool)
    theirs.register_mem_pool_host(pool)
    try:
        for b in batches(n):  # source pages: the first n of the pool
            assert all(ours.batch_set_v1([keys[i] for i in b], pool.indices(b)))
            assert theirs.batch_set([keys[i] for i in b],
                                    [pool.get_data_page(i * pool.page_size) for i in b])
        want = [pool.page_bytes(i) for i in range(0, n, max(1, n // 8))]
        dst = [n + i for i in range(n)]  # loads land in the other half of the pool
        out: dict[str, float] = {}
        cold = True
        for name in ("fx100io", "file") if r % 2 == 0 else ("file", "fx100io"):
            pool.raw[n * pool.tok * pool.page_size:pool.half] = 0
            pool.raw[pool.half + n * pool.tok * pool.page_size:] = 0
            cold &= drop_caches()
            t0 = time.perf_counter()
            for b in batches(n):
                ks, pages = [keys[i] for i in b], [dst[i] for i in b]
                if name == "fx100io":
                    assert all(ours.batch_get_v1(ks, pool.indices(pages)))
                else:  # HiCacheController._generic_page_get
                    got = theirs.batch_get(ks, [pool.get_dummy_flat_data_page() for _ in ks])
                    for p, t in zip(pages, got):
                        assert t is not None
                        pool.set_from_flat_data_page(p * pool.page_size, t)
            out[name] = total / (time.perf_counter() - t0) / 1e9
            for j, i in enumerate(range(0, n, max(1, n // 8))):
                assert pool.page_bytes(dst[i]) == want[j], f"{name}: page {i} differs"
        # fio reads the store's data area (where the pages are), not its index
        data_off = min(m.sb.data_off for m in ours._store._members)
        cold &= drop_caches()
        _moved, rate = fio_read(str(image), total, "4M", args.queue_depth, offset=data_off)
        out["fio"] = rate / 1e9
        out["cold"] = float(cold)
        return out
    finally:
        ours.close()
        if hasattr(theirs, "close"):
            theirs.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--pages", type=int, default=64)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--queue-depth", type=int, default=16)
    args = ap.parse_args()
    workdir = Path(args.dir) / f"fx100io-bench-sglang-{os.getpid()}"
    workdir.mkdir(parents=True)
    pool = HostPool(2 * args.pages, args.page_tokens, args.layers, args.heads, args.head_dim)
    rng = np.random.default_rng(1)
    pool.raw[:] = rng.integers(0, 256, pool.raw.nbytes, dtype=np.uint8)
    page_mib = 2 * pool.page_half / (1 << 20)
    print(f"SGLang HiCache, page_first pages of {page_mib:.1f} MiB (K and V apart), "
          f"{args.pages} pages = {args.pages * page_mib:.0f} MiB per load, batches of {BATCH}, "
          f"on {args.dir}")
    rows = []
    try:
        for r in range(args.rounds):
            res = run_round(args, pool, workdir, r)
            rows.append(res)
            print(f"round {r}: fx100io {res['fx100io']:.2f} GB/s  file {res['file']:.2f} GB/s  "
                  f"fio {res['fio']:.2f} GB/s{'' if res['cold'] else '  (page cache NOT dropped: warm)'}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    med = {k: statistics.median(row[k] for row in rows) for k in ("fx100io", "file", "fio")}
    vs_file, vs_fio = med["fx100io"] / med["file"], med["fx100io"] / med["fio"]
    print(f"median: fx100io {med['fx100io']:.2f} GB/s, HiCacheFile {med['file']:.2f} GB/s, "
          f"fio {med['fio']:.2f} GB/s")
    print(f"ratio fx100io/HiCacheFile = {vs_file:.2f}x (goal >= 1.5x: "
          f"{'met' if vs_file >= 1.5 else 'NOT met'})")
    print(f"ratio fx100io/fio = {vs_fio:.2f}x (goal >= 0.90x: {'met' if vs_fio >= 0.9 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The KV-cache workload (--kv-model): what an inference server asks of storage.

A prompt's KV cache is cut into chunks of --kv-chunk-tokens tokens (LMCache's
layout: one chunk holds K and V of every layer for those tokens, shape
[2, layers, tokens, kv_heads * head_dim]; MLA models keep one latent per
token instead of K and V).  The job first stores every chunk of --kv-prompts
prompts through ChunkStore, then loads whole prompts back, --kv-concurrency
prompts at a time, and reports chunk bandwidth and the time to load one
whole prefix, the number a server's time-to-first-token depends on.

In the fio-style sections an I/O is one chunk: "write" is the store phase,
"read" the load phase, each over its own clock; clat is the time of the
batch call that carried the chunk.  Prefix-load times go to fx100io.kv.

Memory stays bounded by --kv-buffer: each concurrent prompt gets its share
of pinned buffers and loads its chunks in windows that fit, the way a server
streams a long prefix into a bounded staging area.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fx100io.uri_redact import redact

from . import verify as verifymod
from .errors import BenchError
from .options import Job, KvSpec
from .progress import DONE, RUNNING, SETUP, VERIFYING, NullSlot
from .results import JobResult
from .stats import DirStats, Rusage, Series
from .targets import core, drop_page_cache, local_path
from .verify import VerifyLog

TICK_NS = 100_000_000
STORE_OVERHEAD = 1.05  # room for the store's index and alignment
STORE_SLACK = 64 << 20


class KvPlan:
    """Sizes of one KV job, derived from the model and the token counts."""

    def __init__(self, job: Job, kv: KvSpec) -> None:
        m = kv.model
        self.chunk_tokens = kv.chunk_tokens
        self.prompt_tokens = kv.prompt_tokens
        self.chunk_bytes = m.chunk_bytes(kv.chunk_tokens)
        self.chunks_per_prompt = math.ceil(kv.prompt_tokens / kv.chunk_tokens)
        # The last chunk of a prompt holds what is left of it.
        last_tokens = kv.prompt_tokens - (self.chunks_per_prompt - 1) * kv.chunk_tokens
        self.last_chunk_bytes = m.chunk_bytes(last_tokens)
        self.prompt_bytes = m.bytes_per_token * kv.prompt_tokens
        self.writers = kv.store_writers
        if kv.prompts is not None:
            self._plan(kv, kv.prompts)
        elif isinstance(job.size, int):
            # as many prompts as the store holds in --size, its own overhead counted
            # (open_store refuses a size that holds fewer than the plan)
            n = max(1, job.size // self.prompt_bytes)
            self._plan(kv, n)
            while n > 1 and store_bytes_needed(self.data_bytes) > job.size:
                n -= 1
                self._plan(kv, n)
        else:
            self._plan(kv, 4)

    def _plan(self, kv: KvSpec, prompts: int) -> None:
        self.prompts = prompts
        self.concurrency = min(kv.concurrency, self.prompts)
        per_prompt = kv.buffer_bytes // self.concurrency
        self.window = max(1, min(self.chunks_per_prompt, per_prompt // self.chunk_bytes))
        # each writer of the storm keeps replacing one window of chunks: the old
        # and the new copy of it on the device at once
        self.data_bytes = self.prompts * self.prompt_bytes + \
            2 * self.writers * self.window * self.chunk_bytes

    def chunk_len(self, c: int) -> int:
        return self.last_chunk_bytes if c == self.chunks_per_prompt - 1 else self.chunk_bytes

    def as_dict(self, job: Job, kv: KvSpec) -> dict[str, Any]:
        m = kv.model
        return {
            "model": m.name,
            "layers": m.layers,
            "kv_heads": m.kv_heads,
            "head_dim": m.head_dim,
            "dtype": m.dtype,
            "mla": m.mla,
            "bytes_per_token": m.bytes_per_token,
            "chunk_tokens": self.chunk_tokens,
            "chunk_bytes": self.chunk_bytes,
            "prompt_tokens": self.prompt_tokens,
            "prompt_bytes": self.prompt_bytes,
            "chunks_per_prompt": self.chunks_per_prompt,
            "prompts": self.prompts,
            "concurrency": self.concurrency,
            "window_chunks": self.window,
            "store_writers": self.writers,
            "load_priority": kv.load_priority,
        }


def store_bytes_needed(data_bytes: int) -> int:
    """The store size that holds data_bytes of chunks: its index, alignment and slack."""
    return int(data_bytes * STORE_OVERHEAD) + STORE_SLACK


def _key(job: Job, clone: int, prompt: int, chunk: int) -> bytes:
    return f"fxb/{job.name}/{clone}/{prompt}/{chunk}".encode()


def _chunk_id(prompt: int, chunk: int) -> int:
    # The verify header's "offset" field names the chunk, so a chunk that
    # comes back under the wrong key is caught, not just a flipped bit.
    return (prompt << 24) | chunk


def open_store(job: Job, plan: KvPlan) -> Any:
    fx = core()
    path = local_path(job.filename)
    opts: dict[str, Any] = {"direct": job.direct}
    if path is not None:
        opts["engine"] = job.ioengine
    need = store_bytes_needed(plan.data_bytes)
    size = None
    if path is not None:
        exists = os.path.exists(path)
        if isinstance(job.size, int):
            if job.size < need:
                raise BenchError(
                    f"--size={job.size}: {plan.prompts} prompts of {plan.prompt_bytes} bytes need at least {need} "
                    "bytes of store (or lower --kv-prompts)"
                )
            size = job.size
        elif not exists:
            size = need
    try:
        # The benchmark owns its target, as a fio write job does: format it.
        return fx.ChunkStore([job.filename], create=True, size=size, **opts)
    except OSError as e:
        raise BenchError(f"job {job.name!r}: cannot create a ChunkStore on {redact(job.filename)}: "
                         f"{e}") from None


def run_kv_job(
    job: Job, clone: int, progress: Any = None, start_gate: Callable[[], None] | None = None
) -> JobResult:
    assert job.kv is not None
    progress = progress or NullSlot()
    progress.set_state(SETUP)
    kv = job.kv
    plan = KvPlan(job, kv)
    result = JobResult(job, clone, os.getpid())
    result.target_uri = redact(job.filename)
    fx = core()
    store = open_store(job, plan)
    try:
        pool_bytes = max(kv.buffer_bytes, plan.concurrency * plan.window * plan.chunk_bytes)
        pool_bytes += plan.writers * plan.window * plan.chunk_bytes
        pool = fx.BufferPool(pool_bytes)
        bufsets = [
            [pool.alloc(plan.chunk_bytes) for _ in range(plan.window)] for _ in range(plan.concurrency)
        ]
        stormsets = [
            [pool.alloc(plan.chunk_bytes) for _ in range(plan.window)] for _ in range(plan.writers)
        ]
        rng = np.random.default_rng(job.seed)
        for bufs in bufsets + stormsets:
            for b in bufs:
                b[:] = rng.integers(0, 256, size=plan.chunk_bytes, dtype=np.uint8)
        runner = _KvRunner(job, clone, plan, store, bufsets, progress, stormsets)
        if start_gate is not None:
            start_gate()
        ru0 = Rusage.now()
        t_job = time.monotonic_ns()
        deadline = t_job + job.runtime_ns if job.runtime_ns and not job.time_based else None
        progress.set_state(RUNNING)
        try:
            stored = runner.run(runner.store_phase(deadline))
            result.dir_runtime_ns["write"] = runner.store_ns
            path = local_path(job.filename)
            if path and not job.direct and job.invalidate:
                # Loads should come from the device, not from the page cache
                # the store phase just filled.
                drop_page_cache(path)
            if job.verify:
                progress.set_state(VERIFYING)
            load_deadline = (
                time.monotonic_ns() + job.runtime_ns if job.time_based and job.runtime_ns else deadline
            )
            runner.run(runner.load_phase(stored, load_deadline))
            result.dir_runtime_ns["read"] = runner.load_ns
        except BenchError as e:  # an OSError too: before the handler of the others
            result.error = 5
            result.error_msg = str(e)
        except OSError as e:
            result.error = e.errno or 5
            result.error_msg = f"job {job.name!r}: {e}"
        result.rusage = Rusage.now() - ru0
        result.runtime_ns = max(time.monotonic_ns() - t_job, 1)
        result.read, result.write = runner.read, runner.write
        result.series = [runner.series]
        result.kv_load = runner.prefix
        result.verify = runner.vlog
        if runner.vlog is not None and runner.vlog.errors and not result.error:
            result.error = 84
            result.error_msg = (
                f"verify failed: {runner.vlog.errors} chunks bad; first: {runner.vlog.failures[0]}"
            )
        if runner.misses and not result.error:
            result.error = 61  # ENODATA: a stored chunk did not come back
            result.error_msg = (
                f"{runner.misses} stored chunks were not found (or failed the store's CRC) on load"
            )
        st = store.stats()
        info = plan.as_dict(job, kv)
        info.update(
            chunks_stored=runner.write.ios,
            bytes_stored=runner.write.bytes,
            store_seconds=runner.store_ns / 1e9,
            store_GBps=runner.write.bytes / (runner.store_ns / 1e9) / 1e9 if runner.store_ns else 0.0,
            chunks_loaded=runner.read.ios,
            bytes_loaded=runner.read.bytes,
            prompts_loaded=runner.prefix.ios,
            load_seconds=runner.load_ns / 1e9,
            load_GBps=runner.read.bytes / (runner.load_ns / 1e9) / 1e9 if runner.load_ns else 0.0,
            misses=runner.misses,
            store_corruptions=st.get("corruptions", 0),
            store_evictions=st.get("evictions", 0),
            storm_chunks=runner.storm.ios,
            storm_bytes=runner.storm.bytes,
            storm_GBps=runner.storm.bytes / (runner.load_ns / 1e9) / 1e9 if runner.load_ns else 0.0,
        )
        result.kv = info
        result.block_size = plan.chunk_bytes
        result.region = (0, plan.data_bytes)
        del bufsets, stormsets, runner
        pool.close()
    finally:
        store.close()
        progress.set_state(DONE)
    result.end_time = time.time()
    return result


class _KvRunner:
    def __init__(
        self, job: Job, clone: int, plan: KvPlan, store: Any, bufsets: list[list[Any]], progress: Any,
        stormsets: list[list[Any]] | None = None,
    ) -> None:
        self.job = job
        self.clone = clone
        self.plan = plan
        self.store = store
        self.bufsets = bufsets
        self.progress = progress
        self.read = DirStats()
        self.write = DirStats()
        self.prefix = DirStats()  # one sample per whole prompt loaded
        self.stormsets = stormsets or []
        self.storm = DirStats()  # chunks the storm stored during the load phase
        self.series = Series(TICK_NS)
        self.vlog = VerifyLog() if job.verify else None
        self.misses = 0
        self.store_ns = 0
        self.load_ns = 0
        self.t0 = time.monotonic_ns()
        self.next_tick = self.t0 + TICK_NS
        self.stop = False
        self.seq = 0

    def run(self, coro: Any) -> Any:
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(coro)
        finally:
            loop.close()

    def _tick(self, now: int) -> None:
        if now >= self.next_tick:
            self.series.sample(now - self.t0, self.read, self.write)
            self.progress.update(
                self.read.bytes, self.write.bytes, self.read.ios, self.write.ios, (now - self.t0) // 1_000_000
            )
            self.next_tick = now + TICK_NS
            if self.progress.stop_requested:
                self.stop = True

    async def _workers(self, work: Any) -> None:
        tasks = [asyncio.ensure_future(work(bufs)) for bufs in self.bufsets]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def store_phase(self, deadline: int | None) -> int:
        """Store every prompt; returns how many were stored completely."""
        plan, job = self.plan, self.job
        prompts = iter(range(plan.prompts))
        done: list[int] = []
        start = self.t0 = time.monotonic_ns()
        self.next_tick = start + TICK_NS
        self.series.sample(start - self.t0, self.read, self.write)

        async def work(bufs: list[Any]) -> None:
            for p in prompts:
                if self.stop:
                    return
                for first in range(0, plan.chunks_per_prompt, plan.window):
                    chunks = range(first, min(first + plan.window, plan.chunks_per_prompt))
                    keys = [_key(job, self.clone, p, c) for c in chunks]
                    views = [bufs[i][: plan.chunk_len(c)] for i, c in enumerate(chunks)]
                    if self.vlog is not None:
                        for v, c in zip(views, chunks):
                            self.seq += 1
                            verifymod.stamp(v, _chunk_id(p, c), len(v), self.seq)
                    t0 = time.monotonic_ns()
                    await self.store.batch_put(keys, views)
                    t1 = time.monotonic_ns()
                    for v in views:
                        self.write.add(t1 - t0, len(v))
                    self._tick(t1)
                done.append(p)
                if deadline is not None and time.monotonic_ns() >= deadline:
                    self.stop = True
                    return

        try:
            await self._workers(work)
        finally:
            self.store_ns = max(time.monotonic_ns() - start, 1)
        if not done:
            raise BenchError(f"job {job.name!r}: --runtime ended before one prompt was stored")
        self.stored = sorted(done)
        self.stop = False
        return len(done)

    async def load_phase(self, stored: int, deadline: int | None) -> None:
        plan, job = self.plan, self.job
        prompts_done = self.stored
        if job.time_based:
            rng = np.random.default_rng(job.seed + 1)

            def forever() -> Any:
                while True:
                    yield from rng.choice(prompts_done, size=len(prompts_done), replace=False).tolist()

            order: Any = forever()
        else:
            order = iter(prompts_done)
        start = time.monotonic_ns()
        kv = job.kv
        assert kv is not None
        storm_stop = asyncio.Event()

        async def storm(w: int, bufs: list[Any]) -> None:
            # one window of chunks under keys no prompt uses, stored again and again
            keys = [_key(job, self.clone, plan.prompts + w, c) for c in range(plan.window)]
            while not storm_stop.is_set():
                t0 = time.monotonic_ns()
                await self.store.batch_put(keys, bufs)
                t1 = time.monotonic_ns()
                for b in bufs:
                    self.storm.add(t1 - t0, len(b))

        async def work(bufs: list[Any]) -> None:
            for p in order:
                if self.stop:
                    return
                t_prompt = time.monotonic_ns()
                nbytes = 0
                for first in range(0, plan.chunks_per_prompt, plan.window):
                    chunks = range(first, min(first + plan.window, plan.chunks_per_prompt))
                    keys = [_key(job, self.clone, p, c) for c in chunks]
                    views = [bufs[i][: plan.chunk_len(c)] for i, c in enumerate(chunks)]
                    t0 = time.monotonic_ns()
                    hits = await self.store.batch_get(keys, views, priority=kv.load_priority)
                    t1 = time.monotonic_ns()
                    for v, c, hit in zip(views, chunks, hits):
                        if not hit:
                            self.misses += 1
                            continue
                        self.read.add(t1 - t0, len(v))
                        nbytes += len(v)
                        if self.vlog is not None:
                            cid = _chunk_id(p, c)
                            self.vlog.record(cid, len(v), verifymod.check(v, cid, len(v)))
                    self._tick(t1)
                self.prefix.add(time.monotonic_ns() - t_prompt, nbytes)
                if deadline is not None and time.monotonic_ns() >= deadline:
                    self.stop = True
                    return

        storms = [asyncio.ensure_future(storm(w, b)) for w, b in enumerate(self.stormsets)]
        try:
            await self._workers(work)
        finally:
            self.load_ns = max(time.monotonic_ns() - start, 1)
            storm_stop.set()
            await asyncio.gather(*storms, return_exceptions=True)
            for t in storms:
                if not t.cancelled() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
            end = time.monotonic_ns()
            self.series.sample(end - self.t0, self.read, self.write)

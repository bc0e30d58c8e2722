"""docs/architecture.md rule 14 for the store: index commits and compactions do not run on
the event loop of an async caller."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import fx100io

KEY = 1000  # bytes per key: ~1 KiB per index record
NKEYS = 60_000  # ~62 MiB of live records for the compaction to rewrite


async def _fill_to_the_brim(st, keys):
    """Overwrite keys until the live half has less than one block left, so
    the next commit compacts (the live set stays NKEYS records)."""
    log = st._members[0].log
    rec = 32 + KEY
    i = 0
    while log.sb.index_half - log.tail >= 4096:
        free = log.sb.index_half - log.tail
        k = max(1, min(2048, (free - 64) // rec))
        batch = [keys[(i + j) % len(keys)] for j in range(k)]
        i += k
        await st.batch_put(batch, [b""] * k)


class Ticker:
    """A 10 ms ticker on the running loop for the life of an ``async with``;
    .worst is the largest gap between its ticks (how long the loop stalled)."""

    async def __aenter__(self) -> Ticker:
        self.gaps: list[float] = []
        self._done = asyncio.Event()
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        last = time.perf_counter()
        while not self._done.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            self.gaps.append(now - last)
            last = now

    async def __aexit__(self, *exc: object) -> None:
        self._done.set()
        await self._task

    @property
    def worst(self) -> float:
        return max(self.gaps, default=0.0)


def test_compaction_does_not_block_the_event_loop(tmp_file, monkeypatch):
    """A one-chunk batch_put that triggers a compaction of ~62 MiB of index: the compaction
    runs off the loop thread, and the loop runs callbacks while it is under way.  Proven
    without a clock: the compaction waits (up to 60 s) for a callback it asks the loop to
    run; committed on the loop thread, that callback could not run until the compaction
    returned, and the wait would time out."""
    from fx100io.store.local.index_log import IndexLog
    real = IndexLog._compact
    seen: dict = {}

    def watched(self, live, pending):
        seen["thread"] = threading.get_ident()
        ran = threading.Event()
        seen["loop"].call_soon_threadsafe(ran.set)
        seen["loop_ran_meanwhile"] = ran.wait(60)
        return real(self, live, pending)

    async def main():
        keys = [f"{i:0>{KEY}}" for i in range(NKEYS)]
        async with fx100io.ChunkStore(str(tmp_file), create=True, size=(2 * 96 + 16) << 20,
                                      index_size=96 << 20) as st:
            for i in range(0, NKEYS, 5000):
                await st.batch_put(keys[i:i + 5000], [b""] * 5000)
            await _fill_to_the_brim(st, keys)
            before = st.stats()["compactions"]
            seen["loop"], seen["loop_thread"] = asyncio.get_running_loop(), threading.get_ident()
            monkeypatch.setattr(IndexLog, "_compact", watched)
            await st.batch_put(["trigger"], [b"T"])
            assert st.stats()["compactions"] == before + 1
            out = bytearray(1)
            assert await st.batch_get(["trigger"], [out]) == [True] and out == b"T"

    asyncio.run(main())
    assert seen["thread"] != seen["loop_thread"], "the compaction ran on the event loop's thread"
    assert seen["loop_ran_meanwhile"], "the event loop ran nothing while the index compacted"


def test_cancelled_put_waits_for_its_commit(tmp_file, monkeypatch):
    """A put cancelled while its index commit runs on the index thread:
    the commit runs to its end, the caller sees CancelledError only after
    that, and the store stays consistent: the chunk is there with its
    extent accounted for (not given back while an entry points at it)."""
    from fx100io.store.local.index_log import IndexLog
    real = IndexLog.commit
    committing = threading.Event()

    def slow_commit(self, recs, live, apply=None, failed=None):
        committing.set()
        time.sleep(0.2)
        return real(self, recs, live, apply, failed)

    async def main():
        async with fx100io.ChunkStore(str(tmp_file), create=True, size=16 << 20) as st:
            monkeypatch.setattr(IndexLog, "commit", slow_commit)
            task = asyncio.create_task(st.batch_put(["k"], [b"V" * 5000]))
            # cancel once the commit has begun (not after a guessed delay: the
            # data's write and flush before it may take longer on a busy disk)
            deadline = time.monotonic() + 30
            while not committing.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            assert committing.is_set(), "the put never reached its commit"
            task.cancel()
            cancelled = False
            try:
                await task
            except asyncio.CancelledError:
                cancelled = True
            monkeypatch.setattr(IndexLog, "commit", real)
            assert cancelled
            assert st.stats()["bytes_used"] == 8192  # 5000 bytes in whole 4 KiB blocks
            await st.batch_put(["other"], [b"O" * 5000])  # must not land on k's blocks
            outs = [bytearray(5000), bytearray(5000)]
            assert await st.batch_get(["k", "other"], outs) == [True, True]
            assert outs == [b"V" * 5000, b"O" * 5000]

    asyncio.run(main())
    with fx100io.ChunkStore(str(tmp_file)) as st:
        out = bytearray(5000)
        assert st.batch_get_blocking(["k"], [out]) == [True] and out == b"V" * 5000


def test_aclose_waits_for_queued_commits_off_the_loop(tmp_file, monkeypatch):
    """`async with` / aclose(): closing waits for index commits already
    queued (here a slow one), without stalling the event loop meanwhile; the
    put that was running completes and is durable."""
    from fx100io.store.local.index_log import IndexLog
    real = IndexLog.commit

    def slow_commit(self, recs, live, apply=None, failed=None):
        time.sleep(0.4)
        return real(self, recs, live, apply, failed)

    async def main():
        st = fx100io.ChunkStore(str(tmp_file), create=True, size=64 << 20)
        monkeypatch.setattr(IndexLog, "commit", slow_commit)
        put = asyncio.create_task(st.batch_put(["k"], [b"v" * 5000]))
        await asyncio.sleep(0.1)  # the data is written; the commit sleeps on the index thread
        async with Ticker() as ticker:
            await asyncio.sleep(0.03)
            await st.aclose()
        await put
        return ticker.worst

    worst = asyncio.run(main())
    monkeypatch.undo()
    assert worst < 0.15, f"the event loop stalled {worst * 1000:.0f} ms in aclose()"
    with fx100io.ChunkStore(str(tmp_file)) as st:
        out = bytearray(5000)
        assert st.batch_get_blocking(["k"], [out]) == [True] and out == b"v" * 5000


def test_a_failed_put_leaves_no_unretrieved_errors(tmp_file):
    """A put whose writes fail (the store closed under it) raises one error;
    the failed writes' own futures are seen, so asyncio logs no 'exception
    was never retrieved' for each of them."""
    import gc
    seen: list[str] = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, ctx: seen.append(ctx.get("message", "")))
        st = fx100io.ChunkStore(str(tmp_file), create=True, size=64 << 20)
        await st.batch_put(["a"], [b"x" * 4096])
        t = asyncio.create_task(st.batch_put([f"k{i}" for i in range(200)],
                                             [b"y" * 4096] * 200))
        for _ in range(3):
            await asyncio.sleep(0)
        st.close()
        with pytest.raises(fx100io.errors.Fx100ioError):
            await t
        del t
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(main())
    gc.collect()
    assert not [m for m in seen if "never retrieved" in m], seen[:3]

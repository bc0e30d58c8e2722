"""The priority class through a MultipathDevice (fx100io/multipath.py): each
path's queue counts the pieces of a request in the class the caller gave,
whichever path carries it, on an event loop and on a thread; and a bad
priority= is refused at once with InvalidArgumentError, even while no path is
live (not after io_timeout_ms as "no path carried it")."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import numpy as np
import pytest
from support import chunk_bytes
from support.multipath_paths import paths_uri, sparse_backing
from support.target_process import serve

import fx100io
from fx100io import errors
from fx100io.multipath import MultipathDevice

NQN = "nqn.2026-12.io.fx100:multipath-prio"
BS = 64 << 10
SIZE = 16 << 20
N = 16  # requests per batch: round-robin gives each path half


@pytest.fixture
def backing(tmp_path):
    return sparse_backing(tmp_path, SIZE)


def _per_path(dev: MultipathDevice) -> list[dict[str, int]]:
    """Each path's queue counters on the calling thread (its event loop's queue
    when called on the loop)."""
    out = []
    for p in dev._paths:
        d = getattr(p.dev._local, "driver", None) if p.dev is not None else None
        out.append({k: int(v) for k, v in d.queue.stats().items()} if d is not None else {})
    return out


def _delta(after: list[dict[str, int]], before: list[dict[str, int]], key: str) -> list[int]:
    return [a.get(key, 0) - b.get(key, 0) for a, b in zip(after, before)]


def test_the_class_reaches_each_paths_queue(backing):
    data = chunk_bytes("prio", N * BS)
    with serve([backing], NQN) as (_, pa, _a), serve([backing], NQN) as (_, pb, _b):
        with fx100io.open_device(paths_uri(NQN, [pa, pb], max_xfer=BS)) as dev:
            assert isinstance(dev, MultipathDevice)
            for i in range(N):
                dev.write_from_blocking(i * BS, data[i * BS:(i + 1) * BS])

            async def main() -> None:
                out = np.zeros(N * BS, np.uint8)
                # a first read makes this loop's queue on every live path
                assert await dev.read_into(0, out[:BS]) == BS
                # (a queue is this thread's: polled here, on the loop)
                deadline = time.monotonic() + 10
                while not all(p.dev is not None and p.dev._loop_ready() is not None
                              for p in dev._paths):
                    assert time.monotonic() < deadline, "no loop queue on both paths"
                    await asyncio.sleep(0.05)
                before, total = _per_path(dev), dev.queue_stats()
                # reads default to load: the class given must be what the queues count
                futs = dev.start([(fx100io.OP_READ, i * BS, out[i * BS:(i + 1) * BS])
                                  for i in range(N)], priority="store")
                done = await asyncio.wait_for(asyncio.gather(*futs), 30)
                assert [c[0] for c in done] == [BS] * N
                assert np.array_equal(out, data)
                after = _per_path(dev)
                stores = _delta(after, before, "pieces_store")
                assert all(s > 0 for s in stores), stores  # both paths carried some
                assert sum(stores) == N
                assert _delta(after, before, "pieces_load") == [0, 0]
                t = dev.queue_stats()
                assert t["pieces_store"] - total.get("pieces_store", 0) == N
                assert t["pieces_load"] == total.get("pieces_load", 0)
                # a write given "background", and a flush through each path written
                # (both: the blocking writes above): both default to store
                before = _per_path(dev)
                assert await dev.write_from(0, data[:BS], priority="background") == BS
                assert sum(_delta(_per_path(dev), before, "pieces_background")) == 1
                before = _per_path(dev)
                await dev.flush(priority="background")
                after = _per_path(dev)
                assert _delta(after, before, "pieces_background") == [1, 1]
                assert _delta(after, before, "pieces_store") == [0, 0]

            asyncio.run(main())
            # on a thread: the blocking twins, each through its path's queue of this thread
            out = np.zeros(N * BS, np.uint8)
            before = _per_path(dev)
            for i in range(N):
                assert dev.read_into_blocking(i * BS, out[i * BS:(i + 1) * BS],
                                              priority="background") == BS
            assert np.array_equal(out, data)
            after = _per_path(dev)
            bg = _delta(after, before, "pieces_background")
            assert all(b > 0 for b in bg) and sum(bg) == N, bg
            assert _delta(after, before, "pieces_load") == [0, 0]
            before = after
            done = dev.submit_blocking([(fx100io.OP_READ, 0, out[:BS])], priority="store")
            assert done[0][0] == BS
            assert sum(_delta(_per_path(dev), before, "pieces_store")) == 1


BAD = ["urgent", 7, True, 1.5]


def test_a_bad_priority_is_refused_at_once_with_no_live_path(backing):
    with contextlib.ExitStack() as stack:
        _, pa, proc_a = stack.enter_context(serve([backing], NQN))
        _, pb, proc_b = stack.enter_context(serve([backing], NQN))
        dev = stack.enter_context(fx100io.open_device(
            paths_uri(NQN, [pa, pb], io_timeout_ms=1500, reconnect_ms=100)))
        buf = np.zeros(BS, np.uint8)
        for bad in BAD:  # with live paths too
            with pytest.raises(errors.InvalidArgumentError, match="priority"):
                dev.read_into_blocking(0, buf, priority=bad)
        dev.write_from_blocking(0, buf)
        for p in (proc_a, proc_b):
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
        with pytest.raises(errors.FxTimeoutError, match="no path carried it"):
            dev.read_into_blocking(0, buf)
        assert [s["state"] for s in dev.path_stats()] == ["down", "down"]

        def refused(call, *args) -> None:  # noqa: ANN001
            for bad in BAD:
                t0 = time.monotonic()
                with pytest.raises(errors.InvalidArgumentError, match="priority"):
                    call(*args, priority=bad)
                # a wait for a path would have taken io_timeout_ms (1.5 s) and raised
                # FxTimeoutError: the type says it was not that; this says it was at once
                assert time.monotonic() - t0 < 1.0, call

        refused(dev.read_into_blocking, 0, buf)
        refused(dev.write_from_blocking, 0, buf)
        refused(dev.flush_blocking)
        refused(dev.submit_blocking, [(fx100io.OP_READ, 0, buf)])
        for bad_stream in ("x", -1, 1 << 32, True):  # stream= too, with no path live
            t0 = time.monotonic()
            with pytest.raises(errors.InvalidArgumentError, match="stream"):
                dev.submit_blocking([(fx100io.OP_READ, 0, buf)], stream=bad_stream)
            assert time.monotonic() - t0 < 1.0

        async def main() -> None:
            for bad in BAD:
                for coro in (lambda b: dev.read_into(0, buf, priority=b),
                             lambda b: dev.write_from(0, buf, priority=b),
                             lambda b: dev.flush(priority=b),
                             lambda b: dev.submit([(fx100io.OP_READ, 0, buf)], priority=b)):
                    with pytest.raises(errors.InvalidArgumentError, match="priority"):
                        await asyncio.wait_for(coro(bad), 1.0)
                with pytest.raises(errors.InvalidArgumentError, match="priority"):
                    dev.start([(fx100io.OP_READ, 0, buf)], priority=bad)

        asyncio.run(main())
        assert [s["state"] for s in dev.path_stats()] == ["down", "down"]

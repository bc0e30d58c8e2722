"""Device API on real files and loop block devices, both engines."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from support import chunk_bytes

import fx100io
from fx100io import errors

ENGINES = ["io_uring", "psync"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("size", [1, 511, 4096, 4097, (1 << 20) + 3, 64 << 20])
def test_round_trip_pool_buffers(tmp_file, engine, size):
    pool = fx100io.BufferPool(2 * size + (8 << 20))
    data = pool.alloc(size)
    data[:] = chunk_bytes(f"dev-{size}", size)
    with fx100io.open_device(str(tmp_file), create=True, size=size + (1 << 20),
                             engine=engine) as dev:
        assert dev.engine == engine

        async def go():
            assert await dev.write_from(4096, data) == size
            await dev.flush()
            out = pool.alloc(size)
            assert await dev.read_into(4096, out) == size
            return out

        out = asyncio.run(go())
        assert np.array_equal(out, data)
        if engine == "io_uring" and size % 4096 == 0:
            # pool memory is registered: the O_DIRECT reads used fixed buffers
            assert dev.queue_stats()["fixed_ios"] > 0


@pytest.mark.parametrize("engine", ENGINES)
def test_unaligned_buffers_and_offsets(tmp_file, engine):
    """Unaligned address, offset and length take the buffered path and
    still move exactly the right bytes."""
    blob = chunk_bytes("unaligned", 3 << 20)
    with fx100io.open_device(f"file://{tmp_file}", create=True, size=8 << 20, engine=engine) as dev:
        dev.write_from_blocking(0, blob)
        for off, n in [(1, 1), (13, 4096), (4095, 8193), (12345, (2 << 20) + 7)]:
            raw = np.zeros(n + 1, dtype=np.uint8)
            view = raw[1:]  # numpy's allocation plus one: never 4 KiB aligned
            assert dev.read_into_blocking(off, view) == n
            assert np.array_equal(view, blob[off:off + n])
        patch = bytes(range(251)) * 3
        dev.write_from_blocking(777, patch)
        back = bytearray(len(patch) + 10)
        dev.read_into_blocking(772, back)
        assert bytes(back[5:5 + len(patch)]) == patch
        assert bytes(back[:5]) == blob[772:777].tobytes()


def test_read_past_end_is_short(tmp_file):
    with fx100io.open_device(str(tmp_file), create=True, size=1 << 20) as dev:
        buf = fx100io.BufferPool(1 << 20).alloc(8192)
        assert dev.read_into_blocking((1 << 20) - 4096, buf) == 4096
        assert dev.read_into_blocking(2 << 20, buf) == 0


def test_many_concurrent_tasks_one_loop(tmp_file):
    n, size = 200, 64 << 10
    pool = fx100io.BufferPool(2 * n * size)
    srcs = [pool.alloc(size) for _ in range(n)]
    for i, s in enumerate(srcs):
        s[:] = chunk_bytes(f"c{i}", size)
    dsts = [pool.alloc(size) for _ in range(n)]
    with fx100io.open_device(str(tmp_file), create=True, size=n * size, queue_depth=16,
                             slots=32) as dev:
        async def go():
            await asyncio.gather(*(dev.write_from(i * size, s) for i, s in enumerate(srcs)))
            await dev.flush()
            return await asyncio.gather(*(dev.read_into(i * size, d) for i, d in enumerate(dsts)))

        assert asyncio.run(go()) == [size] * n
    for s, d in zip(srcs, dsts):
        assert np.array_equal(s, d)


def test_blocking_calls_from_four_threads(tmp_file):
    size, per_thread = 256 << 10, 24
    with fx100io.open_device(str(tmp_file), create=True, size=4 * per_thread * size) as dev:
        failures = []

        def worker(t):
            try:
                for i in range(per_thread):
                    off = (t * per_thread + i) * size
                    data = chunk_bytes(f"t{t}-{i}", size)
                    dev.write_from_blocking(off, data)
                    back = np.empty(size, dtype=np.uint8)
                    dev.read_into_blocking(off, back)
                    if not np.array_equal(back, data):
                        failures.append((t, i))
            except Exception as e:  # surfaced below
                failures.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert failures == []


def test_loop_device_4096_direct(loop_device):
    with fx100io.open_device(loop_device) as dev:
        assert dev.is_block_device and dev.direct
        assert dev.block_size == 4096
        assert dev.size == 256 << 20
        pool = fx100io.BufferPool(16 << 20)
        src = pool.alloc(8 << 20)
        src[:] = chunk_bytes("loop", 8 << 20)
        dev.write_from_blocking(1 << 20, src)
        dev.flush_blocking()
        dst = pool.alloc(8 << 20)
        assert dev.read_into_blocking(1 << 20, dst) == 8 << 20
        assert np.array_equal(src, dst)
        # an unaligned piece of the same device through the buffered path
        part = bytearray(1000)
        dev.read_into_blocking((1 << 20) + 5, part)
        assert bytes(part) == src[5:1005].tobytes()
        # writing past the end of a block device is refused by the kernel
        with pytest.raises(errors.Fx100ioError):
            dev.write_from_blocking(dev.size, src[:4096])


def test_loop_device_512(loop_device_512):
    with fx100io.open_device(loop_device_512) as dev:
        assert dev.block_size == 512
        data = chunk_bytes("512", 3 * 512)
        buf = fx100io.BufferPool(1 << 20).alloc(len(data))
        buf[:] = data
        dev.write_from_blocking(512, buf)
        out = fx100io.BufferPool(1 << 20).alloc(len(data))
        dev.read_into_blocking(512, out)
        assert np.array_equal(out, data)


def test_features_probe_reports_ring_setup(tmp_file):
    with fx100io.open_device(str(tmp_file), create=True, size=1 << 20) as dev:
        feats = dev.features()
    # this kernel (6.x) has all of them; older ones fall back (tested below)
    assert "fixed_files" in feats and "fixed_buffers" in feats


def test_plain_ring_fallback_stays_correct(tmp_file):
    from support import run_python
    code = f"""
import fx100io, numpy as np
dev = fx100io.open_device({str(tmp_file)!r}, create=True, size=4 << 20)
f = dev.features()
assert "defer_taskrun" not in f and "single_issuer" not in f, f
data = np.arange(1 << 20, dtype=np.uint32).view(np.uint8)[: 3 << 20]
dev.write_from_blocking(0, data)
out = np.empty_like(data)
dev.read_into_blocking(0, out)
assert np.array_equal(out, data)
print("ok")
"""
    assert run_python(code, env={"FX100IO_RING_SETUP": "plain"}).stdout.strip() == "ok"


def test_register_outside_memory(tmp_file):
    """Memory fx100io did not allocate (another library's pool) can be
    registered; I/O into it stays exact before, during and after."""
    outside = np.zeros(4 << 20, dtype=np.uint8)
    data = chunk_bytes("outside", 1 << 20)
    with fx100io.open_device(str(tmp_file), create=True, size=4 << 20) as dev:
        dev.write_from_blocking(0, data)
        with fx100io.register_memory(outside) as reg:
            assert reg.size == outside.nbytes
            view = outside[8192:8192 + (1 << 20)]
            before = dev.queue_stats()["fixed_ios"]
            assert dev.read_into_blocking(0, view) == 1 << 20
            assert np.array_equal(view, data)
            assert dev.queue_stats()["fixed_ios"] > before  # READ_FIXED on outside memory
        outside[:] = 0
        assert dev.read_into_blocking(0, outside[:1 << 20]) == 1 << 20
        assert np.array_equal(outside[:1 << 20], data)
    with pytest.raises(errors.InvalidArgumentError):
        fx100io.register_memory(b"read-only bytes")


def test_registration_ends_with_its_handle(tmp_file):
    """A registration must not outlive its handle: memory freed by its owner
    afterwards may be mapped again elsewhere, and a stale registration would
    send reads to the old pages."""
    import gc
    mem = np.zeros(1 << 20, dtype=np.uint8)
    with fx100io.open_device(str(tmp_file), create=True, size=1 << 20) as dev:
        reg = fx100io.register_memory(mem)
        before = dev.queue_stats()["fixed_ios"]
        dev.read_into_blocking(0, mem)
        assert dev.queue_stats()["fixed_ios"] > before
        del reg
        gc.collect()
        before = dev.queue_stats()["fixed_ios"]
        dev.read_into_blocking(0, mem)
        assert dev.queue_stats()["fixed_ios"] == before  # no longer registered


def test_psync_more_requests_than_slots(tmp_file):
    """psync completes inside submit: it must still never accept more than
    its completion ring holds (a batch larger than `slots`)."""
    data = chunk_bytes("slots", 10 * 4096)
    with fx100io.open_device(str(tmp_file), create=True, size=1 << 20, engine="psync",
                             slots=4) as dev:
        dev.write_from_blocking(0, data)
        outs = [bytearray(4096) for _ in range(10)]
        done = dev.submit_blocking([(fx100io.OP_READ, i * 4096, o) for i, o in enumerate(outs)])
        assert [res for res, _ in done] == [4096] * 10
        assert b"".join(outs) == data.tobytes()


@pytest.mark.parametrize("engine", ["io_uring", "psync"])
def test_empty_requests_beyond_slots_each_complete_once(tmp_file, engine):
    """An empty request completes at accept time and frees its slot at once;
    a batch of them larger than `slots` must still wait for room in the
    completion ring rather than overwrite completions not yet reaped."""
    with fx100io.open_device(str(tmp_file), create=True, size=1 << 20, engine=engine,
                             slots=2) as dev:
        reqs = [(fx100io.OP_READ, 0, bytearray(0)) for _ in range(5)]
        reqs.append((fx100io.OP_READ, 0, bytearray(512)))
        # async with a deadline: a lost completion fails the test instead of hanging it
        done = asyncio.run(asyncio.wait_for(dev.submit(reqs), 10))
        assert done == [(0, 0)] * 5 + [(512, 0)]


def test_raw_queue_round_trip(tmp_file):
    """The calling thread's C queue, driven directly: caller tags come back
    with the byte counts, and the bytes land in the caller's buffers."""
    with fx100io.open_device(str(tmp_file), create=True, size=1 << 20) as dev:
        pool = fx100io.BufferPool(64 << 10)
        src = [pool.alloc(4096) for _ in range(4)]
        for i, b in enumerate(src):
            b[:] = chunk_bytes(f"raw-{i}", 4096)
        q = dev.raw_queue()
        addr = [fx100io._core.buffer_address(b, True)[0] for b in src]
        assert q.submit([(fx100io.OP_WRITE, a, 4096, i * 8192, 100 + i)
                         for i, a in enumerate(addr)]) == 4
        done = {}
        while len(done) < 4:
            q.wait(1, 5000)
            done.update({t: (res, st) for t, res, st, _crc in q.reap()})
        assert done == {100 + i: (4096, 0) for i in range(4)}
        out = pool.alloc(4096)
        assert dev.read_into_blocking(2 * 8192, out) == 4096
        assert np.array_equal(out, src[2])

"""OP_CRC32C: the core checksums a request's bytes piece by piece as they land
(reads) or leave (writes), and the completion carries the CRC32C of the
whole request.  Checked against crc32c() over the same bytes on every engine,
with many small pieces landing out of order, unaligned buffers (the buffered
part of a request), short reads at end of file, and over NVMe/TCP."""

from __future__ import annotations

import asyncio
import os
import random

import numpy as np
import pytest
from support import chunk_bytes
from support.target_process import serve

import fx100io
from fx100io import _core, errors

READ = fx100io.OP_READ | fx100io.OP_CRC32C
WRITE = fx100io.OP_WRITE | fx100io.OP_CRC32C


def test_combine_matches_whole_buffer():
    rng = random.Random(5)
    data = os.urandom(1 << 16)
    assert _core.crc32c_combine(_core.crc32c(data), 0, 0) == _core.crc32c(data)
    for _ in range(200):
        a = rng.randrange(len(data) + 1)
        b = rng.randrange(a, len(data) + 1)
        left, right = data[:a], data[a:b]
        assert _core.crc32c_combine(_core.crc32c(left), _core.crc32c(right), len(right)) == \
            _core.crc32c(data[:b])


@pytest.mark.parametrize("engine", ["io_uring", "psync"])
def test_crc_of_reads_and_writes(tmp_path, engine):
    path = tmp_path / "dev.img"
    # small pieces and a shallow queue: pieces of one request complete in
    # many passes, and those of concurrent requests interleave
    with fx100io.open_device(str(path), create=True, size=64 << 20, engine=engine,
                             max_io=64 << 10, queue_depth=8) as dev:
        pool = fx100io.BufferPool(32 << 20)
        sizes = [4096, 1 << 20, (3 << 20) + 8192, 5 << 20]
        bufs = [pool.alloc(n) for n in sizes]
        offs = [0, 1 << 20, 4 << 20, 16 << 20]
        for i, b in enumerate(bufs):
            b[:] = chunk_bytes(f"crc-{engine}-{i}", b.nbytes)
        done = dev.submit_blocking([(WRITE, off, b) for off, b in zip(offs, bufs)])
        assert [d[0] for d in done] == sizes
        assert [d[2] for d in done] == [_core.crc32c(b) for b in bufs]
        outs = [pool.alloc(n) for n in sizes]
        done = dev.submit_blocking([(READ, off, o) for off, o in zip(offs, outs)])
        assert [d[0] for d in done] == sizes
        for d, o, b in zip(done, outs, bufs):
            assert np.array_equal(o, b)
            assert d[2] == _core.crc32c(b)
        # without the flag the completion keeps its two fields
        assert dev.submit_blocking([(fx100io.OP_READ, 0, outs[0])]) == [(4096, 0)]


@pytest.mark.parametrize("engine", ["io_uring", "psync"])
def test_crc_of_unaligned_and_short_reads(tmp_path, engine):
    path = tmp_path / "dev.img"
    data = chunk_bytes("unaligned", (2 << 20) + 123)
    path.write_bytes(data.tobytes())
    with fx100io.open_device(str(path), engine=engine, max_io=128 << 10) as dev:
        # an odd address and length: O_DIRECT for none of it, the page cache
        # path for all of it
        raw = bytearray((1 << 20) + 7)
        view = memoryview(raw)[3:]
        (res, status, crc), = dev.submit_blocking([(READ, 4099, view)])
        assert (res, status) == (view.nbytes, 0)
        assert bytes(view) == data[4099:4099 + view.nbytes].tobytes()
        assert crc == _core.crc32c(view)
        # past the end of the file: a short read carries no CRC (0), and
        # the caller sees the short count
        out = bytearray(1 << 20)
        (res, _status, crc), = dev.submit_blocking([(READ, len(data) - 1000, out)])
        assert res == 1000 and crc == 0


def test_crc_async_many_requests(tmp_path):
    path = tmp_path / "dev.img"
    with fx100io.open_device(str(path), create=True, size=32 << 20, max_io=32 << 10,
                             queue_depth=16) as dev:
        pool = fx100io.BufferPool(16 << 20)
        bufs = [pool.alloc(256 << 10) for _ in range(24)]
        for i, b in enumerate(bufs):
            b[:] = chunk_bytes(f"async-{i}", b.nbytes)

        async def go():
            w = await dev.submit([(WRITE, i << 20, b) for i, b in enumerate(bufs)])
            outs = [pool.alloc(256 << 10) for _ in bufs]
            r = await dev.submit([(READ, i << 20, o) for i, o in enumerate(outs)])
            return w, r, outs

        w, r, outs = asyncio.run(go())
        for wd, rd, b, o in zip(w, r, bufs, outs):
            assert wd[2] == rd[2] == _core.crc32c(b)
            assert np.array_equal(o, b)


def test_crc_flag_refused_on_flush(tmp_path):
    with fx100io.open_device(str(tmp_path / "d.img"), create=True, size=1 << 20) as dev:
        with pytest.raises(errors.InvalidArgumentError):
            dev.submit_blocking([(fx100io.OP_FLUSH | fx100io.OP_CRC32C, 0, None)])
        with pytest.raises(errors.InvalidArgumentError):
            dev.submit_blocking([(fx100io.OP_READ | (0x80 << 8), 0, bytearray(512))])


@pytest.mark.parametrize("digests", [0, 1], ids=["plain", "digests"])
def test_crc_over_nvme_tcp(tmp_path, digests):
    backing = tmp_path / "ns.img"
    with open(backing, "wb") as f:
        f.truncate(32 << 20)
    nqn = "nqn.2026-11.io.fx100:crc"
    with serve([str(backing)], nqn, block_size=4096) as (host, port, _):
        uri = f"nvme+tcp://{host}:{port}/{nqn}?queues=2&hdgst={digests}&ddgst={digests}&max_xfer=65536"
        with fx100io.open_device(uri) as dev:
            pool = fx100io.BufferPool(8 << 20)
            data = pool.alloc(3 << 20)
            data[:] = chunk_bytes(f"tcp-crc-{digests}", data.nbytes)
            (res, status, crc), = dev.submit_blocking([(WRITE, 8192, data)])
            assert (res, status, crc) == (data.nbytes, 0, _core.crc32c(data))
            out = pool.alloc(3 << 20)
            (res, status, crc), = dev.submit_blocking([(READ, 8192, out)])
            assert (res, status) == (out.nbytes, 0)
            assert np.array_equal(out, data) and crc == _core.crc32c(data)

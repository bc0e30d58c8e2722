"""ChunkStore chunks made of several buffers (a host KV page whose K and V, or whose
layers, lie apart): written gathered and read scattered, byte-exact however the pieces
are cut on either side, CRC-checked as one chunk, and through a bounce buffer on devices
that move whole blocks only."""

from __future__ import annotations

import numpy as np
import pytest
from support import chunk_bytes

import fx100io
from fx100io import errors
from fx100io.device import Device


def cut(buf: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    assert sum(sizes) == buf.nbytes
    out, pos = [], 0
    for n in sizes:
        out.append(buf[pos:pos + n])
        pos += n
    return out


SPLITS = [
    ([64 << 10, 64 << 10], [128 << 10]),             # K+V in, one buffer out
    ([128 << 10], [32 << 10] * 4),                   # one in, four out
    ([4096, 0, 124 << 10], [100 << 10, 28 << 10]),   # an empty piece, unaligned out
    ([1000, (128 << 10) - 1000], [64 << 10] * 2),    # unaligned in
]


@pytest.mark.parametrize("split_in,split_out", SPLITS)
def test_pieces_round_trip_across_different_cuts(tmp_file, split_in, split_out):
    data = chunk_bytes("page", 128 << 10)
    with fx100io.ChunkStore(str(tmp_file), create=True, size=64 << 20) as st:
        st.batch_put_blocking(["page"], [cut(data.copy(), split_in)])
        assert st.chunk_size("page") == data.nbytes
        dst = np.zeros(data.nbytes, dtype=np.uint8)
        assert st.batch_get_blocking(["page"], [cut(dst, split_out)]) == [True]
        assert np.array_equal(dst, data)
        # a plain buffer reads a chunk written in pieces, and the other way round
        st.batch_put_blocking(["plain"], [data])
        dst[:] = 0
        assert st.batch_get_blocking(["plain"], [tuple(cut(dst, split_out))]) == [True]
        assert np.array_equal(dst, data)


def test_pieces_persist_and_crc_covers_all_pieces(tmp_file):
    k, v = chunk_bytes("k", 1 << 20), chunk_bytes("v", 1 << 20)
    with fx100io.ChunkStore(str(tmp_file), create=True, size=64 << 20) as st:
        st.batch_put_blocking(["a", "b"], [[k, v], [v, k]])
    with fx100io.ChunkStore(str(tmp_file)) as st:
        ok, ov = np.zeros_like(k), np.zeros_like(v)
        assert st.batch_get_blocking(["a"], [[ok, ov]]) == [True]
        assert np.array_equal(ok, k) and np.array_equal(ov, v)
        # corrupt a byte of the second piece of "b": the whole chunk is a miss
        off = st._entries[b"b"].off
    with open(tmp_file, "r+b") as f:
        f.seek(off + (1 << 20) + 5)
        b = f.read(1)
        f.seek(off + (1 << 20) + 5)
        f.write(bytes([b[0] ^ 0xFF]))
    with fx100io.ChunkStore(str(tmp_file)) as st:
        ok, ov = np.zeros_like(k), np.zeros_like(v)
        assert st.batch_get_blocking(["b"], [[ok, ov]]) == [False]
        assert st.stats()["corruptions"] == 1


def test_pieces_too_small_and_read_only(tmp_file):
    data = chunk_bytes("x", 8192)
    with fx100io.ChunkStore(str(tmp_file), create=True, size=64 << 20) as st:
        st.batch_put_blocking(["x"], [[data[:4096], data[4096:]]])
        with pytest.raises(errors.BufferTooSmallError):
            st.batch_get_blocking(["x"], [[np.zeros(4096, np.uint8), np.zeros(4095, np.uint8)]])
        with pytest.raises(errors.ReadOnlyBufferError):
            st.batch_get_blocking(["x"], [[np.zeros(4096, np.uint8), bytes(4096)]])
        with pytest.raises(errors.InvalidArgumentError):
            st.batch_put_blocking(["y"], [[data, 7]])


def test_pieces_bounce_on_whole_block_devices(tmp_file, monkeypatch):
    """A device that moves whole blocks only (NVMe-oF) cannot start a piece
    mid-block: pieces that are not whole blocks go through one bounce buffer,
    and the bytes still land in the caller's pieces."""
    monkeypatch.setattr(Device, "aligned_only", property(lambda self: True))
    data = chunk_bytes("page", (64 << 10) + 777)
    with fx100io.ChunkStore(str(tmp_file), create=True, size=64 << 20) as st:
        st.batch_put_blocking(["page"], [cut(data.copy(), [1000, 30000, data.nbytes - 31000])])
        dst = np.zeros(data.nbytes, dtype=np.uint8)
        assert st.batch_get_blocking(["page"], [cut(dst, [5000, data.nbytes - 5000])]) == [True]
        assert np.array_equal(dst, data)
        dst[:] = 0  # whole-block pieces move in place, the last one's tail bounced
        assert st.batch_get_blocking(["page"], [cut(dst, [32 << 10, data.nbytes - (32 << 10)])]) == [True]
        assert np.array_equal(dst, data)


@pytest.mark.parametrize("op", ["get", "put"])
def test_failed_start_of_a_later_piece_awaits_the_started_ones(tmp_file, monkeypatch, op):
    """If a chunk's second piece cannot start, the call raises only once the first
    piece's I/O has ended: a read no longer lands in the caller's memory after the
    call, a write no longer lands in an extent given back."""
    import asyncio
    import errno

    data = chunk_bytes("page", 128 << 10)
    with fx100io.ChunkStore(str(tmp_file), create=True, size=64 << 20) as st:
        st.batch_put_blocking(["page"], [data])
        real = Device.start
        issued: list = []

        def start(self, reqs, **kw):
            if issued:
                raise OSError(errno.EIO, "injected: the second piece does not start")
            # the first piece's I/O ends a while later (as on a busy device): a call
            # that does not wait for it returns before it has
            loop = asyncio.get_running_loop()
            late = []
            for f in real(self, reqs, **kw):
                g = loop.create_future()
                f.add_done_callback(lambda f, g=g: loop.call_later(
                    0.2, lambda: g.done() or g.set_result(f.result())))
                late.append(g)
            issued.extend(late)
            return late

        monkeypatch.setattr(Device, "start", start)
        with pytest.raises(OSError, match="injected"):
            if op == "get":
                dst = np.zeros(data.nbytes, dtype=np.uint8)
                st.batch_get_blocking(["page"], [cut(dst, [64 << 10, 64 << 10])])
            else:
                other = chunk_bytes("other", 128 << 10)
                st.batch_put_blocking(["other"], [cut(other, [64 << 10, 64 << 10])])
        assert issued and all(f.done() for f in issued)
        monkeypatch.undo()
        dst = np.zeros(data.nbytes, dtype=np.uint8)
        assert st.batch_get_blocking(["page"], [dst]) == [True]
        assert np.array_equal(dst, data)
        assert st.chunk_size("other") is None

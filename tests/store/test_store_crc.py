"""The store's CRC32C check on chunks that move in many pieces.

A chunk's CRC is computed piece by piece as the pieces land (in C) and, on
devices that move whole blocks only, joined with the CRC of a bounced tail
(in Python).  These tests hold that split to one rule: the CRC the store keeps
and checks is the CRC32C of the chunk's bytes, whatever the piece size, the
tail, the engine or the transport, and a byte flipped anywhere in a chunk
(first, middle or last piece, or the bounced tail) makes that chunk a miss
that is never served."""

from __future__ import annotations

import numpy as np
import pytest
from support import chunk_bytes
from support.target_process import serve

import fx100io
from fx100io import _core

PIECE = 64 << 10
# one byte, odd tails, exact pieces, a piece and a bit, many pieces with an odd tail
SIZES = [1, 4095, 4096, PIECE, PIECE + 1, 3 * PIECE, 5 * PIECE + 17, 17 * PIECE + 4097]


def _put_all(st, sizes, tag):
    keys = [f"{tag}-{n}" for n in sizes]
    st.batch_put_blocking(keys, [chunk_bytes(k, n) for k, n in zip(keys, sizes)])
    return keys


def _check_all(st, keys, sizes):
    outs = [np.zeros(n + 100, np.uint8) for n in sizes]
    assert st.batch_get_blocking(keys, outs) == [True] * len(keys)
    for k, n, out in zip(keys, sizes, outs):
        want = chunk_bytes(k, n)
        assert np.array_equal(out[:n], want), k
        assert not out[n:].any(), k  # nothing past the chunk was written
        # the CRC kept in the index is the CRC32C of the whole chunk
        assert st._entries[k.encode()].crc == _core.crc32c(want), k


def _flip(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x10]))


@pytest.mark.parametrize("engine", ["io_uring", "psync"])
def test_piecewise_crc_equals_crc_of_whole(tmp_file, engine):
    opts = dict(engine=engine, max_io=PIECE, queue_depth=4)
    with fx100io.ChunkStore(str(tmp_file), create=True, size=64 << 20, **opts) as st:
        keys = _put_all(st, SIZES, engine)
        _check_all(st, keys, SIZES)
    # read back by a store that did not write them (CRCs from the index on disk),
    # with another piece size than the one they were written with
    with fx100io.ChunkStore(str(tmp_file), engine=engine, max_io=12 << 10, queue_depth=3) as st:
        _check_all(st, keys, SIZES)


@pytest.mark.parametrize("where", ["first", "middle", "last", "tail"])
def test_byte_flipped_in_any_piece_is_a_miss(tmp_file, where):
    n = 9 * PIECE + 777  # nine full pieces and a partial tenth
    at = {"first": 5, "middle": 4 * PIECE + 123, "last": 9 * PIECE - 1, "tail": n - 1}[where]
    with fx100io.ChunkStore(str(tmp_file), create=True, size=32 << 20, max_io=PIECE,
                            queue_depth=4) as st:
        st.batch_put_blocking(["good", "bad"], [chunk_bytes("good", n), chunk_bytes("bad", n)])
        off = st._entries[b"bad"].off
    _flip(tmp_file, off + at)
    with fx100io.ChunkStore(str(tmp_file), max_io=PIECE, queue_depth=4) as st:
        outs = [np.empty(n, np.uint8), np.empty(n, np.uint8)]
        assert st.batch_get_blocking(["good", "bad"], outs) == [True, False]
        assert np.array_equal(outs[0], chunk_bytes("good", n))
        assert st.stats()["corruptions"] == 1
        assert not st.contains("bad")


def test_bounced_tails_over_nvme_tcp(tmp_path):
    """NVMe/TCP moves whole blocks only: the last partial block of a chunk goes
    through a bounce block and its CRC is joined to the CRC of the pieces."""
    backing = tmp_path / "ns.img"
    with open(backing, "wb") as f:
        f.truncate(64 << 20)
    nqn = "nqn.2026-11.io.fx100:store-crc"
    with serve([str(backing)], nqn, block_size=4096) as (host, port, _):
        uri = f"nvme+tcp://{host}:{port}/{nqn}?queues=1&max_xfer=65536"
        with fx100io.ChunkStore(uri, create=True, max_io=PIECE, queue_depth=4) as st:
            assert st._members[0].dev.aligned_only
            keys = _put_all(st, SIZES, "tcp")
            _check_all(st, keys, SIZES)
        victim, n = f"tcp-{SIZES[-1]}", SIZES[-1]
        # a byte in the bounced (partial) last block, then one in a middle piece
        for at in (n - 3, 8 * PIECE + 99):
            with fx100io.ChunkStore(uri, max_io=PIECE, queue_depth=4) as st:
                if not st.contains(victim):
                    st.batch_put_blocking([victim], [chunk_bytes(victim, n)])
                off = st._entries[victim.encode()].off
            _flip(backing, off + at)
            with fx100io.ChunkStore(uri, max_io=PIECE, queue_depth=4) as st:
                out = np.empty(n, np.uint8)
                assert st.batch_get_blocking([victim], [out]) == [False]
                assert st.stats()["corruptions"] == 1
                assert not st.contains(victim)
                _check_all(st, keys[:-1], SIZES[:-1])

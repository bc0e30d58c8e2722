"""Our initiator against our own target on loopback: round trips, the store,
and faults (dropped connections, corrupted digests, stalled responses, a
target that dies and comes back).  Each fault ends in a clear error or a
successful retry within the timeout: no hang, never wrong bytes."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from support import chunk_bytes
from support.target_process import serve, wait_port_free

import fx100io
from fx100io import errors

NQN = "nqn.2026-11.io.fx100:test"


@pytest.fixture
def backing(tmp_path):
    p = tmp_path / "ns1.img"
    with open(p, "wb") as f:
        f.truncate(64 << 20)
    return str(p)


def dev_uri(host, port, **q):
    query = "&".join(f"{k}={v}" for k, v in q.items())
    return f"nvme+tcp://{host}:{port}/{NQN}" + (f"?{query}" if query else "")


@pytest.mark.parametrize("block_size", [512, 4096])
@pytest.mark.parametrize("digests", [0, 1], ids=["plain", "digests"])
def test_round_trip_and_backing_file(backing, block_size, digests):
    with serve([backing], NQN, block_size=block_size) as (host, port, _):
        with fx100io.open_device(dev_uri(host, port, queues=2, hdgst=digests,
                                         ddgst=digests)) as dev:
            assert dev.block_size == block_size and dev.size == 64 << 20
            pool = fx100io.BufferPool(16 << 20)
            data = pool.alloc(5 << 20)
            data[:] = chunk_bytes(f"ours-{block_size}-{digests}", 5 << 20)
            dev.write_from_blocking(3 * 4096, data)
            dev.flush_blocking()
            out = pool.alloc(5 << 20)
            before = dev.queue_stats()
            assert dev.read_into_blocking(3 * 4096, out) == 5 << 20
            assert np.array_equal(out, data)
            after = dev.queue_stats()
            # one copy: every received byte went from the socket into `out`
            assert after["bytes_direct"] - before["bytes_direct"] == 5 << 20
            assert after["bytes_copied"] == 0
    # the target wrote through to its file
    with open(backing, "rb") as f:
        f.seek(3 * 4096)
        assert f.read(5 << 20) == data.tobytes()


def test_chunk_store_over_our_target(backing):
    keys = [f"c{i}" for i in range(5)]
    sizes = [3, 5000, 1 << 20, 123_457, 2 << 20]
    with serve([backing], NQN) as (host, port, _):
        u = dev_uri(host, port, queues=2)
        with fx100io.ChunkStore(u, create=True) as st:
            st.batch_put_blocking(keys, [chunk_bytes(k, n) for k, n in zip(keys, sizes)])
        with fx100io.ChunkStore(u) as st:
            outs = [np.empty(n, np.uint8) for n in sizes]
            assert st.batch_get_blocking(keys, outs) == [True] * 5
            assert all(np.array_equal(o, chunk_bytes(k, n)) for o, k, n in zip(outs, keys, sizes))


def test_dropped_connections_fail_clearly_then_recover(backing):
    """The target closes every connection after a few PDUs: requests caught
    in a drop fail with a connection error, the next ones reconnect, and
    nothing read back is ever wrong."""
    data = chunk_bytes("drop", 256 << 10)
    with open(backing, "r+b") as f:
        f.write(data.tobytes())
    with serve([backing], NQN, "--fault-drop-after", "25") as (host, port, _):
        with fx100io.open_device(dev_uri(host, port, io_timeout_ms=3000)) as dev:
            ok = failed = 0
            t0 = time.time()
            for i in range(60):
                out = np.zeros(64 << 10, np.uint8)
                off = (i % 4) * (64 << 10)
                try:
                    dev.read_into_blocking(off, out)
                except (errors.FxConnectionError, errors.FxProtocolError) as e:
                    failed += 1
                    assert e.errno is not None
                    continue
                ok += 1
                assert np.array_equal(out, data[off:off + (64 << 10)])
            assert ok > 20 and failed > 0
            assert time.time() - t0 < 60


def test_corrupted_data_digest_is_never_data(backing):
    data = chunk_bytes("ddgst", 1 << 20)
    with open(backing, "r+b") as f:
        f.write(data.tobytes())
    with serve([backing], NQN, "--fault-corrupt-ddgst", "3") as (host, port, _):
        with fx100io.open_device(dev_uri(host, port, ddgst=1)) as dev:
            bad = good = 0
            for _ in range(12):
                out = np.zeros(128 << 10, np.uint8)
                try:
                    dev.read_into_blocking(0, out)
                except errors.FxProtocolError:
                    bad += 1
                    continue
                good += 1
                assert np.array_equal(out, data[:128 << 10])
            assert bad > 0 and good > 0


def test_stalled_target_times_out(backing):
    with serve([backing], NQN, "--fault-delay-ms", "3000") as (host, port, _):
        with fx100io.open_device(dev_uri(host, port, io_timeout_ms=500,
                                         connect_timeout_ms=10000)) as dev:
            t0 = time.time()
            with pytest.raises(errors.FxTimeoutError):
                dev.read_into_blocking(0, np.zeros(4096, np.uint8))
            assert time.time() - t0 < 3.0  # the deadline, not the stall, ended it


def test_target_restart_in_flight_fail_later_succeed(backing):
    data = chunk_bytes("restart", 1 << 20)
    with serve([backing], NQN) as (host, port, proc):
        dev = fx100io.open_device(dev_uri(host, port, io_timeout_ms=2000))
        dev.write_from_blocking(0, data)
        dev.flush_blocking()
        proc.kill()
        proc.wait()
    try:
        with pytest.raises((errors.FxConnectionError, errors.FxTimeoutError)):
            dev.read_into_blocking(0, np.zeros(1 << 20, np.uint8))
        # while it is down, requests fail fast with a connection error
        t0 = time.time()
        with pytest.raises(errors.FxConnectionError):
            dev.read_into_blocking(0, np.zeros(4096, np.uint8))
        assert time.time() - t0 < 5
        wait_port_free(port)
        with serve([backing], NQN, port=port):
            out = np.zeros(1 << 20, np.uint8)
            deadline = time.time() + 10
            while True:
                try:
                    dev.read_into_blocking(0, out)
                    break
                except errors.FxConnectionError:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.3)
            assert np.array_equal(out, data)
    finally:
        dev.close()


def test_async_many_in_flight(backing):
    with serve([backing], NQN) as (host, port, _):
        with fx100io.open_device(dev_uri(host, port, queues=4)) as dev:
            pool = fx100io.BufferPool(32 << 20)
            srcs = [pool.alloc(512 << 10) for _ in range(24)]
            for i, s in enumerate(srcs):
                s[:] = chunk_bytes(f"a{i}", s.nbytes)

            async def go():
                await asyncio.gather(*(dev.write_from(i * (512 << 10), s) for i, s in enumerate(srcs)))
                outs = [pool.alloc(512 << 10) for _ in srcs]
                await asyncio.gather(*(dev.read_into(i * (512 << 10), o) for i, o in enumerate(outs)))
                return outs

            outs = asyncio.run(go())
            assert all(np.array_equal(o, s) for o, s in zip(outs, srcs))


def test_loads_on_their_own_connection_with_stores_at_once(backing):
    """queues=2: load reads go on the first connection, writes, flushes and reads of
    the other classes on the second (docs/architecture.md, "Priority and write
    admission"); all at once, every byte right, and a load read still works while
    only stores are queued and the other way round."""
    with serve([backing], NQN) as (host, port, _):
        with fx100io.open_device(dev_uri(host, port, queues=2), max_io=128 << 10) as dev:
            pool = fx100io.BufferPool(40 << 20)
            old = pool.alloc(8 << 20)
            old[:] = chunk_bytes("old", old.nbytes)
            dev.write_from_blocking(0, old)
            new = [pool.alloc(2 << 20) for _ in range(4)]
            for i, b in enumerate(new):
                b[:] = chunk_bytes(f"new{i}", b.nbytes)

            async def go():
                outs = [pool.alloc(2 << 20) for _ in range(4)]
                bg = pool.alloc(2 << 20)
                await asyncio.gather(
                    *(dev.write_from((16 << 20) + i * (2 << 20), b) for i, b in enumerate(new)),
                    *(dev.read_into(i * (2 << 20), o) for i, o in enumerate(outs)),
                    dev.read_into(0, bg, priority="background"),
                    dev.flush())
                return outs, bg

            outs, bg = asyncio.run(go())
            for i, o in enumerate(outs):
                assert np.array_equal(o, old[i * (2 << 20):(i + 1) * (2 << 20)])
            assert np.array_equal(bg, old[:2 << 20])
            back = pool.alloc(8 << 20)
            assert dev.read_into_blocking(16 << 20, back) == 8 << 20
            assert np.array_equal(back, np.concatenate(new))
            s = dev.queue_stats()
            assert s["pieces_load"] > 0 and s["pieces_background"] > 0 and s["pieces_store"] > 0
            # which connection carried what: no write went on the load
            # connection while a load read waited, and nothing needed a fallback
            assert s["load_conn_writes"] == 0 and s["conn_fallbacks"] == 0

"""How our initiator cuts the byte stream into PDUs, whatever the segments.

A proxy between the initiator and our target re-cuts what the target sends:
either held back and forwarded in large chunks (many C2HData and responses
in one segment, as a fast target at queue depth 32 sends them), or split into
pieces of a few bytes (a header, a payload or a digest arriving across many
segments).  Every read must come back byte-exact, with and without digests,
for small reads (received in bulk, payloads copied from one receive buffer)
and large ones (payload received straight into the caller's buffer), mixed
in flight together.  Nothing here depends on timing: the proxy's pauses only
shape the segments, the assertions are on bytes and counters.
"""

from __future__ import annotations

import asyncio
import random
import selectors
import socket
import threading

import numpy as np
import pytest
from support import chunk_bytes
from support.target_process import serve

import fx100io

NQN = "nqn.2026-11.io.fx100:rx"
SIZE = 32 << 20


class Recut:
    """TCP proxy: host->target bytes pass as they come; target->host bytes
    are re-cut ("coalesce": gathered until the target pauses, then sent in
    one write; "split": sent in pieces of 1..7 bytes)."""

    def __init__(self, port: int, mode: str, seed: int = 1):
        self.port, self.mode = port, mode
        self.rng = random.Random(seed)
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.addr = self.lsock.getsockname()
        self.stop = False
        self.threads: list[threading.Thread] = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self.threads.append(t)

    def close(self) -> None:
        self.stop = True
        self.lsock.close()
        for t in self.threads:
            t.join(timeout=10)

    def _accept(self) -> None:
        while not self.stop:
            try:
                host, _ = self.lsock.accept()
            except OSError:
                return
            tgt = socket.create_connection(("127.0.0.1", self.port))
            for s in (host, tgt):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = threading.Thread(target=self._pump, args=(host, tgt), daemon=True)
            t.start()
            self.threads.append(t)

    def _send_recut(self, host: socket.socket, data: bytes) -> None:
        if self.mode == "coalesce":
            host.sendall(data)
            return
        i = 0
        while i < len(data):
            n = self.rng.randint(1, 7)
            host.sendall(data[i:i + n])
            i += n

    def _pump(self, host: socket.socket, tgt: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(host, selectors.EVENT_READ)
        sel.register(tgt, selectors.EVENT_READ)
        held = bytearray()
        try:
            while not self.stop:
                # coalesce: hold the target's bytes until it pauses for 20 ms
                events = sel.select(timeout=0.02 if held else 0.2)
                if not events and held:
                    self._send_recut(host, bytes(held))
                    held.clear()
                for key, _ in events:
                    s = key.fileobj
                    data = s.recv(1 << 20)  # type: ignore[union-attr]
                    if not data:
                        if held:
                            self._send_recut(host, bytes(held))
                        return
                    if s is host:
                        tgt.sendall(data)
                    elif self.mode == "coalesce":
                        held += data
                        if len(held) >= 4 << 20:
                            self._send_recut(host, bytes(held))
                            held.clear()
                    else:
                        self._send_recut(host, data)
        except OSError:
            pass
        finally:
            host.close()
            tgt.close()


@pytest.fixture
def backing(tmp_path):
    p = tmp_path / "ns1.img"
    with open(p, "wb") as f:
        f.write(chunk_bytes("rx-backing", SIZE).tobytes())
    return str(p)


def _uri(addr, digests: int) -> str:
    host, port = addr
    return (f"nvme+tcp://{host}:{port}/{NQN}?queues=1&hdgst={digests}&ddgst={digests}"
            "&io_timeout_ms=30000&kato_ms=0")


async def _read_many(dev, pieces: list[tuple[int, int]], pool) -> list[np.ndarray]:
    outs = [pool.alloc(n) for _, n in pieces]
    got = await asyncio.gather(*(dev.read_into(off, o) for (off, _), o in zip(pieces, outs)))
    assert list(got) == [n for _, n in pieces]
    return outs


@pytest.mark.parametrize("mode", ["coalesce", "split"])
@pytest.mark.parametrize("digests", [0, 1], ids=["plain", "digests"])
def test_recut_stream_reads_byte_exact(backing, mode, digests):
    """64 small reads in flight, then small and large reads mixed in flight,
    through a stream cut into big chunks or into 1-7 byte pieces."""
    want = chunk_bytes("rx-backing", SIZE)
    rng = random.Random(7)
    small = [(rng.randrange(SIZE // 4096) * 4096, 4096) for _ in range(64)]
    mixed = [(rng.randrange(SIZE // 4096 - 64) * 4096, rng.choice([512 * 3, 4096, 12288, 256 << 10]))
             for _ in range(24)]
    if mode == "split":  # a few bytes a segment: keep the volume small
        small, mixed = small[:24], [(o, min(n, 64 << 10)) for o, n in mixed[:10]]
    with serve([backing], NQN, block_size=512) as (_, port, _p):
        px = Recut(port, mode)
        try:
            with fx100io.open_device(_uri(px.addr, digests)) as dev:
                pool = fx100io.BufferPool(16 << 20)

                async def run():
                    for pieces in (small, mixed):
                        outs = await _read_many(dev, pieces, pool)
                        for (off, n), o in zip(pieces, outs):
                            assert np.array_equal(o, want[off:off + n]), (off, n)
                        del outs  # back to the pool

                asyncio.run(run())
        finally:
            px.close()


def test_small_reads_are_received_in_bulk_large_ones_direct(backing):
    """Small reads in flight together are parsed out of one receive buffer
    (their payloads copied from it); a large read that follows still lands
    straight in the caller's buffer (the pending bulk receive is cancelled
    before its command goes out)."""
    want = chunk_bytes("rx-backing", SIZE)
    with serve([backing], NQN, block_size=512) as (host, port, _p):
        with fx100io.open_device(f"nvme+tcp://{host}:{port}/{NQN}?queues=1") as dev:
            pool = fx100io.BufferPool(16 << 20)

            async def run():
                pieces = [(i * 8192, 4096) for i in range(32)]
                s0 = dev.queue_stats()
                outs = await _read_many(dev, pieces, pool)
                s1 = dev.queue_stats()
                for (off, n), o in zip(pieces, outs):
                    assert np.array_equal(o, want[off:off + n])
                assert s1["bytes_copied"] - s0["bytes_copied"] == 32 * 4096
                assert s1["bytes_direct"] == s0["bytes_direct"]
                big = pool.alloc(4 << 20)
                assert await dev.read_into(1 << 20, big) == 4 << 20
                s2 = dev.queue_stats()
                assert np.array_equal(big, want[1 << 20:5 << 20])
                assert s2["bytes_direct"] - s1["bytes_direct"] == 4 << 20
                assert s2["bytes_copied"] == s1["bytes_copied"]
                # and back to bulk receives once no large read is in flight
                outs = await _read_many(dev, pieces, pool)
                s3 = dev.queue_stats()
                assert s3["bytes_copied"] - s2["bytes_copied"] == 32 * 4096
                for (off, n), o in zip(pieces, outs):
                    assert np.array_equal(o, want[off:off + n])

            asyncio.run(run())


def test_many_small_writes_in_one_send_read_back_exact(backing):
    """64 small writes in flight go out as batches of capsules (and their
    R2T answers) in single sendmsg calls: the target decodes each exactly."""
    with serve([backing], NQN, block_size=512) as (host, port, _p):
        with fx100io.open_device(f"nvme+tcp://{host}:{port}/{NQN}?queues=1&hdgst=1&ddgst=1") as dev:
            pool = fx100io.BufferPool(8 << 20)
            pieces = [(i * 16384, 512 * (1 + i % 8)) for i in range(64)]
            srcs = []
            for k, (_, n) in enumerate(pieces):
                b = pool.alloc(n)
                b[:] = chunk_bytes(f"w{k}", n)
                srcs.append(b)

            async def run():
                got = await asyncio.gather(*(dev.write_from(off, b) for (off, _), b in zip(pieces, srcs)))
                assert list(got) == [n for _, n in pieces]
                outs = await _read_many(dev, pieces, pool)
                for k, ((_, n), o) in enumerate(zip(pieces, outs)):
                    assert np.array_equal(o, chunk_bytes(f"w{k}", n)), k

            asyncio.run(run())

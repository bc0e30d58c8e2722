"""A completion wakes the asyncio loop when its data arrives, not later.

The loop learns of completions from the queue's fd.  Over NVMe/TCP the data
of a read arrives on a socket; the kernel queues work for the ring from the
softirq that delivers it, and on a ring set up for C waits (DEFER_TASKRUN)
it signals the fd only from an RCU callback, tens of milliseconds later: the
loop slept through every read it had to wait for.

The test needs no clock.  A relay sits between fx100io and our target
(`fx100io target`, loopback) and forwards the target's bytes; once it has
seen the last byte of a read's answer acknowledged by our socket (TCP queues
the data and wakes its readers before it acknowledges), it writes a witness
pipe that the same loop watches.  By the time the loop runs the witness's
callback, the completion must be noticeable: its future done already, or the
queue's fd readable so that this very loop turn reaps it.  With the late
signal the fd was still quiet there, for one read after another.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import select
import socket
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.target_process import serve

import fx100io
from fx100io import OP_READ

MiB = 1 << 20
NQN = "nqn.2026-12.io.fx100:wakeup"
READS = 24


class Relay:
    """TCP relay on loopback: each accepted connection gets its own
    connection to (host, port), bytes pumped both ways.  down[i] counts what
    went from the target to fx100io on connection i; watch(i, n) writes the
    witness pipe once the bytes that take down[i] to n are in fx100io's
    socket."""

    def __init__(self, host: str, port: int):
        self.dst = (host, port)
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(8)
        self.port = self.ls.getsockname()[1]
        self.down: list[int] = []
        self.lock = threading.Lock()
        self.watching: tuple[int, int] | None = None
        self.witness_r, self.witness_w = os.pipe()
        self.socks: list[socket.socket] = []
        self.closed = False
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            t = socket.create_connection(self.dst)
            for s in (c, t):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.socks.append(s)
            with self.lock:
                idx = len(self.down)
                self.down.append(0)
            for args in ((c, t, None), (t, c, idx)):
                th = threading.Thread(target=self._pump, args=args, daemon=True)
                self.threads.append(th)
                th.start()

    def _pump(self, src: socket.socket, dst: socket.socket, idx: int | None) -> None:
        while True:
            try:
                data = src.recv(256 << 10)
                if not data:
                    break
                if idx is not None:
                    # counted before it is sent: fx100io cannot have seen a
                    # byte that down does not count yet
                    with self.lock:
                        self.down[idx] += len(data)
                        total = self.down[idx]
                dst.sendall(data)
            except OSError:
                break
            if idx is None:
                continue
            with self.lock:
                w = self.watching
                fire = w is not None and w[0] == idx and total >= w[1]
                if fire:
                    self.watching = None
            if fire:
                # sendall returns once the bytes are in our send buffer; they
                # are in fx100io's socket when its TCP acknowledged them (the
                # data is queued, and its readers woken, before the ACK goes)
                while fcntl.ioctl(dst, termios.TIOCOUTQ, b"\0" * 4) != b"\0" * 4:
                    time.sleep(0.0001)
                os.write(self.witness_w, b"x")
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def watch(self, idx: int, upto: int) -> None:
        with self.lock:
            self.watching = (idx, upto)

    def close(self) -> None:
        """Stop every thread of the relay (a test after this one may need a
        process without stray threads: the fabric lab's netns join)."""
        self.closed = True
        for s in [self.ls, *self.socks]:
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes accept() and recv()
            except OSError:
                pass
        for th in self.threads:
            th.join()
        for s in [self.ls, *self.socks]:
            s.close()
        os.close(self.witness_r)
        os.close(self.witness_w)


@pytest.fixture
def relayed_target(tmp_path: Path) -> Iterator[Relay]:
    img = tmp_path / "ns.img"
    img.write_bytes(np.random.default_rng(7).integers(0, 256, 64 * MiB, dtype=np.uint8).tobytes())
    with serve([str(img)], NQN, block_size=4096) as (host, port, _proc):
        relay = Relay(host, port)
        try:
            yield relay
        finally:
            relay.close()


def test_each_completion_is_noticed_when_its_data_has_arrived(relayed_target: Relay) -> None:
    relay = relayed_target

    async def run() -> list[tuple[int, bool]]:
        loop = asyncio.get_running_loop()
        with fx100io.open_device(f"nvme+tcp://127.0.0.1:{relay.port}/{NQN}") as dev:
            buf = np.zeros(MiB, dtype=np.uint8)
            # one read to learn which connection carries I/O and how many
            # bytes a 1 MiB read's answer is (C2HData header, data, maybe a
            # response capsule)
            before = list(relay.down)
            assert await dev.read_into(0, buf) == MiB
            delta = [b - (before[i] if i < len(before) else 0) for i, b in enumerate(relay.down)]
            io = int(np.argmax(delta))
            per_read = delta[io]
            assert per_read >= MiB
            qfd = dev._driver().fd  # the queue the async read above used
            seen: list[tuple[int, bool]] = []
            for i in range(1, READS + 1):
                witnessed: asyncio.Future[None] = loop.create_future()
                (fut,) = dev.start([(OP_READ, i * MiB, buf)])

                def on_witness(i: int = i, fut: asyncio.Future = fut,
                               witnessed: asyncio.Future = witnessed) -> None:
                    os.read(relay.witness_r, 1)
                    noticed = fut.done() or bool(select.select([qfd], [], [], 0)[0])
                    seen.append((i, noticed))
                    if not witnessed.done():
                        witnessed.set_result(None)

                loop.add_reader(relay.witness_r, on_witness)
                relay.watch(io, relay.down[io] + per_read)
                # (bounds against a hang, not timing: each takes microseconds)
                res, status = await asyncio.wait_for(fut, 60)
                await asyncio.wait_for(witnessed, 60)
                loop.remove_reader(relay.witness_r)
                assert (res, status) == (MiB, 0)
            return seen

    seen = asyncio.run(run())
    late = [i for i, noticed in seen if not noticed]
    assert len(seen) == READS
    assert not late, (f"reads {late} of {READS}: the whole answer had reached our socket, yet "
                      "the loop could not notice the completion (the queue's fd was quiet)")


def test_async_calls_run_on_a_queue_made_for_fd_wake_ups(relayed_target: Relay) -> None:
    """The blocking calls keep the ring made for C waits; the first async call
    of the thread replaces it (idle) with one whose completions wake a loop."""
    relay = relayed_target
    with fx100io.open_device(f"nvme+tcp://127.0.0.1:{relay.port}/{NQN}") as dev:
        buf = np.zeros(MiB, dtype=np.uint8)
        assert dev.read_into_blocking(0, buf) == MiB
        assert not dev._driver().fd_wake

        async def run() -> None:
            assert await dev.read_into(MiB, buf) == MiB
            d = dev._driver()
            assert d.fd_wake
            assert "defer_taskrun" not in dev.features()
            # a blocking call on the loop's thread uses the same queue
            assert dev.read_into_blocking(2 * MiB, buf) == MiB
            assert dev._driver() is d

        asyncio.run(run())

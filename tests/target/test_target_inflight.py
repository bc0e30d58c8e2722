"""Our NVMe/TCP target with many commands in flight per queue (csrc/target/io.c).

Each I/O queue keeps Reads and Writes in flight and answers them as their
disk I/O completes.  What must hold whatever the order of completions:
every byte is right (cached data through sendfile, uncached through
O_DIRECT, unaligned through buffered I/O), each command's C2HData come
before its CapsuleResp and cover its whole buffer, a read sees a write the
host waited for, the buffers a queue holds stay within its budget (a
write's R2T waits for room), and a host that vanishes with commands in
flight costs nothing afterwards.  Nothing here depends on timing (waits
are for what must happen, with generous deadlines).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pytest
from support import chunk_bytes
from support.target_host import C2H_DATA, H2C_DATA, NQN, R2T, RSP, Closed, Host, admin, io_queue, sqe
from support.target_process import fds, serve, settled, threads

import fx100io

MiB = 1 << 20
T = TypeVar("T")
BUDGET = 32 * MiB       # FX_TGT_IO_BUDGET (csrc/target/tgt.h)
MAX_XFER = 4 * MiB      # MDTS 10: 4 KiB << 10


def drop_cache(path: str) -> None:
    """Push a file's pages out of the page cache (clean pages only: the
    target's writes are synced first), so that reads take the O_DIRECT path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class Pipeline:
    """Many commands in flight on one raw Host: submit without waiting, then
    collect every PDU, serving R2Ts, checking per command that its data
    precede its response and cover exactly its buffer."""

    def __init__(self, h: Host):
        self.h = h
        self.out: dict[int, bytes] = {}        # cid -> data to write
        self.want: dict[int, int] = {}         # cid -> bytes to read
        self.got: dict[int, bytearray] = {}
        self.covered: dict[int, int] = {}
        self.done: dict[int, int] = {}         # cid -> status
        self.r2ts: list[tuple[int, int, int, int]] = []  # (cid, ttag, r2to, r2tl) not yet served
        self.auto_r2t = True

    def read(self, slba: int, nlb: int, bs: int) -> int:
        cid = self.h.submit(sqe(0x02, nsid=1, cdw10=slba & 0xFFFFFFFF, cdw11=slba >> 32,
                                cdw12=nlb - 1), data_in=nlb * bs)
        self.want[cid] = nlb * bs
        self.got[cid] = bytearray(nlb * bs)
        self.covered[cid] = 0
        return cid

    def write(self, slba: int, data: bytes, bs: int) -> int:
        cid = self.h.submit(sqe(0x01, nsid=1, cdw10=slba & 0xFFFFFFFF, cdw11=slba >> 32,
                                cdw12=len(data) // bs - 1), data, incapsule=False)
        self.out[cid] = data
        return cid

    def serve_r2t(self, cid: int, ttag: int, r2to: int, r2tl: int) -> None:
        data = self.out[cid]
        off = r2to
        while off < r2to + r2tl:
            n = min(self.h.maxh2cdata, r2to + r2tl - off)
            last = 0x04 if off + n == r2to + r2tl else 0
            self.h.send_pdu(H2C_DATA, struct.pack("<HHII4x", cid, ttag, off, n),
                            data[off:off + n], flags=last)
            off += n

    def step(self) -> None:
        p = self.h.recv_pdu()
        if p.type == C2H_DATA:
            cccid, _ttag, datao, datal = struct.unpack_from("<HHII", p.header, 8)
            assert cccid in self.want and cccid not in self.done, cccid
            assert p.ddgst_ok, "bad data digest"
            assert datao == self.covered[cccid], "C2HData out of order within a command"
            assert datao + datal <= self.want[cccid]
            self.got[cccid][datao:datao + datal] = p.data
            self.covered[cccid] += datal
        elif p.type == R2T:
            cccid, ttag, r2to, r2tl = struct.unpack_from("<HHII", p.header, 8)
            assert cccid in self.out and cccid not in self.done
            assert r2to == 0 and r2tl == len(self.out[cccid])
            if self.auto_r2t:
                self.serve_r2t(cccid, ttag, r2to, r2tl)
            else:
                self.r2ts.append((cccid, ttag, r2to, r2tl))
        elif p.type == RSP:
            _dw0, _dw1, _sqhd, _sqid, cid, status = struct.unpack_from("<IIHHHH", p.header, 8)
            assert cid not in self.done, f"second response for cid {cid}"
            if cid in self.want and (status >> 1) == 0:
                assert self.covered[cid] == self.want[cid], "response before all its data"
            self.done[cid] = status >> 1
        else:
            raise AssertionError(f"unexpected PDU {p}")

    def wait(self, cids) -> None:
        while any(c not in self.done for c in cids):
            self.step()


@pytest.fixture(params=["engine", "inline"])
def served_by(request, monkeypatch):
    """Each byte-exact test runs against both ways a queue is served: the
    I/O engine, and in line, one command at a time (what a target without
    io_uring does; FX100IO_TARGET_INLINE forces it)."""
    if request.param == "inline":
        monkeypatch.setenv("FX100IO_TARGET_INLINE", "1")
    return request.param


@pytest.fixture
def backing(tmp_path):
    p = tmp_path / "ns1.img"
    with open(p, "wb") as f:
        f.write(os.urandom(64 * MiB))
    return str(p)


@pytest.mark.parametrize("ddgst", [False, True])
@pytest.mark.parametrize("cold", [False, True])
def test_many_reads_in_flight_byte_exact(backing, ddgst, cold, served_by):
    """64 reads of mixed sizes and alignments submitted at once on one queue
    (cached: sendfile; cold: O_DIRECT when 4 KiB-aligned, buffered else),
    more bytes than the queue's budget: every one comes back whole and
    right, its data before its response."""
    with open(backing, "rb") as f:
        content = f.read()
    rng = random.Random(7 + ddgst + 2 * cold)
    with serve([backing], NQN) as (_, port, proc):
        base = threads(proc.pid)
        a = admin(port)
        a.set_queues(1)
        q = io_queue(port, a.cntlid, 1, ddgst=ddgst)
        if cold:
            drop_cache(backing)
        pl = Pipeline(q)
        cids = {}
        for i in range(64):
            if i % 4 == 0:
                nlb = MAX_XFER // 512                           # the largest
            elif i % 4 == 1:
                nlb = rng.randrange(1, 64)                      # small, unaligned
            else:
                nlb = 8 * rng.randrange(1, 256)                 # 4 KiB multiples
            slba = rng.randrange(0, len(content) // 512 - nlb)
            if i % 2 == 0:
                slba -= slba % 8                                # 4 KiB-aligned start
            cids[pl.read(slba, nlb, 512)] = (slba * 512, nlb * 512)
        assert sum(n for _, n in cids.values()) > BUDGET
        pl.wait(list(cids))
        for cid, (off, n) in cids.items():
            assert pl.done[cid] == 0, (cid, hex(pl.done[cid]))
            assert bytes(pl.got[cid]) == content[off:off + n], f"cid {cid} at {off} len {n}"
        # the way asked for served it: in line, no engine thread beside
        # the two connections' own
        if served_by == "inline":
            assert threads(proc.pid) == base + 2
        else:
            assert threads(proc.pid) > base + 2


def test_interleaved_reads_and_writes_across_queues(backing, served_by):
    """Four queues, each with many Reads and Writes in flight at once to
    regions of its own (aligned and unaligned, some over the budget), through
    our initiator: the namespace ends up exactly as written, every read of a
    region written earlier (and waited for) returns it."""
    regions = 4 * 12
    size = 1 * MiB

    async def run(uri: str) -> None:
        with fx100io.open_device(uri) as dev:
            pool = fx100io.BufferPool(regions * size * 2 + 8 * MiB)
            bufs = [pool.alloc(size) for _ in range(regions)]
            outs = [pool.alloc(size) for _ in range(regions)]
            for i, b in enumerate(bufs):
                b[:] = chunk_bytes(f"inflight-{i}", size)

            def off(i: int) -> int:
                # every third region starts 512 bytes off a 4 KiB boundary
                return i * (size + 4096) + (512 if i % 3 == 0 else 0)

            # round 1: all writes in flight together
            assert await asyncio.gather(*(dev.write_from(off(i), bufs[i])
                                          for i in range(regions))) == [size] * regions
            # round 2: reads of round 1 interleaved with rewrites of other regions
            for i in range(0, regions, 2):
                bufs[i][:] = chunk_bytes(f"inflight-again-{i}", size)
            ops = []
            for i in range(regions):
                if i % 2 == 0:
                    ops.append(dev.write_from(off(i), bufs[i]))
                else:
                    ops.append(dev.read_into(off(i), outs[i]))
            assert await asyncio.gather(*ops) == [size] * regions
            for i in range(1, regions, 2):
                assert np.array_equal(outs[i], bufs[i]), f"region {i}"
            # round 3: everything read back, all in flight
            assert await asyncio.gather(*(dev.read_into(off(i), outs[i])
                                          for i in range(regions))) == [size] * regions
            for i in range(regions):
                assert np.array_equal(outs[i], bufs[i]), f"region {i}"

    with serve([backing], NQN) as (_, port, _proc):
        asyncio.run(run(f"nvme+tcp://127.0.0.1:{port}/{NQN}?queues=4"))
        drop_cache(backing)
        # the same bytes cold (O_DIRECT) and, directly, in the file
        asyncio.run(_check_file_matches(port, backing, regions, size))


async def _check_file_matches(port: int, backing: str, regions: int, size: int) -> None:
    with open(backing, "rb") as f:
        content = f.read()
    with fx100io.open_device(f"nvme+tcp://127.0.0.1:{port}/{NQN}?queues=2") as dev:
        pool = fx100io.BufferPool(regions * size + MiB)
        outs = [pool.alloc(size) for _ in range(regions)]
        offs = [i * (size + 4096) + (512 if i % 3 == 0 else 0) for i in range(regions)]
        await asyncio.gather(*(dev.read_into(o, b) for o, b in zip(offs, outs)))
        for i, (o, b) in enumerate(zip(offs, outs)):
            want = chunk_bytes(f"inflight-again-{i}" if i % 2 == 0 else f"inflight-{i}", size)
            assert np.array_equal(b, want), f"region {i} over the target"
            assert content[o:o + size] == want.tobytes(), f"region {i} in the file"


def test_read_after_waited_write_sees_it(backing, served_by):
    """A read sent after the host waited for a write's completion returns the
    written bytes, cached or not, aligned or not (and a read in flight with
    that write is promised nothing, so nothing is checked about it)."""
    with serve([backing], NQN) as (_, port, _proc):
        a = admin(port)
        a.set_queues(2)
        w = io_queue(port, a.cntlid, 1)
        r = io_queue(port, a.cntlid, 2)
        for i, (slba, nlb) in enumerate([(0, 8), (9, 3), (4096, 2048), (77, 1000), (0, 8)]):
            data = chunk_bytes(f"waited-{i}", nlb * 512).tobytes()
            assert w.write(slba, data, 512, incapsule=False).ok
            if i % 2:
                drop_cache(backing)
            c, got = r.read(slba, nlb, 512)
            assert c.ok and got == data, i
            c, got = w.read(slba, nlb, 512)
            assert c.ok and got == data, i


def test_write_r2t_waits_for_room_in_the_budget(backing):
    """Writes whose buffers exceed the queue's budget: R2Ts go out for those
    that fit (8 of the 4 MiB largest), the next only once one of them is done;
    every write lands."""
    n = BUDGET // MAX_XFER + 4
    with serve([backing], NQN) as (_, port, _proc):
        a = admin(port)
        a.set_queues(1)
        q = io_queue(port, a.cntlid, 1)
        pl = Pipeline(q)
        pl.auto_r2t = False
        datas = [chunk_bytes(f"budget-{i}", MAX_XFER).tobytes() for i in range(n)]
        cids = [pl.write(i * (MAX_XFER // 512), datas[i], 512) for i in range(n)]
        while len(pl.r2ts) < BUDGET // MAX_XFER:
            pl.step()
        # no further R2T while those hold the whole budget
        q.sock.settimeout(0.5)
        with pytest.raises(socket.timeout):
            q.recv_exact(1)
        q.sock.settimeout(10)
        first = pl.r2ts.pop(0)
        pl.serve_r2t(*first)
        pl.wait([first[0]])
        assert pl.done[first[0]] == 0
        pl.auto_r2t = True
        for r in pl.r2ts:
            pl.serve_r2t(*r)
        pl.r2ts.clear()
        pl.wait(cids)
        assert all(pl.done[c] == 0 for c in cids)
        for i in range(n):
            c, got = q.read(i * (MAX_XFER // 512), MAX_XFER // 512, 512)
            assert c.ok and got == datas[i], i


def _thp_mode() -> str | None:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")] if "[" in text else None


def _anon_huge_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def _kernel_gives_huge_pages() -> bool:
    """Whether a 2 MiB-aligned anonymous region advised MADV_HUGEPAGE gets a
    huge page in this process, as the target's buffers should."""
    import mmap

    before = _anon_huge_kib(os.getpid())
    m = mmap.mmap(-1, 4 * MiB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        m.madvise(mmap.MADV_HUGEPAGE)
        for off in range(0, 4 * MiB, 4096):
            m[off] = 1
        return _anon_huge_kib(os.getpid()) > before
    finally:
        m.close()


def test_large_read_buffers_are_huge_pages_and_an_idle_queue_gives_them_back(backing, monkeypatch):
    """Uncached 1 MiB reads get buffers that are whole 2 MiB transparent huge
    pages (an O_DIRECT read then reaches the disk as one request instead of
    being split at the block layer's segment limit).  Once the queue is idle
    it keeps 4 MiB (FX_TGT_IO_IDLE_CACHE) of them and gives the rest back;
    every byte read is right."""
    if _thp_mode() not in ("always", "madvise"):
        pytest.skip("transparent huge pages are off on this kernel: the target uses small pages")
    monkeypatch.delenv("FX100IO_TARGET_INLINE", raising=False)  # the engine's buffers
    n = 16
    with serve([backing], NQN) as (_, port, proc):
        before = _anon_huge_kib(proc.pid)
        a = admin(port)
        a.set_queues(1)
        q = io_queue(port, a.cntlid, 1)
        q.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        drop_cache(backing)
        pl = Pipeline(q)
        cids = [pl.read(i * (MiB // 512), MiB // 512, 512) for i in range(n)]
        # Not reading yet: the target's sends block, so it holds the buffers
        # of the reads it could not send (their disk reads are done).
        deadline = time.monotonic() + 30
        while (peak := _anon_huge_kib(proc.pid) - before) < 8 * 2048 and time.monotonic() < deadline:
            time.sleep(0.05)
        if peak == 0 and not _kernel_gives_huge_pages():
            pytest.skip("the kernel gives this machine's processes no huge page now "
                        "(fragmented memory, defrag off, or a cgroup limit)")
        assert peak >= 8 * 2048, f"only {peak} KiB of huge pages with {n} 1 MiB reads held"
        pl.wait(cids)
        with open(backing, "rb") as f:
            want = f.read(n * MiB)
        assert all(pl.done[c] == 0 for c in cids)
        assert b"".join(bytes(pl.got[c]) for c in cids) == want
        # (the engine trims an idle queue's cache after a moment: wait for it)
        deadline = time.monotonic() + 30
        while (held := _anon_huge_kib(proc.pid) - before) > 4096 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 2048 <= held <= 4096, f"{held} KiB of huge pages held by an idle queue"


class _Gather:
    """Stands in for a Host's socket while PDUs are built: what they send is
    kept, to go out in one sendall."""

    def __init__(self) -> None:
        self.out = bytearray()

    def sendall(self, b: bytes) -> None:
        self.out += b


def _built(q: Host, build: Callable[[], T]) -> tuple[T, bytes]:
    """build()'s result and the bytes of the PDUs it sent on q, not sent yet."""
    sock, gather = q.sock, _Gather()
    q.sock = gather  # type: ignore[assignment]
    try:
        return build(), bytes(gather.out)
    finally:
        q.sock = sock


def _disk_reads(dev: str) -> tuple[int, int]:
    """(reads completed, reads merged) of a block device (/sys/block/X/stat)."""
    with open(f"/sys/block/{os.path.basename(dev)}/stat") as f:
        fields = f.read().split()
    return int(fields[0]), int(fields[1])


def test_neighbouring_reads_sent_together_reach_the_disk_merged(loop_device):
    """Sixteen neighbouring 128 KiB reads that arrive together are handed to
    the kernel in one submission, so the block layer merges them into fewer,
    larger disk requests (a cloud volume reads large requests much faster);
    one submission per command never merges.  Every byte is right."""
    n, size = 16, 128 << 10
    content = os.urandom(n * size)
    fd = os.open(loop_device, os.O_RDWR)
    try:
        os.pwrite(fd, content, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    # closing a device written to makes udev probe it (reads, and pages
    # cached): that is over before the count starts and the cache is dropped
    if shutil.which("udevadm"):
        subprocess.run(["udevadm", "settle", "--timeout=30"], check=False)
    fd = os.open(loop_device, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # cold: the O_DIRECT path
    finally:
        os.close(fd)
    with serve([loop_device], NQN, block_size=4096) as (_, port, _proc):
        a = admin(port)
        a.set_queues(1)
        q = io_queue(port, a.cntlid, 1)
        pl = Pipeline(q)
        cids, out = _built(q, lambda: [pl.read(i * size // 4096, size // 4096, 4096)
                                       for i in range(n)])
        before = _disk_reads(loop_device)
        q.sock.sendall(out)  # all sixteen commands in one segment
        pl.wait(cids)
        reads, merged = (y - x for x, y in zip(before, _disk_reads(loop_device)))
    assert all(pl.done[c] == 0 for c in cids)
    assert b"".join(bytes(pl.got[c]) for c in cids) == content
    assert merged > 0 and reads < n, f"{reads} disk reads, {merged} merged, for {n} neighbouring reads"


def test_a_read_is_answered_while_the_host_is_inside_its_next_pdu(backing, served_by):
    """The engine hands a read to the kernel before it waits for more of the
    host's bytes: a read followed by the first bytes of another command is
    answered while that command is still incomplete (then the command
    completes too)."""
    with open(backing, "rb") as f:
        want = f.read(64 << 10)
    drop_cache(backing)
    with serve([backing], NQN, "--stall-timeout-ms", "60000") as (_, port, _proc):
        a = admin(port)
        a.set_queues(1)
        q = io_queue(port, a.cntlid, 1)
        pl = Pipeline(q)
        (first, second), out = _built(q, lambda: (pl.read(0, len(want) // 512, 512),
                                                  pl.read(len(want) // 512, 8, 512)))
        head = len(out) // 2 + 20  # the first command and part of the second
        q.sock.sendall(out[:head])
        q.sock.settimeout(20)  # far below the stall timeout: a read held back fails here
        pl.wait([first])
        assert pl.done[first] == 0 and bytes(pl.got[first]) == want
        q.sock.sendall(out[head:])
        pl.wait([second])
        assert pl.done[second] == 0


def test_host_vanishes_with_commands_in_flight(backing, tmp_path):
    """A host that resets its connections while reads (cached and cold),
    writes waiting for their data and writes waiting for room are in flight:
    the target stays up, serves the next host, and gives back every thread
    and file descriptor (ASan checks the memory)."""
    log = tmp_path / "target.log"
    with serve([backing], NQN, log=log) as (_, port, proc):
        base_threads, base_fds = threads(proc.pid), fds(proc.pid)
        for round_ in range(3):
            a = admin(port)
            a.set_queues(2)
            qs = [io_queue(port, a.cntlid, qid) for qid in (1, 2)]
            if round_ == 1:
                drop_cache(backing)
            for qn, q in enumerate(qs):
                pl = Pipeline(q)
                pl.auto_r2t = False
                for i in range(24):
                    pl.read((i * 8192 + qn * 4096) % (60 * 2048), MAX_XFER // 512, 512)
                for i in range(12):
                    pl.write(i * 8192, bytes(MAX_XFER), 512)
                if round_ == 2:
                    # half a write's data, then gone
                    while not pl.r2ts:
                        pl.step()
                    cid, ttag, _, _ = pl.r2ts[0]
                    q.send_pdu(H2C_DATA, struct.pack("<HHII4x", cid, ttag, 0, 65536),
                               bytes(65536))
            for h in [*qs, a]:
                h.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                h.close()
        # the target is fine and serves a new host
        a = admin(port)
        a.set_queues(1)
        q = io_queue(port, a.cntlid, 1)
        data = chunk_bytes("after", 65536).tobytes()
        assert q.write(16, data, 512, incapsule=False).ok
        c, got = q.read(16, 128, 512)
        assert c.ok and got == data
        q.close()
        a.close()
        assert settled(threads, proc.pid, base_threads) <= base_threads
        assert settled(fds, proc.pid, base_fds) <= base_fds
        assert proc.poll() is None
    text = log.read_text()
    assert "AddressSanitizer" not in text and "runtime error" not in text, text[-3000:]


class _Batch:
    """Stands in for a Host's socket while PDUs are gathered to go in one send."""

    def __init__(self, out: bytearray):
        self.sendall = out.extend


def test_fault_drop_after_with_commands_in_flight(backing):
    """--fault-drop-after still closes a connection right after its Nth PDU
    while many commands are in flight: the host gets exactly N whole PDUs
    (ICResp and the Connect response among them), then the close."""
    n = 40
    with serve([backing], NQN, "--fault-drop-after", str(n)) as (_, port, _proc):
        a = admin(port)
        a.set_queues(1)
        q = io_queue(port, a.cntlid, 1)
        pl = Pipeline(q)
        # All 32 commands leave in one send: sent one by one, the later ones
        # can meet the target's close (a reset, as it closes with commands
        # unread) on the way out, which is this test's race, not the rule.
        real, batch = q.sock, bytearray()
        q.sock = _Batch(batch)
        try:
            for i in range(32):  # 64 PDUs of answers
                pl.read(i * 8, 8, 512)
        finally:
            q.sock = real
        real.sendall(batch)
        seen = 2  # ICResp, Connect response
        with pytest.raises((Closed, ConnectionResetError)):
            while True:
                pl.step()
                seen += 1
        assert seen == n


# --- a reset or a dead controller waits for the old queues' disk I/O -------
#
# FX100IO_TARGET_FAULT_DISK_DELAY_MS holds each write for that long between
# the arrival of its last data and its disk I/O: the window in which a
# controller reset (or a new controller of the same host) used to complete
# while the old queue's write was still to land.  The check is on the bytes
# once every old thread has ended, never on a time.

DISK_DELAY_MS = "1500"


def _held_write(port: int, data: bytes):
    """An admin queue and I/O queue 1 with one write whose data is all sent
    (its disk I/O now held by the delay); returns (admin, queue)."""
    a = admin(port)
    a.set_queues(1)
    q = io_queue(port, a.cntlid, 1)
    pl = Pipeline(q)
    pl.write(0, data, 512)
    pl.step()                  # its R2T, answered with all the data
    assert not pl.done
    _wait_target_read_all(q.sock, port)
    return a, q


def _wait_target_read_all(sock: socket.socket, port: int) -> None:
    """Until the target's thread has read every byte sent on sock: none
    left in our send queue (SIOCOUTQ) nor in the target's receive queue
    (rx_queue of its end in /proc/net/tcp)."""
    import fcntl
    import termios
    me = sock.getsockname()[1]
    while True:
        outq = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        rxq = None
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, remote = fields[1], fields[2]
                if (int(local.split(":")[1], 16) == port and int(remote.split(":")[1], 16) == me):
                    rxq = int(fields[4].split(":")[1], 16)
        if outq == 0 and rxq == 0:
            return
        time.sleep(0.01)


def _media_after_old_threads_end(path: str, pid: int, base_threads: int, size: int) -> bytes:
    """Write B through another path, wait for the old queue's threads to end
    (a write still held would land by then), return what the media hold."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\xbb" * size, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    settled(threads, pid, base_threads, seconds=30)
    with open(path, "rb") as f:
        return f.read(size)


def test_controller_reset_waits_for_writes_on_the_disk(tmp_path, monkeypatch):
    """CC.EN=0 with a write of an I/O queue between its data and its disk
    I/O: once the host sees the reset done (Property Set answered, RDY 0),
    the media no longer change: data written by others then stays."""
    p = str(tmp_path / "ns.img")
    with open(p, "wb") as f:
        f.truncate(16 * MiB)
    monkeypatch.setenv("FX100IO_TARGET_FAULT_DISK_DELAY_MS", DISK_DELAY_MS)
    with serve([p], NQN) as (_, port, proc):
        base = threads(proc.pid)
        a, q = _held_write(port, b"\xaa" * MiB)
        base += 1              # the admin queue's thread stays
        assert a.prop_set(0x14, 0).ok
        assert not (a.prop_get(0x1C)[1] & 1)
        got = _media_after_old_threads_end(p, proc.pid, base, MiB)
        assert got == b"\xbb" * MiB, "a write of the reset controller landed after the reset"
        q.close()
        a.close()


def test_new_controller_waits_for_a_dead_ones_writes(tmp_path, monkeypatch):
    """The admin queue goes (the controller dies) with a write of its I/O
    queue between its data and its disk I/O; the host connects a new
    controller: by the time that Connect is answered the old write is on
    the media, and nothing of the old controller lands afterwards."""
    p = str(tmp_path / "ns.img")
    with open(p, "wb") as f:
        f.truncate(16 * MiB)
    monkeypatch.setenv("FX100IO_TARGET_FAULT_DISK_DELAY_MS", DISK_DELAY_MS)
    with serve([p], NQN) as (_, port, proc):
        base = threads(proc.pid)
        a, q = _held_write(port, b"\xaa" * MiB)
        a.sock.close()
        # the old admin queue's thread has seen the close (the controller
        # is dead); the I/O queue's two threads are still draining
        settled(threads, proc.pid, base + 2, seconds=30)
        a2 = admin(port)       # same host NQN
        base += 1
        got = _media_after_old_threads_end(p, proc.pid, base, MiB)
        assert got == b"\xbb" * MiB, "a write of the dead controller landed after the new Connect"
        q.close()
        a2.close()


# --- H2CData refused by the engine, and nothing after the C2HTermReq -------

C2H_TERM = 0x03
FES_INVALID_PDU_HDR = 0x01
FES_DATA_OUT_OF_RANGE = 0x04


@pytest.mark.parametrize("case", ["unknown-slot", "ttag-ffff", "slot-waiting-for-room",
                                  "beyond-the-r2t", "wrong-cccid"])
def test_bad_h2c_data_ends_the_queue_and_nothing_follows_the_termreq(backing, case):
    """H2CData that no R2T of the engine asked for (a slot not in use, ttag
    0xFFFF, the slot of a write still waiting for room in the budget, data
    beyond its R2T, another command's CCCID) ends the queue with a
    C2HTermReq naming the field; while reads are in flight on the engine,
    not one PDU follows it."""
    with serve([backing], NQN) as (_, port, proc):
        a = admin(port)
        a.set_queues(1)
        q = io_queue(port, a.cntlid, 1)
        pl = Pipeline(q)
        pl.auto_r2t = False
        data = os.urandom(MAX_XFER)
        wcids = [pl.write(i * (MAX_XFER // 512), data, 512) for i in range(BUDGET // MAX_XFER + 1)]
        while len(pl.r2ts) < BUDGET // MAX_XFER:
            pl.step()
        cid0, ttag0, _, _ = pl.r2ts[0]
        assert ttag0 & 0x8000
        held = {t & 0x7FFF for _, t, _, _ in pl.r2ts}
        for i in range(64):    # answers the engine is about to send
            pl.read(16384 + i * 256, 256, 512)
        fes, n = FES_INVALID_PDU_HDR, 4096
        if case == "unknown-slot":
            hdr = struct.pack("<HHII4x", cid0, 0x8000 | 1000, 0, n)
        elif case == "ttag-ffff":
            hdr = struct.pack("<HHII4x", cid0, 0xFFFF, 0, n)
        elif case == "slot-waiting-for-room":
            # the last write holds a slot but got no R2T: any slot but the
            # R2T'd ones is free, waiting for room, or a read's
            hdr = struct.pack("<HHII4x", wcids[-1], 0x8000 | min(set(range(128)) - held), 0, n)
        elif case == "beyond-the-r2t":
            n = 8192
            hdr = struct.pack("<HHII4x", cid0, ttag0, MAX_XFER - 4096, n)
            fes = FES_DATA_OUT_OF_RANGE
        else:
            hdr = struct.pack("<HHII4x", cid0 ^ 0x55, ttag0, 0, n)
        q.send_pdu(H2C_DATA, hdr, bytes(n))
        term, after = None, 0
        try:
            while True:
                p = q.recv_pdu()
                if term is not None:
                    after += 1
                elif p.type == C2H_TERM:
                    term = p
        except (Closed, ConnectionError, TimeoutError):
            pass
        assert term is not None, "no C2HTermReq"
        assert struct.unpack_from("<H", term.header, 8)[0] == fes
        assert after == 0, f"{after} PDUs after the C2HTermReq"
        assert proc.poll() is None
        assert a.cmd(sqe(0x18))[0].ok   # the controller lives on


def test_the_termreq_reaches_a_host_slow_to_read_that_sent_more(backing):
    """A host that has not yet read the answers of 2 reads (512 KiB) sends
    H2CData for no R2T and more bytes after it.  The C2HTermReq queued
    behind those answers still reaches it once it reads: the target sends
    FIN after it and drains what the host sent, instead of closing with
    unread data (a reset, which discards what is still queued to send)."""
    with serve([backing], NQN) as (_, port, proc):
        a = admin(port)
        a.set_queues(1)
        q = io_queue(port, a.cntlid, 1)
        q.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        for i in range(2):
            q.submit(sqe(0x02, nsid=1, cdw10=i * 512, cdw12=511), data_in=256 * 1024)
        time.sleep(0.3)
        q.send_pdu(H2C_DATA, struct.pack("<HHII4x", 1, 0x8000 | 1000, 0, 4096), bytes(4096))
        q.sock.sendall(bytes(65536))   # (more than the target will read)
        time.sleep(0.5)
        term = None
        try:
            while term is None:
                p = q.recv_pdu()
                if p.type == C2H_TERM:
                    term = p
        except (Closed, ConnectionError, TimeoutError):
            pass
        assert term is not None, "no C2HTermReq"
        assert proc.poll() is None
        q.close()
        a.close()

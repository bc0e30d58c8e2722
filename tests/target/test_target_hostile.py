"""Our target (`fx100io target`) under hostile or broken hosts: connections
that never speak, stop half way through the ICReq or never send Connect, a
flood beyond the connection limit, a host that stalls in the middle of a PDU
and one that stops reading.  None of them may exhaust the target's threads
or descriptors, each is closed within its deadline, and a good host (our own
initiator) is served with the right bytes all the while.  An idle but
Connected queue is legal: its controller's KATO bounds it, or without a KATO
the idle timeout (--idle-timeout-ms), and at the connection limit an idle
queue without a KATO gives way to a new host.  A PDU must arrive whole within
the stall timeout of its first byte."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
from support import REPO, chunk_bytes
from support.target_host import CMD, F_LAST, H2C_DATA, ICREQ, NQN, R2T, Closed, Host, admin, io_queue, sqe
from support.target_process import fds, serve, settled, threads

import fx100io

N_IDLE = 500


@pytest.fixture
def backing(tmp_path):
    p = tmp_path / "ns1.img"
    with open(p, "wb") as f:
        f.write(os.urandom(16 << 20))
    return str(p)


# Threads an I/O queue adds once it has moved data: the engine's own, and
# at most 2 x FX_TGT_IO_WORKERS (csrc/target/tgt.h) io_uring workers.
ENGINE_THREADS = 1 + 2 * 2



def closed_by_target(s: socket.socket, seconds: float) -> bool:
    """Drain s: True once the target closed it (EOF or reset), False when it
    is still open after seconds."""
    deadline = time.monotonic() + seconds
    # restored after: a socket left with a 1 ms timeout fails the test's next
    # recv whenever the target is slower than that (seen under ASan)
    before = s.gettimeout()
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            s.settimeout(left)
            if not s.recv(1 << 20):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    finally:
        try:
            s.settimeout(before)
        except OSError:
            pass  # closed meanwhile


def icreq_bytes() -> bytes:
    return struct.pack("<BBBBI", ICREQ, 0, 128, 0, 128) + struct.pack("<HBBI", 0, 0, 0, 0) + \
        bytes(112)


def good_host_round_trip(port: int, tag: str, off: int = 7 * 4096) -> None:
    """Our initiator: open, write 1 MiB, read it back byte for byte."""
    uri = f"nvme+tcp://127.0.0.1:{port}/{NQN}?queues=2&io_timeout_ms=10000"
    with fx100io.open_device(uri) as dev:
        pool = fx100io.BufferPool(4 << 20)
        data = pool.alloc(1 << 20)
        data[:] = chunk_bytes(tag, 1 << 20)
        dev.write_from_blocking(off, data)
        out = pool.alloc(1 << 20)
        assert dev.read_into_blocking(off, out) == 1 << 20
        assert np.array_equal(out, data)


def test_idle_and_half_open_connections_are_closed_and_a_good_host_is_served(backing, tmp_path):
    deadline_s = 5.0
    log = tmp_path / "target.log"
    with serve([backing], NQN, "--handshake-timeout-ms", str(int(deadline_s * 1000)),
               log=log) as (_, port, proc):
        base_threads, base_fds = threads(proc.pid), fds(proc.pid)
        t0 = time.monotonic()
        stale = [socket.create_connection(("127.0.0.1", port)) for _ in range(N_IDLE)]
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(icreq_bytes()[:64])  # half an ICReq, then nothing
        no_connect = Host(port)
        no_connect.icreq()  # a full ICReq/ICResp, then never a Connect
        stale += [half, no_connect.sock]
        # (the deadline runs from the target's accept, which may lag the
        # client's connect by the accept backlog: bound it by the last one)
        t_last = time.monotonic()

        # While they are all held open, a good host is served.
        good_host_round_trip(port, "while-flooded")
        assert time.monotonic() - t0 < deadline_s - 0.5, "too slow to tell the deadline apart"
        assert not any(closed_by_target(s, 0.001) for s in stale[::50]), "closed too early"
        assert threads(proc.pid) <= base_threads + len(stale) + 8

        # Each stale connection is closed by the target within its deadline.
        slack = 3.0
        for i, s in enumerate(stale):
            assert closed_by_target(s, t_last + deadline_s + slack - time.monotonic()), \
                f"stale connection {i} still open {deadline_s + slack:.0f} s after the flood"
        for s in stale:
            s.close()
        # ... and what they held is given back.
        assert settled(threads, proc.pid, base_threads) <= base_threads
        assert settled(fds, proc.pid, base_fds) <= base_fds
        good_host_round_trip(port, "after-the-flood", off=300 * 4096)
        assert proc.poll() is None
    text = log.read_text()
    assert "ICReq/Connect" in text and f"{int(deadline_s * 1000)} ms" in text, text[-3000:]
    # one summary line per sweep, not one line per connection
    assert text.count("ICReq/Connect") < 50, text[-3000:]


def test_connection_limit_refuses_at_once_with_one_log_line(backing, tmp_path):
    """With every slot a Connected queue of a controller with a live keep
    alive (idle or not: its KATO governs it), a new connection is closed at
    once, and the flood is told in a line or two, not one per connection."""
    limit = 8
    log = tmp_path / "target.log"
    with serve([backing], NQN, "--max-connections", str(limit), log=log) as (_, port, proc):
        base_threads, base_fds = threads(proc.pid), fds(proc.pid)
        a = admin(port, kato=30000)
        a.set_queues(limit - 1)
        queues = [io_queue(port, a.cntlid, qid) for qid in range(1, limit)]
        time.sleep(1.3)  # idle past the grace after which a KATO-0 queue gives way
        t0 = time.monotonic()
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", port))
            assert closed_by_target(s, 2.0), "a connection over the limit was not refused"
            s.close()
        assert time.monotonic() - t0 < 10.0
        assert threads(proc.pid) <= base_threads + limit
        # (one socket each, and the admin queue's event eventfd)
        assert fds(proc.pid) <= base_fds + limit + 1
        # the Connected ones are all served
        for i, q in enumerate(queues):
            blk = os.urandom(512)
            assert q.write(i, blk, 512).ok and q.read(i, 1, 512)[1] == blk
        assert a.cmd(sqe(0x18))[0].ok
        for q in queues:
            q.close()
        a.close()
        time.sleep(0.5)  # once they are gone, good hosts get in again
        good_host_round_trip(port, "after-the-limit")
    text = log.read_text()
    refused = [line for line in text.splitlines() if "refused" in line]
    assert refused, text[-3000:]
    assert f"limit {limit}" in refused[0] and "--max-connections" in refused[0], refused[0]
    assert len(refused) <= 15, refused  # at most one a second


def test_at_the_limit_handshakes_give_way_to_new_connections(backing, tmp_path):
    """A flood of idle sockets beyond the limit cannot lock hosts out until
    the handshake deadline: the oldest connection still in its handshake is
    closed to make room, and Connected queues are never touched."""
    limit = 16
    log = tmp_path / "target.log"
    with serve([backing], NQN, "--max-connections", str(limit), log=log) as (_, port, proc):
        base_threads, base_fds = threads(proc.pid), fds(proc.pid)
        a = admin(port, kato=0)
        q = io_queue(port, a.cntlid, 1)
        flood = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
        # the flood evicted its own oldest members, not the Connected queues
        for i, s in enumerate(flood[:100]):
            # (a wait, not a bound: an ASan build on a loaded machine accepts slowly)
            assert closed_by_target(s, 30.0), f"flood connection {i} was not evicted"
        blk = os.urandom(512)
        assert q.write(9, blk, 512).ok and q.read(9, 1, 512)[1] == blk
        # (the burst is over: those evicted are gone; the queue that moved
        # data has its I/O engine: one more thread, and io_uring's workers)
        want = base_threads + limit + ENGINE_THREADS
        assert settled(threads, proc.pid, want) <= want
        # a good host gets in (and its own connections are not evicted once
        # Connected, while the flood goes on)
        more: list[socket.socket] = []
        with fx100io.open_device(f"nvme+tcp://127.0.0.1:{port}/{NQN}?queues=2") as dev:
            more += [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
            pool = fx100io.BufferPool(1 << 20)
            data = pool.alloc(256 << 10)
            data[:] = chunk_bytes("evict", 256 << 10)
            dev.write_from_blocking(1 << 20, data)
            out = pool.alloc(256 << 10)
            assert dev.read_into_blocking(1 << 20, out) == 256 << 10
            assert np.array_equal(out, data)
        assert a.cmd(sqe(0x18))[0].ok
        # (three queues moved data: q and the device's two, each with its
        # engine's threads and io_uring's fd; 64 closing ones may not be
        # reaped yet, and on a loaded machine the flood's last may still be
        # on their way out: the bound holds once they are)
        want = base_threads + limit + 64 + 3 * ENGINE_THREADS
        assert settled(threads, proc.pid, want) <= want
        want = base_fds + limit + 64 + 3
        assert settled(fds, proc.pid, want) <= want
        for s in flood + more:
            s.close()
    text = log.read_text()
    assert "to make room" in text and f"limit {limit}" in text, text[-3000:]
    assert text.count("to make room") <= 15, text[-3000:]


def test_idle_connected_queues_are_not_reaped(backing, tmp_path):
    """Connected queues with no traffic (KATO 0 on the raw host; our initiator
    keeps its controller alive) outlive the handshake and stall timeouts (the
    idle timeout of a KATO-0 controller is 5 minutes by default)."""
    with serve([backing], NQN, "--handshake-timeout-ms", "300", "--stall-timeout-ms", "300",
               log=tmp_path / "target.log") as (_, port, proc):
        a = admin(port, kato=0)
        a.set_queues(1)
        q = io_queue(port, a.cntlid, 1)
        uri = f"nvme+tcp://127.0.0.1:{port}/{NQN}?queues=1&io_timeout_ms=10000"
        with fx100io.open_device(uri) as dev:
            pool = fx100io.BufferPool(1 << 20)
            data = pool.alloc(64 << 10)
            data[:] = chunk_bytes("idle", 64 << 10)
            dev.write_from_blocking(0, data)
            time.sleep(2.0)  # > 6x each timeout, no traffic on q or a
            blk = os.urandom(4096)
            assert q.write(1000, blk, 512).ok  # (away from dev's 64 KiB at 0)
            cqe, back = q.read(1000, 8, 512)
            assert cqe.ok and back == blk
            assert a.cmd(sqe(0x18))[0].ok
            out = pool.alloc(64 << 10)
            assert dev.read_into_blocking(0, out) == 64 << 10
            assert np.array_equal(out, data)
        assert proc.poll() is None


def test_stall_in_the_middle_of_a_pdu_drops_only_that_queue(backing, tmp_path):
    log = tmp_path / "target.log"
    with serve([backing], NQN, "--stall-timeout-ms", "500", log=log) as (_, port, proc):
        a = admin(port, kato=0)
        a.set_queues(2)
        q = io_queue(port, a.cntlid, 1)
        q.sock.sendall(struct.pack("<BBBBI", CMD, 0, 72, 0, 72) + bytes(20))  # 28 of 72 bytes
        t0 = time.monotonic()
        assert closed_by_target(q.sock, 4.0)
        assert time.monotonic() - t0 >= 0.4
        # the controller and its other queues go on
        assert a.cmd(sqe(0x18))[0].ok
        q2 = io_queue(port, a.cntlid, 2)
        blk = os.urandom(512)
        assert q2.write(5, blk, 512).ok and q2.read(5, 1, 512)[1] == blk
        assert proc.poll() is None
    assert "stalled" in log.read_text()


def test_host_that_stops_reading_is_dropped(backing, tmp_path):
    log = tmp_path / "target.log"
    with serve([backing], NQN, "--stall-timeout-ms", "1000", log=log) as (_, port, proc):
        base_threads = threads(proc.pid)
        a = admin(port, kato=0)
        q = io_queue(port, a.cntlid, 1)
        n, each = 20, 4 << 20
        for i in range(n):  # 80 MiB of reads, and we read none of it
            q.submit(sqe(0x02, nsid=1, cdw10=(i % 4) * 8192, cdw12=8191), data_in=each)
        time.sleep(3.0)
        got = 0
        q.sock.settimeout(5.0)
        try:
            while True:
                b = q.sock.recv(1 << 20)
                if not b:
                    break
                got += len(b)
        except ConnectionResetError:
            pass
        except TimeoutError:
            pytest.fail(f"the target still holds the connection ({got} bytes read)")
        assert got < n * each
        assert a.cmd(sqe(0x18))[0].ok  # the controller is fine
        a.close()
        q.close()
        assert settled(threads, proc.pid, base_threads) <= base_threads
    # (which of our send timeout and TCP's user timeout fires first depends on
    # how the kernel trickles window updates: either way the queue is closed)
    text = log.read_text()
    assert "qid 1: host stopped reading" in text or "qid 1: connection ended" in text, text


def test_host_that_resets_while_reading_is_not_called_a_stopped_reader(backing, tmp_path):
    """A host that reads briskly and then resets the connection in the middle
    of our sends ended it itself: no "host stopped reading" line (its window
    was open), and the target serves on."""
    log = tmp_path / "target.log"
    with serve([backing], NQN, "--stall-timeout-ms", "1000", log=log) as (_, port, proc):
        a = admin(port, kato=0)
        a.set_queues(2)
        q = io_queue(port, a.cntlid, 1)
        n, each = 20, 4 << 20
        for i in range(n):
            q.submit(sqe(0x02, nsid=1, cdw10=(i % 4) * 8192, cdw12=8191), data_in=each)
        got = 0
        q.sock.settimeout(5.0)
        while got < 16 << 20:
            b = q.sock.recv(1 << 20)
            assert b, f"the target closed after {got} bytes"
            got += len(b)
        q.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        q.sock.close()  # a reset, with our window open
        time.sleep(0.5)
        assert a.cmd(sqe(0x18))[0].ok
        q2 = io_queue(port, a.cntlid, 2)
        blk = os.urandom(512)
        assert q2.write(7, blk, 512).ok and q2.read(7, 1, 512)[1] == blk
        a.close()
        q2.close()
        assert proc.poll() is None
    assert "host stopped reading" not in log.read_text()


@pytest.mark.parametrize("inline", [False, True], ids=["engine", "inline"])
def test_a_queue_the_keep_alive_ends_gets_no_second_reason(backing, tmp_path, monkeypatch,
                                                           inline):
    """Keep alive expires while a send of reads to a host that does not read
    is blocked (in the queue's engine, or in its own thread when served in
    line): the target says why once (KATO); the send its shutdown broke adds
    no "connection ended: Broken pipe"."""
    if inline:
        monkeypatch.setenv("FX100IO_TARGET_INLINE", "1")
    log = tmp_path / "target.log"
    with serve([backing], NQN, "--stall-timeout-ms", "20000", log=log) as (_, port, proc):
        a = admin(port, kato=1000)
        q = io_queue(port, a.cntlid, 1)
        for i in range(20):  # 80 MiB of reads, none read while KATO runs out
            q.submit(sqe(0x02, nsid=1, cdw10=(i % 4) * 8192, cdw12=8191), data_in=4 << 20)
        deadline = time.monotonic() + 10
        while "no command within KATO" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert closed_by_target(q.sock, 10.0)
        assert proc.poll() is None
        q.close()
        a.close()
    text = log.read_text()
    assert "qid 1: connection ended" not in text, text
    assert "qid 1: host stopped reading" not in text, text


def test_a_write_whose_data_never_comes_holds_no_thread_forever(backing, tmp_path):
    """A Connected queue that got our R2T and never sends the data: the
    write's data is due within 2 x the stall timeout of its R2T (so the I/O
    queue may go first), and when the controller's KATO expires, everything
    goes."""
    with serve([backing], NQN, "--stall-timeout-ms", "300",
               log=tmp_path / "target.log") as (_, port, proc):
        base_threads = threads(proc.pid)
        a = admin(port, kato=1000)
        q = io_queue(port, a.cntlid, 1)
        q.submit(sqe(0x01, nsid=1, cdw12=63), bytes(64 * 512), incapsule=False)
        assert q.recv_pdu().type == 9  # R2T, and we never answer it
        for _ in range(3):
            time.sleep(0.4)
            assert a.cmd(sqe(0x18))[0].ok
        # keep alive stops: KATO (1 s) expires, both queues are closed
        for h in (a, q):
            assert closed_by_target(h.sock, 5.0)
        assert settled(threads, proc.pid, base_threads) <= base_threads
        with pytest.raises((Closed, ConnectionResetError, BrokenPipeError)):
            a.cmd(sqe(0x18))


@pytest.mark.parametrize("args, msg", [
    (["--max-connections", "0"], "--max-connections"),
    (["--handshake-timeout-ms", "0"], "--handshake-timeout-ms"),
    (["--stall-timeout-ms", "-5"], "--stall-timeout-ms"),
    (["--idle-timeout-ms", "-1"], "--idle-timeout-ms"),
])
def test_cli_refuses_bad_limits(tmp_path, args, msg):
    ns = tmp_path / "ns.img"
    ns.write_bytes(bytes(1 << 20))
    p = subprocess.run([sys.executable, "-m", "fx100io", "target", "--namespace", str(ns), *args],
                       capture_output=True, text=True, timeout=60, cwd=str(REPO))
    assert p.returncode == 2, p
    assert msg in p.stderr, p.stderr


def test_binding_takes_the_limits(backing):
    """target_serve(..., max_connections=, handshake_timeout_ms=,
    stall_timeout_ms=, idle_timeout_ms=): a connection that never sends ICReq
    is closed, and a silent KATO-0 controller's queue too."""
    import threading

    from fx100io import _core

    ports: list[int] = []
    ready = threading.Event()

    def run() -> None:
        _core.target_serve("127.0.0.1", "0", NQN, [backing], quiet=True, max_connections=4,
                           handshake_timeout_ms=300, stall_timeout_ms=300, idle_timeout_ms=500,
                           ready=lambda p: (ports.append(p), ready.set()))

    th = threading.Thread(target=run, daemon=True)
    th.start()
    try:
        assert ready.wait(10)
        s = socket.create_connection(("127.0.0.1", ports[0]))
        t0 = time.monotonic()
        assert closed_by_target(s, 5.0)
        assert 0.2 <= time.monotonic() - t0 < 3.0
        s.close()
        extra = [socket.create_connection(("127.0.0.1", ports[0])) for _ in range(6)]
        time.sleep(0.3)
        assert sum(closed_by_target(x, 0.5) for x in extra[4:]) == 2  # over the limit
        for x in extra:
            x.close()
        time.sleep(0.5)
        a = admin(ports[0], kato=0)
        t0 = time.monotonic()
        assert closed_by_target(a.sock, 5.0)
        assert 0.3 <= time.monotonic() - t0 < 3.0
    finally:
        _core.target_stop()
        th.join(10)
    assert not th.is_alive()


def test_admin_data_buffers_per_connection_are_bounded(backing, tmp_path):
    """Admin and Fabrics commands whose data comes by R2T are collected in a
    buffer each (up to 64 KiB): a host that asks for many and never sends
    the data gets only a few; the rest fail at once (retryable)."""
    with serve([backing], NQN, log=tmp_path / "target.log") as (_, port, proc):
        a = admin(port, kato=0)
        n = 40
        cids = []
        for _ in range(n):  # Set Features (Host Identifier), 64 KiB by R2T
            cids.append(a.submit(sqe(0x09, cdw10=0x81), bytes(65536), incapsule=False))
        r2ts, fails = [], 0
        for _ in range(n):
            p = a.recv_pdu()
            if p.type == 9:  # R2T
                cccid, ttag, r2to, r2tl = struct.unpack_from("<HHII", p.header, 8)
                assert r2to == 0 and r2tl == 65536
                r2ts.append((cccid, ttag))
            else:
                assert p.type == 5, p  # CapsuleResp: refused, retryable
                status = struct.unpack_from("<H", p.header, 8 + 14)[0] >> 1
                assert status & 0x7FF and not status & 0x4000, hex(status)
                fails += 1
        assert 1 <= len(r2ts) <= 8 and fails == n - len(r2ts), (len(r2ts), fails)
        # the data for the first one comes: it completes; then a new one is taken
        cccid, ttag = r2ts[0]
        off = 0
        while off < 65536:
            k = min(a.maxh2cdata, 65536 - off)
            last = 4 if off + k == 65536 else 0
            a.send_pdu(6, struct.pack("<HHII4x", cccid, ttag, off, k), bytes(k), flags=last)
            off += k
        p = a.recv_pdu()
        assert p.type == 5 and struct.unpack_from("<H", p.header, 8 + 12)[0] == cccid
        cid = a.submit(sqe(0x09, cdw10=0x81), bytes(65536), incapsule=False)
        p = a.recv_pdu()
        assert p.type == 9 and struct.unpack_from("<H", p.header, 8)[0] == cid
        assert proc.poll() is None


def test_at_the_limit_a_silent_kato0_host_gives_way_to_a_good_host(backing, tmp_path):
    """A raw host with keep alive off (KATO 0) fills the connection limit and
    goes silent: a good host still gets in (the longest idle KATO-0 queue is
    closed for it), while a controller whose keep alive arrives keeps its
    idle queues."""
    limit = 6
    log = tmp_path / "target.log"
    with serve([backing], NQN, "--max-connections", str(limit), log=log) as (_, port, proc):
        kb = admin(port, kato=3000)  # KATO'd, keeps its controller alive below
        kb.set_queues(1)
        kq = io_queue(port, kb.cntlid, 1)
        a = admin(port, kato=0)
        a.set_queues(3)
        silent = [a] + [io_queue(port, a.cntlid, qid) for qid in range(1, 4)]
        for _ in range(4):  # > the 1 s grace; only kb speaks
            time.sleep(0.4)
            assert kb.cmd(sqe(0x18))[0].ok
        good_host_round_trip(port, "evicts-the-silent")
        assert sum(closed_by_target(h.sock, 2.0) for h in silent) >= 3
        # the KATO'd controller and its idle queue were not touched
        assert kb.cmd(sqe(0x18))[0].ok
        blk = os.urandom(512)
        assert kq.write(3, blk, 512).ok and kq.read(3, 1, 512)[1] == blk
        assert proc.poll() is None
    text = log.read_text()
    lines = [ln for ln in text.splitlines() if "idle" in ln and "to make room" in ln]
    assert lines and "KATO 0" in lines[0], text[-3000:]
    assert len(lines) <= 5, lines


def test_idle_kato0_connections_are_reaped_and_kato_hosts_are_not(backing, tmp_path):
    """--idle-timeout-ms: Connected queues of a controller without keep alive
    that receive nothing for that long are closed, in one log line per sweep;
    a controller whose host sends keep alives keeps its idle I/O queue."""
    idle_ms = 1000
    log = tmp_path / "target.log"
    with serve([backing], NQN, "--idle-timeout-ms", str(idle_ms), log=log) as (_, port, proc):
        base_threads = threads(proc.pid)
        kb = admin(port, kato=1500)
        kb.set_queues(1)
        kq = io_queue(port, kb.cntlid, 1)
        silent = []
        for _ in range(3):
            a = admin(port, kato=0)
            a.set_queues(2)
            silent += [a, io_queue(port, a.cntlid, 1), io_queue(port, a.cntlid, 2)]
        t_last = time.monotonic()
        assert not any(closed_by_target(h.sock, 0.001) for h in silent)
        # a good host is served while they sit there
        good_host_round_trip(port, "beside-the-idle")
        slack = 1.5
        reaped_at = []
        for i, h in enumerate(silent):
            assert closed_by_target(h.sock, t_last + idle_ms / 1000 + slack - time.monotonic()), \
                f"silent connection {i} still open"
            reaped_at.append(time.monotonic())
        assert min(reaped_at) - t_last >= idle_ms / 1000 - 0.15, "reaped too early"
        # the KATO'd host: keep alive on the admin queue only, I/O queue idle
        for _ in range(8):  # 3.2 s > 3x the idle timeout
            time.sleep(0.4)
            assert kb.cmd(sqe(0x18))[0].ok
        assert not closed_by_target(kq.sock, 0.001)
        blk = os.urandom(512)
        assert kq.write(11, blk, 512).ok and kq.read(11, 1, 512)[1] == blk
        kb.close()
        kq.close()
        assert settled(threads, proc.pid, base_threads) <= base_threads
        assert proc.poll() is None
    text = log.read_text()
    lines = [ln for ln in text.splitlines() if "--idle-timeout-ms" in ln]
    assert lines and f"{idle_ms} ms" in lines[0] and "KATO 0" in lines[0], text[-3000:]
    assert len(lines) <= 9, lines  # per sweep, not per connection (9 closed)


def test_a_pdu_dripped_byte_by_byte_is_bounded_by_the_stall_timeout(backing, tmp_path):
    """The stall timeout bounds a whole PDU from its first byte: a host that
    sends a capsule header one byte every stall/3 is closed after about
    stall_ms, and a normal host (1 MiB writes and reads) is unaffected."""
    stall_ms = 600
    log = tmp_path / "target.log"
    with serve([backing], NQN, "--stall-timeout-ms", str(stall_ms), log=log) as (_, port, proc):
        a = admin(port, kato=0)
        a.set_queues(1)
        q = io_queue(port, a.cntlid, 1)
        hdr = struct.pack("<BBBBI", CMD, 0, 72, 0, 72) + bytes(64)
        t0 = time.monotonic()
        closed = False
        for i in range(len(hdr)):
            try:
                q.sock.send(hdr[i:i + 1])
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if closed_by_target(q.sock, stall_ms / 3000):
                closed = True
                break
        took = time.monotonic() - t0
        assert closed, "a dripped PDU held the queue for 72 x stall/3"
        assert stall_ms / 1000 - 0.1 <= took < stall_ms / 1000 + 1.0, took
        good_host_round_trip(port, "after-the-drip")
        assert a.cmd(sqe(0x18))[0].ok
        assert proc.poll() is None
    assert "stalled" in log.read_text()


def test_a_kato0_queue_waiting_for_write_data_is_not_idle(backing, tmp_path):
    """A queue that sent an R2T is in the middle of a write: a KATO-0 host
    that takes longer than --idle-timeout-ms to send the data keeps its
    queue, and the write completes with the right bytes."""
    idle_ms = 800
    with serve([backing], NQN, "--idle-timeout-ms", str(idle_ms)) as (_, port, proc):
        a = admin(port, kato=0)
        a.set_queues(1)
        q = io_queue(port, a.cntlid, 1)
        data = os.urandom(64 << 10)
        cid = q.submit(sqe(0x01, nsid=1, cdw10=40, cdw12=len(data) // 512 - 1), data,
                       incapsule=False)
        p = q.recv_pdu()
        assert p.type == R2T, p
        cccid, ttag, r2to, r2tl = struct.unpack_from("<HHII", p.header, 8)
        assert (cccid, r2to, r2tl) == (cid, 0, len(data))
        time.sleep(idle_ms / 1000 * 3)  # the host is slow to send its data
        assert not closed_by_target(q.sock, 0.001), "reaped while a write waited for its data"
        q.send_pdu(H2C_DATA, struct.pack("<HHII4x", cid, ttag, 0, len(data)), data,
                   flags=F_LAST)
        cqe, _, _ = q.complete(cid, data)
        assert cqe.ok
        # The data arrived just now: the controller is active, and its admin queue
        # (which saw no command for the whole wait) is not reaped as idle now that
        # the write ended (the idle sweep runs every 100 ms).
        time.sleep(idle_ms / 1000 / 3)
        assert q.read(40, len(data) // 512, 512)[1] == data
        assert proc.poll() is None


def _write_all_but_the_last_pdu(q, cid: int, ttag: int, data: bytes) -> None:
    off = 0
    while off + q.maxh2cdata < len(data):
        q.send_pdu(H2C_DATA, struct.pack("<HHII4x", cid, ttag, off, q.maxh2cdata),
                   data[off:off + q.maxh2cdata], flags=0)
        off += q.maxh2cdata


@pytest.mark.parametrize("chatty", [False, True])
def test_writes_whose_data_stops_short_do_not_hold_buffers_forever(tmp_path, chatty):
    """A KATO-0 host sends all but the last H2CData of as many 4 MiB writes
    as the queue's budget holds (32 MiB of buffers held) and then falls
    silent, or keeps the queue busy with other commands: each write's data
    is due within 2 x --stall-timeout-ms of its R2T, so the queue is closed
    (and its buffers freed) instead of held for ever; its controller and a
    good queue beside it live on."""
    log = tmp_path / "target.log"
    backing = str(tmp_path / "ns-32m.img")
    with open(backing, "wb") as f:
        f.truncate(32 << 20)
    with serve([backing], NQN, "--stall-timeout-ms", "300", "--idle-timeout-ms", "0",
               log=log) as (_, port, proc):
        a = admin(port, kato=0)
        a.set_queues(2)
        q = io_queue(port, a.cntlid, 1)
        good = io_queue(port, a.cntlid, 2)
        data = os.urandom(4 << 20)
        cids = [q.submit(sqe(0x01, nsid=1, cdw10=i * 8192, cdw12=8192 - 1), data,
                         incapsule=False) for i in range(8)]
        r2ts = []
        while len(r2ts) < len(cids):
            p = q.recv_pdu()
            assert p.type == R2T, p
            r2ts.append(struct.unpack_from("<HH", p.header, 8))
        for cid, ttag in r2ts:
            _write_all_but_the_last_pdu(q, cid, ttag, data)
        if chatty:
            # other commands all along: never silent between PDUs
            deadline = time.monotonic() + 30
            with pytest.raises((Closed, ConnectionResetError, BrokenPipeError)):
                while time.monotonic() < deadline:
                    c, _ = q.read(0, 8, 512)
                    assert c.ok
        assert closed_by_target(q.sock, 30.0), "a queue holding unfinished writes stays open"
        assert "not all of a write's data within 600 ms of its R2T" in log.read_text()
        c, got = good.read(0, 8, 512)
        assert c.ok and len(got) == 4096
        assert a.cmd(sqe(0x18))[0].ok
        assert proc.poll() is None


def test_connection_limit_from_the_open_files_limit_leaves_room_for_engines(backing, tmp_path):
    """Under a low `ulimit -n` the connection limit is lowered so that every
    connection up to it can also hold its I/O engine's io_uring and eventfd
    descriptors (and each namespace its two): filled to the limit with queues that
    moved data, no descriptor runs out (no EMFILE in accept(), no queue
    falling back to in-line service for want of one)."""
    import re
    import resource

    def low_limit() -> None:
        # (soft and hard: the CLI lifts the soft limit toward the hard one)
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))

    log = tmp_path / "target.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "fx100io", "target", "--listen",
                                 "127.0.0.1:0", "--nqn", NQN, "--namespace", backing],
                                stdout=subprocess.PIPE, stderr=err, text=True, cwd=str(REPO),
                                preexec_fn=low_limit)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert "nvme+tcp://" in line, log.read_text()
        port = int(line.split("nvme+tcp://", 1)[1].split("/", 1)[0].rpartition(":")[2])
        m = re.search(r"connection limit lowered from \d+ to (\d+)", log.read_text())
        assert m, log.read_text()
        limit = int(m.group(1))
        hosts = []
        while len(hosts) < limit:
            a = admin(port)
            hosts.append(a)
            n = min(32, limit - len(hosts))
            if n:
                a.set_queues(n)
            for qid in range(1, n + 1):
                q = io_queue(port, a.cntlid, qid)
                hosts.append(q)
                c, _ = q.read(qid, 1, 512)
                assert c.ok
        text = log.read_text()
        assert "accept:" not in text and "Too many open files" not in text, text[-2000:]
        assert "serve one command at a time" not in text, text[-2000:]
        assert proc.poll() is None
        for h in hosts:
            h.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)

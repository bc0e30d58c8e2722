"""What any host can make our target (`fx100io target`) spend, bounded
target-wide: the data of a Connect before the host is known, DH work of
DH-HMAC-CHAP before authentication (per peer address, whatever host NQN it
names), the I/O buffers of all connections together (--io-buffer-budget,
shared fairly between peer addresses), and log lines.  Each test opens many
connections against its bound and checks it with counts, status codes and
bytes; a good host is served all the while.

Loopback has many addresses: a client socket bound to 127.0.0.2 is another
peer to the target than one from 127.0.0.1."""

from __future__ import annotations

import os
import re
import socket
import struct
import threading
import time

import pytest
from support import target_auth_host as auth
from support.target_host import CMD, HOST_A, NQN, R2T, RSP, Closed, Host, sqe, start_target

__all__ = ["start_target"]  # (the fixture, imported for this module's tests)

SC_SGL_LENGTH_INVALID = 0x0F  # Data SGL Length Invalid (generic)
DNR = 0x4000


def from_addr(port: int, addr: str, timeout: float = 10) -> Host:
    """A Host whose connection comes from addr (a loopback address)."""
    h = Host.__new__(Host)
    s = socket.socket()
    s.settimeout(timeout)
    s.bind((addr, 0))
    s.connect(("127.0.0.1", port))
    h.__init__(port, timeout=timeout)  # (sets the fields; its own socket goes)
    h.sock.close()
    h.sock = s
    return h


def connect_capsule(length: int, incapsule: bool) -> tuple[bytearray, bytes]:
    c = bytearray(64)
    c[0], c[1], c[4] = 0x7F, 0x40, 0x01  # Fabrics Connect, SGL
    struct.pack_into("<HHHBxI", c, 40, 0, 0, 31, 0, 0)
    struct.pack_into("<H", c, 2, 1)
    struct.pack_into("<QI3xB", c, 24, 0, length, 0x01 if incapsule else 0x5A)
    return c, bytes(length) if incapsule else b""


def test_connect_data_must_be_exactly_1024_bytes(start_target):
    """A Connect whose data SGL is not 1024 bytes gets Data SGL Length
    Invalid (DNR) at once, no R2T and no buffer for it, and the connection
    ends; a proper Connect on a new connection is served."""
    t = start_target()
    for length, incapsule in ((65536, False), (4096, False), (512, False), (0, False),
                              (2048, True), (1000, True)):
        h = Host(t.port)
        h.icreq()
        c, icd = connect_capsule(length, incapsule)
        h.send_pdu(CMD, bytes(c), icd)
        p = h.recv_pdu()
        assert p.type != R2T, f"R2T for a {length}-byte Connect"
        assert p.type == RSP, p
        status = struct.unpack_from("<H", p.header, 8 + 14)[0] >> 1
        assert status == DNR | SC_SGL_LENGTH_INVALID, (length, hex(status))
        try:
            h.recv_pdu()
            raise AssertionError(f"connection open after a {length}-byte Connect")
        except (Closed, ConnectionResetError):
            pass
        h.close()
    h = Host(t.port)
    h.icreq()
    assert h.connect(0, incapsule=False).ok
    h.enable()
    h.close()
    t.stop()
    assert "Connect with 65536 bytes of data (must be 1024)" in t.stderr


def test_log_lines_are_bounded_target_wide(start_target):
    """Every malformed first PDU is worth a line about its connection; 600
    connections that each send one make at most the burst (100) plus 20 a
    second, and the lines left out are counted in the log."""
    t = start_target()
    t0 = time.monotonic()
    n = 600
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", t.port), timeout=5)
        s.sendall(struct.pack("<BBBBI", CMD, 0, 72, 0, 72) + bytes(64))  # not an ICReq
        s.recv(256)  # its C2HTermReq
        s.close()
    time.sleep(1.2)  # (the listener says what it left out once the flood is over)
    elapsed = time.monotonic() - t0
    h = Host(t.port)  # still served
    h.icreq()
    assert h.connect(0).ok
    h.close()
    t.stop()
    lines = [x for x in t.stderr.splitlines() if "first PDU is not an ICReq" in x]
    left_out = sum(int(m) for m in re.findall(r"\((\d+) log lines? left out", t.stderr))
    assert len(lines) <= 100 + 20 * elapsed + 1, (len(lines), elapsed)
    assert len(lines) + left_out >= n, (len(lines), left_out)


def test_a_log_flood_does_not_hide_failed_authentications(start_target):
    """While connections from 127.0.0.5 flood the log with malformed first
    PDUs, a host at 127.0.0.9 fails authentication 10 times (wrong secret):
    every failure is in the log, as its own line or counted in a line like
    "127.0.0.9: 3 x failed authentication as host ..." (lines that matter
    are never left out silently)."""
    t = auth.keyed(start_target)
    stop = time.monotonic() + 3.0

    def flood() -> None:
        while time.monotonic() < stop:
            s = socket.socket()
            s.bind(("127.0.0.5", 0))
            s.connect(("127.0.0.1", t.port))
            s.sendall(struct.pack("<BBBBI", CMD, 0, 72, 0, 72) + bytes(64))
            try:
                s.recv(256)
            except OSError:
                pass
            s.close()

    th = threading.Thread(target=flood)
    th.start()
    time.sleep(0.5)
    for _ in range(10):
        h = _auth_host(t.port, "127.0.0.9")
        assert "failure" in auth.authenticate(h, auth.SECRET_B, groups=(0,))
        h.close()
        time.sleep(0.1)
    th.join()
    time.sleep(1.5)  # (the counts are said within a second)
    t.stop()
    log = t.stderr
    assert "left out" in log  # (the flood was over the bucket)
    whole = [x for x in log.splitlines()
             if "127.0.0.9" in x and "failed DH-HMAC-CHAP authentication" in x]
    counted = sum(int(m) for m in re.findall(
        r"127\.0\.0\.9: (\d+) x failed authentication as host " + re.escape(HOST_A), log))
    assert len(whole) + counted == 10, (len(whole), counted)


# ------------------------------------------- DH work before authentication

def _auth_host(port: int, addr: str, hostnqn: str = HOST_A) -> Host:
    h = from_addr(port, addr)
    h.icreq()
    assert h.connect(0, hostnqn=hostnqn).ok
    return h


def _challenge(h: Host, tid: int) -> bool:
    """Negotiate ffdhe8192 and receive: True for a Challenge (the target made
    a DH key pair for it), False for a Failure1."""
    assert auth.send(h, auth.negotiate(tid, groups=(5,))).ok
    cqe, m = auth.receive(h)
    assert cqe.ok, cqe
    if auth.failure(m):
        return False
    assert auth.parse_challenge(m)["group"] == 5
    return True


def test_abandoned_transactions_count_as_failures(start_target):
    """A host that takes our Challenge (a DH key pair, ffdhe8192) and never
    answers, starting another transaction, sending Failure2 or closing the
    connection instead, fails as one with a wrong secret does: after 16 from one
    address its next one waits (Failure1 at once, no DH work), each is
    logged, and a host at another address is not held back."""
    t = auth.keyed(start_target, "--dhchap-dhgroup", "ffdhe8192")
    for _ in range(4):
        h = _auth_host(t.port, "127.0.0.1")
        # two left for the next Negotiate, one ended with Failure2, the
        # last left by the close
        for tid in range(4):
            assert _challenge(h, tid)
            if tid == 2:
                assert auth.send(h, struct.pack("<BBHHBB", 0, 0xF0, 0, tid, 1,
                                                auth.RC_FAILED)).ok
        h.close()
    time.sleep(0.3)  # (the closes are seen by the target's threads)
    h = _auth_host(t.port, "127.0.0.1")
    assert not _challenge(h, 9), "a 17th challenge at once"
    h.close()
    h = _auth_host(t.port, "127.0.0.2")
    assert "failure" not in auth.authenticate(h, auth.SECRET_A, groups=(5,))
    h.close()
    log = auth.log_of(t)
    assert log.count("abandoned DH-HMAC-CHAP authentication after our challenge (started "
                     "another)") == 8, log
    assert log.count("ended DH-HMAC-CHAP authentication with Failure2") == 4, log
    assert log.count("abandoned DH-HMAC-CHAP authentication after our challenge (closed the "
                     "connection)") == 4, log
    assert "too many failed attempts from this address" in log


def test_dh_work_per_address_is_bounded_whatever_host_nqn(start_target):
    """Two threads from 127.0.0.1 take Challenges and abandon them, cycling
    through 8 host NQNs that each have a secret (so that no per-host count
    stops them) for 3 s: they get at most 32 + 4 a second, the rest a
    Failure1 at once; meanwhile a host at 127.0.0.2 authenticates with
    ffdhe8192 in well under a second."""
    nqns = [HOST_A[:-2] + f"{0xa0 + i:02x}" for i in range(8)]
    keys = [a for n in nqns for a in ("--dhchap-key", f"{n}={auth.SECRET_A}")]
    t = start_target(*keys, "--dhchap-dhgroup", "ffdhe8192")
    served, refused = [0], [0]
    stop = time.monotonic() + 3.0

    def abuse(k: int) -> None:
        i = k
        while time.monotonic() < stop:
            h = _auth_host(t.port, "127.0.0.1", nqns[i % len(nqns)])
            for tid in range(4):
                if _challenge(h, tid):
                    served[0] += 1
                else:
                    refused[0] += 1
            h.close()
            i += 2

    t0 = time.monotonic()
    threads = [threading.Thread(target=abuse, args=(k,)) for k in range(2)]
    for th in threads:
        th.start()
    time.sleep(1.5)
    h = _auth_host(t.port, "127.0.0.2", nqns[0])
    a0 = time.monotonic()
    ch = auth.authenticate(h, auth.SECRET_A, hostnqn=nqns[0], groups=(5,))
    took = time.monotonic() - a0
    h.close()
    for th in threads:
        th.join()
    elapsed = time.monotonic() - t0
    assert "failure" not in ch and ch["group"] == 5
    assert took < 1.0, f"{took:.2f} s to authenticate beside the abuse"
    assert refused[0] > 0
    assert served[0] <= 32 + 4 * elapsed + 1, (served[0], refused[0], elapsed)
    assert "too many DH transactions from this address" in auth.log_of(t)


NQNS = [HOST_A[:-2] + f"{0xa0 + i:02x}" for i in range(8)]
KEYS = [a for n in NQNS for a in ("--dhchap-key", f"{n}={auth.SECRET_A}")]


def _chal(h: Host, tid: int, group: int = 1) -> bool:
    """Negotiate a DH group and receive: True for a Challenge, False for a
    Failure1."""
    assert auth.send(h, auth.negotiate(tid, groups=(group,))).ok
    cqe, m = auth.receive(h)
    assert cqe.ok, cqe
    if auth.failure(m):
        return False
    assert auth.parse_challenge(m)["group"] == group
    return True


def _drain(port: int, addr: str, limit: int = 200) -> int:
    """Challenges (ffdhe2048) an address gets at once: before its first
    refusal or first wait for a token (a Challenge that takes 150 ms or
    more), 4 a connection, host NQNs rotated so that no per-host backoff
    stops it."""
    n = 0
    while n < limit:
        h = _auth_host(port, addr, NQNS[(n // 4) % len(NQNS)])
        for tid in range(4):
            t0 = time.monotonic()
            if not _chal(h, tid) or time.monotonic() - t0 >= 0.15:
                h.close()
                return n
            n += 1
        h.close()
    return n


def test_an_address_pushed_out_of_the_table_keeps_its_spent_bucket(start_target):
    """An address that spent its 32 DH tokens, then 256 other addresses (one
    challenge each, the size of the address table): it gets no more than the
    refill of the elapsed time (4 a second), not a fresh bucket.  A slot is
    replaced only once its bucket has refilled; meanwhile the newcomers
    share the overflow bucket."""
    t = start_target(*KEYS, "--dhchap-dhgroup", "ffdhe2048")
    first = _drain(t.port, "127.0.0.1")
    t0 = time.monotonic()
    for i in range(256):
        h = _auth_host(t.port, f"127.0.{1 + i // 250}.{1 + i % 250}", NQNS[i % len(NQNS)])
        _chal(h, 0)
        h.close()
    again = _drain(t.port, "127.0.0.1")
    elapsed = time.monotonic() - t0
    assert first >= 32
    assert again <= 4 * elapsed + 2, (first, again, elapsed)


def test_a_neighbour_at_the_same_address_does_not_lock_out_a_keyed_host(start_target):
    """A host behind the same address (NAT, the same IPv6 /64) abandons
    challenges under other host NQNs and drains the address's bucket.  A
    host with the right secret that has not yet authenticated from there
    waits for the next token (at most 250 ms) rather than fail; one that
    has authenticated from there lately has a bucket of its own, and
    succeeds every time while the abuse goes on."""
    t = start_target(*KEYS, "--dhchap-key", f"{HOST_A}={auth.SECRET_A}",
                     "--dhchap-dhgroup", "ffdhe2048")
    assert _drain(t.port, "127.0.0.1") >= 32
    h = _auth_host(t.port, "127.0.0.1")
    ch = auth.authenticate(h, auth.SECRET_A, groups=(1,))
    h.close()
    assert "failure" not in ch, ch
    stop = time.monotonic() + 4.0

    def abuse() -> None:
        i = 0
        while time.monotonic() < stop:
            h = _auth_host(t.port, "127.0.0.1", NQNS[i % len(NQNS)])
            for tid in range(4):
                _chal(h, tid)
            h.close()
            i += 1

    th = threading.Thread(target=abuse)
    th.start()
    time.sleep(0.5)
    ok = tries = 0
    while time.monotonic() < stop - 0.5:
        h = _auth_host(t.port, "127.0.0.1")
        ok += "failure" not in auth.authenticate(h, auth.SECRET_A, groups=(1,))
        tries += 1
        h.close()
        time.sleep(0.1)
    th.join()
    assert tries >= 5 and ok == tries, (ok, tries)


def test_no_large_data_before_a_queue_has_authenticated(start_target):
    """Before its host has authenticated, a queue takes no more data than
    an authentication message needs (4 KiB): a 64 KiB AUTH_Send by R2T is
    refused at once (Data SGL Length Invalid), with no R2T and no buffer,
    and the queue still authenticates."""
    t = auth.keyed(start_target)
    h = _auth_host(t.port, "127.0.0.1")
    cid = h.submit(auth.auth_cmd(auth.AUTH_SEND, 65536), bytes(65536), incapsule=False)
    cqe, _, pdus = h.complete(cid, b"")
    assert [p.type for p in pdus] == [RSP]
    assert cqe.sc == SC_SGL_LENGTH_INVALID and cqe.status & DNR
    assert "failure" not in auth.authenticate(h, auth.SECRET_A, groups=(0,))
    h.close()


# ------------------------------------------------- the I/O buffer budget

MiB = 1 << 20


def _admin_from(port: int, addr: str, queues: int = 0) -> Host:
    h = from_addr(port, addr)
    h.icreq()
    assert h.connect(0).ok
    h.enable()
    if queues:
        assert h.set_queues(queues) >= queues
    return h


def _io_from(port: int, addr: str, cntlid: int, qid: int) -> Host:
    h = from_addr(port, addr)
    h.icreq()
    assert h.connect(qid, cntlid=cntlid, sqsize=127).ok
    return h


def _r2ts_each(hosts: list[Host], seconds: float) -> list[int | None]:
    """R2Ts the target sends each of these queues within seconds (each one is
    a write's buffer taken from the budget); None for a queue the target
    closed (the squeeze of a host over its share that sends no data while
    others wait: tgt.h, FX_TGT_SQUEEZE_MS), whose buffers went back."""
    out: list[int | None] = []
    end = time.monotonic() + seconds
    for h in hosts:
        n: int | None = 0
        h.sock.settimeout(max(0.05, end - time.monotonic()))
        try:
            while True:
                p = h.recv_pdu()
                assert p.type == R2T, p
                n = (n or 0) + 1
        except TimeoutError:
            pass
        except (Closed, ConnectionResetError):
            n = None
        h.sock.settimeout(10)
        out.append(n)
    return out


def _r2ts(hosts: list[Host], seconds: float) -> int:
    """R2Ts the target sends these queues within seconds; none may be closed."""
    each = _r2ts_each(hosts, seconds)
    assert None not in each, each
    return sum(n or 0 for n in each)


def _drop_cache(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_one_host_holding_all_it_can_leaves_room_for_another(start_target):
    """Budget 16 MiB.  A host at 127.0.0.1 opens 4 I/O queues and sends 4
    writes of 4 MiB on each, never their data: each R2T is a 4 MiB buffer
    held until the stall timeout.  It gets 3 (3/4 of the budget for a
    lone address; a queue alone could take 32 MiB), not 16.  Meanwhile a
    host at 127.0.0.2 writes 1 MiB and reads 1 MiB (from the disk, not the
    page cache: an O_DIRECT buffer) at once, byte for byte: well before the
    hog's buffers could come back (the stall timeout is long, 30 s, so that
    a loaded machine never reaches it while the test runs)."""
    t = start_target("--io-buffer-budget", "16", "--stall-timeout-ms", "30000",
                     sizes=(64 << 20,))
    hog = _admin_from(t.port, "127.0.0.1", queues=4)
    hog_q = [_io_from(t.port, "127.0.0.1", hog.cntlid, q) for q in range(1, 5)]
    for i, q in enumerate(hog_q):
        for j in range(4):
            slba = (i * 4 + j) * 8192
            q.submit(sqe(0x01, nsid=1, cdw10=slba, cdw12=8191), bytes(4 * MiB), incapsule=False)
    held = _r2ts_each(hog_q, 1.0)
    assert None not in held and sum(n or 0 for n in held) == 3, held
    good = _admin_from(t.port, "127.0.0.2", queues=1)
    gq = _io_from(t.port, "127.0.0.2", good.cntlid, 1)
    data = os.urandom(MiB)
    t0 = time.monotonic()
    assert gq.write(40 * 2048, data, 512, incapsule=False).ok
    took_w = time.monotonic() - t0
    _drop_cache(t.paths[0])
    with open(t.paths[0], "rb") as f:
        f.seek(48 * MiB)
        want = f.read(MiB)
    t0 = time.monotonic()
    cqe, got = gq.read(48 * 2048, 2048, 512)
    took_r = time.monotonic() - t0
    assert cqe.ok and got == want
    # served without waiting for the hog's buffers (they are held for 30 s)
    assert took_w < 10 and took_r < 10, (took_w, took_r)
    with open(t.paths[0], "rb") as f:
        f.seek(40 * MiB)
        assert f.read(MiB) == data
    # the hog never holds more than its share: a queue of its squeezed (closed for
    # sending no data while writes wait for room) gives its buffers back, and only
    # then may its other queues take them
    later = _r2ts_each(hog_q, 0.3)
    live = [n + (m or 0) for n, m in zip(held, later) if m is not None]
    assert sum(live) <= 3, (held, later)
    for h in [*hog_q, hog, gq, good]:
        h.close()


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_io_buffers_of_many_queues_that_never_read_stay_within_the_budget(start_target):
    """8 I/O queues each read 8 x 4 MiB from the disk and never read their
    socket: the target's buffers stay within the 16 MiB budget (its resident
    memory grows by less than 32 MiB, where 8 queues of 32 MiB could hold
    256 MiB), and a host at 127.0.0.2 still reads 1 MiB byte for byte at once."""
    t = start_target("--io-buffer-budget", "16", "--stall-timeout-ms", "5000",
                     sizes=(64 << 20,))
    warm = _admin_from(t.port, "127.0.0.3", queues=1)  # (threads and arenas of a queue up)
    wq = _io_from(t.port, "127.0.0.3", warm.cntlid, 1)
    assert wq.read(0, 8, 512)[0].ok
    _drop_cache(t.paths[0])
    rss0 = _rss_mib(t.proc.pid)
    hog = _admin_from(t.port, "127.0.0.1", queues=8)
    hog_q = []
    for q in range(1, 9):
        h = _io_from(t.port, "127.0.0.1", hog.cntlid, q)
        h.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        hog_q.append(h)
    for q in hog_q:
        for j in range(8):
            q.submit(sqe(0x02, nsid=1, cdw10=j * 8192 % (64 * 2048), cdw12=8191),
                     data_in=4 * MiB)
    time.sleep(1.5)
    grew = _rss_mib(t.proc.pid) - rss0
    with open(t.paths[0], "rb") as f:
        f.seek(60 * MiB)
        want = f.read(MiB)
    _drop_cache(t.paths[0])
    good = _admin_from(t.port, "127.0.0.2", queues=1)
    gq = _io_from(t.port, "127.0.0.2", good.cntlid, 1)
    t0 = time.monotonic()
    cqe, got = gq.read(60 * 2048, 2048, 512)
    took = time.monotonic() - t0
    assert cqe.ok and got == want
    assert took < 0.5, took
    assert grew < 32, f"target grew by {grew:.0f} MiB"
    for h in [*hog_q, hog, gq, good, wq, warm]:
        h.close()


def test_admin_data_of_many_connections_comes_out_of_the_budget(start_target):
    """80 connections each ask for 4 admin commands' data of 64 KiB by R2T
    (Set Features, Host Identifier) and never send it: the R2Ts together
    stay within a lone address's part of the 16 MiB budget (12 MiB: 192
    buffers; 320 were given before), the rest fail at once, retryable."""
    t = start_target("--io-buffer-budget", "16", "--stall-timeout-ms", "5000")
    hosts = [_admin_from(t.port, "127.0.0.1") for _ in range(80)]
    r2ts = fails = 0
    for h in hosts:
        for _ in range(4):
            h.submit(sqe(0x09, cdw10=0x81), bytes(65536), incapsule=False)
    for h in hosts:
        for _ in range(4):
            p = h.recv_pdu()
            if p.type == R2T:
                r2ts += 1
            else:
                assert p.type == RSP, p
                status = struct.unpack_from("<H", p.header, 8 + 14)[0] >> 1
                assert status & 0xFF and not status & DNR, hex(status)
                fails += 1
    assert r2ts == 12 * MiB // 65536 and fails == 320 - r2ts, (r2ts, fails)
    for h in hosts:
        h.close()


def test_binding_and_cli_take_the_budget(tmp_path):
    """target_serve(io_buffer_budget_mib=) is honoured (8 MiB: a lone
    address gets 6 MiB, one 4 MiB write buffer), under 8 MiB is refused, and
    so is the CLI's --io-buffer-budget 7."""
    import subprocess
    import sys

    from support import REPO

    from fx100io import _core, errors

    ns = tmp_path / "ns.img"
    ns.write_bytes(bytes(16 << 20))
    p = subprocess.run([sys.executable, "-m", "fx100io", "target", "--namespace", str(ns),
                        "--io-buffer-budget", "7"], capture_output=True, text=True, timeout=60,
                       cwd=str(REPO))
    assert p.returncode == 2 and "--io-buffer-budget must be 8.." in p.stderr, p
    with pytest.raises(errors.InvalidArgumentError):
        _core.target_serve("127.0.0.1", "0", NQN, [str(ns)], quiet=True, io_buffer_budget_mib=4)
    ports: list[int] = []
    ready = threading.Event()

    def run() -> None:
        _core.target_serve("127.0.0.1", "0", NQN, [str(ns)], quiet=True, io_buffer_budget_mib=8,
                           stall_timeout_ms=5000, ready=lambda p: (ports.append(p), ready.set()))

    th = threading.Thread(target=run, daemon=True)
    th.start()
    try:
        assert ready.wait(10)
        a = _admin_from(ports[0], "127.0.0.1", queues=1)
        q = _io_from(ports[0], "127.0.0.1", a.cntlid, 1)
        for j in range(3):
            q.submit(sqe(0x01, nsid=1, cdw10=j * 8192, cdw12=8191), bytes(4 * MiB),
                     incapsule=False)
        assert _r2ts([q], 0.5) == 1
        q.close()
        a.close()
    finally:
        _core.target_stop()
        th.join(10)
    assert not th.is_alive()


def test_a_command_waiting_for_the_budget_starts_when_another_queue_frees_room(start_target):
    """Budget 8 MiB: a lone address may hold 6 MiB.  Its write of 4 MiB on
    one queue gets its R2T; a second 4 MiB write on another queue waits for
    room (no R2T), and gets it as soon as the first one's data is in and
    its buffer is given back (another queue's release wakes it); both
    land byte for byte."""
    t = start_target("--io-buffer-budget", "8", sizes=(32 << 20,))
    a = _admin_from(t.port, "127.0.0.1", queues=2)
    qa = _io_from(t.port, "127.0.0.1", a.cntlid, 1)
    qb = _io_from(t.port, "127.0.0.1", a.cntlid, 2)
    da, db = os.urandom(4 * MiB), os.urandom(4 * MiB)
    cid_a = qa.submit(sqe(0x01, nsid=1, cdw10=0, cdw12=8191), da, incapsule=False)
    time.sleep(0.2)
    cid_b = qb.submit(sqe(0x01, nsid=1, cdw10=8192, cdw12=8191), db, incapsule=False)
    qb.sock.settimeout(0.5)
    with pytest.raises(TimeoutError):
        qb.recv_pdu()  # waits for room: no R2T
    qb.sock.settimeout(10)
    assert qa.complete(cid_a, da)[0].ok
    t0 = time.monotonic()
    assert qb.complete(cid_b, db)[0].ok
    assert time.monotonic() - t0 < 1.0
    with open(t.paths[0], "rb") as f:
        assert f.read(8 * MiB) == da + db
    for h in (qa, qb, a):
        h.close()


@pytest.mark.parametrize("hogs", [1, 2, 3])
def test_hosts_at_several_addresses_holding_r2ts_leave_room_for_another(start_target, hogs):
    """Budget 16 MiB.  Hosts at 1, 2 or 3 addresses each send 4 writes of
    4 MiB and never their data: shares are checked when a buffer is taken,
    so the first takes its lone 3/4 and the second the last quarter.  While
    a host waits for room, one that holds more than its share and sends no
    write data is closed within FX_TGT_SQUEEZE_MS (500 ms), not after the
    2 x stall_ms data timeout (10 s here): a host at 127.0.0.2 then writes
    1 MiB and reads 1 MiB from the disk promptly, byte for byte."""
    t = start_target("--io-buffer-budget", "16", "--stall-timeout-ms", "5000",
                     sizes=(64 << 20,))
    keep = []
    got = []
    for i in range(hogs):
        addr = f"127.0.0.{10 + i}"
        a = _admin_from(t.port, addr, queues=1)
        q = _io_from(t.port, addr, a.cntlid, 1)
        for j in range(4):
            q.submit(sqe(0x01, nsid=1, cdw10=(i * 4 + j) * 8192, cdw12=8191), bytes(4 * MiB),
                     incapsule=False)
        try:
            got.append(_r2ts([q], 0.3))
        except (OSError, Closed):
            got.append(-1)
        keep += [a, q]
    assert got[0] == 3, got
    good = _admin_from(t.port, "127.0.0.2", queues=1)
    gq = _io_from(t.port, "127.0.0.2", good.cntlid, 1)
    gq.sock.settimeout(30)
    data = os.urandom(MiB)
    t0 = time.monotonic()
    assert gq.write(40 * 2048, data, 512, incapsule=False).ok
    took_w = time.monotonic() - t0
    _drop_cache(t.paths[0])
    with open(t.paths[0], "rb") as f:
        f.seek(48 * MiB)
        want = f.read(MiB)
    t0 = time.monotonic()
    cqe, rd = gq.read(48 * 2048, 2048, 512)
    took_r = time.monotonic() - t0
    assert cqe.ok and rd == want
    with open(t.paths[0], "rb") as f:
        f.seek(40 * MiB)
        assert f.read(MiB) == data
    assert took_w < 1.5 and took_r < 1.5, (hogs, got, took_w, took_r)
    for h in [*keep, gq, good]:
        try:
            h.close()
        except OSError:
            pass
    assert t.proc.poll() is None


def test_a_full_budget_still_lets_hosts_connect_with_data_by_r2t(start_target):
    """Budget 16 MiB, filled by write R2Ts from two addresses (12 + 4 MiB,
    nobody waiting).  A host at a third address whose Connect data (1024
    bytes) comes by R2T still connects: Connect and authentication data are
    not taken from the I/O budget (bounded per connection instead)."""
    t = start_target("--io-buffer-budget", "16", "--stall-timeout-ms", "5000",
                     sizes=(64 << 20,))
    keep = []
    for addr, n, want in (("127.0.0.1", 3, 3), ("127.0.0.3", 1, 1)):
        a = _admin_from(t.port, addr, queues=1)
        q = _io_from(t.port, addr, a.cntlid, 1)
        for j in range(n):
            q.submit(sqe(0x01, nsid=1, cdw10=j * 8192, cdw12=8191), bytes(4 * MiB),
                     incapsule=False)
        assert _r2ts([q], 0.5) == want
        keep += [a, q]
    h = from_addr(t.port, "127.0.0.2")
    h.icreq()
    cqe = h.connect(0, incapsule=False)
    assert cqe.ok, hex(cqe.status)
    h.enable()
    for x in [*keep, h]:
        x.close()

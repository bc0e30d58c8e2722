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

import re
import socket
import struct
import threading
import time

import test_target_auth as auth
from test_target import CMD, HOST_A, R2T, RSP, Closed, Host, start_target

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
    for i in range(n):
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
    answers, starting another transaction or closing the connection
    instead, fails as one with a wrong secret does: after 16 from one
    address its next one waits (Failure1 at once, no DH work), each is
    logged, and a host at another address is not held back."""
    t = auth.keyed(start_target, "--dhchap-dhgroup", "ffdhe8192")
    for _ in range(4):
        h = _auth_host(t.port, "127.0.0.1")
        for tid in range(4):  # 3 left for the next Negotiate, the 4th by the close
            assert _challenge(h, tid)
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
                     "another)") == 12, log
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

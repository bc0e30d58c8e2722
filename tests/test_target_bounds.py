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
import time

from test_target import CMD, R2T, RSP, Closed, Host, start_target

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

"""A deliberately hostile NVMe/TCP target for tests.

It answers the control path correctly (ICResp, Connect, properties,
Identify, Set Features, Keep Alive) so the initiator reaches its data path,
then answers Read commands with the malformed PDUs a broken or malicious
controller could send.  Hand-written with struct from the spec's layouts,
independently of fx100io's C code.
"""

from __future__ import annotations

import socket
import struct
import threading

CH = struct.Struct("<BBBBI")
ICREQ, ICRESP, H2C_TERM, C2H_TERM, CMD, RSP, H2C_DATA, C2H_DATA, R2T = 0, 1, 2, 3, 4, 5, 6, 7, 9
F_LAST, F_SUCCESS = 0x04, 0x08
NSZE, LBA = 8192, 512

SCENARIOS = (
    "datal-past-buffer", "datao-out-of-order", "unknown-cid", "unknown-type", "bad-hlen",
    "huge-plen", "pdo-inside-header", "success-without-data", "r2t-for-read", "garbage",
    "term-req", "close-mid-data",
)


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return buf


def _rsp(cid: int, dw0: int = 0, status: int = 0) -> bytes:
    cqe = struct.pack("<IIHHHH", dw0, 0, 0, 0, cid, status << 1)
    return CH.pack(RSP, 0, 24, 0, 24) + cqe


def _c2h(cid: int, data: bytes, datao: int = 0, flags: int = F_LAST | F_SUCCESS) -> bytes:
    return CH.pack(C2H_DATA, flags, 24, 24, 24 + len(data)) + \
        struct.pack("<HHII4x", cid, 0, datao, len(data)) + data


def _identify_ctrl() -> bytes:
    b = bytearray(4096)
    b[77] = 0                                   # MDTS: no limit
    struct.pack_into("<H", b, 78, 1)            # CNTLID
    struct.pack_into("<I", b, 80, 0x10300)      # VER 1.3
    struct.pack_into("<I", b, 516, 1)           # NN
    struct.pack_into("<I", b, 536, 0x100005)    # SGLS: supported, keyed/transport bits
    b[768:768 + 20] = b"nqn.2026-11.io.evil\0"[:20]
    struct.pack_into("<I", b, 1792, 4)          # IOCCSZ: 64-byte capsules, no in-capsule data
    struct.pack_into("<I", b, 1796, 1)          # IORCSZ
    return bytes(b)


def _identify_ns() -> bytes:
    b = bytearray(4096)
    struct.pack_into("<QQQ", b, 0, NSZE, NSZE, NSZE)
    b[25] = 0            # NLBAF
    b[26] = 0            # FLBAS: format 0
    b[128 + 2] = 9       # LBAF0: LBADS 512
    return bytes(b)


class EvilTarget:
    """Serve on 127.0.0.1:<free port> in a thread; `scenario` picks how Read
    commands on I/O queues are answered."""

    def __init__(self, scenario: str):
        assert scenario in SCENARIOS
        self.scenario = scenario
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.cc = 0
        self._stop = False
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()

    def close(self) -> None:
        self._stop = True
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            pass
        self.sock.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        try:
            with c:
                _recv_exact(c, 128)                                  # ICReq
                c.sendall(CH.pack(ICRESP, 0, 128, 0, 128) + struct.pack("<HBBI", 0, 0, 0, 1 << 17)
                          + bytes(112))
                qid = None
                while True:
                    t, _f, hlen, _pdo, plen = CH.unpack(_recv_exact(c, 8))
                    rest = _recv_exact(c, plen - 8)
                    if t != CMD:
                        return
                    sqe = rest[:64]
                    opcode, _fl, cid = struct.unpack_from("<BBH", sqe, 0)
                    if opcode == 0x7F:
                        fctype = sqe[4]
                        if fctype == 0x01:                           # Connect
                            qid = struct.unpack_from("<H", sqe, 42)[0]
                            c.sendall(_rsp(cid, dw0=1))
                        elif fctype == 0x04:                         # Property Get
                            off = struct.unpack_from("<I", sqe, 44)[0]
                            val = {0x0: (127 | (1 << 24) | (1 << 37)), 0x8: 0x10300,
                                   0x14: self.cc, 0x1C: (1 if self.cc & 1 else 0)
                                   | (8 if self.cc & 0xC000 else 0)}.get(off, 0)
                            c.sendall(CH.pack(RSP, 0, 24, 0, 24) +
                                      struct.pack("<QHHHH", val, 0, 0, cid, 0))
                        else:                                        # Property Set
                            self.cc = struct.unpack_from("<Q", sqe, 48)[0]
                            c.sendall(_rsp(cid))
                    elif qid == 0 and opcode == 0x06:                # Identify
                        cns = struct.unpack_from("<I", sqe, 40)[0] & 0xFF
                        data = _identify_ctrl() if cns == 1 else _identify_ns()
                        c.sendall(_c2h(cid, data, flags=F_LAST) + _rsp(cid))
                    elif qid == 0 and opcode == 0x09:                # Set Features
                        c.sendall(_rsp(cid, dw0=(3 << 16) | 3))
                    elif qid == 0:                                   # Keep Alive, others
                        c.sendall(_rsp(cid))
                    elif opcode == 0x02:                             # Read: misbehave
                        nlb = (struct.unpack_from("<I", sqe, 48)[0] & 0xFFFF) + 1
                        if not self._evil(c, cid, nlb * LBA):
                            return
                    else:                                            # Write, Flush: fine
                        c.sendall(_rsp(cid))
        except (ConnectionError, OSError, struct.error):
            return

    def _evil(self, c: socket.socket, cid: int, n: int) -> bool:
        s = self.scenario
        if s == "datal-past-buffer":
            c.sendall(_c2h(cid, b"\xAA" * (n + 4096)))
        elif s == "datao-out-of-order":
            c.sendall(_c2h(cid, b"\xAA" * 512, datao=n - 512 + 4096))
        elif s == "unknown-cid":
            c.sendall(_c2h(cid ^ 0x5A5A, b"\xAA" * n))
        elif s == "unknown-type":
            c.sendall(CH.pack(0x42, 0, 24, 0, 24) + bytes(16))
        elif s == "bad-hlen":
            c.sendall(CH.pack(C2H_DATA, F_LAST, 200, 200, 200 + n) + bytes(192) + b"\xAA" * n)
        elif s == "huge-plen":
            c.sendall(CH.pack(C2H_DATA, F_LAST, 24, 24, 0x7FFFFFF0) +
                      struct.pack("<HHII4x", cid, 0, 0, 0x7FFFFFF0 - 24) + b"\xAA" * 4096)
        elif s == "pdo-inside-header":
            c.sendall(CH.pack(C2H_DATA, F_LAST, 24, 8, 24 + n) +
                      struct.pack("<HHII4x", cid, 0, 0, n) + b"\xAA" * n)
        elif s == "success-without-data":
            c.sendall(_rsp(cid))
        elif s == "r2t-for-read":
            c.sendall(CH.pack(R2T, 0, 24, 0, 24) + struct.pack("<HHII4x", cid, 1, 0, n))
        elif s == "garbage":
            c.sendall(bytes(range(256)) * 4)
        elif s == "term-req":
            c.sendall(CH.pack(C2H_TERM, 0, 24, 0, 24) + struct.pack("<HHH10x", 1, 0, 0))
        elif s == "close-mid-data":
            c.sendall(_c2h(cid, b"\xAA" * n)[: 24 + n // 2])
            return False
        return True

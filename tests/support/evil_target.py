"""A deliberately hostile NVMe/TCP target for tests.

It answers the control path correctly (ICResp, Connect, properties,
Identify, Set Features, Keep Alive) so the initiator reaches its data path,
then misbehaves on the data path the way a broken or malicious controller
could:

- read scenarios (READ_SCENARIOS) answer every Read with malformed PDUs;
  writes are served correctly;
- write scenarios (WRITE_SCENARIOS) answer the first Write with a broken
  R2T/response sequence and serve everything after it correctly (reads
  return what was written), so a test can check that the next command, on a
  fresh connection, works.

Knobs shape what the controller reports (MAXH2CDATA, IOCCSZ, ICDOFF, MDTS,
CAP.MPSMIN, the namespace's size and LBA format), for the initiator's
geometry checks.  Hand-written with struct from the spec's layouts,
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
STORE_MAX = 8 << 20

READ_SCENARIOS = (
    "datal-past-buffer", "datao-out-of-order", "unknown-cid", "unknown-type", "bad-hlen",
    "huge-plen", "pdo-inside-header", "success-without-data", "r2t-for-read", "garbage",
    "term-req", "close-mid-data", "success-without-last",
)
SCENARIOS = READ_SCENARIOS  # the name older tests import

WRITE_SCENARIOS = (
    "r2t-flood",           # 5000 R2Ts for the same range, then success
    "r2t-repeat",          # the whole range requested twice
    "r2t-out-of-order",    # second half requested first
    "r2t-past-end",        # r2to + r2tl beyond the transfer
    "r2t-overflow",        # r2to + r2tl wraps a u32
    "r2t-zero",            # r2tl 0
    "early-success",       # success after half the data was requested
    "success-without-r2t",  # success without asking for any data
    "r2t-for-incapsule",   # R2T for a write whose data came in the capsule
    "r2t-unknown-cid",     # R2T for a command that does not exist
    "c2h-for-write",       # C2HData (SUCCESS) answering a write
)


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return bytes(buf)


def _rsp(cid: int, dw0: int = 0, status: int = 0) -> bytes:
    cqe = struct.pack("<IIHHHH", dw0, 0, 0, 0, cid, status << 1)
    return CH.pack(RSP, 0, 24, 0, 24) + cqe


def _c2h(cid: int, data: bytes, datao: int = 0, flags: int = F_LAST | F_SUCCESS) -> bytes:
    return CH.pack(C2H_DATA, flags, 24, 24, 24 + len(data)) + \
        struct.pack("<HHII4x", cid, 0, datao, len(data)) + data


def _r2t(cid: int, ttag: int, r2to: int, r2tl: int) -> bytes:
    return CH.pack(R2T, 0, 24, 0, 24) + struct.pack("<HHII4x", cid, ttag, r2to, r2tl)


class EvilTarget:
    """Serve on 127.0.0.1:<free port> in a thread; `scenario` picks how the
    data path misbehaves (see the module docstring)."""

    def __init__(self, scenario: str = "good", *, maxh2cdata: int = 1 << 17, ioccsz: int = 4,
                 icdoff: int = 0, mdts: int = 0, mpsmin: int = 0, nsze: int = NSZE,
                 lbads: int = 9):
        assert scenario == "good" or scenario in READ_SCENARIOS or scenario in WRITE_SCENARIOS
        self.scenario = scenario
        self.maxh2cdata = maxh2cdata
        self.ioccsz = ioccsz
        self.icdoff = icdoff
        self.mdts = mdts
        self.mpsmin = mpsmin
        self.nsze = nsze
        self.lbads = lbads
        self.store = bytearray(min(nsze << lbads, STORE_MAX))
        self.evil_done = False          # the first write has been answered badly
        self.io_closed = threading.Event()  # an I/O connection ended after misbehaving
        self.incapsule_writes = 0
        self.r2t_writes = 0
        self.h2c_bytes = 0              # H2CData payload received (all writes)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.cc = 0
        self._stop = False
        self._lock = threading.Lock()
        self._tls = threading.local()   # per connection: capsules not served yet
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()

    @property
    def uri(self) -> str:
        return f"nvme+tcp://127.0.0.1:{self.port}/nqn.2026-11.io.evil"

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

    # ------------------------------------------------------------ identify

    def _identify_ctrl(self) -> bytes:
        b = bytearray(4096)
        b[77] = self.mdts                               # MDTS (0: no limit)
        struct.pack_into("<H", b, 78, 1)                # CNTLID
        struct.pack_into("<I", b, 80, 0x10300)          # VER 1.3
        struct.pack_into("<I", b, 516, 1)               # NN
        struct.pack_into("<I", b, 536, 0x100005)        # SGLS: supported, keyed/transport bits
        b[768:768 + 20] = b"nqn.2026-11.io.evil\0"[:20]
        struct.pack_into("<I", b, 1792, self.ioccsz)    # IOCCSZ (4: 64-byte capsules, no data)
        struct.pack_into("<I", b, 1796, 1)              # IORCSZ
        struct.pack_into("<H", b, 1800, self.icdoff)    # ICDOFF (16-byte units)
        return bytes(b)

    def _identify_ns(self) -> bytes:
        b = bytearray(4096)
        struct.pack_into("<QQQ", b, 0, self.nsze, self.nsze, self.nsze)
        b[25] = 0            # NLBAF
        b[26] = 0            # FLBAS: format 0
        b[128 + 2] = self.lbads
        return bytes(b)

    # --------------------------------------------------------------- serve

    def _serve(self, c: socket.socket) -> None:
        evil_here = False
        try:
            with c:
                _recv_exact(c, 128)                                  # ICReq
                c.sendall(CH.pack(ICRESP, 0, 128, 0, 128) +
                          struct.pack("<HBBI", 0, 0, 0, self.maxh2cdata) + bytes(112))
                qid = None
                # capsules that arrived while a write's H2CData was awaited
                self._tls.pending = []
                while True:
                    if self._tls.pending:
                        t, pdo, rest = self._tls.pending.pop(0)
                    else:
                        t, _f, hlen, pdo, plen = CH.unpack(_recv_exact(c, 8))
                        rest = _recv_exact(c, plen - 8)
                    if t != CMD:
                        return
                    sqe = rest[:64]
                    incap = rest[pdo - 8:] if pdo else b""
                    opcode, _fl, cid = struct.unpack_from("<BBH", sqe, 0)
                    fctype = sqe[4] if opcode == 0x7F else -1
                    if fctype not in (0x01, 0x05, 0x06) and not self._may_serve(qid):
                        c.sendall(_rsp(cid, status=0x191))           # authentication required
                    elif opcode == 0x7F:
                        if fctype == 0x01:                           # Connect
                            qid = struct.unpack_from("<H", sqe, 42)[0]
                            c.sendall(_rsp(cid, dw0=self._connect_dw0(qid, incap)))
                        elif fctype in (0x05, 0x06):                 # AUTH_Send / AUTH_Receive
                            if not self._auth_command(c, cid, fctype, sqe, incap):
                                return
                        elif fctype == 0x04:                         # Property Get
                            off = struct.unpack_from("<I", sqe, 44)[0]
                            cap = 127 | (1 << 24) | (1 << 37) | (self.mpsmin << 48)
                            val = {0x0: cap, 0x8: 0x10300,
                                   0x14: self.cc, 0x1C: (1 if self.cc & 1 else 0)
                                   | (8 if self.cc & 0xC000 else 0)}.get(off, 0)
                            c.sendall(CH.pack(RSP, 0, 24, 0, 24) +
                                      struct.pack("<QHHHH", val, 0, 0, cid, 0))
                        else:                                        # Property Set
                            self.cc = struct.unpack_from("<Q", sqe, 48)[0]
                            c.sendall(_rsp(cid))
                    elif qid == 0 and opcode == 0x06:                # Identify
                        cns = struct.unpack_from("<I", sqe, 40)[0] & 0xFF
                        data = self._identify_ctrl() if cns == 1 else self._identify_ns()
                        c.sendall(_c2h(cid, data, flags=F_LAST) + _rsp(cid))
                    elif qid == 0 and opcode == 0x09:                # Set Features
                        c.sendall(_rsp(cid, dw0=(3 << 16) | 3))
                    elif qid == 0:                                   # Keep Alive, others
                        c.sendall(_rsp(cid))
                    elif opcode == 0x02:                             # Read
                        slba, n = self._lba_range(sqe)
                        if self.scenario in READ_SCENARIOS:
                            evil_here = True
                            if not self._evil_read(c, cid, n):
                                return
                        else:
                            off = slba << self.lbads
                            c.sendall(_c2h(cid, bytes(self.store[off:off + n]), flags=F_LAST)
                                      + _rsp(cid))
                    elif opcode == 0x01:                             # Write
                        slba, n = self._lba_range(sqe)
                        sgl_addr = struct.unpack_from("<Q", sqe, 24)[0]
                        with self._lock:
                            go_evil = self.scenario in WRITE_SCENARIOS and not self.evil_done
                            self.evil_done = self.evil_done or go_evil
                        if go_evil:
                            evil_here = True
                            self._evil_write(c, cid, n, incap)
                            # keep reading until the host hangs up
                            while c.recv(1 << 16):
                                pass
                            return
                        self._good_write(c, cid, slba, n, incap, sgl_addr)
                    else:                                            # Flush, others: fine
                        c.sendall(_rsp(cid))
        except (ConnectionError, OSError, struct.error):
            return
        finally:
            if evil_here:
                self.io_closed.set()

    # Hooks for in-band authentication (tests/support/auth_target.py): this target
    # asks for none and refuses AUTH_Send/AUTH_Receive (Invalid Opcode).
    def _connect_dw0(self, qid: int, data: bytes) -> int:
        return 1  # CNTLID 1

    def _may_serve(self, qid: int | None) -> bool:
        return True

    def _auth_command(self, c: socket.socket, cid: int, fctype: int, sqe: bytes,
                      incap: bytes) -> bool:
        """Answer one AUTH_Send/Receive; False ends the connection."""
        c.sendall(_rsp(cid, status=0x4001))
        return True

    def _lba_range(self, sqe: bytes) -> tuple[int, int]:
        slba = struct.unpack_from("<Q", sqe, 40)[0]
        nlb = (struct.unpack_from("<I", sqe, 48)[0] & 0xFFFF) + 1
        return slba, nlb << self.lbads

    def _store(self, slba: int, data: bytes) -> None:
        off = slba << self.lbads
        if off + len(data) <= len(self.store):
            self.store[off:off + len(data)] = data

    def _recv_h2c(self, c: socket.socket, cid: int, want: int) -> bytes:
        """Receive H2CData PDUs until `want` bytes arrived."""
        got = bytearray()
        while len(got) < want:
            t, _f, _hlen, pdo, plen = CH.unpack(_recv_exact(c, 8))
            rest = _recv_exact(c, plen - 8)
            if t == CMD:    # the host pipelines commands: serve it later
                self._tls.pending.append((t, pdo, rest))
                continue
            if t != H2C_DATA:
                raise ConnectionError(f"expected H2CData, got type {t}")
            cccid, _ttag, _datao, datal = struct.unpack_from("<HHII", rest, 0)
            if cccid != cid:
                raise ConnectionError("H2CData for another command")
            got += rest[pdo - 8:pdo - 8 + datal]
            self.h2c_bytes += datal
        return bytes(got)

    def _good_write(self, c: socket.socket, cid: int, slba: int, n: int, incap: bytes,
                    sgl_addr: int) -> None:
        if incap:
            # In-capsule data starts ICDOFF 16-byte units into the capsule's
            # data area (this target's reading of ICDOFF; NVMe/TCP targets
            # report 0), plus the SGL's offset.
            start = self.icdoff * 16 + sgl_addr
            self.incapsule_writes += 1
            self._store(slba, incap[start:start + n])
            c.sendall(_rsp(cid))
            return
        self.r2t_writes += 1
        c.sendall(_r2t(cid, 1, 0, n))
        self._store(slba, self._recv_h2c(c, cid, n))
        c.sendall(_rsp(cid))

    def _drain(self, c: socket.socket) -> threading.Thread:
        """Read (and count) what the host sends while we keep talking."""
        def run() -> None:
            try:
                while True:
                    b = c.recv(1 << 16)
                    if not b:
                        return
                    self.h2c_bytes += len(b)
            except OSError:
                return
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    def _evil_write(self, c: socket.socket, cid: int, n: int, incap: bytes) -> None:
        s = self.scenario
        half = n // 2
        if s == "r2t-flood":
            t = self._drain(c)
            c.sendall(_r2t(cid, 1, 0, n) * 5000 + _rsp(cid))
            t.join(10)
        elif s == "r2t-repeat":
            c.sendall(_r2t(cid, 1, 0, n))
            self._recv_h2c(c, cid, n)
            c.sendall(_r2t(cid, 2, 0, n))
            self._recv_h2c(c, cid, n)
            c.sendall(_rsp(cid))
        elif s == "r2t-out-of-order":
            c.sendall(_r2t(cid, 1, half, n - half))
            self._recv_h2c(c, cid, n - half)
            c.sendall(_r2t(cid, 2, 0, half))
            self._recv_h2c(c, cid, half)
            c.sendall(_rsp(cid))
        elif s == "r2t-past-end":
            c.sendall(_r2t(cid, 1, 0, n + 4096))
        elif s == "r2t-overflow":
            c.sendall(_r2t(cid, 1, 0, half) + _r2t(cid, 2, half, 0xFFFFFFFF - half + 512))
        elif s == "r2t-zero":
            c.sendall(_r2t(cid, 1, 0, 0))
        elif s == "early-success":
            c.sendall(_r2t(cid, 1, 0, half))
            self._recv_h2c(c, cid, half)
            c.sendall(_rsp(cid))
        elif s == "success-without-r2t":
            c.sendall(_rsp(cid))
        elif s == "r2t-for-incapsule":
            assert incap, "the test must make the host send this write in the capsule"
            c.sendall(_r2t(cid, 1, 0, n))
            self._recv_h2c(c, cid, n)
            c.sendall(_rsp(cid))
        elif s == "r2t-unknown-cid":
            c.sendall(_r2t(cid ^ 0x5A5A, 1, 0, n))
        elif s == "c2h-for-write":
            c.sendall(_c2h(cid, b"\xAA" * n))

    def _evil_read(self, c: socket.socket, cid: int, n: int) -> bool:
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
            c.sendall(_r2t(cid, 1, 0, n))
        elif s == "garbage":
            c.sendall(bytes(range(256)) * 4)
        elif s == "term-req":
            c.sendall(CH.pack(C2H_TERM, 0, 24, 0, 24) + struct.pack("<HHH10x", 1, 0, 0))
        elif s == "close-mid-data":
            c.sendall(_c2h(cid, b"\xAA" * n)[: 24 + n // 2])
            return False
        elif s == "success-without-last":
            # all the data, SUCCESS set but not LAST_PDU, and no CapsuleResp
            c.sendall(_c2h(cid, b"\xAA" * n, flags=F_SUCCESS))
        return True

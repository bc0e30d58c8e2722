"""A small synchronous NVMe/TCP host written from the spec (socket + struct), sharing no
code with fx100io (only CRC32C, itself checked against the standard check value), and the
`start_target` fixture that runs `fx100io target` as a real subprocess: what the tests of
our target (tests/target) drive it with."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fx100io._core import crc32c
from support import REPO

NQN = "nqn.2024-01.io.fx100io:test-target"
DISC_NQN = "nqn.2014-08.org.nvmexpress.discovery"
HOST_A = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a"
HOST_B = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b"

# PDU types and flags (NVMe/TCP 1.0)
ICREQ, ICRESP, H2C_TERM, C2H_TERM, CMD, RSP, H2C_DATA, C2H_DATA, R2T = 0, 1, 2, 3, 4, 5, 6, 7, 9
F_HDGST, F_DDGST, F_LAST, F_SUCCESS = 1, 2, 4, 8


# --------------------------------------------------------------- the host

@dataclass
class Pdu:
    type: int
    flags: int
    hlen: int
    pdo: int
    plen: int
    header: bytes  # hlen bytes
    data: bytes
    ddgst_ok: bool


@dataclass
class Cqe:
    dw0: int
    dw1: int
    sqhd: int
    sqid: int
    cid: int
    status: int  # status field (without the phase bit)

    @property
    def sc(self) -> int:
        return self.status & 0xFF

    @property
    def sct(self) -> int:
        return (self.status >> 8) & 7

    @property
    def ok(self) -> bool:
        return (self.status & 0x7FF) == 0


class Closed(Exception):
    pass


def sqe(opcode: int, nsid: int = 0, cdw10: int = 0, cdw11: int = 0, cdw12: int = 0,
        cdw13: int = 0, cdw14: int = 0, cdw15: int = 0) -> bytearray:
    b = bytearray(64)
    b[0] = opcode
    b[1] = 0x40  # PSDT: SGL
    struct.pack_into("<I", b, 4, nsid)
    struct.pack_into("<6I", b, 40, cdw10, cdw11, cdw12, cdw13, cdw14, cdw15)
    return b


class Host:
    """A minimal synchronous NVMe/TCP host."""

    def __init__(self, port: int, hdgst: bool = False, ddgst: bool = False, timeout: float = 10,
                 hpda: int = 0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.port = port
        self.hdgst = False
        self.ddgst = False
        self.want_hdgst, self.want_ddgst, self.hpda = hdgst, ddgst, hpda
        self.cid = 0
        self.maxh2cdata = 0
        self.cntlid = None
        self.qid = 0
        self.record: list[bytes] | None = None  # PDUs sent, when a list

    def close(self) -> None:
        self.sock.close()

    # --- raw PDUs
    def recv_exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            b = self.sock.recv(n - len(out))
            if not b:
                raise Closed(f"connection closed after {len(out)} of {n} bytes")
            out += b
        return bytes(out)

    def recv_pdu(self) -> Pdu:
        ch = self.recv_exact(8)
        t, flags, hlen, pdo, plen = struct.unpack("<BBBBI", ch)
        assert 8 <= hlen <= plen <= 8 << 20, (t, hlen, plen)
        rest = self.recv_exact(plen - 8)
        full = ch + rest
        header = full[:hlen]
        if flags & F_HDGST:
            assert struct.unpack_from("<I", full, hlen)[0] == crc32c(header), "bad header digest"
        data, ok = b"", True
        if pdo:
            end = plen - (4 if flags & F_DDGST else 0)
            data = full[pdo:end]
            if flags & F_DDGST:
                ok = struct.unpack_from("<I", full, end)[0] == crc32c(data)
        elif t == C2H_TERM:
            data = full[hlen:]
        return Pdu(t, flags, hlen, pdo, plen, header, data, ok)

    def send_pdu(self, ptype: int, specific: bytes, data: bytes = b"", flags: int = 0,
                 bad_hdgst: bool = False, bad_ddgst: bool = False) -> None:
        hlen = 8 + len(specific)
        digests = ptype not in (ICREQ, H2C_TERM)
        hd = 4 if self.hdgst and digests else 0
        dd = 4 if self.ddgst and digests and data else 0
        if hd:
            flags |= F_HDGST
        if dd:
            flags |= F_DDGST
        pdo = hlen + hd if data else 0
        plen = hlen + hd + len(data) + dd
        header = struct.pack("<BBBBI", ptype, flags, hlen, pdo, plen) + specific
        out = bytearray(header)
        if hd:
            out += struct.pack("<I", crc32c(header) ^ (1 if bad_hdgst else 0))
        out += data
        if dd:
            out += struct.pack("<I", crc32c(data) ^ (1 if bad_ddgst else 0))
        if self.record is not None:
            self.record.append(bytes(out))
        self.sock.sendall(out)

    # --- connection set-up
    def icreq(self) -> Pdu:
        dgst = (1 if self.want_hdgst else 0) | (2 if self.want_ddgst else 0)
        self.send_pdu(ICREQ, struct.pack("<HBBI", 0, self.hpda, dgst, 0) + bytes(112))
        p = self.recv_pdu()
        assert p.type == ICRESP and p.hlen == 128 and p.plen == 128, p
        pfv, cpda, dg, maxdata = struct.unpack_from("<HBBI", p.header, 8)
        assert pfv == 0 and cpda == 0 and dg == dgst
        assert maxdata >= 4096 and maxdata % 4 == 0
        self.maxh2cdata = maxdata
        self.hdgst, self.ddgst = bool(dg & 1), bool(dg & 2)
        return p

    def next_cid(self) -> int:
        self.cid = (self.cid + 1) & 0xFFFF
        return self.cid

    def submit(self, cmd: bytearray, data_out: bytes | None = None, incapsule: bool = True,
               data_in: int = 0, bad_ddgst: bool = False) -> int:
        cid = self.next_cid()
        struct.pack_into("<H", cmd, 2, cid)
        icd = b""
        if data_out:
            sgl_type = 0x01 if incapsule else 0x5A
            struct.pack_into("<QI3xB", cmd, 24, 0, len(data_out), sgl_type)
            if incapsule:
                icd = data_out
        else:
            struct.pack_into("<QI3xB", cmd, 24, 0, data_in, 0x5A)
        self.send_pdu(CMD, bytes(cmd), icd, bad_ddgst=bad_ddgst)
        return cid

    def complete(self, cid: int, data_out: bytes | None = None,
                 data_in: int = 0) -> tuple[Cqe, bytes, list[Pdu]]:
        """Serve R2Ts, collect C2HData, until the CapsuleResp for cid."""
        buf = bytearray(data_in)
        seen: list[Pdu] = []
        while True:
            p = self.recv_pdu()
            seen.append(p)
            if p.type == C2H_DATA:
                cccid, _ttag, datao, datal = struct.unpack_from("<HHII", p.header, 8)
                assert cccid == cid and len(p.data) == datal
                assert datao + datal <= data_in, (datao, datal, data_in)
                buf[datao:datao + datal] = p.data
            elif p.type == R2T:
                cccid, ttag, r2to, r2tl = struct.unpack_from("<HHII", p.header, 8)
                assert cccid == cid and data_out is not None
                assert r2to + r2tl <= len(data_out)
                off = r2to
                while off < r2to + r2tl:
                    n = min(self.maxh2cdata, r2to + r2tl - off)
                    last = F_LAST if off + n == r2to + r2tl else 0
                    self.send_pdu(H2C_DATA, struct.pack("<HHII4x", cid, ttag, off, n),
                                  data_out[off:off + n], flags=last)
                    off += n
            elif p.type == RSP:
                c = Cqe(*struct.unpack_from("<IIHHHH", p.header, 8))
                c.status >>= 1
                assert c.cid == cid
                return c, bytes(buf), seen
            else:
                raise AssertionError(f"unexpected PDU {p}")

    def cmd(self, cmd: bytearray, data_out: bytes | None = None, incapsule: bool = True,
            data_in: int = 0) -> tuple[Cqe, bytes]:
        cid = self.submit(cmd, data_out, incapsule, data_in)
        c, data, _ = self.complete(cid, data_out, data_in)
        return c, data

    def connect(self, qid: int = 0, subnqn: str = NQN, hostnqn: str = HOST_A,
                cntlid: int = 0xFFFF, kato: int = 0, sqsize: int = 31,
                incapsule: bool = True) -> Cqe:
        c = bytearray(64)
        c[0] = 0x7F
        c[1] = 0x40
        c[4] = 0x01  # fctype Connect
        struct.pack_into("<HHHBxI", c, 40, 0, qid, sqsize, 0, kato)
        d = bytearray(1024)
        d[0:16] = bytes(range(16))
        struct.pack_into("<H", d, 16, cntlid)
        d[256:256 + len(subnqn)] = subnqn.encode()
        d[512:512 + len(hostnqn)] = hostnqn.encode()
        cqe, _ = self.cmd(c, bytes(d), incapsule=incapsule)
        if cqe.ok:
            self.cntlid = cqe.dw0 & 0xFFFF
            self.qid = qid
        return cqe

    def prop_get(self, off: int, size8: bool = False) -> tuple[Cqe, int]:
        c = bytearray(64)
        c[0], c[1], c[4] = 0x7F, 0x40, 0x04
        c[40] = 1 if size8 else 0
        struct.pack_into("<I", c, 44, off)
        cqe, _ = self.cmd(c)
        return cqe, cqe.dw0 | (cqe.dw1 << 32 if size8 else 0)

    def prop_set(self, off: int, value: int) -> Cqe:
        c = bytearray(64)
        c[0], c[1], c[4] = 0x7F, 0x40, 0x00
        struct.pack_into("<IQ", c, 44, off, value)
        return self.cmd(c)[0]

    def identify(self, cns: int, nsid: int = 0) -> tuple[Cqe, bytes]:
        return self.cmd(sqe(0x06, nsid=nsid, cdw10=cns), data_in=4096)

    def enable(self) -> None:
        assert self.prop_set(0x14, (6 << 16) | (4 << 20) | 1).ok
        cqe, csts = self.prop_get(0x1C)
        assert cqe.ok and csts & 1

    def set_queues(self, n: int) -> int:
        cqe, _ = self.cmd(sqe(0x09, cdw10=0x07, cdw11=(n - 1) | ((n - 1) << 16)))
        assert cqe.ok
        return (cqe.dw0 & 0xFFFF) + 1

    def get_log(self, lid: int, length: int, offset: int = 0) -> tuple[Cqe, bytes]:
        numd = length // 4 - 1
        return self.cmd(sqe(0x02, cdw10=lid | ((numd & 0xFFFF) << 16), cdw11=numd >> 16,
                            cdw12=offset & 0xFFFFFFFF, cdw13=offset >> 32), data_in=length)

    def read(self, slba: int, nlb: int, bs: int, nsid: int = 1) -> tuple[Cqe, bytes]:
        return self.cmd(sqe(0x02, nsid=nsid, cdw10=slba & 0xFFFFFFFF, cdw11=slba >> 32,
                            cdw12=nlb - 1), data_in=nlb * bs)

    def write(self, slba: int, data: bytes, bs: int, nsid: int = 1,
              incapsule: bool | None = None, fua: bool = False) -> Cqe:
        if incapsule is None:
            incapsule = len(data) <= 8192
        nlb = len(data) // bs
        return self.cmd(sqe(0x01, nsid=nsid, cdw10=slba & 0xFFFFFFFF, cdw11=slba >> 32,
                            cdw12=(nlb - 1) | (1 << 30 if fua else 0)), data, incapsule)[0]

    def expect_term_then_close(self) -> Pdu:
        p = self.recv_pdu()
        assert p.type == C2H_TERM, p
        with pytest.raises((Closed, ConnectionResetError)):
            while True:
                self.recv_pdu()
        return p


def admin(port: int, hdgst: bool = False, ddgst: bool = False, kato: int = 0,
          hostnqn: str = HOST_A) -> Host:
    h = Host(port, hdgst, ddgst)
    h.icreq()
    cqe = h.connect(0, kato=kato, hostnqn=hostnqn)
    assert cqe.ok, cqe
    h.enable()
    return h


def io_queue(port: int, cntlid: int, qid: int, hdgst: bool = False, ddgst: bool = False,
             hostnqn: str = HOST_A, sqsize: int = 127) -> Host:
    h = Host(port, hdgst, ddgst)
    h.icreq()
    cqe = h.connect(qid, cntlid=cntlid, hostnqn=hostnqn, sqsize=sqsize)
    assert cqe.ok, cqe
    return h


# ---------------------------------------------------------- the target

class Target:
    def __init__(self, proc: subprocess.Popen, port: int, paths: list[Path], bs: int):
        self.proc, self.port, self.paths, self.bs = proc, port, paths, bs
        self.stderr = ""
        self.log: Any = None

    def stop(self, sig: int = signal.SIGINT) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.log.seek(0)
        self.stderr = self.log.read().decode(errors="replace")
        return rc


@pytest.fixture
def start_target(tmp_path):
    started: list[Target] = []

    def start(*extra: str, sizes: tuple[int, ...] = (16 << 20,), bs: int = 512,
              paths: list[Path] | None = None) -> Target:
        if paths is None:
            paths = []
            for i, size in enumerate(sizes):
                p = tmp_path / f"ns{i + 1}.img"
                with open(p, "wb") as f:
                    f.write(os.urandom(size))
                paths.append(p)
        args = [sys.executable, "-m", "fx100io", "target", "--listen", "127.0.0.1:0",
                "--nqn", NQN, "--block-size", str(bs)]
        for p in paths:
            args += ["--namespace", str(p)]
        # stderr to a file: an undrained pipe would block the target's logging
        log = open(tmp_path / f"target{len(started)}.log", "w+b")  # noqa: SIM115 (outlives us)
        proc = subprocess.Popen(args + list(extra), stdout=subprocess.PIPE, stderr=log,
                                text=True, cwd=str(REPO))
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else ""
        m = re.fullmatch(r"listening on nvme\+tcp://127\.0\.0\.1:(\d+)/(\S+)\n", line)
        if not m:
            proc.kill()
            log.seek(0)
            raise AssertionError(f"no listening line: {line!r} {log.read()!r}")
        assert m.group(2) == NQN
        t = Target(proc, int(m.group(1)), paths, bs)
        t.log = log
        started.append(t)
        return t

    yield start
    for t in started:
        rc = t.stop()
        assert rc == 0, f"target exited {rc}: {t.stderr}"


# ------------------------------------------------------------ discovery

def discover(port: int, hostnqn: str = HOST_A) -> list[dict]:
    h = Host(port)
    h.icreq()
    assert h.connect(0, subnqn=DISC_NQN, hostnqn=hostnqn).ok
    h.enable()
    cqe, idc = h.identify(1)
    assert cqe.ok and idc[768:768 + len(DISC_NQN)].decode() == DISC_NQN
    assert struct.unpack_from("<I", idc, 516)[0] == 0  # NN
    cqe, hdr = h.get_log(0x70, 1024)
    assert cqe.ok
    genctr, numrec, recfmt = struct.unpack_from("<QQH", hdr, 0)
    assert recfmt == 0 and 1 <= numrec <= 8
    cqe, page = h.get_log(0x70, 1024 * (1 + numrec))
    assert cqe.ok and struct.unpack_from("<Q", page, 0)[0] == genctr
    # the entries again, read with an offset (LPO)
    cqe, tail = h.get_log(0x70, 1024 * numrec, offset=1024)
    assert cqe.ok and tail == page[1024:]
    entries = []
    for i in range(numrec):
        e = page[1024 * (i + 1):1024 * (i + 2)]
        entries.append(dict(
            trtype=e[0], adrfam=e[1], subtype=e[2], portid=struct.unpack_from("<H", e, 4)[0],
            cntlid=struct.unpack_from("<H", e, 6)[0],
            trsvcid=e[32:64].rstrip(b"\0 ").decode(), subnqn=e[256:512].rstrip(b"\0").decode(),
            traddr=e[512:768].rstrip(b"\0 ").decode()))
    # I/O queues do not exist on a discovery controller
    assert h.cmd(sqe(0x09, cdw10=0x07, cdw11=0))[0].sc == 0x02
    h.close()
    return entries

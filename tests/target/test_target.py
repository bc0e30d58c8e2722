"""`fx100io target` end to end: the real command in a subprocess, driven by a
small NVMe/TCP host written from the spec (socket + struct, tests/support/target_host.py), so the
target is checked against an implementation that shares no code with it
(only CRC32C, itself checked against the standard check value).  Data are
compared byte for byte with the backing file."""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support import REPO
from support.target_host import (
    C2H_DATA,
    CMD,
    DISC_NQN,
    F_LAST,
    H2C_DATA,
    H2C_TERM,
    HOST_A,
    HOST_B,
    ICREQ,
    ICRESP,
    NQN,
    R2T,
    RSP,
    Closed,
    Cqe,
    Host,
    admin,
    discover,
    io_queue,
    sqe,
    start_target,
)

from fx100io._core import crc32c

__all__ = ["start_target"]  # (the fixture, imported for this module's tests)


def test_crc32c_is_castagnoli():
    assert crc32c(b"123456789") == 0xE3069283


# ------------------------------------------------------------------ CLI

@pytest.mark.parametrize("args, msg", [
    ([], "--namespace"),
    (["--namespace", "/nonexistent/x.img"], "No such file"),
    (["--namespace", "/tmp"], "is a directory"),
    (["--namespace", "NS", "--nqn", "not-an-nqn"], "is not an NQN"),
    (["--namespace", "NS", "--nqn", DISC_NQN], "discovery NQN"),
    (["--namespace", "NS", "--listen", "127.0.0.1:99999"], "port must be"),
    (["--namespace", "NS", "--listen", "::1:4420"], "[ADDR]:PORT"),
    (["--namespace", "NS", "--block-size", "1024"], "invalid choice"),
    (["--namespace", "NS", "--allow-host", "bob"], "is not an NQN"),
])
def test_cli_refuses_bad_options(tmp_path, args, msg):
    ns = tmp_path / "ns.img"
    ns.write_bytes(bytes(1 << 20))
    args = [str(ns) if a == "NS" else a for a in args]
    p = subprocess.run([sys.executable, "-m", "fx100io", "target", *args], capture_output=True,
                       text=True, timeout=60, cwd=str(REPO))
    assert p.returncode == 2, p
    assert msg in p.stderr, p.stderr


def test_cli_reports_listen_failure(tmp_path):
    ns = tmp_path / "ns.img"
    ns.write_bytes(bytes(1 << 20))
    p = subprocess.run([sys.executable, "-m", "fx100io", "target", "--namespace", str(ns),
                        "--listen", "192.0.2.1:4420"], capture_output=True, text=True,
                       timeout=60, cwd=str(REPO))
    assert p.returncode == 1
    assert "192.0.2.1:4420" in p.stderr and "assign" in p.stderr


def test_sigterm_exits_cleanly(start_target):
    t = start_target()
    h = admin(t.port)
    assert t.stop(signal.SIGTERM) == 0
    with pytest.raises((Closed, ConnectionResetError)):
        h.recv_pdu()


# ------------------------------------------------------ admin bring-up

def test_admin_bringup_and_identify(start_target):
    t = start_target(sizes=(8 << 20, (3 << 20) + 700))
    h = Host(t.port)
    h.icreq()
    cqe = h.connect(0, kato=0)
    assert cqe.ok and 1 <= h.cntlid <= 0xFFEF

    cqe, cap = h.prop_get(0x00, size8=True)
    assert cqe.ok
    mqes = cap & 0xFFFF
    assert mqes >= 31
    assert (cap >> 16) & 1  # CQR
    assert (cap >> 24) & 0xFF  # TO
    assert (cap >> 37) & 1  # CSS: NVM
    assert (cap >> 48) & 0xF == 0  # MPSMIN 4 KiB
    cqe, vs = h.prop_get(0x08)
    assert cqe.ok and vs == 0x00010300
    cqe, csts = h.prop_get(0x1C)
    assert cqe.ok and csts & 1 == 0
    assert not h.prop_get(0x40)[0].ok  # no such property
    h.enable()

    cqe, idc = h.identify(1)
    assert cqe.ok and len(idc) == 4096
    assert struct.unpack_from("<H", idc, 78)[0] == h.cntlid
    assert struct.unpack_from("<I", idc, 80)[0] == 0x00010300
    assert idc[77] > 0  # MDTS
    assert struct.unpack_from("<H", idc, 320)[0] > 0  # KAS: Linux refuses 0
    assert struct.unpack_from("<H", idc, 514)[0] > 0  # MAXCMD
    assert struct.unpack_from("<I", idc, 516)[0] == 2  # NN
    sgls = struct.unpack_from("<I", idc, 536)[0]
    assert sgls & 1 and sgls & (1 << 20)
    assert idc[768:768 + len(NQN)].decode() == NQN and idc[768 + len(NQN)] == 0
    ioccsz, iorcsz = struct.unpack_from("<II", idc, 1792)
    assert ioccsz >= 4 and iorcsz >= 1
    assert struct.unpack_from("<H", idc, 1800)[0] == 0  # ICDOFF
    assert idc[24:64].decode().strip() and idc[4:24].decode().strip()

    for nsid, path in enumerate(t.paths, 1):
        cqe, ns = h.identify(0, nsid)
        assert cqe.ok
        nsze, ncap = struct.unpack_from("<QQ", ns, 0)
        assert nsze == ncap == path.stat().st_size // 512
        assert ns[128 + 2] == 9  # LBADS
        cqe, desc = h.identify(3, nsid)
        assert cqe.ok and desc[0] in (1, 2, 3) and desc[1] in (8, 16)
    cqe, lst = h.identify(2, 0)
    assert cqe.ok and struct.unpack_from("<3I", lst, 0) == (1, 2, 0)
    cqe, lst = h.identify(2, 1)
    assert cqe.ok and struct.unpack_from("<2I", lst, 0) == (2, 0)
    cqe, _ = h.identify(0, 3)
    assert (cqe.sct, cqe.sc) == (0, 0x0B)
    cqe, _ = h.identify(0x42)
    assert (cqe.sct, cqe.sc) == (0, 0x02)

    assert h.set_queues(4) == 4
    cqe, _ = h.cmd(sqe(0x0A, cdw10=0x07))
    assert cqe.ok and cqe.dw0 == 3 | (3 << 16)
    assert h.cmd(sqe(0x18))[0].ok  # Keep Alive
    cqe, log = h.get_log(0x02, 512)  # SMART: zeros
    assert cqe.ok and log == bytes(512)
    assert (h.cmd(sqe(0x7E))[0].sc) == 0x01  # invalid opcode

    # shutdown: CSTS.SHST reports complete
    assert h.prop_set(0x14, (6 << 16) | (4 << 20) | 1 | (1 << 14)).ok
    cqe, csts = h.prop_get(0x1C)
    assert (csts >> 2) & 3 == 2
    h.close()


def test_commands_before_connect_and_sequence(start_target):
    t = start_target()
    h = Host(t.port)
    h.icreq()
    cqe, _ = h.identify(1)
    assert (cqe.sct, cqe.sc) == (0, 0x0C)  # command sequence error: Connect first
    cqe = h.connect(0, subnqn="nqn.2024-01.io.fx100io:nope")
    assert (cqe.sct, cqe.sc) == (1, 0x82) and cqe.dw0 == 256  # IPO: subnqn in the data
    assert h.connect(0).ok
    cqe = h.connect(0)
    assert (cqe.sct, cqe.sc) == (0, 0x0C)  # second Connect
    h.close()


def test_connect_data_via_r2t(start_target):
    t = start_target()
    h = Host(t.port)
    h.icreq()
    assert h.connect(0, incapsule=False).ok
    h.enable()
    h.close()


# ------------------------------------------------------------------ I/O

def rand_blocks(n: int, bs: int) -> bytes:
    return os.urandom(n * bs)


@pytest.mark.parametrize("hdgst,ddgst", [(False, False), (True, False), (False, True),
                                         (True, True)])
def test_write_read_back_byte_exact(start_target, hdgst, ddgst):
    t = start_target(sizes=(32 << 20,))
    bs = 512
    nblocks = (32 << 20) // bs
    a = admin(t.port, hdgst, ddgst)
    a.set_queues(2)
    q = io_queue(t.port, a.cntlid, 1, hdgst, ddgst)
    written = {}
    slba = 3
    # in-capsule (small), R2T with one H2CData, R2T with several H2CData PDUs
    for nlb in (1, 7, 16, 33, 64, 257, 300, 2048, 8192):
        data = rand_blocks(nlb, bs)
        for incapsule in ((True, False) if nlb * bs <= 16384 else (False,)):
            assert q.write(slba, data, bs, incapsule=incapsule).ok
        written[slba] = data
        slba += nlb + 1 + (slba * 7919) % 97
    assert slba < nblocks
    for slba, data in written.items():
        cqe, back = q.read(slba, len(data) // bs, bs)
        assert cqe.ok and back == data
    assert q.cmd(sqe(0x00, nsid=1))[0].ok  # flush
    disk = t.paths[0].read_bytes()
    for slba, data in written.items():
        assert disk[slba * bs:slba * bs + len(data)] == data
    # a large read streams the file back (several C2HData PDUs with a digest)
    cqe, big = q.read(1000, 8192, bs)
    assert cqe.ok and big == t.paths[0].read_bytes()[1000 * bs:(1000 + 8192) * bs]
    q.close()
    a.close()


def test_read_c2hdata_framing(start_target):
    """C2HData PDUs cover the command's data exactly, in order, the last one
    flagged LAST_PDU, then a CapsuleResp."""
    t = start_target(sizes=(8 << 20,))
    a = admin(t.port)
    for ddgst in (False, True):
        q = io_queue(t.port, a.cntlid, 1 + ddgst, ddgst=ddgst)
        cid = q.submit(sqe(0x02, nsid=1, cdw10=0, cdw12=8191), data_in=4 << 20)
        cqe, data, seen = q.complete(cid, data_in=4 << 20)
        assert cqe.ok and data == t.paths[0].read_bytes()[:4 << 20]
        off = 0
        for p in seen[:-1]:
            assert p.type == C2H_DATA and p.ddgst_ok
            _, _, datao, datal = struct.unpack_from("<HHII", p.header, 8)
            assert datao == off
            off += datal
            assert bool(p.flags & F_LAST) == (off == 4 << 20)
        assert off == 4 << 20 and seen[-1].type == RSP
        q.close()
    a.close()


def test_hpda_alignment_of_c2h_data(start_target):
    t = start_target()
    a = admin(t.port)
    q = Host(t.port, hdgst=True, hpda=7)  # data at multiples of 32 bytes
    q.icreq()
    assert q.connect(1, cntlid=a.cntlid).ok
    cid = q.submit(sqe(0x02, nsid=1, cdw12=7), data_in=4096)
    cqe, data, seen = q.complete(cid, data_in=4096)
    assert cqe.ok and data == t.paths[0].read_bytes()[:4096]
    assert seen[0].type == C2H_DATA and seen[0].pdo % 32 == 0 and seen[0].pdo >= 28


def test_lba_range_and_namespace_checks(start_target):
    t = start_target(sizes=(1 << 20,))
    nblocks = (1 << 20) // 512
    a = admin(t.port)
    q = io_queue(t.port, a.cntlid, 1)
    cqe, _ = q.read(nblocks - 1, 2, 512)
    assert (cqe.sct, cqe.sc) == (0, 0x80)
    cqe, _ = q.read(nblocks, 1, 512)
    assert (cqe.sct, cqe.sc) == (0, 0x80)
    cqe, _ = q.read((1 << 64) - 1, 1, 512)
    assert (cqe.sct, cqe.sc) == (0, 0x80)
    before = t.paths[0].read_bytes()
    cqe = q.write(nblocks - 1, bytes(1024), 512)
    assert (cqe.sct, cqe.sc) == (0, 0x80)
    cqe = q.write(nblocks - 4, bytes(4096), 512, incapsule=False)  # no R2T for a bad range
    assert (cqe.sct, cqe.sc) == (0, 0x80)
    assert t.paths[0].read_bytes() == before
    cqe, _ = q.read(0, 1, 512, nsid=2)
    assert (cqe.sct, cqe.sc) == (0, 0x0B)
    cqe, _ = q.read(nblocks - 1, 1, 512)
    assert cqe.ok
    # a read whose SGL is shorter than the data: refused, nothing sent
    cid = q.submit(sqe(0x02, nsid=1, cdw12=7), data_in=512)
    cqe, _, seen = q.complete(cid, data_in=512)
    assert (cqe.sct, cqe.sc) == (0, 0x0F) and len(seen) == 1
    # in-capsule data whose descriptor points past the capsule
    cmd = sqe(0x01, nsid=1, cdw12=0)
    cid = q.next_cid()
    struct.pack_into("<H", cmd, 2, cid)
    struct.pack_into("<QI3xB", cmd, 24, 100, 512, 0x01)
    q.send_pdu(CMD, bytes(cmd), bytes(512))
    cqe, _, _ = q.complete(cid)
    assert (cqe.sct, cqe.sc) == (0, 0x16)


def test_flush_fua_and_write_zeroes(start_target):
    t = start_target(sizes=(4 << 20,))
    a = admin(t.port)
    q = io_queue(t.port, a.cntlid, 1)
    data = rand_blocks(64, 512)
    assert q.write(100, data, 512, fua=True).ok
    assert q.cmd(sqe(0x00, nsid=1))[0].ok
    assert q.cmd(sqe(0x00, nsid=0xFFFFFFFF))[0].ok
    assert t.paths[0].read_bytes()[100 * 512:164 * 512] == data
    assert q.cmd(sqe(0x08, nsid=1, cdw10=110, cdw12=9))[0].ok  # Write Zeroes 10 blocks
    cqe, back = q.read(100, 64, 512)
    assert back == data[:10 * 512] + bytes(10 * 512) + data[20 * 512:]
    cqe, _ = q.cmd(sqe(0x08, nsid=1, cdw10=(4 << 20) // 512 - 1, cdw12=1))
    assert (cqe.sct, cqe.sc) == (0, 0x80)
    assert q.cmd(sqe(0x09, nsid=1))[0].sc == 0x01  # DSM not supported: invalid opcode


def test_block_size_4096(start_target):
    t = start_target(sizes=((8 << 20) + 1000,), bs=4096)
    a = admin(t.port)
    cqe, ns = a.identify(0, 1)
    assert struct.unpack_from("<Q", ns, 0)[0] == 2048 and ns[130] == 12
    q = io_queue(t.port, a.cntlid, 1)
    data = rand_blocks(9, 4096)
    assert q.write(2039, data, 4096).ok
    cqe, back = q.read(2039, 9, 4096)
    assert cqe.ok and back == data
    assert (q.read(2047, 2, 4096)[0].sc) == 0x80


def test_loop_block_device(start_target, loop_device):
    """A real block device as the namespace (size from BLKGETSIZE64)."""
    t = start_target(paths=[Path(loop_device)], bs=4096)
    a = admin(t.port)
    cqe, ns = a.identify(0, 1)
    assert struct.unpack_from("<Q", ns, 0)[0] == (256 << 20) // 4096
    q = io_queue(t.port, a.cntlid, 1)
    data = rand_blocks(300, 4096)
    assert q.write(12345, data, 4096).ok
    assert q.cmd(sqe(0x00, nsid=1))[0].ok
    cqe, back = q.read(12345, 300, 4096)
    assert cqe.ok and back == data
    with open(loop_device, "rb") as f:
        f.seek(12345 * 4096)
        assert f.read(len(data)) == data


def test_several_io_queues_in_parallel(start_target):
    t = start_target(sizes=(32 << 20,))
    a = admin(t.port)
    assert a.set_queues(3) == 3
    queues = [io_queue(t.port, a.cntlid, qid) for qid in (1, 2, 3)]
    errors: list[BaseException] = []
    results: dict[int, bytes] = {}

    def worker(i: int, q: Host) -> None:
        try:
            for k in range(20):
                slba = (i * 20 + k) * 256
                data = rand_blocks(256, 512)
                assert q.write(slba, data, 512).ok
                results[slba] = data
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i, q)) for i, q in enumerate(queues)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    # read everything back through a different queue than wrote it
    for slba, data in results.items():
        cqe, back = queues[(slba // 256 + 1) % 3].read(slba, 256, 512)
        assert cqe.ok and back == data

    # I/O Connect errors: beyond the granted queues, a taken qid, a wrong cntlid or host
    h = Host(t.port)
    h.icreq()
    cqe = h.connect(4, cntlid=a.cntlid)
    assert (cqe.sct, cqe.sc) == (1, 0x82) and cqe.dw0 == (1 << 16) | 42
    cqe = h.connect(2, cntlid=a.cntlid)
    assert (cqe.sct, cqe.sc) == (0, 0x0C)
    cqe = h.connect(1, cntlid=(a.cntlid + 1) & 0xFFFF)
    assert (cqe.sct, cqe.sc) == (1, 0x82) and cqe.dw0 == 16
    cqe = h.connect(1, cntlid=a.cntlid, hostnqn=HOST_B)
    assert (cqe.sct, cqe.sc) == (1, 0x82)
    cqe = h.connect(1, cntlid=a.cntlid, sqsize=0)
    assert (cqe.sct, cqe.sc) == (1, 0x82) and cqe.dw0 == (1 << 16) | 44

    # the admin queue going away takes its I/O queues with it
    a.close()
    for q in queues:
        with pytest.raises((Closed, ConnectionResetError, BrokenPipeError)):
            deadline = time.monotonic() + 5  # a read may still beat the close
            while time.monotonic() < deadline:
                q.read(0, 1, 512)
                time.sleep(0.02)


def test_pipelined_commands_with_r2t(start_target):
    """The host may send more capsules behind a write before our R2T arrives:
    reads and other writes interleave with the R2T/H2CData exchange."""
    t = start_target(sizes=(8 << 20,))
    a = admin(t.port)
    q = io_queue(t.port, a.cntlid, 1)
    w1, w2 = rand_blocks(64, 512), rand_blocks(40, 512)
    c1 = q.submit(sqe(0x01, nsid=1, cdw10=0, cdw12=63), w1, incapsule=False)
    c2 = q.submit(sqe(0x01, nsid=1, cdw10=200, cdw12=39), w2, incapsule=False)
    c3 = q.submit(sqe(0x02, nsid=1, cdw10=1000, cdw12=7), data_in=4096)
    r2ts, resps, reads = {}, {}, bytearray(4096)
    answered = False
    while len(resps) < 3:
        p = q.recv_pdu()
        if p.type == R2T:
            cccid, ttag, r2to, r2tl = struct.unpack_from("<HHII", p.header, 8)
            r2ts[cccid] = (ttag, r2to, r2tl)
        elif p.type == C2H_DATA:
            _, _, datao, datal = struct.unpack_from("<HHII", p.header, 8)
            reads[datao:datao + datal] = p.data
        elif p.type == RSP:
            cqe = Cqe(*struct.unpack_from("<IIHHHH", p.header, 8))
            resps[cqe.cid] = cqe.status >> 1
        if len(r2ts) == 2 and not answered:
            answered = True
            # answer the second R2T first: transfers are independent
            for cid, data in ((c2, w2), (c1, w1)):
                ttag, r2to, r2tl = r2ts[cid]
                q.send_pdu(H2C_DATA, struct.pack("<HHII4x", cid, ttag, r2to, r2tl),
                           data[r2to:r2to + r2tl], flags=F_LAST)
    assert resps == {c1: 0, c2: 0, c3: 0}
    disk = t.paths[0].read_bytes()
    assert disk[:len(w1)] == w1 and disk[200 * 512:200 * 512 + len(w2)] == w2
    assert bytes(reads) == disk[1000 * 512:1000 * 512 + 4096]


def test_discovery_log_lists_our_subsystem(start_target):
    t = start_target()
    entries = discover(t.port)
    nvm = [e for e in entries if e["subtype"] == 2]
    assert len(nvm) == 1
    e = nvm[0]
    assert (e["trtype"], e["adrfam"], e["trsvcid"], e["traddr"], e["subnqn"]) == (
        3, 1, str(t.port), "127.0.0.1", NQN)
    assert e["cntlid"] == 0xFFFF
    assert all(x["subtype"] in (2, 3) for x in entries)


def test_allowed_hosts(start_target):
    t = start_target("--allow-host", HOST_A)
    h = Host(t.port)
    h.icreq()
    cqe = h.connect(0, hostnqn=HOST_B)
    assert (cqe.sct, cqe.sc) == (1, 0x84) and cqe.status & 0x4000  # DNR
    h.close()
    admin(t.port, hostnqn=HOST_A).close()
    # discovery answers anyone but lists the subsystem only to allowed hosts
    assert [e for e in discover(t.port, HOST_B) if e["subtype"] == 2] == []
    assert [e["subnqn"] for e in discover(t.port, HOST_A) if e["subtype"] == 2] == [NQN]


# ---------------------------------------------- broken and hostile PDUs

def _bad_first_pdu(h: Host) -> None:
    h.send_pdu(CMD, bytes(sqe(0x06)))  # a capsule before ICReq


def _unknown_type(h: Host) -> None:
    h.icreq()
    h.sock.sendall(struct.pack("<BBBBI", 0x55, 0, 8, 0, 8))


def _bad_hlen(h: Host) -> None:
    h.icreq()
    h.sock.sendall(struct.pack("<BBBBI", CMD, 0, 24, 0, 72) + bytes(64))


def _huge_plen(h: Host) -> None:
    h.icreq()
    h.sock.sendall(struct.pack("<BBBBI", CMD, 0, 72, 72, 0xFFFFFFF0) + bytes(64))


def _plen_below_hlen(h: Host) -> None:
    h.icreq()
    h.sock.sendall(struct.pack("<BBBBI", CMD, 0, 72, 0, 16) + bytes(64))


def _pdo_inside_header(h: Host) -> None:
    h.icreq()
    h.sock.sendall(struct.pack("<BBBBI", CMD, 0, 72, 8, 72 + 512) + bytes(64 + 512))


def _bad_header_digest(h: Host) -> None:
    h.want_hdgst = True
    h.icreq()
    h.send_pdu(CMD, bytes(sqe(0x06)), bad_hdgst=True)


def _second_icreq(h: Host) -> None:
    h.icreq()
    h.send_pdu(ICREQ, struct.pack("<HBBI", 0, 0, 0, 0) + bytes(112))


def _h2c_data_without_r2t(h: Host) -> None:
    h.icreq()
    assert h.connect(0).ok
    h.send_pdu(H2C_DATA, struct.pack("<HHII4x", 1, 7, 0, 512), bytes(512), flags=F_LAST)


def _h2c_data_past_r2t(h: Host) -> None:
    h.icreq()
    assert h.connect(0).ok
    h.enable()
    h.set_queues(1)
    cntlid = h.cntlid
    q = Host(h.port)
    q.icreq()
    assert q.connect(1, cntlid=cntlid).ok
    cid = q.submit(sqe(0x01, nsid=1, cdw12=7), bytes(4096), incapsule=False)
    p = q.recv_pdu()
    assert p.type == R2T
    _, ttag, _, r2tl = struct.unpack_from("<HHII", p.header, 8)
    q.send_pdu(H2C_DATA, struct.pack("<HHII4x", cid, ttag, 2048, 4096), bytes(4096))
    h.admin_sock = h.sock  # kept open: closing it would end the I/O queue anyway
    h.sock = q.sock  # the I/O queue is the one that must be terminated


def _h2c_datal_mismatch(h: Host) -> None:
    h.icreq()
    assert h.connect(0).ok
    h.sock.sendall(struct.pack("<BBBBIHHII4x", H2C_DATA, 0, 24, 24, 24 + 100, 1, 0, 0, 64)
                   + bytes(100))


def _unsupported_pfv(h: Host) -> None:
    h.send_pdu(ICREQ, struct.pack("<HBBI", 1, 0, 0, 0) + bytes(112))


def _c2h_type_from_host(h: Host) -> None:
    h.icreq()
    h.sock.sendall(struct.pack("<BBBBI", RSP, 0, 24, 0, 24) + bytes(16))


@pytest.mark.parametrize("attack, fes", [
    (_bad_first_pdu, 0x02), (_unknown_type, 0x01), (_bad_hlen, 0x01), (_huge_plen, 0x05),
    (_plen_below_hlen, 0x01), (_pdo_inside_header, 0x01), (_bad_header_digest, 0x03),
    (_second_icreq, 0x02), (_h2c_data_without_r2t, 0x01), (_h2c_data_past_r2t, 0x04),
    (_h2c_datal_mismatch, 0x01), (_unsupported_pfv, 0x06), (_c2h_type_from_host, 0x01),
])
def test_malformed_pdu_ends_only_that_connection(start_target, attack, fes):
    t = start_target(sizes=(4 << 20,))
    good = admin(t.port)
    good.set_queues(2)
    gq = io_queue(t.port, good.cntlid, 2)
    data = rand_blocks(8, 512)
    assert gq.write(10, data, 512).ok

    bad = Host(t.port)
    attack(bad)
    term = bad.expect_term_then_close()
    assert struct.unpack_from("<H", term.header, 8)[0] == fes
    assert term.flags == 0 and term.hlen == 24 and 24 <= term.plen <= 24 + 152

    # everything else keeps working
    cqe, back = gq.read(10, 8, 512)
    assert cqe.ok and back == data
    assert good.cmd(sqe(0x18))[0].ok
    admin(t.port, hostnqn=HOST_B).close()
    assert t.proc.poll() is None


def test_garbage_and_abrupt_disconnects_do_not_hurt_the_target(start_target):
    t = start_target()
    for blob in (b"", b"\x00", os.urandom(7), os.urandom(200), os.urandom(5000)):
        s = socket.create_connection(("127.0.0.1", t.port))
        s.sendall(blob)
        s.close()
    # half a capsule, then gone
    h = Host(t.port)
    h.icreq()
    h.sock.sendall(struct.pack("<BBBBI", CMD, 0, 72, 0, 72) + bytes(20))
    h.close()
    # a write whose data never comes
    a = admin(t.port)
    q = io_queue(t.port, a.cntlid, 1)
    q.submit(sqe(0x01, nsid=1, cdw12=63), bytes(64 * 512), incapsule=False)
    assert q.recv_pdu().type == R2T
    q.close()
    a.close()
    time.sleep(0.2)
    admin(t.port).close()
    assert t.proc.poll() is None


def test_h2c_term_from_host_closes_quietly(start_target):
    t = start_target()
    h = Host(t.port)
    h.icreq()
    h.send_pdu(H2C_TERM, struct.pack("<HHH10x", 1, 0, 0))
    with pytest.raises((Closed, ConnectionResetError)):
        h.recv_pdu()
    admin(t.port).close()


def test_data_digest_error_fails_only_the_command(start_target):
    t = start_target(sizes=(1 << 20,))
    a = admin(t.port)
    q = io_queue(t.port, a.cntlid, 1, ddgst=True)
    before = t.paths[0].read_bytes()
    # in-capsule data with a bad digest
    cid = q.submit(sqe(0x01, nsid=1, cdw10=5, cdw12=3), os.urandom(2048), bad_ddgst=True)
    cqe, _, _ = q.complete(cid)
    assert (cqe.sct, cqe.sc) == (0, 0x22) and not cqe.status & 0x4000  # retryable
    # H2CData with a bad digest
    data = os.urandom(8192)
    cid = q.submit(sqe(0x01, nsid=1, cdw10=50, cdw12=15), data, incapsule=False)
    p = q.recv_pdu()
    assert p.type == R2T
    _, ttag, _, r2tl = struct.unpack_from("<HHII", p.header, 8)
    q.send_pdu(H2C_DATA, struct.pack("<HHII4x", cid, ttag, 0, r2tl), data, flags=F_LAST,
               bad_ddgst=True)
    cqe, _, _ = q.complete(cid)
    assert (cqe.sct, cqe.sc) == (0, 0x22)
    assert t.paths[0].read_bytes() == before
    # the queue is still in step
    assert q.write(50, data, 512, incapsule=False).ok
    assert q.read(50, 16, 512)[1] == data


# ----------------------------------------------------- fault injection

def test_fault_corrupt_ddgst(start_target):
    t = start_target("--fault-corrupt-ddgst", "3")
    a = admin(t.port, ddgst=True)
    q = io_queue(t.port, a.cntlid, 1, ddgst=True)
    oks = []
    for _ in range(6):
        cid = q.submit(sqe(0x02, nsid=1, cdw12=7), data_in=4096)
        cqe, data, seen = q.complete(cid, data_in=4096)
        assert cqe.ok
        oks.append(seen[0].ddgst_ok)
        if seen[0].ddgst_ok:
            assert data == t.paths[0].read_bytes()[:4096]
    assert oks == [True, True, False, True, True, False]


def test_fault_drop_after(start_target):
    t = start_target("--fault-drop-after", "4")
    h = Host(t.port)
    h.icreq()                      # 1
    assert h.connect(0).ok         # 2
    assert h.prop_get(0x08)[0].ok  # 3
    assert h.prop_get(0x08)[0].ok  # 4, then the target hangs up
    with pytest.raises((Closed, ConnectionResetError, BrokenPipeError)):
        h.prop_get(0x08)
    # a new connection has its own count
    h2 = Host(t.port)
    h2.icreq()
    assert h2.connect(0).ok


def test_fault_delay(start_target):
    t = start_target("--fault-delay-ms", "300")
    h = Host(t.port)
    h.icreq()
    assert h.connect(0).ok
    t0 = time.monotonic()
    assert h.cmd(sqe(0x18))[0].ok
    assert time.monotonic() - t0 >= 0.29


def test_keep_alive_timeout_drops_the_controller(start_target):
    t = start_target()
    a = admin(t.port, kato=600)
    a.set_queues(1)
    q = io_queue(t.port, a.cntlid, 1)
    # keep alive (and I/O) keeps it
    for _ in range(6):
        time.sleep(0.2)
        assert a.cmd(sqe(0x18))[0].ok
    for _ in range(4):
        time.sleep(0.2)
        assert q.read(0, 1, 512)[0].ok  # traffic on an I/O queue counts too
    # silence: the controller and its queues go
    time.sleep(1.5)
    for h in (a, q):
        with pytest.raises((Closed, ConnectionResetError, BrokenPipeError)):
            h.cmd(sqe(0x18))
    assert t.stop() == 0
    assert "KATO" in t.stderr


def test_capsules_read_after_a_stall_past_kato_never_run(start_target):
    """The target is stopped (SIGSTOP) past its controller's KATO while a
    Keep Alive waits in the admin queue's socket and two writes in the I/O
    queue's.  Resumed, it must run none of them: KATO is checked when each
    capsule is read, against the clock then, and the first one after expiry
    does not restart the timer for the next.  The medium keeps its old bytes
    and the controller is gone."""
    t = start_target()
    a = admin(t.port, kato=500)
    a.set_queues(1)
    q = io_queue(t.port, a.cntlid, 1)
    assert q.write(0, b"\x11" * 4096, 512).ok
    with open(t.paths[0], "rb") as f:
        before = f.read(8192)
    assert before[:4096] == b"\x11" * 4096
    os.kill(t.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(1.2)  # past KATO (500 ms) by more than the 100 ms tick
        a.submit(sqe(0x18))
        q.submit(sqe(0x01, nsid=1, cdw10=0, cdw12=7), b"\xaa" * 4096)  # in the capsule
        q.submit(sqe(0x01, nsid=1, cdw10=8, cdw12=7), b"\xbb" * 4096, incapsule=False)
        time.sleep(0.2)  # (in the target's socket buffers before it resumes)
    finally:
        os.kill(t.proc.pid, signal.SIGCONT)
    for h in (a, q):
        with pytest.raises((Closed, ConnectionResetError, BrokenPipeError)):
            while True:  # no response, no R2T: the connection just ends
                p = h.recv_pdu()
                raise AssertionError(f"the target answered after its KATO ran out: {p}")
    assert t.stop() == 0
    with open(t.paths[0], "rb") as f:
        assert f.read(8192) == before, "a write read after the KATO ran out landed"
    assert "past KATO" in t.stderr or "no command within KATO" in t.stderr, t.stderr


def test_controller_reset_drops_io_queues(start_target):
    t = start_target()
    a = admin(t.port)
    q = io_queue(t.port, a.cntlid, 1)
    assert a.prop_set(0x14, 0).ok  # CC.EN = 0
    cqe, csts = a.prop_get(0x1C)
    assert csts & 1 == 0
    with pytest.raises((Closed, ConnectionResetError, BrokenPipeError)):
        q.read(0, 1, 512)
    a.enable()
    q = io_queue(t.port, a.cntlid, 1)
    assert q.read(0, 1, 512)[0].ok


def test_disconnect_command_closes_io_queue(start_target):
    t = start_target()
    a = admin(t.port)
    q = io_queue(t.port, a.cntlid, 1)
    c = bytearray(64)
    c[0], c[1], c[4] = 0x7F, 0x40, 0x08
    assert q.cmd(c)[0].ok
    with pytest.raises((Closed, ConnectionResetError)):
        q.recv_pdu()
    assert io_queue(t.port, a.cntlid, 1).read(0, 1, 512)[0].ok  # qid free again


# ------------------------------------------------------------ tshark

@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")
def test_tshark_decodes_our_pdus_without_malformed_packets(start_target, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("capturing on lo needs root")
    t = start_target(sizes=(4 << 20,))
    pcap = tmp_path / "nvme.pcap"
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # (ASan runs)
    cap = subprocess.Popen(["tshark", "-i", "lo", "-f", f"tcp port {t.port}", "-w", str(pcap)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 20
        err = ""
        while "Capturing on" not in err and time.monotonic() < deadline:
            r, _, _ = select.select([cap.stderr], [], [], 0.5)
            if r:
                err += cap.stderr.readline()
            if cap.poll() is not None:
                pytest.skip(f"tshark cannot capture here: {err}{cap.stderr.read()}")
        time.sleep(1.5)  # dumpcap reports before its filter is attached
        for hdgst, ddgst in ((False, False), (True, True)):
            a = admin(t.port, hdgst, ddgst)
            a.identify(1)
            a.get_log(0x02, 512)
            q = io_queue(t.port, a.cntlid, 1 + hdgst, hdgst, ddgst)
            assert q.write(0, rand_blocks(4, 512), 512).ok                  # in-capsule
            assert q.write(64, rand_blocks(64, 512), 512, incapsule=False).ok  # R2T
            assert q.read(0, 128, 512)[0].ok
            q.close()
            a.close()
        discover(t.port)
        time.sleep(1.0)
    finally:
        cap.send_signal(signal.SIGINT)
        cap.wait(20)
    decode = ["tshark", "-r", str(pcap), "-d", f"tcp.port=={t.port},nvme-tcp",
              "-o", "nvme-tcp.check_hdgst:TRUE", "-o", "nvme-tcp.check_ddgst:TRUE"]
    pdus = subprocess.run(decode + ["-T", "fields", "-e", "nvme-tcp.type"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert pdus.returncode == 0, pdus.stderr
    types = {int(x) for line in pdus.stdout.split() for x in line.split(",") if x}
    assert {ICREQ, ICRESP, CMD, RSP, C2H_DATA, R2T, H2C_DATA} <= types, (types, pcap.stat())
    # (digest status: 1 good, 0 bad -- a capture with --fault-corrupt-ddgst shows 0)
    bad = subprocess.run(decode + ["-Y", "_ws.malformed || (_ws.expert.severity >= warning"
                                   " && !tcp.analysis.flags) || nvme-tcp.hdgst.status == 0"
                                   " || nvme-tcp.ddgst.status == 0"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 0 and bad.stdout.strip() == "", bad.stdout[:3000]
    # wireshark checked the digests too: some were there to check
    dg = subprocess.run(decode + ["-Y", "nvme-tcp.type == 7 && nvme-tcp.hdgst.status == 1"
                                  " && nvme-tcp.ddgst.status == 1"],
                        capture_output=True, text=True, timeout=120, env=env)
    assert dg.stdout.strip(), "no C2HData with both digests checked good"


# ----------------------------------------------------------------- fuzz

def _valid_session(port: int, hdgst: bool, ddgst: bool) -> list[bytes]:
    """The PDUs of a valid admin + I/O session as the host would send them,
    recorded from our host (one recording per digest setting)."""
    h = Host(port, hdgst, ddgst)
    h.record = []
    h.icreq()
    assert h.connect(0).ok
    h.enable()
    h.identify(1)
    h.set_queues(1)
    h.get_log(0x02, 64)
    h.close()
    return h.record


def test_fuzzed_pdus_never_crash_the_target(start_target):
    import random

    t = start_target(sizes=(1 << 20,))
    rng = random.Random(1234)
    sessions = [_valid_session(t.port, hd, dd) for hd, dd in ((0, 0), (1, 1))]
    for i in range(int(os.environ.get("FX100IO_FUZZ_ITERATIONS", "300"))):
        pdus = list(rng.choice(sessions))
        k = rng.randrange(len(pdus))
        b = bytearray(pdus[k])
        for _ in range(rng.randint(1, 4)):
            what = rng.random()
            if what < 0.6 and b:
                pos = rng.randrange(min(len(b), 80)) if rng.random() < 0.7 else rng.randrange(len(b))
                b[pos] = rng.randrange(256)
            elif what < 0.8:
                b = b[:rng.randrange(len(b) + 1)]
            else:
                b += os.urandom(rng.randint(1, 64))
        pdus[k] = bytes(b)
        s = socket.create_connection(("127.0.0.1", t.port))
        s.settimeout(0.05)
        try:
            s.sendall(b"".join(pdus))
            while s.recv(65536):
                pass
        except (TimeoutError, ConnectionResetError, BrokenPipeError):
            pass
        finally:
            s.close()
        assert t.proc.poll() is None, f"target died at iteration {i}"
    a = admin(t.port)
    q = io_queue(t.port, a.cntlid, 1)
    data = rand_blocks(8, 512)
    assert q.write(3, data, 512).ok and q.read(3, 8, 512)[1] == data

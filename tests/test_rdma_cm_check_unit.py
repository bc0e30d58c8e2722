"""The pure parts of tests/rdma_cm_check.py, byte for byte against the NVMe/RDMA and
NVMe-oF layouts (../shared/notes/nvme-rdma.md): the CM private data, the keyed SGL
descriptor, the Connect and Property Get SQEs, the Connect data, and the decoders of
the accept, the reject and the CQE.  The expected bytes are written out by offset (or
as literal hex), not with the struct formats the module uses."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import rdma_cm_check as chk

HERE = Path(__file__).resolve().parent


def put(buf: bytearray, off: int, value: int, size: int) -> None:
    buf[off:off + size] = value.to_bytes(size, "little")


def test_cm_private_data_admin_queue():
    # recfmt 0, qid 0, hrqsize 32, hsqsize 31, then 24 zero bytes
    assert chk.cm_private_data(0, 32, 31) == bytes.fromhex("0000" "0000" "2000" "1f00") + bytes(24)


def test_cm_private_data_io_queue():
    want = bytearray(32)
    put(want, 2, 3, 2)        # qid
    put(want, 4, 128, 2)      # hrqsize
    put(want, 6, 127, 2)      # hsqsize
    assert chk.cm_private_data(3, 128, 127) == bytes(want)
    assert len(chk.cm_private_data(0xFFFF, 0xFFFF, 0xFFFF)) == 32


def test_keyed_sgl_descriptor():
    d = chk.keyed_sgl(0x1122334455667788, 0x0400, 0xAABBCCDD)
    assert d == bytes.fromhex("8877665544332211" "000400" "ddccbbaa" "40")
    assert chk.keyed_sgl(0, 0, 0) == bytes(15) + b"\x40"      # no data: length 0, key 0
    assert chk.keyed_sgl(1, (1 << 24) - 1, 1)[8:11] == b"\xff\xff\xff"
    with pytest.raises(ValueError):
        chk.keyed_sgl(0, 1 << 24, 0)


def test_connect_sqe():
    sgl = chk.keyed_sgl(0x7F0000001000, 1024, 0x1234)
    sqe = chk.connect_sqe(cid=5, qid=0, sqsize=31, sgl=sgl, kato_ms=15000)
    want = bytearray(64)
    want[0] = 0x7F                 # opcode: fabrics
    want[1] = 0x40                 # PSDT = 01b: SGL
    put(want, 2, 5, 2)             # command id
    want[4] = 0x01                 # fctype: Connect
    want[24:40] = sgl              # SGL1
    put(want, 40, 0, 2)            # recfmt
    put(want, 42, 0, 2)            # qid
    put(want, 44, 31, 2)           # sqsize, 0's based
    want[46] = 0                   # cattr
    put(want, 48, 15000, 4)        # kato
    assert sqe == bytes(want)
    assert sqe[24:40] == bytes.fromhex("00100000007f0000" "000400" "34120000" "40")
    io = chk.connect_sqe(cid=1, qid=7, sqsize=127, sgl=sgl)
    assert io[42:44] == b"\x07\x00" and io[44:46] == b"\x7f\x00" and io[48:52] == bytes(4)


def test_property_get_cap_sqe():
    sqe = chk.property_get_sqe(cid=9, offset=0, size8=True, sgl=chk.keyed_sgl(0, 0, 0))
    want = bytearray(64)
    want[0], want[1] = 0x7F, 0x40
    put(want, 2, 9, 2)
    want[4] = 0x04                 # fctype: Property Get
    want[39] = 0x40                # zero-length keyed descriptor: only its type byte set
    want[40] = 1                   # attrib: 8-byte property
    put(want, 44, 0, 4)            # offset: CAP
    assert sqe == bytes(want)
    csts = chk.property_get_sqe(cid=1, offset=0x1C, size8=False, sgl=chk.keyed_sgl(0, 0, 0))
    assert csts[40] == 0 and csts[44:48] == b"\x1c\x00\x00\x00"


def test_connect_data():
    hostid = uuid.UUID("12345678-9abc-def0-1122-334455667788").bytes
    sub, host = "nqn.2024-01.io.fx100io:lab", "nqn.2014-08.org.nvmexpress:uuid:1234"
    data = chk.connect_data(hostid, 0xFFFF, sub, host)
    want = bytearray(1024)
    want[0:16] = hostid
    put(want, 16, 0xFFFF, 2)
    want[256:256 + len(sub)] = sub.encode()
    want[512:512 + len(host)] = host.encode()
    assert data == bytes(want)
    assert data[:18] == bytes.fromhex("123456789abcdef01122334455667788" "ffff")
    with pytest.raises(ValueError):
        chk.connect_data(hostid, 0xFFFF, "n" * 256, host)
    with pytest.raises(ValueError):
        chk.connect_data(b"short", 0xFFFF, sub, host)


def test_decode_accept():
    data = bytes.fromhex("0000" "2000" "00000000") + bytes(24)
    assert chk.decode_accept(data) == {"recfmt": 0, "crqsize": 32}
    with pytest.raises(ValueError):
        chk.decode_accept(b"\x00\x00")


@pytest.mark.parametrize("sts,word", [(1, "length"), (2, "recfmt"), (3, "qid"), (4, "hsqsize"),
                                      (5, "hrqsize"), (6, "no resources"), (7, "IRD"),
                                      (8, "ORD")])
def test_decode_reject_statuses(sts, word):
    data = bytes([0, 0, sts, 0]) + bytes(144)       # the CM pads a REJ's private data
    status, why = chk.decode_reject(data)
    assert status == sts
    assert f"status {sts} (" in why and word in why


def test_decode_reject_that_is_not_nvme_rdma():
    assert chk.decode_reject(b"")[0] is None
    assert "no NVMe/RDMA listener" in chk.decode_reject(b"")[1]
    assert chk.decode_reject(bytes(148))[0] is None           # the CM's own reject, zeros
    status, why = chk.decode_reject(bytes.fromhex("0000" "0900"))
    assert status == 9 and "unknown reason" in why


def test_decode_cqe():
    # Connect success: cntlid 1 in dw0, sqhd 1, sqid 0, cid 5, status 0, phase 1
    cqe = bytes.fromhex("01000000" "00000000" "0100" "0000" "0500" "0100")
    c = chk.decode_cqe(cqe)
    assert (c["dw0"] & 0xFFFF, c["sqhd"], c["sqid"], c["cid"], c["status"], c["phase"]) == (
        1, 1, 0, 5, 0, 1)
    # Property Get CAP: the 64-bit value in dw0|dw1
    cap = 0x0000_0020_F001_03FF
    raw = bytearray(16)
    put(raw, 0, cap, 8)
    put(raw, 12, 6, 2)
    assert chk.decode_cqe(bytes(raw))["result"] == cap
    # Connect error: SCT 1 (command specific), SC 0x82 (invalid parameters), DNR
    raw = bytearray(16)
    put(raw, 14, ((1 << 14) | (1 << 8) | 0x82) << 1, 2)
    c = chk.decode_cqe(bytes(raw))
    assert c["status"] == 0x4182 and c["status"] & 0x7FF == 0x182 and c["phase"] == 0
    with pytest.raises(ValueError):
        chk.decode_cqe(bytes(15))


def test_result_line_keys():
    assert json.loads(chk.result_line()) == {
        "connected": False, "crqsize": None, "cntlid": None, "connect_status": None,
        "cap": None, "reject_status": None, "error": None}


def test_script_without_rdma_reports_json_not_a_traceback():
    """On a host without RDMA (or without pyverbs) the script still prints one JSON line
    with the error, and exits non-zero."""
    p = subprocess.run([sys.executable, str(HERE / "rdma_cm_check.py"), "--addr", "127.0.0.1",
                        "--port", "4421", "--subnqn", "nqn.a", "--hostnqn", "nqn.b",
                        "--timeout", "2"], capture_output=True, text=True, timeout=60)
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1, p.stdout + p.stderr
    res = json.loads(lines[0])
    if Path("/dev/infiniband/rdma_cm").exists():
        pytest.skip("this host has RDMA CM: the script's outcome depends on the network")
    assert p.returncode in (1, 2) and res["connected"] is False and res["error"]
    assert "Traceback" not in p.stderr

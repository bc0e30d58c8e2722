"""The pure parts of tests/support/rdma_cm_check.py, byte for byte against the NVMe/RDMA and
NVMe-oF layouts (docs/nvme-rdma.md): the CM private data, the keyed SGL
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
from support import rdma_cm_check as chk

SUPPORT = Path(__file__).resolve().parents[1] / "support"


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
    p = subprocess.run([sys.executable, str(SUPPORT / "rdma_cm_check.py"), "--addr", "127.0.0.1",
                        "--port", "4421", "--subnqn", "nqn.a", "--hostnqn", "nqn.b",
                        "--timeout", "2"], capture_output=True, text=True, timeout=60)
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1, p.stdout + p.stderr
    res = json.loads(lines[0])
    if Path("/dev/infiniband/rdma_cm").exists():
        pytest.skip("this host has RDMA CM: the script's outcome depends on the network")
    assert p.returncode in (1, 2) and res["connected"] is False and res["error"]
    assert "Traceback" not in p.stderr


# ---- the check's flow, against a model of pyverbs and of an NVMe/RDMA target -----------
#
# No RDMA here, so the steps of Check (CM events, QP states, receives, SEND, responses,
# deadlines) run against stand-ins with the same names and signatures as pyverbs 44.
# The model target is strict where a real one is: it RDMA-READs the Connect data only
# from a QP in RTS whose access flags allow remote read, with the MR's rkey.

import os  # noqa: E402
import types  # noqa: E402
from collections import deque  # noqa: E402

ENUMS = dict(IBV_WC_SUCCESS=0, IBV_WC_REM_ACCESS_ERR=10, IBV_QPT_RC=2, IBV_WR_SEND=2,
             IBV_SEND_SIGNALED=2, IBV_QPS_RESET=0, IBV_QPS_INIT=1, IBV_QPS_RTR=2, IBV_QPS_RTS=3,
             IBV_ACCESS_LOCAL_WRITE=1, IBV_ACCESS_REMOTE_WRITE=2, IBV_ACCESS_REMOTE_READ=4)
CM_ENUMS = dict(RDMA_PS_TCP=0x106, RDMA_CM_EVENT_ADDR_RESOLVED=0, RDMA_CM_EVENT_ROUTE_RESOLVED=2,
                RDMA_CM_EVENT_CONNECT_RESPONSE=5, RDMA_CM_EVENT_REJECTED=8,
                RDMA_CM_EVENT_ESTABLISHED=9, RDMA_CM_EVENT_DISCONNECTED=10)
E = types.SimpleNamespace(**ENUMS)
CE = types.SimpleNamespace(**CM_ENUMS)
CAP_VALUE = 0x0000_0020_3C01_03FF


class Target:
    """What the target does, and what it saw."""

    def __init__(self, mode: str = "ok"):
        self.mode = mode            # ok | silent | no-response | connect-error
        self.private_data = b""
        self.commands: list[bytes] = []
        self.connect_data = b""
        self.qp_states: list[int] = []


def fake_pyverbs(target: Target) -> dict[str, types.ModuleType]:
    mrs: dict[int, object] = {}
    next_addr = [0x7F00_0000_0000]

    class WC:
        def __init__(self, wr_id, status=0, byte_len=0):
            self.wr_id, self.status, self.byte_len, self.vendor_err = wr_id, status, byte_len, 0

    class CQ:
        def __init__(self, ctx, cqe, cq_context, channel, comp_vector):
            self.wcs: deque = deque()

        def poll(self, n=1):
            out = [self.wcs.popleft() for _ in range(min(n, len(self.wcs)))]
            return len(out), out

        def close(self):
            pass

    class MR:
        def __init__(self, pd, length, access):
            self.buf, self.access, self.data = next_addr[0], access, bytearray(length)
            next_addr[0] += 1 << 20
            self.lkey, self.rkey = 0x100 + len(mrs), 0x2000 + len(mrs)
            mrs[self.buf] = self

        def write(self, data, length, offset=0):
            self.data[offset:offset + length] = data[:length]

        def read(self, length, offset):
            return bytes(self.data[offset:offset + length])

        def close(self):
            pass

    def mem(addr, length):
        for base, mr in mrs.items():
            if base <= addr and addr + length <= base + len(mr.data):
                return mr, addr - base
        raise AssertionError(f"no MR holds {addr:#x}+{length}")

    class SGE:
        def __init__(self, addr, length, lkey):
            self.addr, self.length, self.lkey = addr, length, lkey

    class RecvWR:
        def __init__(self, wr_id=0, num_sge=0, sg=None):
            assert num_sge == 1 and len(sg) == 1
            self.wr_id, self.sg = wr_id, sg

    class SendWR:
        def __init__(self, wr_id=0, opcode=2, num_sge=0, sg=None, send_flags=2):
            assert num_sge == 1 and len(sg) == 1 and opcode == E.IBV_WR_SEND
            self.wr_id, self.sg, self.send_flags = wr_id, sg, send_flags

    class QPCap:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    class QPInitAttr:
        def __init__(self, qp_type, scq, rcq, cap, sq_sig_all=1):
            assert qp_type == E.IBV_QPT_RC and scq is rcq
            self.cq, self.cap = scq, cap

    class QP:
        def __init__(self, pd, init):
            self.cq, self.cap, self.qp_num = init.cq, init.cap, 0x11
            self.state, self.access, self.recvs = E.IBV_QPS_RESET, 0, deque()

        def modify(self, attr, mask):
            self.state, self.access = attr.qp_state, attr.qp_access_flags
            target.qp_states.append(attr.qp_state)

        def post_recv(self, wr):
            assert self.state >= E.IBV_QPS_INIT, "receive posted on a QP in RESET"
            assert len(self.recvs) < self.cap.max_recv_wr
            self.recvs.append(wr)

        def post_send(self, wr):
            assert self.state == E.IBV_QPS_RTS, "SEND on a QP not in RTS"
            sge = wr.sg[0]
            mr, off = mem(sge.addr, sge.length)
            assert sge.lkey == mr.lkey and sge.length == 64
            sqe = mr.read(64, off)
            target.commands.append(sqe)
            if target.mode == "no-response":
                return
            cqe = self._execute(sqe)
            if cqe is None:
                self.cq.wcs.append(WC(wr.wr_id, status=E.IBV_WC_REM_ACCESS_ERR))
                return
            rwr = self.recvs.popleft()                    # the response may come first
            rmr, roff = mem(rwr.sg[0].addr, 16)
            rmr.write(cqe, 16, roff)
            self.cq.wcs.append(WC(rwr.wr_id, byte_len=16))
            self.cq.wcs.append(WC(wr.wr_id))

        def _execute(self, sqe):
            cid = int.from_bytes(sqe[2:4], "little")
            assert sqe[0] == 0x7F and sqe[1] == 0x40 and sqe[39] == 0x40
            addr = int.from_bytes(sqe[24:32], "little")
            length = int.from_bytes(sqe[32:35], "little")
            key = int.from_bytes(sqe[35:39], "little")
            result, status = 0, 0
            if sqe[4] == 0x01:
                if not self.access & E.IBV_ACCESS_REMOTE_READ:
                    return None                           # the target's RDMA READ fails
                mr, off = mem(addr, length)
                assert key == mr.rkey and mr.access & E.IBV_ACCESS_REMOTE_READ
                target.connect_data = mr.read(length, off)
                result = 1
                if target.mode == "connect-error":
                    result, status = 0, 0x4182
            elif sqe[4] == 0x04:
                assert (addr, length, key) == (0, 0, 0)
                assert sqe[40] == 1 and sqe[44:48] == bytes(4)
                result = CAP_VALUE
            raw = bytearray(16)
            raw[0:8] = result.to_bytes(8, "little")
            raw[12:14] = cid.to_bytes(2, "little")
            raw[14:16] = ((status << 1) | 1).to_bytes(2, "little")
            return bytes(raw)

        def close(self):
            pass

    class CMEventChannel:
        def __init__(self):
            self.rfd, self.wfd = os.pipe()
            self.fd = self.rfd
            self.events: deque = deque()

        def post(self, etype, data=b""):
            self.events.append((etype, data))
            os.write(self.wfd, b"e")

        def close(self):
            os.close(self.rfd)
            os.close(self.wfd)

    class CMEvent:
        def __init__(self, channel):
            assert os.read(channel.rfd, 1) == b"e", "CMEvent would block"
            self.event_type, self.private_data = channel.events.popleft()

        def event_str(self):
            return {v: k for k, v in CM_ENUMS.items()}.get(self.event_type, "?")

        def ack_cm_event(self):
            pass

    class Attr:
        max_qp_rd_atom, max_qp_init_rd_atom = 128, 128

    class Ctx:
        def query_device(self):
            return Attr()

    class AddrInfo:
        def __init__(self, src=None, dst=None, dst_service=None, port_space=0):
            assert dst and dst_service and port_space == CE.RDMA_PS_TCP

    class QPAttr:
        def __init__(self, state, access):
            self.qp_state, self.qp_access_flags = state, access

    class ConnParam:
        def __init__(self, resources=1, depth=1, flow_control=0, retry=5, rnr_retry=5, srq=0,
                     qp_num=0, data_len=0):
            self.qp_num, self.data_len, self.data = qp_num, data_len, b""

        def set_private_data(self, data):
            self.data = bytes(data[:self.data_len])

    class CMID:
        def __init__(self, creator=None, port_space=0):
            self.channel, self.context, self.pd = creator, Ctx(), object()
            self.got_rep = False

        def resolve_addr(self, ai, timeout_ms):
            self.channel.post(CE.RDMA_CM_EVENT_ADDR_RESOLVED)

        def resolve_route(self, timeout_ms):
            self.channel.post(CE.RDMA_CM_EVENT_ROUTE_RESOLVED)

        def init_qp_attr(self, state):
            # before the REP the CM gives no remote access (as Linux's cma does)
            access = (E.IBV_ACCESS_REMOTE_READ | E.IBV_ACCESS_REMOTE_WRITE) if self.got_rep else 0
            return QPAttr(state, access), 0x1FF

        def connect(self, param):
            assert param.qp_num == 0x11
            target.private_data = param.data
            if target.mode == "silent":
                return
            qid, hrqsize, hsqsize = (int.from_bytes(param.data[i:i + 2], "little")
                                     for i in (2, 4, 6))
            if qid == 0 and hsqsize + 1 > 32:
                self.channel.post(CE.RDMA_CM_EVENT_REJECTED, bytes([0, 0, 4, 0]) + bytes(144))
                return
            self.got_rep = True
            self.channel.post(CE.RDMA_CM_EVENT_CONNECT_RESPONSE,
                              (0).to_bytes(2, "little") + hrqsize.to_bytes(2, "little") + bytes(4))

        def establish(self):
            pass

        def disconnect(self):
            self.channel.post(CE.RDMA_CM_EVENT_DISCONNECTED)

        def close(self):
            pass

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        return m

    mods = {
        "pyverbs.enums": module("pyverbs.enums", **ENUMS),
        "pyverbs.cm_enums": module("pyverbs.cm_enums", **CM_ENUMS),
        "pyverbs.cmid": module("pyverbs.cmid", CMEventChannel=CMEventChannel, CMEvent=CMEvent,
                               CMID=CMID, AddrInfo=AddrInfo, ConnParam=ConnParam),
        "pyverbs.cq": module("pyverbs.cq", CQ=CQ),
        "pyverbs.mr": module("pyverbs.mr", MR=MR),
        "pyverbs.qp": module("pyverbs.qp", QP=QP, QPCap=QPCap, QPInitAttr=QPInitAttr),
        "pyverbs.wr": module("pyverbs.wr", SGE=SGE, RecvWR=RecvWR, SendWR=SendWR),
    }
    pkg = module("pyverbs", __path__=[])
    for name, m in mods.items():
        setattr(pkg, name.split(".")[1], m)
    mods["pyverbs"] = pkg
    return mods


def run_against(monkeypatch, target: Target, *extra: str) -> dict:
    for name, m in fake_pyverbs(target).items():
        monkeypatch.setitem(sys.modules, name, m)
    args = chk.parser().parse_args(["--addr", "10.88.0.2", "--port", "4421", "--subnqn",
                                    "nqn.2024-01.io.fx100io:lab", "--hostnqn", "nqn.host",
                                    "--hostid", "12345678-9abc-def0-1122-334455667788",
                                    "--timeout", "0.3", *extra])
    return chk.run_check(args)


def test_flow_connect_and_property_get(monkeypatch):
    t = Target()
    res = run_against(monkeypatch, t)
    assert res == {"connected": True, "crqsize": 32, "cntlid": 1, "connect_status": 0,
                   "cap": CAP_VALUE, "reject_status": None, "error": None}
    assert t.private_data == chk.cm_private_data(0, 32, 31)
    # INIT before the receives, INIT again once the REP grants remote access, RTR, RTS
    assert t.qp_states == [E.IBV_QPS_INIT, E.IBV_QPS_INIT, E.IBV_QPS_RTR, E.IBV_QPS_RTS]
    assert [c[4] for c in t.commands] == [0x01, 0x04]
    assert [int.from_bytes(c[2:4], "little") for c in t.commands] == [0, 1]
    assert t.commands[0][44:46] == (31).to_bytes(2, "little")
    assert t.connect_data == chk.connect_data(
        uuid.UUID("12345678-9abc-def0-1122-334455667788").bytes, 0xFFFF,
        "nqn.2024-01.io.fx100io:lab", "nqn.host")


def test_flow_rejected_hsqsize(monkeypatch):
    res = run_against(monkeypatch, Target(), "--hsqsize", "200")
    assert res["connected"] is False and res["reject_status"] == 4
    assert "hsqsize" in res["error"]
    assert res["cntlid"] is None and res["connect_status"] is None


def test_flow_target_that_never_answers_the_cm_times_out(monkeypatch):
    res = run_against(monkeypatch, Target("silent"))
    assert res["connected"] is False and res["reject_status"] is None
    assert res["error"] == "timed out after 0.3 s waiting for the target's answer to the CM connect"


def test_flow_command_without_response_times_out(monkeypatch):
    res = run_against(monkeypatch, Target("no-response"))
    assert res["connected"] is True and res["connect_status"] is None
    assert res["error"] == "timed out after 0.3 s waiting for the Fabrics Connect response"


def test_flow_connect_error_status(monkeypatch):
    res = run_against(monkeypatch, Target("connect-error"))
    assert res["connected"] is True and res["connect_status"] == 0x4182
    assert res["cntlid"] is None and res["cap"] is None
    assert "Fabrics Connect failed: status 0x4182" in res["error"]

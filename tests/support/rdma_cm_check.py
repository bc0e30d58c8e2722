#!/usr/bin/env python3
"""An independent NVMe/RDMA connect check, written with pyverbs (not fx100io's C core).

It runs the same steps as fx100io's RDMA transport, by a second implementation, so the
two can be compared against one target:

  1. RDMA CM (port space TCP): resolve address and route, an RC QP of our own (external
     to the CM id: created, moved to INIT and given its receives before the connect),
     ``rdma_connect`` with the 32-byte NVMe/RDMA private data (recfmt 0, qid, hrqsize,
     hsqsize).  The target accepts (its private data holds crqsize) or rejects (its
     private data holds the NVMe/RDMA reject status, decoded here).
  2. The Fabrics Connect command: a 64-byte SQE in one signaled SEND, its 1024-byte data
     (hostid, cntlid, subnqn at 256, hostnqn at 512) in a registered buffer that the
     target reads by RDMA READ through a keyed SGL data block descriptor.
  3. On the admin queue (qid 0): a Property Get of CAP (8 bytes), with a zero-length keyed
     descriptor, the value in the response CQE.

Every wait has a deadline (--timeout, default 10 s): a target that never answers ends in
"error": "timed out ...", never a hang.  One JSON line on stdout:

  {"connected": bool, "crqsize": N, "cntlid": N, "connect_status": N, "cap": N,
   "reject_status": N|null, "error": str|null}

connect_status is the NVMe status field of the Connect response (SCT << 8 | SC, 0 on
success).  Exit status 0 when connected and the Connect succeeded, 1 otherwise, 2 when
pyverbs is missing or the arguments are wrong.

    python3 tests/support/rdma_cm_check.py --addr 10.88.0.2 --port 4421 \\
        --subnqn nqn.2024-01.io.fx100io:lab --hostnqn nqn.2014-08.org.nvmexpress:uuid:...

The byte builders and decoders at the top need no pyverbs and are unit-tested on any
host (tests/fabric/test_rdma_cm_check_unit.py); only run_check() needs an RDMA device.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import struct
import sys
import time
import uuid
from typing import Any

# ---- NVMe/RDMA and NVMe-oF formats (all little-endian) ------------------------------------

NVME_FABRICS_OPCODE = 0x7F
FCTYPE_PROPERTY_SET = 0x00
FCTYPE_CONNECT = 0x01
FCTYPE_PROPERTY_GET = 0x04
PSDT_SGL = 0x40                 # CDW0 flags bits 7:6 = 01b: SGLs for the data
SGL_KEYED_DATA_BLOCK = 0x40     # descriptor type 4, subtype 0 (address)
PROP_CAP = 0x00
SQE_SIZE = 64
CQE_SIZE = 16
CONNECT_DATA_SIZE = 1024
CM_PRIVATE_DATA_SIZE = 32

REJECT_REASONS = {
    1: "invalid private data length",
    2: "invalid record format (recfmt)",
    3: "invalid queue id (qid)",
    4: "invalid host send queue size (hsqsize)",
    5: "invalid host receive queue size (hrqsize)",
    6: "no resources",
    7: "invalid IRD",
    8: "invalid ORD",
}


def cm_private_data(qid: int, hrqsize: int, hsqsize: int, recfmt: int = 0) -> bytes:
    """The NVMe/RDMA CM connect request's 32 bytes: recfmt, qid, hrqsize, hsqsize, zeros."""
    return struct.pack("<HHHH24x", recfmt, qid, hrqsize, hsqsize)


def decode_accept(data: bytes) -> dict[str, int]:
    """The accept's private data: recfmt, crqsize (the controller's receive queue size)."""
    if len(data) < 4:
        raise ValueError(f"accept private data is {len(data)} bytes, fewer than 4")
    recfmt, crqsize = struct.unpack_from("<HH", data, 0)
    return {"recfmt": recfmt, "crqsize": crqsize}


def decode_reject(data: bytes) -> tuple[int | None, str]:
    """(NVMe/RDMA reject status or None, a sentence) from a reject's private data.
    None when the data is not an NVMe/RDMA reject (too short, or status 0, as when
    the CM itself rejects: no listener on that address and port)."""
    if len(data) < 4:
        return None, (f"rejected without NVMe/RDMA private data ({len(data)} bytes): no "
                      "NVMe/RDMA listener at that address and port?")
    recfmt, sts = struct.unpack_from("<HH", data, 0)
    if sts == 0:
        return None, ("rejected without an NVMe/RDMA status (zero private data): no "
                      "NVMe/RDMA listener at that address and port?")
    why = REJECT_REASONS.get(sts, "unknown reason")
    return sts, f"rejected by the target: NVMe/RDMA status {sts} ({why}), recfmt {recfmt}"


def keyed_sgl(addr: int, length: int, key: int) -> bytes:
    """A keyed SGL data block descriptor (16 bytes): address u64, length u24, key u32,
    byte 15 = 0x40.  length 0 and key 0 for a command without data."""
    if not 0 <= length < 1 << 24:
        raise ValueError(f"keyed SGL length {length} does not fit 24 bits")
    return struct.pack("<Q", addr) + length.to_bytes(3, "little") + struct.pack("<IB", key,
                                                                                 SGL_KEYED_DATA_BLOCK)


def connect_sqe(cid: int, qid: int, sqsize: int, sgl: bytes, kato_ms: int = 0,
                cattr: int = 0, recfmt: int = 0) -> bytes:
    """The Fabrics Connect SQE: opcode 0x7f, PSDT SGL, fctype 0x01 at byte 4, SGL1 at
    24..39, recfmt 40, qid 42, sqsize (0's based) 44, cattr 46, kato 48."""
    if len(sgl) != 16:
        raise ValueError("SGL descriptor must be 16 bytes")
    return struct.pack("<BBHB19x16sHHHBxI12x", NVME_FABRICS_OPCODE, PSDT_SGL, cid, FCTYPE_CONNECT,
                       sgl, recfmt, qid, sqsize, cattr, kato_ms)


def property_get_sqe(cid: int, offset: int, size8: bool, sgl: bytes) -> bytes:
    """The Fabrics Property Get SQE: fctype 0x04, attrib at byte 40 (size: 0 = 4 bytes,
    1 = 8 bytes), offset u32 at 44."""
    if len(sgl) != 16:
        raise ValueError("SGL descriptor must be 16 bytes")
    return struct.pack("<BBHB19x16sB3xI16x", NVME_FABRICS_OPCODE, PSDT_SGL, cid,
                       FCTYPE_PROPERTY_GET, sgl, 1 if size8 else 0, offset)


def connect_data(hostid: bytes, cntlid: int, subnqn: str, hostnqn: str) -> bytes:
    """The Connect command's 1024 bytes: hostid (16) at 0, cntlid at 16, subnqn at 256,
    hostnqn at 512, each NQN NUL-padded in its 256 bytes."""
    if len(hostid) != 16:
        raise ValueError("hostid must be 16 bytes")
    sub, host = subnqn.encode(), hostnqn.encode()
    for name, b in (("subnqn", sub), ("hostnqn", host)):
        if len(b) > 255:
            raise ValueError(f"{name} is {len(b)} bytes, more than 255")
    return struct.pack("<16sH238x256s256s256x", hostid, cntlid, sub, host)


def decode_cqe(cqe: bytes) -> dict[str, int]:
    """A 16-byte completion: dw0, dw1, sqhd, sqid, cid, status (the field without the
    phase bit: SCT << 8 | SC, plus CRD/M/DNR above), phase, and the 64-bit result."""
    if len(cqe) < CQE_SIZE:
        raise ValueError(f"CQE is {len(cqe)} bytes, fewer than 16")
    dw0, dw1, sqhd, sqid, cid, st = struct.unpack_from("<IIHHHH", cqe, 0)
    return {"dw0": dw0, "dw1": dw1, "result": dw0 | dw1 << 32, "sqhd": sqhd, "sqid": sqid,
            "cid": cid, "status": st >> 1, "phase": st & 1}


def result_line(connected: bool = False, crqsize: int | None = None, cntlid: int | None = None,
                connect_status: int | None = None, cap: int | None = None,
                reject_status: int | None = None, error: str | None = None) -> str:
    return json.dumps({"connected": connected, "crqsize": crqsize, "cntlid": cntlid,
                       "connect_status": connect_status, "cap": cap,
                       "reject_status": reject_status, "error": error})


# ---- pyverbs -----------------------------------------------------------------------------


def import_pyverbs() -> None:
    """Make `import pyverbs.*` work, through fx100io's finder (it knows where Debian's
    python3-pyverbs lives; this checkout's fx100io when run as a script), else the
    plain import."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if repo not in sys.path:
        sys.path.append(repo)
    try:
        from fx100io.rdma_devices import import_pyverbs as find
    except Exception:   # fx100io not importable by this interpreter: the plain import
        try:
            import pyverbs  # noqa: F401
        except ImportError as ex:
            raise ImportError(f"pyverbs is not available ({ex}): install Debian's "
                              "python3-pyverbs") from None
        return
    find()


class CheckTimeout(Exception):
    pass


class CheckError(Exception):
    pass


def _rdma_cm_fds() -> set[int]:
    fds = set()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return fds
    for n in names:
        try:
            if os.readlink(f"/proc/self/fd/{n}") == "/dev/infiniband/rdma_cm":
                fds.add(int(n))
        except OSError:
            pass
    return fds


class Check:
    """One connection: CM id, our own CQ and RC QP, registered buffers."""

    SEND_WR_ID = 1 << 32

    def __init__(self, args: argparse.Namespace):
        import pyverbs.cm_enums as ce
        import pyverbs.enums as e
        self.e, self.ce = e, ce
        self.args = args
        self.timeout = float(args.timeout)
        self.cmid: Any = None
        self.qp: Any = None
        self.cq: Any = None
        self.mrs: list[Any] = []
        self.cid = 0
        self.connected = False
        from pyverbs.cmid import CMEventChannel
        before = _rdma_cm_fds()
        try:
            self.channel = CMEventChannel()
        except Exception as ex:
            raise CheckError(f"cannot open the RDMA CM ({ex}): no RDMA stack or device here "
                             "(rdma_ucm module, /dev/infiniband/rdma_cm, `rdma link`)") from None
        # pyverbs 44 does not show the channel's fd: it is the rdma_cm file it opened
        fd = getattr(self.channel, "fd", None)
        if fd is None:
            new = _rdma_cm_fds() - before
            fd = max(new) if new else None
        self.channel_fd: int | None = fd

    # -- CM events, each with a deadline
    def _next_event(self) -> tuple[int, str, bytes]:
        from pyverbs.cmid import CMEvent
        if self.channel_fd is not None:
            p = select.poll()
            p.register(self.channel_fd, select.POLLIN)
            if not p.poll(int(self.timeout * 1000)):
                raise CheckTimeout
            ev = CMEvent(self.channel)
        else:   # no fd: interrupt the blocking read with an alarm
            fired = []
            old = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
            signal.setitimer(signal.ITIMER_REAL, self.timeout)
            try:
                ev = CMEvent(self.channel)
            except Exception:
                if fired:
                    raise CheckTimeout from None
                raise
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
        try:
            return ev.event_type, ev.event_str(), ev.private_data
        finally:
            ev.ack_cm_event()

    def wait_event(self, what: str, expected: int) -> tuple[int, bytes]:
        try:
            etype, name, data = self._next_event()
        except CheckTimeout:
            raise CheckError(f"timed out after {self.timeout:g} s waiting for {what}") from None
        if etype != expected and etype != self.ce.RDMA_CM_EVENT_REJECTED:
            raise CheckError(f"{what}: got CM event {name or etype} instead")
        return etype, data

    def connect(self, res: dict[str, Any]) -> bool:
        from pyverbs.cmid import CMID, AddrInfo, ConnParam
        from pyverbs.cq import CQ
        from pyverbs.mr import MR
        from pyverbs.qp import QP, QPCap, QPInitAttr
        from pyverbs.wr import SGE, RecvWR
        e, ce, a = self.e, self.ce, self.args
        ms = int(self.timeout * 1000)
        self.cmid = CMID(creator=self.channel, port_space=ce.RDMA_PS_TCP)
        ai = AddrInfo(src=a.src, dst=a.addr, dst_service=str(a.port), port_space=ce.RDMA_PS_TCP)
        self.cmid.resolve_addr(ai, ms)
        etype, _ = self.wait_event("address resolution", ce.RDMA_CM_EVENT_ADDR_RESOLVED)
        self.cmid.resolve_route(ms)
        self.wait_event("route resolution", ce.RDMA_CM_EVENT_ROUTE_RESOLVED)
        ctx, pd = self.cmid.context, self.cmid.pd
        attr = ctx.query_device()
        nrecv = max(1, min(a.hrqsize, 128))
        self.cq = CQ(ctx, nrecv + 8, None, None, 0)
        cap = QPCap(max_send_wr=4, max_recv_wr=nrecv, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap,
                                    sq_sig_all=0))
        qattr, mask = self.cmid.init_qp_attr(e.IBV_QPS_INIT)
        self.qp.modify(qattr, mask)
        # receive buffers: one CQE each, posted before the first send
        self.rx = MR(pd, nrecv * CQE_SIZE, e.IBV_ACCESS_LOCAL_WRITE)
        self.sqe_mr = MR(pd, SQE_SIZE, e.IBV_ACCESS_LOCAL_WRITE)
        self.data_mr = MR(pd, CONNECT_DATA_SIZE, e.IBV_ACCESS_LOCAL_WRITE
                          | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE)
        self.mrs = [self.rx, self.sqe_mr, self.data_mr]
        for i in range(nrecv):
            sge = SGE(self.rx.buf + i * CQE_SIZE, CQE_SIZE, self.rx.lkey)
            self.qp.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[sge]))
        param = ConnParam(resources=min(int(attr.max_qp_rd_atom), 255),
                          depth=min(int(attr.max_qp_init_rd_atom), 255), flow_control=1,
                          retry=7, rnr_retry=7, qp_num=self.qp.qp_num,
                          data_len=CM_PRIVATE_DATA_SIZE)
        param.set_private_data(cm_private_data(a.qid, a.hrqsize, a.hsqsize))
        self.cmid.connect(param)
        etype, data = self.wait_event("the target's answer to the CM connect",
                                      ce.RDMA_CM_EVENT_CONNECT_RESPONSE)
        if etype == ce.RDMA_CM_EVENT_REJECTED:
            res["reject_status"], res["error"] = decode_reject(data)
            return False
        acc = decode_accept(data)
        res["crqsize"] = acc["crqsize"]
        # INIT again: only now (the REP in hand) does the CM grant remote read/write access
        # and the responder resources the target's RDMA READs need; then RTR and RTS
        for state in (e.IBV_QPS_INIT, e.IBV_QPS_RTR, e.IBV_QPS_RTS):
            qattr, mask = self.cmid.init_qp_attr(state)
            self.qp.modify(qattr, mask)
        self.cmid.establish()
        self.connected = res["connected"] = True
        return True

    def command(self, what: str, sqe: bytes) -> dict[str, int]:
        """SEND one SQE, wait for its send completion and its response; the CQE decoded."""
        from pyverbs.wr import SGE, RecvWR, SendWR
        e = self.e
        self.sqe_mr.write(sqe, len(sqe), 0)
        sge = SGE(self.sqe_mr.buf, SQE_SIZE, self.sqe_mr.lkey)
        self.qp.post_send(SendWR(wr_id=self.SEND_WR_ID, opcode=e.IBV_WR_SEND, num_sge=1, sg=[sge],
                                 send_flags=e.IBV_SEND_SIGNALED))
        got: dict[int, Any] = {}
        deadline = time.monotonic() + self.timeout
        cqe = None
        while cqe is None or self.SEND_WR_ID not in got:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CheckError(f"timed out after {self.timeout:g} s waiting for the {what} "
                                 "response")
            n, wcs = self.cq.poll(8)
            for wc in wcs:
                if wc.status != e.IBV_WC_SUCCESS:
                    raise CheckError(f"{what}: work completion {wc.wr_id:#x} failed with "
                                     f"status {wc.status} (vendor error {wc.vendor_err:#x})")
                if wc.wr_id == self.SEND_WR_ID:
                    got[wc.wr_id] = wc
                    continue
                slot = int(wc.wr_id)
                c = decode_cqe(self.rx.read(CQE_SIZE, slot * CQE_SIZE))
                # give the buffer back before anything else can fail
                rsge = SGE(self.rx.buf + slot * CQE_SIZE, CQE_SIZE, self.rx.lkey)
                self.qp.post_recv(RecvWR(wr_id=slot, num_sge=1, sg=[rsge]))
                if wc.byte_len != CQE_SIZE:
                    raise CheckError(f"{what}: response of {wc.byte_len} bytes, not 16")
                if c["cid"] != self.cid:
                    raise CheckError(f"{what}: response for command id {c['cid']}, "
                                     f"expected {self.cid}")
                cqe = c
            if not n:
                time.sleep(0.0005)
        self.cid += 1
        return cqe

    def fabrics_connect(self, res: dict[str, Any]) -> None:
        a = self.args
        hostid = uuid.UUID(a.hostid).bytes if a.hostid else uuid.uuid4().bytes
        self.data_mr.write(connect_data(hostid, a.cntlid, a.subnqn, a.hostnqn), CONNECT_DATA_SIZE,
                           0)
        sgl = keyed_sgl(self.data_mr.buf, CONNECT_DATA_SIZE, self.data_mr.rkey)
        c = self.command("Fabrics Connect", connect_sqe(self.cid, a.qid, a.hsqsize, sgl,
                                                        kato_ms=a.kato_ms))
        res["connect_status"] = c["status"]
        if c["status"] != 0:
            res["error"] = (f"Fabrics Connect failed: status {c['status']:#x} "
                            f"(dw0 {c['dw0']:#x})")
            return
        res["cntlid"] = c["dw0"] & 0xFFFF
        if a.qid == 0:
            c = self.command("Property Get CAP",
                             property_get_sqe(self.cid, PROP_CAP, True, keyed_sgl(0, 0, 0)))
            if c["status"] != 0:
                res["error"] = f"Property Get CAP failed: status {c['status']:#x}"
                return
            res["cap"] = c["result"]

    def close(self) -> None:
        if self.connected:
            self.timeout = min(self.timeout, 2.0)
            try:
                self.cmid.disconnect()
                self._next_event()
            except Exception:
                pass
        for obj in [self.qp, *self.mrs, self.cq, self.cmid, self.channel]:
            if obj is not None:
                try:
                    obj.close()
                except Exception:
                    pass


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = json.loads(result_line())
    chk = None
    try:
        chk = Check(args)
        if chk.connect(res):
            chk.fabrics_connect(res)
    except CheckError as ex:
        res["error"] = str(ex)
    except Exception as ex:  # pyverbs raises its own classes: report, never a traceback
        res["error"] = f"{type(ex).__name__}: {ex}"
    finally:
        if chk is not None:
            chk.close()
    return res


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="NVMe/RDMA connect check with pyverbs: RDMA CM "
                                "connect, Fabrics Connect, Property Get CAP; one JSON line.")
    p.add_argument("--addr", required=True, help="target IP address")
    p.add_argument("--port", type=int, default=4420, help="target port (default 4420)")
    p.add_argument("--src", default=None, help="local IP address to bind (default: any)")
    p.add_argument("--subnqn", required=True)
    p.add_argument("--hostnqn", required=True)
    p.add_argument("--hostid", default=None, help="host id UUID (default: a random one)")
    p.add_argument("--qid", type=int, default=0)
    p.add_argument("--hsqsize", type=int, default=31, help="host send queue size, 0's based "
                   "(also the Connect's SQSIZE; default 31)")
    p.add_argument("--hrqsize", type=int, default=32, help="host receive queue size (default 32)")
    p.add_argument("--cntlid", type=lambda s: int(s, 0), default=0xFFFF,
                   help="controller id for the Connect data (0xFFFF: any, for the admin queue)")
    p.add_argument("--kato-ms", type=int, default=0, help="keep alive timeout (default 0: off)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds for every wait (10)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        import_pyverbs()
    except Exception as ex:
        print(result_line(error=str(ex)))
        return 2
    res = run_check(args)
    print(json.dumps(res))
    return 0 if res["connected"] and res["connect_status"] == 0 and not res["error"] else 1


if __name__ == "__main__":
    sys.exit(main())

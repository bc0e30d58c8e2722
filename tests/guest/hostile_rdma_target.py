"""A hostile NVMe/RDMA target of our own (pyverbs), for tests/guest/test_rdma_command_keys.py.

Run as a script inside the lab guest: `python3 hostile_rdma_target.py ADDR PORT 1,2,3`.  It
serves just enough of a controller (Fabrics Connect, properties, Identify, Set Features) for
fx100io's initiator to open one namespace on one I/O queue, then plays the scenarios named,
one per I/O queue connection, and says what happened as JSON lines on stdout:

1. a READ: it RDMA-WRITEs the pattern of the command's blocks with the key the command gave
   it and answers with a plain SEND (no remote invalidation, so the host must invalidate the
   key itself); at the next command it RDMA-WRITEs 0xEE bytes with that key again;
2. a WRITE: it RDMA-READs the data with the command's key and answers; at the next command
   it RDMA-READs with that key again;
3. a READ: before answering, it RDMA-READs the command's buffer with the command's own key
   (which allows remote writes only);
4. a READ: before answering, it RDMA-WRITEs just past the end of the command's buffer with
   the command's own key.

Each attack is expected to fail with a remote access error; an attack fails the queue pair,
so the host reconnects for the next scenario.  Blocking pyverbs calls only: the test that
starts this process bounds it with its own timeout.
"""

from __future__ import annotations

import collections
import json
import struct
import sys

sys.path.append("/usr/lib/python3/dist-packages")  # Debian's python3-pyverbs, after the rest

import pyverbs.cm_enums as ce  # noqa: E402
import pyverbs.enums as e  # noqa: E402
from pyverbs.cmid import CMID, AddrInfo, ConnParam  # noqa: E402
from pyverbs.qp import QPCap, QPInitAttr  # noqa: E402

BLOCK = 4096
NS_BLOCKS = 2048  # 8 MiB
RECVS = 64
CAPSULE = 64
SIGNALED = e.IBV_SEND_SIGNALED


def say(**kv) -> None:
    print(json.dumps(kv), flush=True)


def pattern(slba: int, n: int) -> bytes:
    """The bytes the target "holds" at block slba onwards: each block says its number."""
    return b"".join(struct.pack("<Q", slba + i) * (BLOCK // 8) for i in range(n // BLOCK))


class Conn:
    """One accepted queue: FIFO receive buffers (a receive queue completes in order)."""

    def __init__(self, cmid: CMID):
        self.id = cmid
        self.recvs: collections.deque = collections.deque()
        for _ in range(RECVS):
            mr = cmid.reg_msgs(CAPSULE)
            cmid.post_recv(mr, CAPSULE)
            self.recvs.append(mr)
        cmid.accept(ConnParam(resources=4, depth=4, data_len=32))
        self.rsp = cmid.reg_msgs(16)
        self.big = cmid.reg_read(1 << 20)  # RDMA READ lands here, RDMA WRITE leaves from here

    def next_capsule(self) -> bytes | None:
        wc = self.id.get_recv_comp()
        mr = self.recvs.popleft()
        if wc.status != e.IBV_WC_SUCCESS:
            return None
        data = mr.read(CAPSULE, 0)
        self.id.post_recv(mr, CAPSULE)
        self.recvs.append(mr)
        return data

    def respond(self, cid: int, dw0: int = 0, dw1: int = 0, status: int = 0) -> bool:
        self.rsp.write(struct.pack("<IIHHHH", dw0, dw1, 0, 0, cid, status << 1), 16)
        self.id.post_send(self.rsp, SIGNALED, 16)
        return self.id.get_send_comp().status == e.IBV_WC_SUCCESS

    def rdma(self, write: bool, addr: int, key: int, n: int) -> int:
        """One RDMA WRITE (from self.big) or READ (into it); the completion's status."""
        if write:
            self.id.post_write(self.big, n, addr, key, SIGNALED)
        else:
            self.id.post_read(self.big, n, addr, key, SIGNALED)
        return self.id.get_send_comp().status


def sgl(cap: bytes) -> tuple[int, int, int]:
    addr = struct.unpack_from("<Q", cap, 24)[0]
    n = int.from_bytes(cap[32:35], "little")
    key = struct.unpack_from("<I", cap, 35)[0]
    return addr, n, key


def serve_admin(c: Conn, until_ns_identify: bool) -> None:
    """Answer admin capsules; return after Identify Namespace (until_ns_identify), or once a
    shutdown was reported complete, or when the queue dies."""
    cc = 0
    cap = 127 | 1 << 16 | 1 << 24 | 1 << 37  # MQES 128, CQR, TO 500 ms, NVM command set
    while True:
        cmd = c.next_capsule()
        if cmd is None:
            return
        opc, cid = cmd[0], struct.unpack_from("<H", cmd, 2)[0]
        dw0 = dw1 = 0
        if opc == 0x7F:  # Fabrics
            fctype = cmd[4]
            off = struct.unpack_from("<I", cmd, 44)[0]
            if fctype == 0x01:  # Connect
                dw0 = 1  # cntlid
            elif fctype == 0x04:  # Property Get
                val = {0x0: cap, 0x8: 0x10400, 0x14: cc,
                       0x1C: (1 if cc & 1 else 0) | ((2 << 2) if cc & (3 << 14) else 0)}
                v = val.get(off, 0)
                dw0, dw1 = v & 0xFFFFFFFF, v >> 32
            elif fctype == 0x00 and off == 0x14:  # Property Set of CC
                cc = struct.unpack_from("<I", cmd, 48)[0]
        elif opc == 0x06:  # Identify
            cns = cmd[40]
            addr, n, key = sgl(cmd)
            page = bytearray(4096)
            if cns == 1:
                page[77] = 5  # MDTS: 128 KiB
                struct.pack_into("<I", page, 516, 1)  # NN
                struct.pack_into("<I", page, 1792, 4)  # IOCCSZ: the capsule alone, no data
                struct.pack_into("<I", page, 1796, 1)  # IORCSZ
            elif cns == 0:
                struct.pack_into("<QQ", page, 0, NS_BLOCKS, NS_BLOCKS)
                page[130] = 12  # LBAF0: 4 KiB blocks
            c.big.write(bytes(page), 4096, 0)
            c.rdma(True, addr, key, min(n, 4096))
            if not c.respond(cid):
                return
            if cns == 0 and until_ns_identify:
                return
            continue
        elif opc == 0x09:  # Set Features (Number of Queues): one of each
            dw0 = 0
        if not c.respond(cid, dw0, dw1):
            return
        if opc == 0x7F and cmd[4] == 0x04 and off == 0x1C and cc & (3 << 14):
            return  # the host saw its shutdown complete: it is closing the queue


def serve_io(c: Conn, scenario: int) -> None:
    """One I/O queue connection, one scenario (see the module's docstring)."""
    prev = None  # (op, addr, n, key) of the last completed command
    while True:
        cmd = c.next_capsule()
        if cmd is None:
            say(scenario=scenario, event="queue gone")
            return
        opc, cid = cmd[0], struct.unpack_from("<H", cmd, 2)[0]
        if opc == 0x7F:  # Connect
            c.respond(cid, 1)
            continue
        if prev is not None:
            op, addr, n, key = prev
            write = op == "read"  # the key of a read allowed remote writes while it lasted
            status = c.rdma(write, addr, key, min(n, BLOCK))
            say(scenario=scenario, event="after", op=op, addr=addr, key=key,
                attack="write" if write else "read", status=status)
            return
        addr, n, key = sgl(cmd)
        slba = struct.unpack_from("<Q", cmd, 40)[0]
        if opc == 0x02 and scenario == 3:
            status = c.rdma(False, addr, key, BLOCK)
            say(scenario=scenario, event="read with a write key", key=key, status=status)
            return
        if opc == 0x02 and scenario == 4:
            status = c.rdma(True, addr + n, key, BLOCK)
            say(scenario=scenario, event="past the end", addr=addr + n, key=key, status=status)
            return
        if opc == 0x02:
            c.big.write(pattern(slba, n), n, 0)
            status = c.rdma(True, addr, key, n)
            say(scenario=scenario, event="served", op="read", key=key, n=n, status=status)
            prev = ("read", addr, n, key)
        elif opc == 0x01:
            status = c.rdma(False, addr, key, n)
            say(scenario=scenario, event="served", op="write", key=key, n=n, status=status,
                data=c.big.read(n, 0)[:16].hex())
            prev = ("write", addr, n, key)
        c.respond(cid)


def main() -> None:
    addr, port = sys.argv[1], sys.argv[2]
    scenarios = [int(x) for x in sys.argv[3].split(",")]
    ai = AddrInfo(src=addr, src_service=port, port_space=ce.RDMA_PS_TCP, flags=ce.RAI_PASSIVE)
    cap = QPCap(max_send_wr=16, max_recv_wr=RECVS, max_send_sge=1, max_recv_sge=1)
    listen = CMID(creator=ai, qp_init_attr=QPInitAttr(qp_type=e.IBV_QPT_RC, cap=cap))
    listen.listen()
    say(event="listening")
    admin = Conn(listen.get_request())
    serve_admin(admin, until_ns_identify=True)
    for scenario in scenarios:
        io = Conn(listen.get_request())
        serve_io(io, scenario)
        io.id.close()
    serve_admin(admin, until_ns_identify=False)  # the host's shutdown
    say(event="done")


if __name__ == "__main__":
    main()

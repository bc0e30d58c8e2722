"""A hostile NVMe/RDMA target of our own (pyverbs), for tests/guest/test_rdma_command_keys.py.

Run as a script inside the lab guest: `python3 hostile_rdma_target.py ADDR PORT 1,2,3
[GRANT]`.  It serves just enough of a controller (Fabrics Connect, properties, Identify, Set
Features granting GRANT I/O queues, 1 unless given) for fx100io's initiator to open one
namespace, then plays the scenarios named, one per I/O queue connection (7: per two), and
says what happened as JSON lines on stdout:

1. a READ: it RDMA-WRITEs the pattern of the command's blocks with the key the command gave
   it and answers with a plain SEND (no remote invalidation, so the host must invalidate the
   key itself); at the next command it RDMA-WRITEs 0xEE bytes with that key again;
2. a WRITE: it RDMA-READs the data with the command's key and answers; at the next command
   it RDMA-READs with that key again;
3. a READ: before answering, it RDMA-READs the command's buffer with the command's own key
   (which allows remote writes only);
4. a READ: before answering, it RDMA-WRITEs just past the end of the command's buffer with
   the command's own key.

5. a READ: it answers at once, writing nothing, with SEND_WITH_INVALIDATE of a key that is
   not the command's (the command's key with its low byte, the bind counter, one further);
6. a READ of two commands: it takes both capsules, writes nothing, and answers the first with
   SEND_WITH_INVALIDATE of the second's key (a live key of ours, just not this command's).
7. scenario 6 across two queue pairs of one host thread (the host's default on a target that
   grants enough I/O queues): it accepts two I/O queues, takes a READ capsule from each,
   answers the first with SEND_WITH_INVALIDATE of the second's key, waits a second and
   answers the second with a plain SEND (a host that still thought the second key live would
   invalidate it again); then it accepts the two reconnected queues and serves every READ on
   either (the pattern, a plain SEND) until the host shuts the controller down, saying which
   queue pair each came on.

Each attack is expected to fail (a remote access error, or the host taking the queue down);
an attack fails the queue pair, so the host reconnects for the next scenario.  The queue pairs
are our own (not librdmacm's), so that a response can carry an invalidation.  Every wait
polls with a deadline: the process never hangs, and the test bounds it with its own timeout
too.

The admin queue is answered at every moment, as a real controller's is: while it waits for
an I/O queue's connect request and while it waits for an I/O capsule, the target serves any
admin capsule that arrived (the host may send admin commands whenever it likes: Identify
CNS 03h after Identify Namespace, keep alive, a log page).  An admin command it does not
implement gets an error status (Invalid Command Opcode or Invalid Field), never silence.
pyverbs' rdma_get_request holds the GIL while it blocks, so this is one thread that polls:
the listening id's event channel (found in /proc/self/fd: pyverbs does not give its fd) is
checked with select() before get_request is called.
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import struct
import sys
import time

sys.path.append("/usr/lib/python3/dist-packages")  # Debian's python3-pyverbs, after the rest

import pyverbs.cm_enums as ce  # noqa: E402
import pyverbs.enums as e  # noqa: E402
from pyverbs.cmid import CMID, AddrInfo, ConnParam  # noqa: E402
from pyverbs.cq import CQ  # noqa: E402
from pyverbs.mr import MR  # noqa: E402
from pyverbs.qp import QP, QPCap, QPInitAttr  # noqa: E402
from pyverbs.wr import SGE, RecvWR, SendWR  # noqa: E402

BLOCK = 4096
NS_BLOCKS = 2048  # 8 MiB
RECVS = 64
CAPSULE = 64
SIGNALED = e.IBV_SEND_SIGNALED
WAIT_S = 60  # no completion takes this long unless something is wrong
GRANT = 1  # I/O queues granted by Set Features Number of Queues (argv[4])


def say(**kv) -> None:
    print(json.dumps(kv), flush=True)


def pattern(slba: int, n: int) -> bytes:
    """The bytes the target "holds" at block slba onwards: each block says its number."""
    return b"".join(struct.pack("<Q", slba + i) * (BLOCK // 8) for i in range(n // BLOCK))


class Gone(Exception):
    """The queue pair failed (the host took it down, or an attack failed it)."""


class Conn:
    """One accepted queue, on a queue pair of our own: librdmacm's rdma_post_send cannot send
    with an invalidation.  Receives complete in order (one receive queue)."""

    def __init__(self, cmid: CMID, listen: CMID):
        self.id = cmid
        ctx = cmid.context or listen.context
        self.pd = cmid.pd or listen.pd
        self.scq = CQ(ctx, 64, None, None, 0)
        self.rcq = CQ(ctx, RECVS, None, None, 0)
        cap = QPCap(max_send_wr=16, max_recv_wr=RECVS, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.scq, rcq=self.rcq,
                                         cap=cap))
        for state in (e.IBV_QPS_INIT, e.IBV_QPS_RTR, e.IBV_QPS_RTS):
            attr, mask = cmid.init_qp_attr(state)
            if state == e.IBV_QPS_RTR:
                attr.max_dest_rd_atomic = 4
            if state == e.IBV_QPS_RTS:
                attr.max_rd_atomic = 4
            self.qp.modify(attr, mask)
            if state == e.IBV_QPS_INIT:
                self.recvs = [MR(self.pd, CAPSULE, e.IBV_ACCESS_LOCAL_WRITE) for _ in range(RECVS)]
                for i in range(RECVS):
                    self._post_recv(i)
        self.next_recv = 0
        cmid.accept(ConnParam(resources=4, depth=4, qp_num=self.qp.qp_num, data_len=32))
        self.rsp = MR(self.pd, 16, e.IBV_ACCESS_LOCAL_WRITE)
        # RDMA READ lands here, RDMA WRITE leaves from here
        self.big = MR(self.pd, 1 << 20, e.IBV_ACCESS_LOCAL_WRITE)

    def _post_recv(self, i: int) -> None:
        mr = self.recvs[i]
        self.qp.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[SGE(mr.buf, CAPSULE, mr.lkey)]))

    @staticmethod
    def _poll(cq: CQ, idle=None, wait_s: float = WAIT_S):
        """The next completion of cq; idle() runs between polls (the admin queue's service
        while an I/O queue waits)."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            n, wcs = cq.poll()
            if n > 0:
                return wcs[0]
            if idle is None or not idle():
                time.sleep(0.001)
        raise Gone(f"no completion within {wait_s} s")

    def _take(self, wc) -> bytes | None:
        if wc.status != e.IBV_WC_SUCCESS:
            return None
        i = wc.wr_id
        data = self.recvs[i].read(CAPSULE, 0)
        self._post_recv(i)
        return data

    def next_capsule(self, idle=None) -> bytes | None:
        try:
            wc = self._poll(self.rcq, idle)
        except Gone:
            return None
        return self._take(wc)

    def capsule_now(self) -> tuple[bool, bytes | None]:
        """(True, capsule or None if the queue failed) when one had arrived; (False, None)
        when none had."""
        n, wcs = self.rcq.poll()
        if n <= 0:
            return False, None
        return True, self._take(wcs[0])

    def _send(self, wr: SendWR, wait_s: float = WAIT_S) -> int:
        self.qp.post_send(wr)
        try:
            return self._poll(self.scq, wait_s=wait_s).status
        except Gone:
            return -1

    def respond(self, cid: int, dw0: int = 0, dw1: int = 0, status: int = 0,
                invalidate: int | None = None, wait_s: float = WAIT_S) -> bool:
        """The response capsule; with invalidate, sent WITH_INVALIDATE of that key."""
        self.rsp.write(struct.pack("<IIHHHH", dw0, dw1, 0, 0, cid, status << 1), 16)
        sg = [SGE(self.rsp.buf, 16, self.rsp.lkey)]
        if invalidate is None:
            wr = SendWR(opcode=e.IBV_WR_SEND, num_sge=1, sg=sg, send_flags=SIGNALED)
        else:
            # the invalidate key shares its place in the work request with imm_data
            wr = SendWR(opcode=e.IBV_WR_SEND_WITH_INV, num_sge=1, sg=sg, send_flags=SIGNALED,
                        imm_data=invalidate)
        return self._send(wr, wait_s) == e.IBV_WC_SUCCESS

    def rdma(self, write: bool, addr: int, key: int, n: int) -> int:
        """One RDMA WRITE (from self.big) or READ (into it); the completion's status."""
        wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE if write else e.IBV_WR_RDMA_READ, num_sge=1,
                    sg=[SGE(self.big.buf, n, self.big.lkey)], send_flags=SIGNALED)
        wr.set_wr_rdma(key, addr)
        return self._send(wr)

    def close(self) -> None:
        # what hangs on the PD first: the CM id owns the PD
        self.qp.close()
        for mr in [*self.recvs, self.rsp, self.big]:
            mr.close()
        self.scq.close()
        self.rcq.close()
        self.id.close()


def sgl(cap: bytes) -> tuple[int, int, int]:
    addr = struct.unpack_from("<Q", cap, 24)[0]
    n = int.from_bytes(cap[32:35], "little")
    key = struct.unpack_from("<I", cap, 35)[0]
    return addr, n, key


SC_INVALID_OPCODE = 0x01
SC_INVALID_FIELD = 0x02


class Admin:
    """The admin queue's controller: properties, Identify, Set Features, Keep Alive.  Other
    commands get an error status, as a real controller's unsupported ones do."""

    def __init__(self, c: Conn):
        self.c = c
        self.cc = 0
        self.gone = False
        self.shut_down = False  # the host saw its shutdown complete (it is closing the queue)
        self.cap = 127 | 1 << 16 | 1 << 24 | 1 << 37  # MQES 128, CQR, TO 500 ms, NVM commands

    def serve_pending(self) -> bool:
        """Answer one admin capsule if one arrived; whether one did."""
        if self.gone:
            return False
        got, cmd = self.c.capsule_now()
        if got:
            self._handle(cmd)
        return got

    def serve_until_shutdown(self) -> None:
        while not self.gone and not self.shut_down:
            self._handle(self.c.next_capsule())

    def _handle(self, cmd: bytes | None) -> None:
        if cmd is None:
            self.gone = True
            return
        c = self.c
        opc, cid = cmd[0], struct.unpack_from("<H", cmd, 2)[0]
        dw0 = dw1 = status = 0
        if opc == 0x7F:  # Fabrics
            fctype = cmd[4]
            off = struct.unpack_from("<I", cmd, 44)[0]
            if fctype == 0x01:  # Connect
                dw0 = 1  # cntlid
            elif fctype == 0x04:  # Property Get
                cc = self.cc
                val = {0x0: self.cap, 0x8: 0x10400, 0x14: cc,
                       0x1C: (1 if cc & 1 else 0) | ((2 << 2) if cc & (3 << 14) else 0)}
                v = val.get(off, 0)
                dw0, dw1 = v & 0xFFFFFFFF, v >> 32
                if off == 0x1C and cc & (3 << 14):
                    self.shut_down = True
            elif fctype == 0x00 and off == 0x14:  # Property Set of CC
                self.cc = struct.unpack_from("<I", cmd, 48)[0]
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
            elif cns == 3:
                pass  # Namespace Identification Descriptors: none (an empty list)
            else:
                status = SC_INVALID_FIELD
            if not status:
                c.big.write(bytes(page), 4096, 0)
                c.rdma(True, addr, key, min(n, 4096))
        elif opc == 0x09:  # Set Features (Number of Queues: GRANT of each; others accepted)
            dw0 = (GRANT - 1) * 0x10001 if cmd[40] == 0x07 else 0
        elif opc == 0x18:  # Keep Alive
            pass
        else:
            status = SC_INVALID_OPCODE
        if not c.respond(cid, dw0, dw1, status):
            self.gone = True


def wait_request(listen: CMID, fd: int, admin: Admin):
    """The next connect request on listen, serving the admin queue while none is there."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0)
        if ready:
            return listen.get_request()
        if not admin.serve_pending():
            time.sleep(0.001)
    raise Gone(f"no connect request within {WAIT_S} s")


def rdma_cm_fds() -> set[int]:
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/infiniband/rdma_cm":
                fds.add(int(name))
        except OSError:
            pass
    return fds


def serve_io(c: Conn, scenario: int, admin: Admin) -> None:
    """One I/O queue connection, one scenario (see the module's docstring)."""
    prev = None  # (op, addr, n, key) of the last completed command
    while True:
        cmd = c.next_capsule(admin.serve_pending)
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
        if opc == 0x02 and scenario == 5:
            wrong = (key & ~0xFF) | ((key + 1) & 0xFF)
            sent = c.respond(cid, invalidate=wrong)
            say(scenario=scenario, event="invalidated a wrong key", key=key, wrong=wrong,
                sent=sent)
            return
        if opc == 0x02 and scenario == 6:
            second = c.next_capsule(admin.serve_pending)
            if second is None:
                say(scenario=scenario, event="queue gone")
                return
            _, n2, key2 = sgl(second)
            sent = c.respond(cid, invalidate=key2)
            say(scenario=scenario, event="invalidated the other command's key", key=key,
                other=key2, n=n, n2=n2, sent=sent)
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


def accept_io(listen: CMID, fd: int, admin: Admin) -> Conn:
    """The next I/O queue, its Fabrics Connect answered."""
    c = Conn(wait_request(listen, fd, admin), listen)
    cmd = c.next_capsule(admin.serve_pending)
    if cmd is None or cmd[0] != 0x7F:
        raise Gone("an I/O queue that did not start with a Connect")
    c.respond(struct.unpack_from("<H", cmd, 2)[0], 1)
    return c


def capsule_any(conns: list[Conn], admin: Admin) -> tuple[int, bytes | None]:
    """The next capsule on any of conns: (its index, it); None when that queue failed.
    (-1, None) once the host shut the controller down."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if admin.gone or admin.shut_down:
            return -1, None
        for i, c in enumerate(conns):
            got, cmd = c.capsule_now()
            if got:
                return i, cmd
        if not admin.serve_pending():
            time.sleep(0.001)
    raise Gone(f"no capsule within {WAIT_S} s")


def serve_two(listen: CMID, fd: int, admin: Admin) -> list[Conn]:
    """Scenario 7 (see the module's docstring); the queues it leaves open."""
    conns = [accept_io(listen, fd, admin), accept_io(listen, fd, admin)]
    reads = []
    while len(reads) < 2:
        i, cmd = capsule_any(conns, admin)
        if cmd is None:
            say(scenario=7, event="queue gone", pair=i)
            return conns
        if cmd[0] == 0x02:
            reads.append((i, cmd))
    (p1, first), (p2, second) = reads
    _, n, key = sgl(first)
    _, n2, key2 = sgl(second)
    sent = conns[p1].respond(struct.unpack_from("<H", first, 2)[0], invalidate=key2)
    time.sleep(1)
    # the host took both queue pairs down at the first response: this one finds none
    # (a few seconds at most: a send to a queue pair that is no more is retried, then fails)
    sent2 = conns[p2].respond(struct.unpack_from("<H", second, 2)[0], wait_s=5)
    say(scenario=7, event="invalidated the other command's key", key=key, other=key2, n=n,
        n2=n2, pairs=[p1, p2], sent=sent, sent2=sent2)
    for c in conns:
        c.close()
    conns = [accept_io(listen, fd, admin), accept_io(listen, fd, admin)]
    say(scenario=7, event="reconnected")
    gone = [False, False]
    while not admin.gone and not admin.shut_down and not all(gone):
        i, cmd = capsule_any(conns, admin)
        if i < 0:
            break
        if cmd is None:
            gone[i] = True
            continue
        opc, cid = cmd[0], struct.unpack_from("<H", cmd, 2)[0]
        if opc != 0x02:
            conns[i].respond(cid, status=SC_INVALID_OPCODE)
            continue
        addr, n, key = sgl(cmd)
        slba = struct.unpack_from("<Q", cmd, 40)[0]
        conns[i].big.write(pattern(slba, n), n, 0)
        status = conns[i].rdma(True, addr, key, n)
        conns[i].respond(cid)
        say(scenario=7, event="served", pair=i, slba=slba, n=n, status=status)
    return conns


def main() -> None:
    global GRANT
    faulthandler.register(signal.SIGUSR1)  # the test's way to see where a stuck target is
    addr, port = sys.argv[1], sys.argv[2]
    scenarios = [int(x) for x in sys.argv[3].split(",")]
    GRANT = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    ai = AddrInfo(src=addr, src_service=port, port_space=ce.RDMA_PS_TCP, flags=ce.RAI_PASSIVE)
    had = rdma_cm_fds()
    listen = CMID(creator=ai)  # no QP from librdmacm: each Conn makes its own
    fds = rdma_cm_fds() - had  # the listening id's own event channel (a synchronous id)
    assert len(fds) == 1, f"cannot tell the listening id's event channel among {fds}"
    listen.listen()
    say(event="listening")
    admin = Admin(Conn(listen.get_request(), listen))  # the first connect is the admin queue
    fd = fds.pop()
    left: list[Conn] = []
    for scenario in scenarios:
        if scenario == 7:
            left += serve_two(listen, fd, admin)
            continue
        io = Conn(wait_request(listen, fd, admin), listen)
        serve_io(io, scenario, admin)
        io.close()
    admin.serve_until_shutdown()  # the host's shutdown
    for c in left:
        c.close()
    say(event="done")


if __name__ == "__main__":
    main()

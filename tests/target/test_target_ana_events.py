"""The ANA change notices of `fx100io target`, from the raw spec host
(tests/support/target_host.py): a host that stops reading its socket stalls only its
own admin queue, never the listener, the control socket or the other hosts' notices;
the `change` state is left by itself; each port's ANA log has change counts of its
own.  Helpers and the control socket fixture are test_target_ana's."""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
import time

from support.target_host import RSP, Host, admin, sqe, start_target
from test_target_ana import (
    AER_ANA,
    NON_OPTIMIZED,
    aer,
    ctl_path,
    get_ana_log,
    keep_alive_is_next,
    next_rsp,
    parse_ana_log,
    two_ports,
)

from fx100io.target_ctl import control

__all__ = ["ctl_path", "start_target"]  # (fixtures, imported for this module's tests)


def stop_reading(h: Host, commands: int = 160, length: int = 65536) -> None:
    """Make the target block sending to h: its receive window is shut (a 4 KiB
    buffer, never read) and commands whose answers total more than any send buffer
    (tcp_wmem's 4 MiB) are queued behind it; returns once nothing more arrives."""
    h.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    numd = length // 4 - 1
    for _ in range(commands):  # Get Log Page (ANA, RAE set), 64 KiB each
        h.submit(sqe(0x02, cdw10=0x0C | (1 << 15) | ((numd & 0xFFFF) << 16)), data_in=length)
    last, still, deadline = -1, 0, time.monotonic() + 20
    while still < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
        n = struct.unpack("i", fcntl.ioctl(h.sock.fileno(), termios.FIONREAD,
                                           b"\0\0\0\0"))[0]
        still = still + 1 if n == last and n > 0 else 0
        last = n
    assert still >= 5, "the target kept sending to a host that does not read"


def test_stalled_host_blocks_no_one(start_target, ctl_path: str) -> None:
    """A host with an AER held that stops reading its socket: an ANA change of its
    port is still answered at once by the control socket, the other host of that
    port gets its notice, new connections are accepted and served, and `ports`
    answers, while the stalled host's queue waits for its own stall timeout."""
    t, p1, p2 = two_ports(start_target, ctl_path, "--stall-timeout-ms", "8000")
    good = admin(p1)  # (connected first: the target's list has the stalled one first)
    good_cid = aer(good)
    keep_alive_is_next(good)
    stalled = admin(p1)
    aer(stalled)
    stop_reading(stalled)
    # (before: the listener sent the notices itself and waited here, on the stalled
    # host's socket, up to twice the stall timeout; 2 s is far below that)
    assert control(ctl_path, "ana-state 1 1 non-optimized", timeout=2) == ""
    good.sock.settimeout(2)
    c = next_rsp(good)
    assert c.cid == good_cid and c.ok and c.dw0 == AER_ANA, c
    cqe, page = get_ana_log(good)
    assert cqe.ok and parse_ana_log(page)[1][1][0] == NON_OPTIMIZED
    for port in (p1, p2):  # accepted and served meanwhile
        h = Host(port, timeout=2)
        h.icreq()
        assert h.connect(0).ok
        h.enable()
        h.close()
    assert control(ctl_path, "ports", timeout=2).splitlines()[0].endswith("1=non-optimized")
    # the stalled host still has its queue (its own stall timeout has not passed)
    assert t.proc.poll() is None
    stalled.close()
    good.close()


def test_notice_reaches_a_host_inside_a_pdu(start_target, ctl_path: str) -> None:
    """The admin queue's thread waits for its socket and its events together: a
    notice goes out while the host is in the middle of sending a PDU."""
    t, p1, _ = two_ports(start_target, ctl_path)
    h = admin(p1)
    cid = aer(h)
    keep_alive_is_next(h)
    h.sock.sendall(struct.pack("<BBBBI", 4, 0, 72, 0, 72) + bytes(8))  # a capsule, begun
    control(ctl_path, "ana-state 1 1 inaccessible", timeout=2)
    h.sock.settimeout(2)
    p = h.recv_pdu()
    assert p.type == RSP
    c = struct.unpack_from("<IIHHHH", p.header, 8)
    assert c[4] == cid and c[0] == AER_ANA, c
    h.sock.sendall(bytes(56))  # the rest of that capsule (opcode 0: Delete I/O SQ)
    h.sock.settimeout(5)
    assert h.recv_pdu().type == RSP
    h.close()

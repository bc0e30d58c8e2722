"""The ANA change notices of `fx100io target`, from the raw spec host
(tests/support/target_host.py): a host that stops reading its socket stalls only its
own admin queue, never the listener, the control socket or the other hosts' notices;
the `change` state is left by itself; each port's ANA log has change counts of its
own.  Helpers and the control socket fixture are test_target_ana's."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import termios
import time
from pathlib import Path

import pytest
from support.target_host import RSP, Host, admin, sqe, start_target
from test_target_ana import (
    AER_ANA,
    CHANGE,
    NON_OPTIMIZED,
    OPTIMIZED,
    PERSISTENT_LOSS,
    aer,
    ctl_path,
    get_ana_log,
    keep_alive_is_next,
    live_io,
    next_rsp,
    parse_ana_log,
    two_ports,
)

from fx100io.target_ctl import TargetControlError, control

__all__ = ["ctl_path", "start_target"]  # (fixtures, imported for this module's tests)


def stop_reading(h: Host, length: int = 65536) -> None:
    """Make the target block sending to h: its receive window is shut (a 4 KiB
    buffer, never read) and commands whose answers total more than the target's send
    buffer can grow to (tcp_wmem's maximum) are queued behind it; returns once
    nothing more arrives."""
    h.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    wmem_max = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    commands = max(160, wmem_max // length + 64)
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
    t, p1, p2 = two_ports(start_target, ctl_path, "--stall-timeout-ms", "12000")
    good = admin(p1)  # (connected first: the target's list has the stalled one first)
    good_cid = aer(good)
    keep_alive_is_next(good)
    stalled = admin(p1)
    aer(stalled)
    stop_reading(stalled)
    # (before: the listener sent the notices itself and waited here, on the stalled
    # host's socket, at least one stall timeout; 4 s is far below that)
    assert control(ctl_path, "ana-state 1 1 non-optimized", timeout=4) == ""
    good.sock.settimeout(4)
    c = next_rsp(good)
    assert c.cid == good_cid and c.ok and c.dw0 == AER_ANA, c
    cqe, page = get_ana_log(good)
    assert cqe.ok and parse_ana_log(page)[1][1][0] == NON_OPTIMIZED
    for port in (p1, p2):  # accepted and served meanwhile
        h = Host(port, timeout=4)
        h.icreq()
        assert h.connect(0).ok
        h.enable()
        h.close()
    assert control(ctl_path, "ports", timeout=4).splitlines()[0].endswith("1=non-optimized")
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


def wait_state(ctl: str, line: int, want: str, seconds: float = 15.0) -> str:
    """`ports`' line for port line+1 once it ends with want (or the last one seen)."""
    deadline = time.monotonic() + seconds
    while True:
        got = control(ctl, "ports", timeout=5).splitlines()[line]
        if got.endswith(want) or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_change_is_left_for_the_state_asked(start_target, ctl_path: str) -> None:
    """`ana-state PORT GROUP change THEN MS`: the group is in change (I/O fails with
    Asymmetric Access Transition), then in THEN after MS, announced by a second
    notice once the host has read the log."""
    t, p1, _ = two_ports(start_target, ctl_path)
    h = admin(p1)
    h.sock.settimeout(5)
    cid = aer(h)
    control(ctl_path, "ana-state 1 1 change non-optimized 700")
    c = next_rsp(h)
    assert c.cid == cid and c.dw0 == AER_ANA, c
    cqe, page = get_ana_log(h)  # (without RAE: the next change is announced)
    assert cqe.ok and parse_ana_log(page)[1][1][0] == CHANGE
    cid2 = aer(h)
    c = next_rsp(h)  # (within the socket's 5 s)
    assert c.cid == cid2 and c.dw0 == AER_ANA, c
    cqe, page = get_ana_log(h)
    chg, groups = parse_ana_log(page)
    assert groups[1][0] == NON_OPTIMIZED and chg == 2 and groups[1][1] == 2
    assert control(ctl_path, "ports").splitlines()[0].endswith("1=non-optimized")
    h.close()


def test_change_is_left_after_anatt(start_target, ctl_path: str) -> None:
    """Without THEN and MS (and for a group that starts in change): back to the
    state before (optimized at the start) after ANATT, 10 s, well before a Linux host
    resets the controller (2 x ANATT); I/O then goes through again."""
    t, p1, p2 = two_ports(start_target, ctl_path, "--ana-state", "2:1=change")
    control(ctl_path, "ana-state 1 1 non-optimized")
    control(ctl_path, "ana-state 1 1 change")
    lines = control(ctl_path, "ports").splitlines()
    assert lines[0].endswith("1=change") and lines[1].endswith("1=change"), lines
    assert wait_state(ctl_path, 0, "1=non-optimized").endswith("1=non-optimized")
    assert wait_state(ctl_path, 1, "1=optimized").endswith("1=optimized")
    a, q = live_io(p2)
    data = os.urandom(4096)
    assert q.write(0, data, 512).ok
    rc, got = q.read(0, 8, 512)
    assert rc.ok and got == data
    q.close()
    a.close()


def test_a_later_state_ends_the_change(start_target, ctl_path: str) -> None:
    t, _, _ = two_ports(start_target, ctl_path)
    control(ctl_path, "ana-state 1 1 change optimized 300")
    control(ctl_path, "ana-state 1 1 inaccessible")
    time.sleep(1.0)  # past the 300 ms the change was given
    assert control(ctl_path, "ports").splitlines()[0].endswith("1=inaccessible")


def test_change_arguments_are_checked(start_target, ctl_path: str) -> None:
    t, p1, _ = two_ports(start_target, ctl_path)
    for line, why in [
            ("ana-state 1 1 optimized inaccessible", "for change only"),
            ("ana-state 1 1 optimized inaccessible 100", "for change only"),
            ("ana-state 1 1 change change", "state after change change"),
            ("ana-state 1 1 change fast", "state after change fast"),
            ("ana-state 1 1 change optimized 0", "time in change 0"),
            ("ana-state 1 1 change optimized 10001", "time in change 10001"),
            ("ana-state 1 1 change optimized -5", "time in change -5"),
            ("ana-state 1 1 change optimized 10x", "time in change 10x"),
            ("ana-state 1 1 change optimized 100 more", "wrong arguments")]:
        with pytest.raises(TargetControlError, match=why):
            control(ctl_path, line)
    assert control(ctl_path, "ports").splitlines()[0].endswith("1=optimized")


def test_change_counts_are_per_port_and_per_group(start_target, tmp_path: Path,
                                                  ctl_path: str) -> None:
    """Each port's ANA log has its own change count (one more per change of that log)
    and each group descriptor its own (one more per change of that group); a state set
    to what it is changes nothing and announces nothing; `all` is one change."""
    ns2 = tmp_path / "g2.img"
    ns2.write_bytes(bytes(1 << 20))
    t, p1, p2 = two_ports(start_target, ctl_path, "--namespace", f"{ns2},ana_group=2")
    h1, h2 = admin(p1), admin(p2)
    for h in (h1, h2):
        h.sock.settimeout(5)
    cid = aer(h2)
    control(ctl_path, "ana-state 2 1 inaccessible")
    assert next_rsp(h2).cid == cid
    control(ctl_path, "ana-state 2 1 optimized")
    control(ctl_path, "ana-state 2 2 non-optimized")
    chg, groups = parse_ana_log(get_ana_log(h2)[1])  # (read: notices unmasked)
    assert chg == 3 and groups[1][:2] == (OPTIMIZED, 2) and groups[2][:2] == (NON_OPTIMIZED, 1)
    # port 1's log did not change
    assert parse_ana_log(get_ana_log(h1)[1]) == (0, {1: (OPTIMIZED, 0, [1]),
                                                     2: (OPTIMIZED, 0, [2])})
    # no change, no count, no notice
    cid = aer(h2)
    control(ctl_path, "ana-state 2 2 non-optimized")
    control(ctl_path, "ana-state 2 all optimized")  # (group 2 only: one change)
    c = next_rsp(h2)
    assert c.cid == cid and c.dw0 == AER_ANA
    chg, groups = parse_ana_log(get_ana_log(h2)[1])
    assert chg == 4 and groups[1][:2] == (OPTIMIZED, 2) and groups[2][:2] == (OPTIMIZED, 2)
    cid = aer(h2)
    control(ctl_path, "ana-state 2 1 optimized")
    keep_alive_is_next(h2)
    control(ctl_path, "ana-state 2 all persistent-loss")  # both groups, one log change
    assert next_rsp(h2).cid == cid
    chg, groups = parse_ana_log(get_ana_log(h2)[1])
    assert chg == 5 and groups[1][:2] == (PERSISTENT_LOSS, 3)
    assert groups[2][:2] == (PERSISTENT_LOSS, 3)
    h1.close()
    h2.close()


def test_event_descriptors_stay_bounded(start_target, ctl_path: str) -> None:
    """An NVM controller's admin queue holds one more descriptor (its event eventfd)
    and no more threads: at the connection limit, with every slot such a queue, the
    target holds at most two descriptors and one thread a connection, refuses the
    rest, answers every queue's AER on a change, and gives all back when they go."""
    from support.target_process import fds, settled, threads
    limit = 12
    t, p1, _ = two_ports(start_target, ctl_path, "--max-connections", str(limit))
    pid = t.proc.pid
    base_fds, base_threads = fds(pid), threads(pid)
    hosts = [admin(p1, kato=30000) for _ in range(limit)]
    cids = [aer(h) for h in hosts]
    for h in hosts:
        keep_alive_is_next(h)
    extra = socket.create_connection(("127.0.0.1", p1), timeout=5)
    try:  # over the limit: closed at once
        assert extra.recv(1) == b""
    except ConnectionResetError:
        pass
    extra.close()
    assert fds(pid) <= base_fds + 2 * limit
    assert threads(pid) <= base_threads + limit
    control(ctl_path, "ana-state 1 1 inaccessible")
    for h, cid in zip(hosts, cids):
        h.sock.settimeout(5)
        c = next_rsp(h)
        assert c.cid == cid and c.dw0 == AER_ANA, c
        h.close()
    assert settled(fds, pid, base_fds) <= base_fds
    assert settled(threads, pid, base_threads) <= base_threads

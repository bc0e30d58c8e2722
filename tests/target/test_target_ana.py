"""`fx100io target` with several listening ports and Asymmetric Namespace Access,
driven by the raw spec host (tests/support/target_host.py): the Identify fields,
the ANA log page as seen through each port, the path-related statuses of I/O per
state, the ANA change asynchronous event, the control socket (states changed and a
port closed and opened while it runs, bad input refused) and the discovery log
listing every port.  Data are compared byte for byte with the backing file."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support import REPO
from support.target_host import (
    DISC_NQN,
    HOST_A,
    NQN,
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

from fx100io.target_ctl import TargetControlError, control

__all__ = ["start_target"]  # (the fixture, imported for this module's tests)

OPTIMIZED, NON_OPTIMIZED, INACCESSIBLE, PERSISTENT_LOSS, CHANGE = 1, 2, 3, 4, 0x0F
ANA_LOG = 0x0C
AER_ANA = 0x000C0302  # notice (2h), ANA change (03h), log page 0Ch
SCT_PATH = 3
# path-related status codes (NVMe Base 2.0, Figure 104)
SC_PERSISTENT_LOSS, SC_INACCESSIBLE, SC_TRANSITION = 0x01, 0x02, 0x03


@pytest.fixture
def ctl_path():
    # (a unix socket path must fit in 108 bytes: pytest's tmp_path may not)
    d = tempfile.mkdtemp(prefix="fx-ana-", dir="/tmp")
    yield os.path.join(d, "ctl.sock")
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)


def two_ports(start_target, ctl: str, *extra: str, second: str = "127.0.0.1:0",  # noqa: ANN001, ANN201
              sizes=(4 << 20,)):
    """A target on two loopback ports (port ids 1 and 2: the fixture's --listen, then
    second) with a control socket; returns (target, port 1's TCP port, port 2's)."""
    t = start_target("--listen", second, "--control", ctl, *extra, sizes=sizes)
    line = t.proc.stdout.readline()
    assert line.startswith("listening on nvme+tcp://127.0.0.1:"), line
    p2 = int(line.split("127.0.0.1:", 1)[1].split("/", 1)[0])
    return t, t.port, p2


def get_ana_log(h: Host, rgo: bool = False, rae: bool = False, length: int = 4096,
                offset: int = 0) -> tuple[Cqe, bytes]:
    numd = length // 4 - 1
    cdw10 = ANA_LOG | (1 << 8 if rgo else 0) | (1 << 15 if rae else 0) | ((numd & 0xFFFF) << 16)
    return h.cmd(sqe(0x02, cdw10=cdw10, cdw11=numd >> 16, cdw12=offset), data_in=length)


def parse_ana_log(page: bytes) -> tuple[int, dict[int, tuple[int, int, list[int]]]]:
    """-> (change count, {group: (state, group change count, [nsids])})."""
    chgcnt, ngrps = struct.unpack_from("<QH", page, 0)
    at, groups = 16, {}
    for _ in range(ngrps):
        grpid, nnsids, gchg, state = struct.unpack_from("<IIQB", page, at)
        nsids = list(struct.unpack_from(f"<{nnsids}I", page, at + 32))
        groups[grpid] = (state & 0x0F, gchg, nsids)
        at += 32 + 4 * nnsids
    return chgcnt, groups


def admin_disc(port: int) -> Host:
    h = Host(port)
    h.icreq()
    assert h.connect(0, subnqn=DISC_NQN).ok
    h.enable()
    return h


def live_io(port: int, qid: int = 1) -> tuple[Host, Host]:
    a = admin(port)
    a.set_queues(2)
    return a, io_queue(port, a.cntlid, qid)


def test_identify_reports_ana(start_target, ctl_path: str) -> None:
    t, p1, _ = two_ports(start_target, ctl_path)
    # a second namespace in group 2
    h = admin(p1)
    cqe, idc = h.identify(1)
    assert cqe.ok
    cmic = idc[76]
    assert cmic & 0x08 and cmic & 0x02 and cmic & 0x01  # ANA, several controllers, ports
    assert struct.unpack_from("<I", idc, 92)[0] & (1 << 11)  # OAES: ANA change notices
    # (Identify Controller bytes 338-341 NVMSETIDMAX/ENDGIDMAX, 342 ANATT, 343 ANACAP,
    # 344-347 ANAGRPMAX, 348-351 NANAGRPID, 352-355 PELS)
    assert idc[338:342] == bytes(4)
    assert idc[342] == 10  # ANATT: 10 s
    assert idc[343] == 0x5F  # ANACAP: every state, ANAGRPID fixed while attached
    anagrpmax, nanagrpid, pels = struct.unpack_from("<III", idc, 344)
    assert anagrpmax == nanagrpid == 32 and pels == 0
    nn = struct.unpack_from("<I", idc, 516)[0]
    mnan = struct.unpack_from("<I", idc, 540)[0]
    assert nn == mnan == 1
    cqe, idn = h.identify(0, nsid=1)
    assert cqe.ok
    assert idn[30] & 1  # NMIC: shared
    assert struct.unpack_from("<I", idn, 92)[0] == 1  # ANAGRPID
    h.close()


def test_namespace_groups_and_log_per_port(start_target, tmp_path: Path,
                                           ctl_path: str) -> None:
    ns2 = tmp_path / "g2.img"
    ns2.write_bytes(os.urandom(1 << 20))
    t, p1, p2 = two_ports(
        start_target, ctl_path, "--namespace", f"{ns2},ana_group=2", "--ana-state", "2:2=inaccessible",
        second="127.0.0.1:0,ana_state=non-optimized")
    h = admin(p1)
    cqe, idn = h.identify(0, nsid=2)
    assert cqe.ok and struct.unpack_from("<I", idn, 92)[0] == 2
    cqe, page = get_ana_log(h)
    assert cqe.ok
    chg1, g1 = parse_ana_log(page)
    assert g1 == {1: (OPTIMIZED, 0, [1]), 2: (OPTIMIZED, 0, [2])}
    h2 = admin(p2)
    cqe, page = get_ana_log(h2)
    assert cqe.ok
    _, g2 = parse_ana_log(page)
    assert {k: v[0] for k, v in g2.items()} == {1: NON_OPTIMIZED, 2: INACCESSIBLE}
    assert g2[1][2] == [1] and g2[2][2] == [2]
    # RGO: the groups without their NSID lists
    cqe, page = get_ana_log(h2, rgo=True)
    assert cqe.ok
    _, g2r = parse_ana_log(page)
    assert g2r == {k: (v[0], v[1], []) for k, v in g2.items()}
    assert page[16 + 2 * 32:] == bytes(len(page) - 16 - 2 * 32)
    # a window of the page, read with an offset, is the same bytes
    cqe, whole = get_ana_log(h2, length=256)
    cqe2, tail = get_ana_log(h2, length=128, offset=16)
    assert cqe.ok and cqe2.ok and tail == whole[16:144]
    # a change through port 2 bumps the change count, and port 1 does not see it
    control(ctl_path, "ana-state 2 1 change")
    chg2, g2b = parse_ana_log(get_ana_log(h2)[1])
    assert g2b[1][0] == CHANGE and g2b[1][1] == chg2 and chg2 > chg1
    assert g2b[2] == g2[2]
    assert parse_ana_log(get_ana_log(h)[1])[1] == g1
    assert "port 2" in control(ctl_path, "ports")
    h.close()
    h2.close()


@pytest.mark.parametrize("state,status", [
    ("optimized", None), ("non-optimized", None),
    ("inaccessible", SC_INACCESSIBLE), ("persistent-loss", SC_PERSISTENT_LOSS),
    ("change", SC_TRANSITION)])
def test_io_status_per_state(start_target, ctl_path: str, state: str,
                             status: int | None) -> None:
    t, p1, p2 = two_ports(start_target, ctl_path)
    a, q = live_io(p1)
    data = os.urandom(8 * 512)
    assert q.write(8, data, 512).ok
    control(ctl_path, f"ana-state 1 1 {state}")
    new = os.urandom(8 * 512)
    for incapsule in (True, False):
        wc = q.write(16, new, 512, incapsule=incapsule)
        rc, got = q.read(8, 8, 512)
        if status is None:
            assert wc.ok and rc.ok and got == data
        else:
            for c in (wc, rc):
                assert (c.sct, c.sc) == (SCT_PATH, status), c
                assert not c.status & 0x4000  # not DNR: another path may serve it
    with open(t.paths[0], "rb") as f:
        f.seek(16 * 512)
        assert (f.read(len(new)) == new) == (status is None)
    # the other port still serves (its own state)
    a2, q2 = live_io(p2)
    rc, got = q2.read(8, 8, 512)
    assert rc.ok and got == data
    for h in (q, a, q2, a2):
        h.close()


def aer(h: Host) -> int:
    return h.submit(sqe(0x0C))


def next_rsp(h: Host) -> Cqe:
    p = h.recv_pdu()
    assert p.type == RSP, p
    c = Cqe(*struct.unpack_from("<IIHHHH", p.header, 8))
    c.status >>= 1
    return c


def keep_alive_is_next(h: Host) -> None:
    """The next response is the Keep Alive's: no AER completed meanwhile."""
    cid = h.submit(sqe(0x18))
    c = next_rsp(h)
    assert c.cid == cid and c.ok, c


def test_aer_on_ana_change(start_target, ctl_path: str) -> None:
    t, p1, p2 = two_ports(start_target, ctl_path)
    h = admin(p1)
    cid = aer(h)
    keep_alive_is_next(h)
    # a change through another port is not this controller's
    control(ctl_path, "ana-state 2 1 inaccessible")
    keep_alive_is_next(h)
    control(ctl_path, "ana-state 1 1 non-optimized")
    c = next_rsp(h)
    assert c.cid == cid and c.ok and c.dw0 == AER_ANA, c
    # until the log is read (without RAE), no other notice
    cid2 = aer(h)
    control(ctl_path, "ana-state 1 1 inaccessible")
    keep_alive_is_next(h)
    cqe, page = get_ana_log(h, rae=True)  # RAE: still masked
    assert cqe.ok and parse_ana_log(page)[1][1][0] == INACCESSIBLE
    control(ctl_path, "ana-state 1 1 change")
    keep_alive_is_next(h)
    cqe, page = get_ana_log(h)  # read: the next change is reported
    assert cqe.ok and parse_ana_log(page)[1][1][0] == CHANGE
    control(ctl_path, "ana-state 1 1 optimized")
    c = next_rsp(h)
    assert c.cid == cid2 and c.dw0 == AER_ANA, c
    # a change while no AER is held waits for the next one
    assert get_ana_log(h)[0].ok
    control(ctl_path, "ana-state 1 all non-optimized")
    keep_alive_is_next(h)
    cid3 = aer(h)
    c = next_rsp(h)
    assert c.cid == cid3 and c.dw0 == AER_ANA, c
    # the AER limit (AERL + 1 = 4 held) is kept
    cids = [aer(h) for _ in range(4)]
    keep_alive_is_next(h)
    over = aer(h)
    c = next_rsp(h)
    assert c.cid == over and (c.sct, c.sc) == (1, 0x05), c
    assert cids
    h.close()


def test_close_port_drops_its_connections(start_target, ctl_path: str) -> None:
    t, p1, p2 = two_ports(start_target, ctl_path)
    a1, q1 = live_io(p1)
    a2, q2 = live_io(p2)
    data = os.urandom(64 * 512)
    assert q2.write(0, data, 512, incapsule=False).ok
    control(ctl_path, f"close-port 127.0.0.1:{p2}")
    for h in (a2, q2):
        with pytest.raises((Closed, ConnectionResetError)):
            h.recv_pdu()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", p2), timeout=5)
    # the survivor serves, byte-exact, what was written through the dead path
    rc, got = q1.read(0, 64, 512)
    assert rc.ok and got == data
    more = os.urandom(128 * 512)
    assert q1.write(64, more, 512, incapsule=False).ok
    rc, got = q1.read(64, 128, 512)
    assert rc.ok and got == more
    assert [e["portid"] for e in discover(p1) if e["subnqn"] == NQN] == [1]
    # the discovery log's generation counter moved with the change
    d = admin_disc(p1)
    assert d.get_log(0x70, 1024)[1][:8] == struct.pack("<Q", 2)
    d.close()
    with pytest.raises(TargetControlError, match="already closed"):
        control(ctl_path, "close-port 2")
    # opened again: the same TCP port, served again
    control(ctl_path, "open-port 2")
    a2, q2 = live_io(p2)
    rc, got = q2.read(64, 128, 512)
    assert rc.ok and got == more
    for h in (a1, q1, a2, q2):
        h.close()


def test_io_queue_must_use_its_controllers_port(start_target, ctl_path: str) -> None:
    t, p1, p2 = two_ports(start_target, ctl_path)
    a = admin(p1)
    a.set_queues(2)
    h = Host(p2)
    h.icreq()
    c = h.connect(1, cntlid=a.cntlid, hostnqn=HOST_A)
    assert (c.sct, c.sc) == (1, 0x82), c  # Connect Invalid Parameters
    h.close()
    a.close()


def test_discovery_lists_each_port(start_target, ctl_path: str) -> None:
    t, p1, p2 = two_ports(start_target, ctl_path)
    for via in (p1, p2):
        entries = discover(via)
        subs = [e for e in entries if e["subnqn"] == NQN]
        assert [(e["portid"], e["trsvcid"], e["traddr"]) for e in subs] == [
            (1, str(p1), "127.0.0.1"), (2, str(p2), "127.0.0.1")]
        cur = [e for e in entries if e["subtype"] == 3]
        assert len(cur) == 1 and cur[0]["trsvcid"] == str(via)


def test_control_refuses_bad_input(start_target, ctl_path: str) -> None:
    t, p1, p2 = two_ports(start_target, ctl_path)
    for line, why in [
            ("frobnicate 1", "unknown command"),
            ("ana-state 3 1 optimized", "no port 3"),
            ("ana-state 127.0.0.1:1 1 optimized", "no port"),
            ("ana-state 1 0 optimized", "ANA group 0"),
            ("ana-state 1 33 optimized", "ANA group 33"),
            ("ana-state 1 1 fast", "ANA state fast"),
            ("ana-state 1 1", "wrong arguments"),
            ("", "empty command"),
            ("x" * 600, "longer than")]:
        with pytest.raises(TargetControlError, match=why):
            control(ctl_path, line)
    # nothing changed, and the target still serves
    assert control(ctl_path, "ports").splitlines() == [
        f"port 1 127.0.0.1:{p1} open 1=optimized", f"port 2 127.0.0.1:{p2} open 1=optimized"]
    a, q = live_io(p1)
    assert q.read(0, 1, 512)[0].ok
    # the command-line tool: exit 1 and the reason
    r = subprocess.run([sys.executable, "-m", "fx100io", "target-ctl", ctl_path, "ana-state",
                        "1", "1", "bogus"], capture_output=True, text=True, cwd=str(REPO),
                       timeout=60)
    assert r.returncode == 1 and "ANA state bogus" in r.stderr
    r = subprocess.run([sys.executable, "-m", "fx100io", "target-ctl", ctl_path, "ana-state",
                        "2", "1", "inaccessible"], capture_output=True, text=True,
                       cwd=str(REPO), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "2 127.0.0.1" in control(ctl_path, "ports").splitlines()[1]
    assert control(ctl_path, "ports").splitlines()[1].endswith("1=inaccessible")
    q.close()
    a.close()


@pytest.mark.parametrize("args,why", [
    (["--listen", "127.0.0.1:0,ana_state=fast"], "ANA state 'fast'"),
    (["--listen", "127.0.0.1:0,ana_group=33,ana_state=optimized"], "ANA group '33'"),
    (["--listen", "127.0.0.1:0,color=red"], "unknown option"),
    (["--ana-state", "3:1=optimized"], "port id 3"),
    (["--ana-state", "1=optimized"], "PORT:GROUP=STATE"),
    (["--ana-state", "1:40=optimized"], "ANA group '40'"),
    (["--namespace", "/dev/null,ana_group=0"], "ANA group '0'")])
def test_cli_refuses_bad_ana_options(tmp_path: Path, args: list[str], why: str) -> None:
    ns = tmp_path / "ns.img"
    ns.write_bytes(bytes(1 << 20))
    r = subprocess.run([sys.executable, "-m", "fx100io", "target", "--listen", "127.0.0.1:0",
                        "--namespace", str(ns), *args], capture_output=True, text=True,
                       cwd=str(REPO), timeout=60)
    assert r.returncode == 2 and why in r.stderr, r.stderr


def test_close_port_under_load(start_target, ctl_path: str) -> None:
    """Writes and reads in flight on the port that closes: the target ends them with
    the connection, and the other port goes on serving, byte-exact."""
    t, p1, p2 = two_ports(start_target, ctl_path, sizes=(16 << 20,))
    a1, q1 = live_io(p1)
    a2, q2 = live_io(p2)
    for i in range(32):  # pipelined: 64 KiB writes by R2T and reads, not waited for
        q2.submit(sqe(0x01, nsid=1, cdw10=i * 128, cdw12=127), os.urandom(64 << 10),
                  incapsule=False)
        q2.submit(sqe(0x02, nsid=1, cdw10=i * 128, cdw12=127), data_in=64 << 10)
    control(ctl_path, "close-port 2")
    with pytest.raises((Closed, ConnectionResetError)):
        while True:  # (R2Ts and answers sent before the close, then the end)
            q2.recv_pdu()
    # port 1, in a range port 2 never wrote
    data = os.urandom(1 << 20)
    for k in range(0, len(data), 256 << 10):
        assert q1.write(8192 + k // 512, data[k:k + (256 << 10)], 512, incapsule=False).ok
    rc, got = q1.read(8192, len(data) // 512, 512)
    assert rc.ok and got == data
    assert t.proc.poll() is None
    for h in (a1, q1, a2):
        h.close()


def test_serve_ports_helper(tmp_path: Path, ctl_path: str) -> None:
    """tests/support/target_process.serve_ports, which the initiator's multipath tests
    use: two ports, an initial state, the control socket."""
    from support.target_process import serve_ports
    ns = tmp_path / "ns.img"
    ns.write_bytes(bytes(1 << 20))
    with serve_ports([str(ns)], NQN, ["127.0.0.1:0", "127.0.0.1:0,ana_state=inaccessible"],
                     control=ctl_path) as (ports, proc):
        assert len(ports) == 2 and ports[0] != ports[1]
        assert control(ctl_path, "ports").splitlines() == [
            f"port 1 127.0.0.1:{ports[0]} open 1=optimized",
            f"port 2 127.0.0.1:{ports[1]} open 1=inaccessible"]
        a, q = live_io(ports[1])
        assert (q.read(0, 1, 512)[0].sct, q.read(0, 1, 512)[0].sc) == (SCT_PATH, SC_INACCESSIBLE)
        q.close()
        a.close()

"""What hosts that fail or stall TLS handshakes cost our target, and that a good
host is served meanwhile (csrc/target/tls.c, FX_TGT_TLS_HS_* in tgt.h):
handshakes that send part of a ClientHello and stop (slow loris), many at once
from one address and from many, are pushed out past 8 unproven per address
(its oldest) and 64 in the target (the oldest of the address with the most),
and the rest are closed by the handshake's 3 s limit; a handshake whose key
has proven itself is never pushed out, so many right-key opens at once from
one address all succeed, and so do a good host's opens while its address
floods the target with connections that never prove a key; wrong keys, even
as the good host's own NQN from its own address, never lock the right key
out; IPv6 sources count by their /64.  Real sockets on loopback (several
127.0.0.x source addresses; IPv6 ones in a network namespace of the test's
own), our initiator as the good host, bytes checked."""

from __future__ import annotations

import contextlib
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support.target_process import serve

import fx100io
from fx100io import errors

NQN = "nqn.2026-12.io.fx100:tlsbounds"
HOST = "nqn.2014-08.org.nvmexpress:uuid:f0100000-0000-4000-8000-00000000f200"
BAD_HOST = "nqn.2014-08.org.nvmexpress:uuid:f0100000-0000-4000-8000-00000000f2ba"
KEY = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"
OTHER = "NVMeTLSkey-1:01:MDAxMTIyMzM0NDU1NjY3Nzg4OTlhYWJiY2NkZGVlZmZwJEiQ:"
PER_ADDR, TARGET_WIDE, HS_LIMIT_S = 8, 64, 3.0  # tgt.h: FX_TGT_TLS_HS_*
# a handshake record that announces 512 bytes of ClientHello, and 9 of them
PARTIAL_HELLO = bytes([0x16, 3, 1, 2, 0, 1, 0, 1, 0xFC]) + bytes(5)
# a whole record that holds only the start of a ClientHello (announcing 508
# bytes): the target reads it at once, then waits for the rest
FIRST_FRAGMENT = bytes([0x16, 3, 1, 0, 4, 1, 0, 1, 0xFC])


@pytest.fixture
def image(tmp_path):
    p = tmp_path / "ns.img"
    with open(p, "wb") as f:
        f.truncate(64 << 20)
    return str(p)


def uri(host, port, hostnqn=HOST, key=KEY):
    return f"nvme+tcp://{host}:{port}/{NQN}?hostnqn={hostnqn}&tls_key={key}&connect_timeout_ms=5000"


def slow_loris(port: int, src: str, first: bytes = PARTIAL_HELLO) -> socket.socket:
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    s.sendall(first)
    return s


def closed(s: socket.socket) -> bool:
    """The target closed it (EOF or reset), without waiting."""
    if not select.select([s], [], [], 0)[0]:
        return False
    try:
        return s.recv(4096, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def wait_until(cond, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def good_host_round_trip(host: str, port: int, seed: int) -> None:
    """Our initiator opens every queue over TLS, writes and reads back."""
    pool = fx100io.BufferPool(1 << 20)
    src, dst = pool.alloc(256 << 10), pool.alloc(256 << 10)
    src[:] = np.random.default_rng(seed).integers(0, 256, src.size, dtype=np.uint8)
    with fx100io.open_device(uri(host, port)) as dev:
        assert dev.write_from_blocking(seed << 20, src) == src.size
        assert dev.read_into_blocking(seed << 20, dst) == dst.size
    assert bytes(dst) == bytes(src)


def test_stalled_handshakes_are_pushed_out_per_address_and_time_limited(image, tmp_path):
    log = tmp_path / "target.log"
    with serve([image], NQN, "--tls", "required", "--tls-key", f"{HOST}={KEY}",
               log=log) as (host, port, _proc), contextlib.ExitStack() as stack:
        groups = {}
        t0 = time.monotonic()
        for src in ("127.0.0.2", "127.0.0.1"):  # the second: the good host's own address
            groups[src] = [slow_loris(port, src) for _ in range(3 * PER_ADDR)]
            for s in groups[src]:
                stack.callback(s.close)
        for src, socks in groups.items():
            # (the time limit closes them all too: the count is checked
            # while it cannot have yet, so that only the bound explains it)
            assert wait_until(lambda socks=socks: sum(not closed(s) for s in socks) <= PER_ADDR,
                              HS_LIMIT_S - 0.5), f"{src}: more than {PER_ADDR} stalled handshakes kept"
        # a good host, from the same address as one group, is served meanwhile
        good_host_round_trip(host, port, 1)
        # every stalled handshake ends within the limit (and a little slack)
        every = [s for socks in groups.values() for s in socks]
        assert wait_until(lambda: all(closed(s) for s in every), HS_LIMIT_S + 5.0)
        assert time.monotonic() - t0 < HS_LIMIT_S + 6.0  # the limit ended them, not the test
        good_host_round_trip(host, port, 2)
    text = log.read_text()
    assert f"unproven TLS handshakes in progress from 127.0.0.2 (limit {PER_ADDR}): closed " \
           "the oldest" in text
    assert "(the TLS handshake's time limit)" in text


def test_stalled_handshakes_from_many_addresses_are_bounded_target_wide(image, tmp_path):
    log = tmp_path / "target.log"
    with serve([image], NQN, "--tls", "required", "--tls-key", f"{HOST}={KEY}",
               log=log) as (host, port, _proc), contextlib.ExitStack() as stack:
        # two old ones from an address of its own: past the target's limit
        # the flood's addresses, with the most, give way, not this one
        few = [slow_loris(port, "127.0.2.1") for _ in range(2)]
        for s in few:
            stack.callback(s.close)
        socks = []
        for i in range(12):  # 12 addresses x 8 = 96 handshakes, none past its address's limit
            for _ in range(PER_ADDR):
                s = slow_loris(port, f"127.0.1.{i + 2}")
                stack.callback(s.close)
                socks.append(s)
        assert wait_until(lambda: sum(not closed(s) for s in socks + few) <= TARGET_WIDE,
                          HS_LIMIT_S - 0.5)
        assert not any(closed(s) for s in few), "an address with 2 in progress was pushed out"
        good_host_round_trip(host, port, 3)
        assert wait_until(lambda: all(closed(s) for s in socks + few), HS_LIMIT_S + 5.0)
    assert f"unproven TLS handshakes in progress in the target (limit {TARGET_WIDE}): closed " \
           "the oldest of the address with the most, 127.0.1." in log.read_text()


def test_a_handshake_that_waits_after_a_whole_record_is_counted_again(image, tmp_path):
    """A record in hand is not counted (reading it does not wait), but one
    that then waits for the rest of its ClientHello is, like any other."""
    log = tmp_path / "target.log"
    with serve([image], NQN, "--tls", "required", "--tls-key", f"{HOST}={KEY}",
               log=log) as (host, port, _proc), contextlib.ExitStack() as stack:
        socks = [slow_loris(port, "127.0.0.3", FIRST_FRAGMENT) for _ in range(3 * PER_ADDR)]
        for s in socks:
            stack.callback(s.close)
        assert wait_until(lambda: sum(not closed(s) for s in socks) <= PER_ADDR,
                          HS_LIMIT_S - 0.5), f"more than {PER_ADDR} kept"
        good_host_round_trip(host, port, 50)
    assert f"unproven TLS handshakes in progress from 127.0.0.3 (limit {PER_ADDR}): closed " \
           "the oldest" in log.read_text()


def run_threads(fn, n: int, timeout: float = 120) -> list[BaseException | None]:
    """fn(i) on n threads started together; what each raised (None: nothing)."""
    out: list[BaseException | None] = [None] * n
    go = threading.Barrier(n)

    def one(i):
        try:
            go.wait(30)
            fn(i)
        except BaseException as e:  # noqa: BLE001 (returned)
            out[i] = e

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout)
    assert not any(th.is_alive() for th in threads), "an open did not end"
    return out


def test_many_right_key_opens_at_once_from_one_address_all_succeed(image, tmp_path):
    """A node whose workers all open at the job's start (or hosts behind one
    NAT): three times the per-address limit of handshakes at once, each a
    host with the key, none pushed out."""
    log = tmp_path / "target.log"
    with serve([image], NQN, "--tls", "required", "--tls-key", f"{HOST}={KEY}",
               log=log) as (host, port, _proc):
        for _round in range(2):
            errs = run_threads(lambda i: good_host_round_trip(host, port, 16 + i), 3 * PER_ADDR)
            assert errs == [None] * (3 * PER_ADDR), [e for e in errs if e]
    assert "pushed out" not in log.read_text() and "closed the oldest" not in log.read_text()


class Flood:
    """Connections from src that send a TLS record's first byte and nothing
    more, as fast as one thread can, each kept open until the target closes
    it (the per-address limit or the time limit)."""

    def __init__(self, port: int, src: str) -> None:
        self.port, self.src, self.n = port, src, 0
        self.stop = threading.Event()
        self.th = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        held: list[socket.socket] = []
        try:
            while not self.stop.is_set():
                s = socket.socket()
                s.bind((self.src, 0))
                s.settimeout(5)
                try:
                    s.connect(("127.0.0.1", self.port))
                    s.sendall(b"\x16")
                except OSError:
                    s.close()
                    continue
                held.append(s)
                self.n += 1
                if len(held) > 256:  # (our own fds: the target closed most long ago)
                    for o in held[:128]:
                        o.close()
                    del held[:128]
        finally:
            for o in held:
                o.close()

    def __enter__(self) -> Flood:
        self.th.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.th.join(30)
        assert not self.th.is_alive()


def test_a_flood_from_the_good_hosts_address_does_not_push_its_handshakes_out(image, tmp_path):
    log = tmp_path / "target.log"
    with serve([image], NQN, "--tls", "required", "--tls-key", f"{HOST}={KEY}",
               log=log) as (host, port, _proc), Flood(port, "127.0.0.1") as flood, \
            Flood(port, "127.0.0.1") as flood2:
        assert wait_until(lambda: flood.n + flood2.n >= 4 * PER_ADDR, 30)
        # each open is several handshakes (the admin queue and each I/O
        # queue); some of them two at once
        for seed in range(24, 30):
            good_host_round_trip(host, port, seed)
        errs = run_threads(lambda i: good_host_round_trip(host, port, 30 + i), 4)
        assert errs == [None] * 4, [e for e in errs if e]
        assert flood.n + flood2.n >= 8 * PER_ADDR  # the flood went on meanwhile
    assert f"from 127.0.0.1 (limit {PER_ADDR}): closed the oldest" in log.read_text()


def test_wrong_keys_as_the_good_hosts_nqn_from_its_address_never_lock_it_out(image, tmp_path):
    """Anyone behind the good host's address (NAT, the same IPv6 /64) may
    claim its host NQN, which is no secret, with wrong keys as often as it
    likes: the right key still gets in every time."""
    log = tmp_path / "target.log"
    with serve([image], NQN, "--tls", "required", "--tls-key", f"{HOST}={KEY}",
               log=log) as (host, port, _proc):
        stop = threading.Event()
        failures: list[str] = []
        unexpected: list[BaseException] = []

        def attacker():
            while not stop.is_set():
                try:
                    fx100io.open_device(uri(host, port, HOST, OTHER)).close()
                    unexpected.append(AssertionError("a wrong key opened a device"))
                    return
                except errors.Fx100ioError as e:
                    failures.append(str(e))
                except BaseException as e:  # noqa: BLE001 (reported below)
                    unexpected.append(e)
                    return

        threads = [threading.Thread(target=attacker, daemon=True) for _ in range(2)]
        for th in threads:
            th.start()
        try:
            assert wait_until(lambda: len(failures) >= 40, 60)  # well past any "16 in a row"
            for seed in range(40, 46):
                good_host_round_trip(host, port, seed)
        finally:
            stop.set()
            for th in threads:
                th.join(30)
        assert not unexpected, unexpected
        assert not any(th.is_alive() for th in threads)
        assert all("wrong key" in f or "TLS" in f for f in failures), failures[:3]
        good_host_round_trip(host, port, 46)
        text = log.read_text()
        assert f"TLS handshake with host {HOST} failed: the host's TLS PSK does not match " \
               "ours (wrong key)" in text
        assert KEY not in text and OTHER not in text


# IPv6: a host with one address usually has its whole /64, so the bound is per
# /64 (target.c peer_key).  The scenario runs in a network namespace of its own
# (unshare), where it can give loopback the IPv6 addresses it needs.
V6_SAME_64 = ("2001:db8:1::a", "2001:db8:1::b", "2001:db8:1::c")
V6_OTHER_64 = "2001:db8:2::a"


def _ipv6_scenario(image: str, log: str) -> None:
    for cmd in (["ip", "link", "set", "lo", "up"],
                *(["ip", "-6", "addr", "add", f"{a}/128", "dev", "lo", "nodad"]
                  for a in (*V6_SAME_64, V6_OTHER_64))):
        subprocess.run(cmd, check=True, timeout=30)
    from support.target_process import _target

    args = ["--listen", "[::1]:0", "--nqn", NQN, "--tls", "required", "--tls-key",
            f"{HOST}={KEY}", "--namespace", image]
    with _target(args, 1, Path(log)) as (bound, _proc), contextlib.ExitStack() as stack:
        port = bound[0][1]

        def loris(src: str) -> socket.socket:
            s = socket.socket(socket.AF_INET6)
            stack.callback(s.close)
            s.bind((src, 0))
            s.settimeout(5)
            s.connect(("::1", port))
            s.sendall(PARTIAL_HELLO)
            return s

        other = [loris(V6_OTHER_64) for _ in range(PER_ADDR // 2)]
        # 3 addresses x 8: each within its own address's count, 24 in one /64
        same = [loris(src) for src in V6_SAME_64 for _ in range(PER_ADDR)]
        assert wait_until(lambda: sum(not closed(s) for s in same) <= PER_ADDR,
                          HS_LIMIT_S - 0.5), "more than 8 stalled handshakes kept from one /64"
        assert not any(closed(s) for s in other), "another /64's handshakes were pushed out"
        good_host_round_trip("[::1]", port, 4)


def test_ipv6_handshakes_are_bounded_per_64_prefix(image, tmp_path):
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2) for a network namespace")
    log = tmp_path / "target.log"
    code = ("import sys; sys.path[:0] = sys.argv[1:3]; import test_target_tls_bounds as t; "
            "t._ipv6_scenario(sys.argv[3], sys.argv[4])")
    here = Path(__file__).resolve().parent
    r = subprocess.run(["unshare", "--net", sys.executable, "-c", code, str(here),
                        str(here.parent), image, str(log)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    text = log.read_text()
    assert f"unproven TLS handshakes in progress from 2001:db8:1:0::/64 (limit {PER_ADDR}): " \
           "closed the oldest" in text, text[-2000:]
    assert "2001:db8:2:0::/64 (limit" not in text

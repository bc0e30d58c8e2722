"""What hosts that fail or stall TLS handshakes cost our target, and that a good
host is served meanwhile (csrc/target/tls.c, FX_TGT_TLS_HS_* in tgt.h):
handshakes that send part of a ClientHello and stop (slow loris), many at once
from one address and from many, are pushed out oldest first past 8 per address
and 64 in the target, and the rest are closed by the handshake's 3 s limit;
wrong-key handshakes as one host from one address are refused, before any key
work, after 16 failures in a row, for a wait that a success clears.  Real
sockets on loopback (several 127.0.0.x source addresses), our initiator as the
good host, bytes checked."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time

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


@pytest.fixture
def image(tmp_path):
    p = tmp_path / "ns.img"
    with open(p, "wb") as f:
        f.truncate(64 << 20)
    return str(p)


def uri(host, port, hostnqn=HOST, key=KEY):
    return f"nvme+tcp://{host}:{port}/{NQN}?hostnqn={hostnqn}&tls_key={key}&connect_timeout_ms=5000"


def slow_loris(port: int, src: str) -> socket.socket:
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    s.sendall(PARTIAL_HELLO)
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
            assert wait_until(lambda socks=socks: sum(not closed(s) for s in socks) <= PER_ADDR,
                              HS_LIMIT_S - 0.5), f"{src}: more than {PER_ADDR} stalled handshakes kept"
        assert time.monotonic() - t0 < HS_LIMIT_S
        # a good host, from the same address as one group, is served meanwhile
        good_host_round_trip(host, port, 1)
        # every stalled handshake ends within the limit (and a little slack)
        every = [s for socks in groups.values() for s in socks]
        assert wait_until(lambda: all(closed(s) for s in every), HS_LIMIT_S + 2.0)
        assert time.monotonic() - t0 < HS_LIMIT_S + 2.5
        good_host_round_trip(host, port, 2)
    text = log.read_text()
    assert f"TLS handshakes in progress from 127.0.0.2 (limit {PER_ADDR}): closed the oldest" in text
    assert "(the TLS handshake's time limit)" in text


def test_stalled_handshakes_from_many_addresses_are_bounded_target_wide(image, tmp_path):
    log = tmp_path / "target.log"
    with serve([image], NQN, "--tls", "required", "--tls-key", f"{HOST}={KEY}",
               log=log) as (host, port, _proc), contextlib.ExitStack() as stack:
        socks = []
        for i in range(12):  # 12 addresses x 8 = 96 handshakes, none past its address's limit
            for _ in range(PER_ADDR):
                s = slow_loris(port, f"127.0.1.{i + 2}")
                stack.callback(s.close)
                socks.append(s)
        assert wait_until(lambda: sum(not closed(s) for s in socks) <= TARGET_WIDE,
                          HS_LIMIT_S - 0.5)
        good_host_round_trip(host, port, 3)
        assert wait_until(lambda: all(closed(s) for s in socks), HS_LIMIT_S + 2.0)
    assert f"TLS handshakes in progress in the target (limit {TARGET_WIDE}): closed the oldest" \
        in log.read_text()


def test_wrong_key_handshakes_back_off_and_a_good_host_is_served(image, tmp_path):
    log = tmp_path / "target.log"
    with serve([image], NQN, "--tls", "required", "--tls-key", f"{HOST}={KEY}",
               "--tls-key", f"{BAD_HOST}={KEY}", log=log) as (host, port, _proc):
        stop = threading.Event()
        failures: list[str] = []
        unexpected: list[BaseException] = []

        def attacker():
            while not stop.is_set():
                try:
                    fx100io.open_device(uri(host, port, BAD_HOST, OTHER)).close()
                    unexpected.append(AssertionError("a wrong key opened a device"))
                    return
                except errors.Fx100ioError as e:
                    failures.append(str(e))
                except BaseException as e:  # noqa: BLE001 (reported below)
                    unexpected.append(e)
                    return

        threads = [threading.Thread(target=attacker, daemon=True) for _ in range(4)]
        for th in threads:
            th.start()
        try:
            # the good host, same address, other host NQN: served while they fail
            for seed in range(4, 8):
                good_host_round_trip(host, port, seed)
            assert wait_until(lambda: len(failures) >= 40, 60)
        finally:
            stop.set()
            for th in threads:
                th.join(30)
        assert not unexpected, unexpected
        assert not any(th.is_alive() for th in threads)
        text = log.read_text()
        assert f"TLS handshake with host {BAD_HOST} failed: the host's TLS PSK does not match " \
               "ours (wrong key)" in text
        assert f"TLS handshake with host {BAD_HOST} failed: too many failed TLS handshakes as " \
               "this host from this address" in text
        assert KEY not in text and OTHER not in text
        # the right key for that host gets in once the wait is over (at most 8 s)
        # and clears it; refusals meanwhile do not lengthen the wait
        t0 = time.monotonic()
        while True:
            try:
                fx100io.open_device(uri(host, port, BAD_HOST, KEY)).close()
                break
            except errors.Fx100ioError as e:
                assert "refused" in str(e) or "TLS" in str(e), e
                assert time.monotonic() - t0 < 8 + 2, "the backoff outlasted its 8 s bound"
                time.sleep(0.2)
        fx100io.open_device(uri(host, port, BAD_HOST, KEY)).close()

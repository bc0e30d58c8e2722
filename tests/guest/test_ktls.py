"""kTLS on our initiator's NVMe/TCP connections, in the lab guest (whose 6.12 kernel has the
`tls` module; this machine's has not): after our userspace handshake the kernel seals and
opens the records (csrc/nvme_tcp/ktls.c) and the data path is the clear-text one.  Our own
target runs in the guest too, on its loopback, on kTLS as well (its default, --ktls auto)
unless a test pins its own layer (--ktls off).  Bytes are checked against what was written
and against the target's file; queue_stats() shows which record layer each of the
initiator's connections used, the target's control socket (`tls`) which its own used.
The bodies run inside the guest (@pytest.mark.guest)."""

from __future__ import annotations

import asyncio
import errno
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from support import REPO, chunk_bytes, read_once_reconnected, write_then_read_back
from support.ktls import kernel_has_ktls
from support.record_proxy import RecordProxy
from support.target_auth_host import SECRET_A
from support.target_process import serve, sparse_image, tls_args, wait_port_free
from support.tls_keys import KEY, KEY48
from support.tls_midread import (
    PATHS,
    end_mid_read,
    target_layer,
    target_tls,
    ticket_mid_read,
    ticket_on_path,
    wait_tls_open,
)

import fx100io
from fx100io import errors

pytest_plugins = ["support.lab_fixture"]
pytestmark = [pytest.mark.lab, pytest.mark.guest]

NQN = "nqn.2026-12.io.fx100:ktls"
HOST = "nqn.2014-08.org.nvmexpress:uuid:f0100000-0000-4000-8000-00000000f1c1"
SIZE = 16 << 20


def uri(port, key=KEY, **q):
    q = {"hostnqn": HOST, "tls_key": key, **q}
    return f"nvme+tcp://127.0.0.1:{port}/{NQN}?" + "&".join(f"{k}={v}" for k, v in q.items())


def test_the_guest_kernel_takes_the_tls_ulp(fabric_lab):
    assert kernel_has_ktls()


# (offset, length): 4 KiB to 4 MiB at offsets that are no multiple of the lengths
IOS = [(512, 4096), (9 * 512, 20 * 1024 + 512), (3 << 20 | 1536, (1 << 20) + 4096),
       (6 << 20 | 512, 4 << 20)]


def _ctl(tmp_path, target_ktls=True):
    """The target's options for its control socket and record layer; the socket's path."""
    ctl = tmp_path / "ctl.sock"
    return ctl, ["--control", str(ctl), "--ktls", "auto" if target_ktls else "off"]


@pytest.mark.parametrize(("ddgst", "auth", "key", "target_ktls"),
                         [(0, False, KEY, True), (1, False, KEY, True), (1, True, KEY, True),
                          (0, True, KEY48, True), (1, False, KEY, False)],
                         ids=["plain", "digests", "digests-dhchap", "sha384-dhchap",
                              "digests-target-on-ours"])
def test_reads_and_writes_on_ktls_are_byte_exact(fabric_lab, tmp_path, ddgst, auth, key,
                                                 target_ktls):
    img = sparse_image(tmp_path, SIZE)
    ctl, targs = _ctl(tmp_path, target_ktls)
    args = tls_args(HOST, key) + (["--dhchap-key", f"{HOST}={SECRET_A}"] if auth else []) + targs
    q = {"queues": 2, "hdgst": ddgst, "ddgst": ddgst}
    if auth:
        q["dhchap_secret"] = SECRET_A
    with serve([img], NQN, *args) as (_host, port, _):
        with fx100io.open_device(uri(port, key, **q), queue_depth=32) as dev:
            pool = fx100io.BufferPool(16 << 20)
            written = write_then_read_back(dev, pool, IOS, f"ktls-{ddgst}-{auth}")
            # all at once, records of several answers back to back
            outs = [pool.alloc(len(b)) for _, b in written]
            done = dev.submit_blocking([(fx100io.OP_READ, off, o)
                                        for (off, _), o in zip(written, outs)])
            assert [c[0] for c in done] == [len(b) for _, b in written]
            assert all(np.array_equal(o, b) for o, (_, b) in zip(outs, written))
            st = dev.queue_stats()
            assert (st["ktls_conns"], st["tls_user_conns"]) == (2, 0), st
            target_layer(ctl, target_ktls)
    with open(img, "rb") as f:
        for off, buf in written:
            f.seek(off)
            assert f.read(len(buf)) == buf.tobytes()


@pytest.mark.parametrize("ddgst", [0, 1], ids=["plain", "digests"])
def test_ktls_off_keeps_our_record_layer(fabric_lab, tmp_path, ddgst):
    """Our initiator's own record layer against the target on kTLS, 4 KiB to 4 MiB."""
    img = sparse_image(tmp_path, SIZE)
    ctl, targs = _ctl(tmp_path)
    with serve([img], NQN, *tls_args(HOST, KEY), *targs) as (_host, port, _):
        with fx100io.open_device(uri(port, ktls="off", hdgst=ddgst, ddgst=ddgst),
                                 queue_depth=8) as dev:
            for off, n in IOS:
                data = chunk_bytes(f"ktls-off-{ddgst}-{off}", n)
                assert dev.write_from_blocking(off, data) == data.nbytes
                out = np.empty_like(data)
                assert dev.read_into_blocking(off, out) == data.nbytes
                assert np.array_equal(out, data), (off, n)
            st = dev.queue_stats()
            assert (st["ktls_conns"], st["tls_user_conns"]) == (0, 1), st
            target_layer(ctl, True)


# (run with -S, from the repository, and without numpy: its start-up is what costs
# under TCG)
_WRITER = """
import sys, fx100io
dev = fx100io.open_device(sys.argv[1], queue_depth=32)
buf = bytearray(b"\\x5a") * (4 << 20)
print("writing", flush=True)
while True:
    dev.write_from_blocking(0, buf)
"""


def _line_within(stream, seconds):
    """The next line of a child's stdout, or None when none came within seconds."""
    ready, _, _ = select.select([stream], [], [], seconds)
    return stream.readline() if ready else None


def test_a_wrong_key_and_a_host_killed_mid_write_leave_the_target_on_ktls_serving(
        fabric_lab, tmp_path):
    """(One target for both: its start-up costs seconds under TCG.)  A host with the wrong
    key fails the handshake (before any kTLS) with a log line on the target.  A host process
    killed while it writes 4 MiB at a time to the target on kTLS (its
    connections cut mid-record): the target ends those connections (its control socket's
    tls_open falls to 0: no crash, no hang, none left behind) and serves a new host
    byte-exact, on kTLS."""
    img = sparse_image(tmp_path, SIZE)
    log = tmp_path / "target.log"
    ctl, targs = _ctl(tmp_path)
    with serve([img], NQN, *tls_args(HOST, KEY), *targs, log=log) as (_host, port, proc):
        with pytest.raises(errors.Fx100ioError):
            fx100io.open_device(uri(port, KEY48, connect_timeout_ms=5000), queue_depth=4)
        # the host may see its failure before the target has logged it (under ASan, often)
        deadline = time.monotonic() + 20
        while "TLS handshake with host" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        wait_tls_open(ctl, 0)
        w = subprocess.Popen([sys.executable, "-S", "-c", _WRITER, uri(port, queues=2)],
                             stdout=subprocess.PIPE, text=True, cwd=str(REPO))
        try:
            assert w.stdout is not None
            line = _line_within(w.stdout, 60)
            assert line is not None and line.strip() == "writing", (line, w.poll())
            assert target_tls(ctl)["tls_open"] == 3  # (its admin queue and 2 I/O queues)
            time.sleep(0.5)
        finally:
            w.send_signal(signal.SIGKILL)
            w.wait()
        wait_tls_open(ctl, 0)
        data = chunk_bytes("ktls-after-drop", 4 << 20)
        with fx100io.open_device(uri(port, queues=2), queue_depth=8) as dev:
            assert dev.write_from_blocking(8 << 20, data) == data.nbytes
            out = np.empty_like(data)
            assert dev.read_into_blocking(8 << 20, out) == data.nbytes
            assert np.array_equal(out, data)
        assert proc.poll() is None, log.read_text()[-2000:]
        target_layer(ctl, True)


# what the target logs for a record from the host that its kernel refuses
HOST_RECORD_WHY = {"tag": "kTLS: a TLS record failed its integrity check",
                   "oversize": "kTLS: the TLS peer sent a record of a size TLS 1.3 forbids"}


@pytest.mark.parametrize("how", sorted(HOST_RECORD_WHY))
def test_a_broken_record_from_the_host_ends_the_targets_ktls_connection(fabric_lab, tmp_path,
                                                                         how):
    """A record from the host flipped (EBADMSG) or oversized (EMSGSIZE) on its way while it
    writes 4 MiB: the target's kernel refuses it, the target logs why and closes (no crash),
    and the host reconnects and writes byte-exact."""
    img = sparse_image(tmp_path, SIZE)
    log = tmp_path / "target.log"
    ctl, targs = _ctl(tmp_path)
    with serve([img], NQN, *tls_args(HOST, KEY), *targs, log=log) as (_host, port, proc):
        proxy = RecordProxy(port, how, upstream=True)
        try:
            dev = fx100io.open_device(uri(proxy.listen_port, io_timeout_ms=20000,
                                          reconnect_ms=50), queue_depth=8)
            try:
                data = chunk_bytes("ktls-host-" + how, 4 << 20)
                with pytest.raises((errors.FxProtocolError, errors.FxConnectionError)):
                    dev.write_from_blocking(0, data)
                assert proxy.fired.is_set()
                deadline = time.monotonic() + 10
                while HOST_RECORD_WHY[how] not in log.read_text():
                    assert time.monotonic() < deadline, log.read_text()[-2000:]
                    time.sleep(0.1)
                assert dev.write_from_blocking(0, data) == data.nbytes
                out = np.empty_like(data)
                assert dev.read_into_blocking(0, out) == data.nbytes
                assert np.array_equal(out, data)
            finally:
                dev.close()
        finally:
            proxy.close()
        assert proc.poll() is None
        target_layer(ctl, True)


def test_a_target_that_dies_mid_transfer_fails_the_read_then_it_reconnects(fabric_lab,
                                                                            tmp_path):
    """The target killed while 8 MiB reads are in flight on kTLS connections: the read fails
    with a connection error (no hang, no wrong bytes: the buffer holds data or what it
    held), and once the target is back the next read reconnects, again on kTLS."""
    img = sparse_image(tmp_path, SIZE)
    data = chunk_bytes("ktls-kill", 8 << 20)
    with open(img, "r+b") as f:
        f.write(data.tobytes())
    cm = serve([img], NQN, *tls_args(HOST, KEY))
    _host, port, proc = cm.__enter__()
    try:
        dev = fx100io.open_device(uri(port, queues=2, io_timeout_ms=10000,
                                      connect_timeout_ms=5000, reconnect_ms=100),
                                  queue_depth=32)
        try:
            out = np.empty(8 << 20, np.uint8)
            assert dev.read_into_blocking(0, out) == 8 << 20
            out[:] = 0x77

            async def read_and_kill():
                task = asyncio.ensure_future(dev.read_into(0, out))
                await asyncio.sleep(0.05)
                proc.kill()
                return await asyncio.wait_for(task, 60)

            try:
                asyncio.run(read_and_kill())
                killed_mid = False  # (the read won the race: nothing to check there)
            except (errors.FxConnectionError, errors.FxProtocolError, errors.FxTimeoutError):
                killed_mid = True
            assert np.all((out == data) | (out == 0x77) | (out == 0)), "bytes no one sent"
            proc.wait()
            cm.__exit__(None, None, None)
            wait_port_free(port)
            cm = serve([img], NQN, *tls_args(HOST, KEY), port=port)
            cm.__enter__()
            read_once_reconnected(dev, out, 60, 0.2)
            assert np.array_equal(out, data)
            st = dev.queue_stats()
            assert st["reconnects"] >= 1 and st["tls_user_conns"] == 0, st
            print(f"killed mid-read: {killed_mid}; stats {st}")
        finally:
            dev.close()
    finally:
        cm.__exit__(None, None, None)


@pytest.mark.parametrize("how", ["tag", "oversize", "cut"])
def test_a_broken_record_mid_transfer_on_ktls(fabric_lab, tmp_path, how, capfd):
    """A record flipped, oversized or cut on its way while an 8 MiB read is in flight on
    kTLS: the read fails promptly with the error our record layer gives (EBADMSG for a bad
    tag; never io_timeout_ms's timeout: the kernel reports a refused record once, and the
    receive that meets it must hand it to us), its buffer holds data, zeros or what it held,
    the reason is logged, and the next read reconnects on kTLS and is byte-exact."""
    img = sparse_image(tmp_path, SIZE)
    data = chunk_bytes("ktls-broken-" + how, 8 << 20)
    with open(img, "r+b") as f:
        f.write(data.tobytes())
    with serve([img], NQN, *tls_args(HOST, KEY)) as (_host, port, _):
        proxy = RecordProxy(port, how)
        try:
            dev = fx100io.open_device(uri(proxy.listen_port, io_timeout_ms=30000,
                                          reconnect_ms=50), queue_depth=32)
            try:
                out = np.full(8 << 20, 0x77, np.uint8)
                t0 = time.monotonic()
                with pytest.raises((errors.FxProtocolError, errors.FxConnectionError)) as e:
                    dev.read_into_blocking(0, out)
                assert time.monotonic() - t0 < 20, "the broken record was caught by the timeout"
                assert proxy.fired.is_set()
                assert np.all((out == data) | (out == 0) | (out == 0x77))
                err = capfd.readouterr().err
                if how == "tag":
                    assert e.value.errno == errno.EBADMSG
                    assert "kTLS: a TLS record failed its integrity check" in err
                elif how == "oversize":
                    assert "kTLS: the TLS peer sent a record of a size TLS 1.3 forbids" in err
                out[:] = 0
                assert dev.read_into_blocking(0, out) == 8 << 20
                assert np.array_equal(out, data)
                st = dev.queue_stats()
                assert st["reconnects"] >= 1 and st["ktls_conns"] >= 2, st
                assert st["tls_user_conns"] == 0, st
            finally:
                dev.close()
        finally:
            proxy.close()


C_KTLS = REPO / "tests" / "c" / "build" / "test_ktls"


def test_records_that_are_not_data_on_ktls(fabric_lab):
    """tests/c/test_ktls.c on this kernel: our server's tickets are dropped, an alert and
    close_notify end the stream with their reasons, a bad tag is EBADMSG, and a KeyUpdate is
    a clear error on 6.12 (its kTLS cannot take a second receive key), all on kTLS."""
    if not C_KTLS.exists():
        pytest.fail(f"{C_KTLS} is not built: run `make -C tests/c all` on the host first",
                    pytrace=False)
    p = subprocess.run([str(C_KTLS)], capture_output=True, text=True, timeout=120)
    print(p.stdout, p.stderr)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ktls: kernel" in p.stdout
    assert "test_ktls: ok" in p.stdout


# The io_uring data path meeting a record that is not data in the middle of a read's
# C2HData (our target's --fault-tls-record): the kernel fails the exact receive into the
# read's buffer with EIO (having perhaps decrypted the record there), recvmsg fetches the
# record, and the read goes on byte-exact (a ticket) or fails cleanly (an alert,
# close_notify).  The same contract as on our own layer (tests/fabric/
# test_tls_records_mid_read.py, support/tls_midread.py).

# The target on kTLS sends the record through its kernel (a TLS_SET_RECORD_TYPE cmsg);
# "ours" pins the target's own layer, so the initiator's kTLS meets both.

@pytest.mark.parametrize(("n", "target_ktls"),
                         [(1 << 20, True), (4 << 20, True), (1 << 20, False)],
                         ids=["1MiB", "4MiB", "1MiB-target-ours"])
def test_a_ticket_mid_read_on_ktls_is_dropped_and_the_read_is_byte_exact(fabric_lab, tmp_path,
                                                                          n, target_ktls):
    ticket_mid_read(tmp_path, n, ktls=True, target_ktls=target_ktls)


@pytest.mark.parametrize("kind", ["close_notify", "fatal", "warning"])
def test_an_alert_mid_read_on_ktls_fails_the_read_cleanly_then_it_reconnects(fabric_lab,
                                                                              tmp_path, kind,
                                                                              capfd):
    end_mid_read(tmp_path, kind, True, capfd, target_ktls=True)


# (not "drop-after": on kTLS it sends as the page-cache read does, which "small" and
# "ddgst" cover; our layer's own split for it is tests/fabric's)
@pytest.mark.parametrize("path", sorted(set(PATHS) - {"drop-after"}))
def test_the_ticket_fault_fires_on_every_read_path_of_the_target_on_ktls(fabric_lab, tmp_path,
                                                                         path):
    img_dir = None
    if path == "disk":
        # (the namespace in the guest share, whose pages fadvise may evict: the guest's
        # /tmp is tmpfs, whose pages are the file)
        img_dir = fabric_lab.guest_scratch / "ktls-path-disk"
        img_dir.mkdir(exist_ok=True)
    ticket_on_path(tmp_path, path, True, target_ktls=True, img_dir=img_dir)

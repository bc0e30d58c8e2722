"""The Linux kernel's NVMe/TCP TLS in the lab guest, both ways, byte-checked: our userspace
initiator against nvmet with a TLS 1.3 port, and the kernel's host (nvme-tcp with `tls`)
against our target (docs/kernel-path.md, "TLS").

The guest's 6.12 backports kernel has NVMe/TCP TLS on both sides (CONFIG_NVME_TCP_TLS,
CONFIG_NVME_TARGET_TCP_TLS, the `.nvme` keyring) and kTLS (tls.ko, loaded at boot), but
neither side does the TLS handshake itself: both hand the socket to the `tlshd` daemon
through the netlink handshake family.  Debian 12 has no tlshd; the lab fetches trixie's
(tools/fabric_lab/fabric_lab/tlshd.py, at lab start; the tests skip, saying why, only when
the Debian archive cannot be reached and nothing is cached).  A module fixture runs it in
the guest with a config of our own; the PSKs go into `.nvme` as libnvme puts them there
(tests/support/nvme_keyring.py: the derived TLS PSK under its identity `NVMe0R01 <hostnqn>
<subnqn>`), and the kernel host is connected by writing its options to /dev/nvme-fabrics,
since Debian 12's nvme-cli 2.3 has no `connect --tls`: by hand, and by fx100io's kernel path
(`kernel.connect` with a tls_key), which does the same.

Everything talks over the guest's loopback: tlshd looks the peer's address up
(getnameinfo), and the guest has no DNS, so for the guest's own address each handshake would
wait for the resolver's timeout, longer than nvmet's 10 s handshake timeout; `localhost`
is answered by /etc/hosts at once.

The bodies run inside the guest (@pytest.mark.guest).  The nvmet port with TLS (port id 29,
127.0.0.1:4429) is added through configfs and removed at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from support import chunk_bytes, write_then_read_back
from support.nvme_keyring import insert_psk, remove
from support.nvmet_port import extra_port
from support.target_process import serve, sparse_image, tls_args
from support.tls_keys import KEY, OTHER

import fx100io
from fx100io import errors, kernel

pytest_plugins = ["support.lab_fixture"]
pytestmark = [pytest.mark.lab, pytest.mark.guest]

PORT_ID, PORT = 29, 4429
LOOPBACK = "127.0.0.1"
HOST = "nqn.2014-08.org.nvmexpress:uuid:f0100000-0000-4000-8000-00000000c029"
# the kernel host's identity (its own, so no host NQN the guest already uses is reused)
KHOST_ID = "f0100000-0000-4000-8000-00000000c02a"
KHOST = f"nqn.2014-08.org.nvmexpress:uuid:{KHOST_ID}"
KNQN = "nqn.2026-12.io.fx100:kernel-tls"
TLSHD_CONF = """[debug]
loglevel=1
tls=0
nl=0

[authenticate]
keyrings=.nvme
"""


def in_guest() -> bool:
    from fabric_lab import guest_userland  # (on sys.path once the lab plugin is loaded)

    return guest_userland.in_guest()


@pytest.fixture(scope="module")
def tlshd(fabric_lab, tmp_path_factory):
    """tlshd running in the guest (on the host: fetched and cached, or the module skips)."""
    from fabric_lab import tlshd as fetch

    if not in_guest():
        try:
            fetch.ensure()
        except fetch.TlshdUnavailable as err:
            pytest.skip(f"no tlshd for the guest's kernel TLS: {err}")
        yield None
        return
    binary = fetch.cached()
    if binary is None:
        pytest.skip("tlshd is not cached where the guest sees it: `lab.py tlshd`, then "
                    "restart the lab")
    d = tmp_path_factory.mktemp("tlshd")
    (d / "tlshd.conf").write_text(TLSHD_CONF)
    log = d / "tlshd.log"
    with open(log, "w") as out:
        p = subprocess.Popen([str(binary), "-c", str(d / "tlshd.conf"), "-s"], stdout=out,
                             stderr=out)
    try:
        deadline = time.monotonic() + 30
        while "linked into our session keyring" not in log.read_text():
            assert p.poll() is None, f"tlshd exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"tlshd did not start: {log.read_text()}"
            time.sleep(0.1)
        yield log
    finally:
        p.terminate()
        p.wait(timeout=10)
        print(f"tlshd's log:\n{log.read_text()[-4000:]}")


@contextlib.contextmanager
def psk_in_keyring(configured: str, hostnqn: str, subnqn: str):
    serial = insert_psk(configured, hostnqn, subnqn)
    try:
        yield serial
    finally:
        remove(serial)


@pytest.fixture
def nvmet_tls_port(fabric_lab, tlshd):
    """nvmet's lab-ram subsystem on 127.0.0.1:4429 with TLS 1.3 required, HOST's PSK (from
    KEY) in `.nvme`."""
    if not in_guest():  # on the host the test only hands over to the guest
        yield None
        return
    nqn = fabric_lab.subsystem("lab-ram").nqn
    attrs = {"addr_trtype": "tcp", "addr_adrfam": "ipv4", "addr_traddr": LOOPBACK,
             "addr_trsvcid": str(PORT), "addr_tsas": "tls1.3", "addr_treq": "required"}
    with psk_in_keyring(KEY, HOST, nqn), extra_port(PORT_ID, nqn, attrs) as d:
        try:
            yield nqn, d
        finally:
            for c in kernel.list():
                if c.subsysnqn == nqn and c.trsvcid == str(PORT):
                    kernel.disconnect(c)


def test_the_guest_kernel_has_nvme_tcp_tls(fabric_lab):
    """nvme-fabrics offers the tls, keyring and tls_key options; nvme-keyring (the .nvme
    keyring's module) and kTLS (tls.ko) are loaded."""
    opts = Path("/dev/nvme-fabrics").read_text()
    tokens = {t.split("=", 1)[0] for t in opts.strip().split(",")}
    assert {"tls", "keyring", "tls_key"} <= tokens, opts
    assert Path("/sys/module/nvme_keyring").is_dir()
    assert Path("/sys/module/tls").is_dir()


def test_nvme_cli_cannot_ask_for_tls(fabric_lab):
    """Why the kernel host is connected through /dev/nvme-fabrics here: Debian 12's nvme-cli
    2.3 has no `connect --tls` (libnvme gained the keyring and tls_key options in 1.4)."""
    out = subprocess.run(["nvme", "connect", "--help"], capture_output=True, text=True,
                         timeout=30)
    text = out.stdout + out.stderr
    assert "--nqn" in text  # the help text itself was read
    assert "--tls" not in text, "nvme-cli has connect --tls now: the kernel path can use it"
    assert shutil.which("tlshd") is None  # (ours is the lab's cached one, not installed)


# (offset, length) at offsets no multiple of the lengths, up to 1 MiB
IOS = [(512, 4096), (9 * 512, 20 * 1024 + 512), (3 << 20 | 1536, 1 << 20)]


@pytest.mark.parametrize("ktls", ["off", "auto"])
def test_our_initiator_reads_and_writes_nvmet_over_tls(fabric_lab, nvmet_tls_port, ktls):
    """Our initiator's TLS (our record layer, or kTLS after our handshake) against nvmet's
    TLS port and tlshd: bytes written over TLS read back equal over TLS, and equal in clear
    text from the lab's plain port (what nvmet stored)."""
    nqn, _ = nvmet_tls_port
    uri = (f"nvme+tcp://{LOOPBACK}:{PORT}/{nqn}?hostnqn={HOST}&tls_key={KEY}&ktls={ktls}"
           "&queues=2&connect_timeout_ms=20000")
    pool = fx100io.BufferPool(8 << 20)
    with fx100io.open_device(uri, queue_depth=8) as dev:
        written = write_then_read_back(dev, pool, IOS, f"nvmet-tls-{ktls}")
        st = dev.queue_stats()
        want = (2, 0) if ktls == "auto" else (0, 2)
        assert (st["ktls_conns"], st["tls_user_conns"]) == want, st
    clear = f"nvme+tcp://{fabric_lab.host}:{fabric_lab.port}/{nqn}?hostnqn={HOST}"
    with fx100io.open_device(clear) as dev:
        for off, buf in written:
            out = pool.alloc(len(buf))
            assert dev.read_into_blocking(off, out) == len(buf)
            assert np.array_equal(out, buf), (off, len(buf))


def test_a_wrong_key_or_none_fails_against_nvmet_clearly(fabric_lab, nvmet_tls_port, capfd):
    """A host whose key is not the one in `.nvme`, one whose identity has no key there, and
    one in clear text are all refused, quickly and with an error that says TLS (never a
    hang, never clear text)."""
    nqn, _ = nvmet_tls_port
    base = f"nvme+tcp://{LOOPBACK}:{PORT}/{nqn}?connect_timeout_ms=20000&queues=1"
    stranger = HOST.replace("c029", "c0ff")
    seen = []
    for what, q in (("wrong key", f"&hostnqn={HOST}&tls_key={OTHER}"),
                    ("no key for this host", f"&hostnqn={stranger}&tls_key={KEY}"),
                    ("clear text", f"&hostnqn={HOST}")):
        t0 = time.monotonic()
        with pytest.raises(errors.Fx100ioError) as ei:
            with fx100io.open_device(base + q):
                pass
        took = time.monotonic() - t0
        err = capfd.readouterr().err
        seen.append(f"{what}: {type(ei.value).__name__} after {took:.2f} s: {ei.value} / {err}")
        assert took < 15, f"{what}: refused after {took:.1f} s"
        assert KEY[16:40] not in str(ei.value) + err and OTHER[16:40] not in str(ei.value) + err
        if what != "clear text":
            assert isinstance(ei.value, errors.FxConnectionError)
            assert "TLS handshake failed" in err, err
    with capfd.disabled():
        print("\n".join(seen))


def _fabrics_connect(options: str) -> str:
    """Write options to /dev/nvme-fabrics as nvme-cli does; the kernel's answer
    (`instance=N,cntlid=M`)."""
    fd = os.open("/dev/nvme-fabrics", os.O_RDWR)
    try:
        os.write(fd, options.encode())
        return os.read(fd, 4096).decode().strip()
    finally:
        os.close(fd)


def test_the_kernel_host_reads_and_writes_our_target_over_tls(fabric_lab, tlshd, tmp_path):
    """The guest kernel's nvme-tcp with `tls` (its PSK looked up in `.nvme` by identity,
    handed to tlshd, then kTLS) against `fx100io target --tls required`: what the kernel
    writes through its block device is in our target's file, byte for byte, and what we put
    in the file the kernel reads back."""
    img = sparse_image(tmp_path, 16 << 20)
    seed = chunk_bytes("kernel-tls-seed", 1 << 20)
    with open(img, "r+b") as f:
        f.seek(8 << 20)
        f.write(seed.tobytes())
    with psk_in_keyring(KEY, KHOST, KNQN) as serial, \
            serve([img], KNQN, *tls_args(KHOST, KEY), log=tmp_path / "target.log") as (
                _h, port, _p):
        answer = _fabrics_connect(
            f"nqn={KNQN},transport=tcp,traddr={LOOPBACK},trsvcid={port},hostnqn={KHOST},"
            f"hostid={KHOST_ID},nr_io_queues=2,tls")
        assert answer.startswith("instance="), answer
        name = "nvme" + answer.split(",")[0].split("=")[1]
        try:
            ctrl = Path("/sys/class/nvme") / name
            # the key the kernel found in .nvme for our identity, by serial
            assert int((ctrl / "tls_key").read_text().strip(), 16) == serial
            (c,) = [c for c in kernel.list() if c.name == name]
            (dev_path,) = c.namespaces  # (waits for the block device)
            pool = fx100io.BufferPool(8 << 20)  # (aligned, for O_DIRECT)
            data = pool.alloc(3 << 20)
            data[:] = chunk_bytes("kernel-tls-write", data.nbytes)
            with fx100io.open_device(dev_path) as dev:
                assert dev.write_from_blocking(1 << 20, data) == data.nbytes
                dev.flush_blocking()
                back = pool.alloc(seed.nbytes)
                assert dev.read_into_blocking(8 << 20, back) == seed.nbytes
                assert np.array_equal(back, seed)
        finally:
            kernel.disconnect(name)
    with open(img, "rb") as f:
        f.seek(1 << 20)
        assert f.read(data.nbytes) == data.tobytes()
    log = (tmp_path / "target.log").read_text()
    assert KHOST in log, log


def test_kernel_connect_with_tls_reads_and_writes_our_target(fabric_lab, tlshd, tmp_path):
    """kernel.connect with a tls_key (fx100io's kernel path: the PSK into `.nvme`, the
    options with `tls` written to /dev/nvme-fabrics, since nvme-cli 2.3 has no --tls)
    against our target: a wrong key attaches nothing and says TLS; the right one gives a
    block device whose writes are in our file, byte for byte; the `with` exit detaches."""
    img = sparse_image(tmp_path, 16 << 20)
    hid = KHOST_ID.replace("c02a", "c02b")
    host = f"nqn.2014-08.org.nvmexpress:uuid:{hid}"
    with serve([img], KNQN, *tls_args(host, KEY), log=tmp_path / "target.log") as (
            _h, port, _p):
        uri = f"nvme+tcp://{LOOPBACK}:{port}/{KNQN}?hostnqn={host}&hostid={hid}&queues=2"
        before = [c.name for c in kernel.list()]
        t0 = time.monotonic()
        with pytest.raises(errors.Fx100ioError) as ei:
            kernel.connect(f"{uri}&tls_key={OTHER}")
        print(f"kernel.connect, wrong key: {type(ei.value).__name__} after "
              f"{time.monotonic() - t0:.2f} s: {ei.value}")
        assert isinstance(ei.value, errors.DevicePermissionError)
        assert "TLS handshake with the target failed" in str(ei.value)
        assert OTHER[16:40] not in str(ei.value)
        assert [c.name for c in kernel.list()] == before
        pool = fx100io.BufferPool(4 << 20)
        data = pool.alloc(2 << 20)
        data[:] = chunk_bytes("kernel-connect-tls", data.nbytes)
        with kernel.connect(f"{uri}&tls_key={KEY}") as c:
            assert (c.sysfs_path / "tls_key").read_text().strip() not in ("", "0")
            (dev_path,) = c.namespaces
            with fx100io.open_device(dev_path, path="kernel") as dev:
                assert dev.write_from_blocking(512 * 3, data) == data.nbytes
                dev.flush_blocking()
                back = pool.alloc(data.nbytes)
                assert dev.read_into_blocking(512 * 3, back) == data.nbytes
                assert np.array_equal(back, data)
        assert [c.name for c in kernel.list()] == before
    with open(img, "rb") as f:
        f.seek(512 * 3)
        assert f.read(data.nbytes) == data.tobytes()


def _wait_live(name: str, timeout: float = 60) -> None:
    state = Path("/sys/class/nvme") / name / "state"
    deadline = time.monotonic() + timeout
    while state.read_text().strip() != "live":
        assert time.monotonic() < deadline, f"{name} is {state.read_text().strip()!r}"
        time.sleep(0.1)


def test_one_identity_shares_its_key_and_another_key_is_refused(fabric_lab, tlshd, tmp_path):
    """Two kernel.connect calls of one (hostnqn, subnqn) use the one `.nvme` key (the
    second finds it and reuses its serial, as libnvme does); a connect of that identity with
    another key is refused before anything is written, and leaves the installed key alone:
    the first controller still reconnects (a controller reset hands tlshd its key again).
    attach() with the other key does not share these controllers; with the same key it does."""
    img = sparse_image(tmp_path, 16 << 20)
    hid = KHOST_ID.replace("c02a", "c02c")
    host = f"nqn.2014-08.org.nvmexpress:uuid:{hid}"
    with serve([img], KNQN, *tls_args(host, KEY), log=tmp_path / "target.log") as (
            _h, port, _p):
        uri = f"nvme+tcp://{LOOPBACK}:{port}/{KNQN}?hostnqn={host}&hostid={hid}"
        with kernel.connect(f"{uri}&tls_key={KEY}") as first, \
                kernel.connect(f"{uri}&tls_key={KEY}", duplicate_connect=True) as second:
            assert first.name != second.name
            serial = (first.sysfs_path / "tls_key").read_text().strip()
            assert (second.sysfs_path / "tls_key").read_text().strip() == serial
            with pytest.raises(errors.DeviceBusyError, match="holds another PSK") as ei:
                kernel.connect(f"{uri}&tls_key={OTHER}", duplicate_connect=True)
            assert OTHER[16:40] not in str(ei.value) and KEY[16:40] not in str(ei.value)
            assert (first.sysfs_path / "tls_key").read_text().strip() == serial
            # attach() shares a live controller only when it was connected with this key
            with pytest.raises(errors.DeviceBusyError, match="not attached with this tls_key"):
                kernel.attach(f"{uri}&tls_key={OTHER}")
            shared = kernel.attach(f"{uri}&tls_key={KEY}")
            assert not shared.attached and shared.controller.name in (first.name, second.name)
            shared.release()
            (first.sysfs_path / "reset_controller").write_text("1")
            time.sleep(0.5)
            _wait_live(first.name)
            (dev_path,) = first.namespaces
            pool = fx100io.BufferPool(1 << 20)
            data = pool.alloc(64 << 10)
            data[:] = chunk_bytes("kernel-tls-after-reset", data.nbytes)
            with fx100io.open_device(dev_path, path="kernel") as dev:
                assert dev.write_from_blocking(0, data) == data.nbytes
                dev.flush_blocking()
    with open(img, "rb") as f:
        assert f.read(data.nbytes) == data.tobytes()

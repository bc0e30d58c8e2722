"""The Linux kernel's NVMe/TCP initiator authenticating to our target with
DH-HMAC-CHAP (`fx100io target --dhchap-key`), in the fabric lab guest
(`nvme connect --dhchap-secret [--dhchap-ctrl-secret]`, nvme-cli 2.3).

The host's secret is made in the guest by `nvme gen-dhchap-key`, so the
target is also checked to take nvme-cli's secrets as they are.  A wrong
secret must fail the connect (and leave no device).  The guest kernel needs
NVMe in-band authentication (CONFIG_NVME_HOST_AUTH, Linux 6.0+ built with
it); Debian 12's stock 6.1 kernel does not have it, and then the tests skip
saying so."""

from __future__ import annotations

import os
import re
import shlex

import pytest
from support import dhchap_reference as ref
from support.kernel_lab import (
    Region,
    _backing_bytes,
    _connect_command,
    _find_device_script,
    _guest,
    _guest_ok,
    _guest_read_md5,
    _host_ip,
    _host_nqn,
    _md5,
    _random_bytes,
    guest_connection,
    lab,
    our_target,
)

pytest_plugins = ["support.lab_fixture"]
pytestmark = pytest.mark.lab
__all__ = ["lab"]  # (the fixture, imported for this module's tests)


@pytest.fixture
def auth_lab(lab):
    """The lab, once its guest kernel is known to do NVMe in-band authentication."""
    rc, out = _guest(lab, "uname -r; "
                          "c=/boot/config-$(uname -r); "
                          "grep -E '^CONFIG_NVME_(HOST_)?AUTH=' $c 2>/dev/null; "
                          "modprobe nvme_auth 2>/dev/null; "
                          "[ -d /sys/module/nvme_auth ] && echo have-nvme_auth; "
                          "nvme connect --help 2>&1 | grep -c dhchap", timeout=120)
    lines = out.split()
    has_kernel = "have-nvme_auth" in out or re.search(r"CONFIG_NVME_(HOST_)?AUTH=[ym]", out)
    if not has_kernel:
        pytest.skip(f"the lab guest's kernel ({lines[0] if lines else '?'}) has no NVMe in-band "
                    "authentication (CONFIG_NVME_HOST_AUTH / nvme_auth): DH-HMAC-CHAP from the "
                    "kernel initiator cannot be tested with it")
    return lab


def _gen_secret(lab, nqn: str, hmac: int) -> str:
    out = _guest_ok(lab, f"nvme gen-dhchap-key --hmac={hmac} --nqn={shlex.quote(nqn)}")
    m = re.search(r"DHHC-1:0[0-3]:[A-Za-z0-9+/=]+:", out)
    assert m, out
    ref.parse_secret(m.group(0))  # well formed, by the reference's reading too
    return m.group(0)


def _serve(lab, tmp_path, *extra: str):
    return our_target(tmp_path, _host_ip(lab), 4096, *extra)


def _prefill(tmp_path, region: Region, data) -> None:
    """Data in the namespace's file before the target serves it."""
    backing = tmp_path / "ns1.img"
    with open(backing, "wb") as f:
        f.truncate(64 << 20)
        f.seek(region.offset)
        f.write(data.tobytes())


@pytest.mark.parametrize("bidir", [False, True], ids=["host", "bidirectional"])
def test_kernel_initiator_authenticates_to_our_target(auth_lab, tmp_path, bidir):
    lab = auth_lab
    guest_nqn = _host_nqn()
    secret = _gen_secret(lab, guest_nqn, 1)
    ctrl_secret = ref.format_secret(os.urandom(48), 2)
    extra = ["--dhchap-key", f"{guest_nqn}={secret}"]
    connect = f"--dhchap-secret={shlex.quote(secret)}"
    if bidir:
        # one DH group (ffdhe2048: the cheapest for the guest at TCG speed) and one hash
        extra += ["--dhchap-ctrl-key", f"{guest_nqn}={ctrl_secret}",
                  "--dhchap-dhgroup", "ffdhe2048", "--dhchap-hash", "sha384"]
        connect += f" --dhchap-ctrl-secret={shlex.quote(ctrl_secret)}"
        want = "DH-HMAC-CHAP, sha384, DH group ffdhe2048, bidirectional"
    else:
        # the kernel offers every hash and group: we pick the strongest we allow
        extra += ["--dhchap-dhgroup", "null,ffdhe3072"]
        want = "DH-HMAC-CHAP, sha512, DH group ffdhe3072"
    data = _random_bytes(f"kauth-{bidir}", 256 << 10)
    region = Region(1 << 20, data.nbytes, 4096)
    _prefill(tmp_path, region, data)
    with _serve(lab, tmp_path, *extra) as target:
        with guest_connection(lab, target, guest_nqn, digests=False, extra=connect) as device:
            assert _guest_read_md5(lab, device, region) == _md5(data)
            path = "/tmp/kauth.bin"
            out = _guest_ok(lab, f"dd if=/dev/urandom of={path} bs=4096 count=64 2>/dev/null && "
                                 f"md5sum {path} && dd if={path} of={device} bs=4096 count=64 "
                                 f"seek=1024 oflag=direct conv=fsync 2>/dev/null; rc=$?; "
                                 f"rm -f {path}; exit $rc")
            written = Region(4 << 20, 256 << 10, 4096)
            assert _md5(_backing_bytes(target, written)) == out.split()[0]
        log = target.log_text()
        # the admin queue and every I/O queue authenticated; the secret is nowhere
        assert f"host {guest_nqn} authenticated" in log and want in log, log[-3000:]
        assert "failed DH-HMAC-CHAP" not in log, log[-3000:]
        for s in (secret, ctrl_secret, secret[10:40], ctrl_secret[10:40]):
            assert s not in log


def test_kernel_initiator_with_a_wrong_secret_is_refused(auth_lab, tmp_path):
    lab = auth_lab
    guest_nqn = _host_nqn()
    secret = _gen_secret(lab, guest_nqn, 1)
    wrong = _gen_secret(lab, guest_nqn, 1)
    assert wrong != secret
    with _serve(lab, tmp_path, "--dhchap-key", f"{guest_nqn}={secret}",
                "--dhchap-dhgroup", "null") as target:
        try:
            rc, out = _guest(lab, _connect_command(target, guest_nqn, digests=False,
                                                   extra=f"--dhchap-secret={shlex.quote(wrong)}"))
            assert rc != 0, f"nvme connect with a wrong secret succeeded:\n{out}"
            rc, listing = _guest(lab, _find_device_script(target.nqn, seconds=2))
            assert rc != 0, f"a device appeared for a host with a wrong secret: {listing}"
            # no secret at all: refused too
            rc, out = _guest(lab, _connect_command(target, guest_nqn, digests=False))
            assert rc != 0, f"nvme connect without a secret succeeded:\n{out}"
        finally:
            _guest(lab, f"nvme disconnect -n {shlex.quote(target.nqn)}")
        log = target.log_text()
        assert f"host {guest_nqn} failed DH-HMAC-CHAP authentication: response mismatch" in log, \
            log[-3000:]
        assert secret not in log and wrong not in log
        _, dmesg = _guest(lab, "dmesg | tail -n 30")
        assert re.search(r"auth|authentication", dmesg, re.I), dmesg


def test_kernel_initiator_reauthenticates_with_io_in_flight(auth_lab, tmp_path):
    """Writing the controller's dhchap_secret attribute makes Linux
    re-authenticate every queue of a live controller while its I/O goes on:
    that I/O must not fail (the queue stays authenticated meanwhile)."""
    lab = auth_lab
    guest_nqn = _host_nqn()
    secret = _gen_secret(lab, guest_nqn, 1)
    with _serve(lab, tmp_path, "--dhchap-key", f"{guest_nqn}={secret}",
                "--dhchap-dhgroup", "null,ffdhe2048") as target:
        with guest_connection(lab, target, guest_nqn, digests=False,
                              extra=f"--dhchap-secret={shlex.quote(secret)}") as device:
            nqn = shlex.quote(target.nqn)
            ctrl = _guest_ok(lab, "for c in /sys/class/nvme/nvme*; do "
                                  f"[ \"$(cat $c/subsysnqn)\" = {nqn} ] && echo $c; done").split()
            assert len(ctrl) == 1 and re.fullmatch(r"/sys/class/nvme/nvme\d+", ctrl[0]), ctrl
            out = _guest_ok(lab, "(for i in $(seq 1 30); do "
                                 f"dd if={device} of=/dev/null bs=4096 count=64 iflag=direct "
                                 "2>/dev/null || exit 1; done) & p=$!; sleep 0.3; "
                                 f"echo -n {shlex.quote(secret)} > {ctrl[0]}/dhchap_secret; "
                                 "wait $p; echo io-rc=$?; sleep 2", timeout=300)
            assert "io-rc=0" in out, out
            _guest_ok(lab, f"dd if={device} of=/dev/null bs=4096 count=16 iflag=direct")
        log = target.log_text()
        assert log.count(f"host {guest_nqn} authenticated") >= 2, log[-3000:]
        assert "failed DH-HMAC-CHAP" not in log, log[-3000:]

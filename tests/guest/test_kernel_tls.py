"""The kernel's NVMe/TCP TLS in the lab guest: why the kernel path refuses tls=1
(docs/kernel-path.md, "TLS"), checked against the real kernel, nvmet and nvme-cli rather
than assumed.

The guest runs Debian's 6.12 backports kernel, which has NVMe/TCP TLS on both sides
(CONFIG_NVME_TCP_TLS, CONFIG_NVME_TARGET_TCP_TLS, the .nvme keyring), but its userland is
this host's Debian 12: no tlshd (ktls-utils is in neither bookworm nor bookworm-backports)
and nvme-cli 2.3 without `connect --tls`.  Both kernel sides hand every handshake to tlshd
through the netlink handshake family, so without it an nvmet port that requires TLS
completes none (nvmet logs "nvmet_tcp: failed to start TLS, err=-3": ESRCH, nobody took the
upcall): our userspace initiator, asking for TLS with the right key, must get a
clear error within its connect timeout (never a hang, never clear text), and the kernel path
must refuse tls=1 before anything is attached.  When a test here fails because tlshd or an
nvme-cli with --tls has appeared, the kernel path can do TLS: build it and turn this file
into its byte-checked test.

The bodies run inside the guest (@pytest.mark.guest).  The nvmet port with TLS (port id 29,
4429) is added through configfs and removed at the end.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from support.nvmet_port import extra_port

import fx100io
from fx100io import errors, kernel

pytest_plugins = ["support.lab_fixture"]
pytestmark = [pytest.mark.lab, pytest.mark.guest]

PORT_ID, PORT = 29, 4429
HOST = "nqn.2014-08.org.nvmexpress:uuid:f0100000-0000-4000-8000-00000000c029"
KEY = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"


def test_the_guest_kernel_has_nvme_tcp_tls(fabric_lab):
    """The kernel side is there: nvme-fabrics offers the tls, keyring and tls_key options,
    and nvme-keyring (the .nvme keyring's module) is loaded.  (kTLS itself, tls.ko, is
    loaded at boot too: our initiator hands it its records, tests/guest/test_ktls.py.)"""
    opts = Path("/dev/nvme-fabrics").read_text()
    tokens = {t.split("=", 1)[0] for t in opts.strip().split(",")}
    assert {"tls", "keyring", "tls_key"} <= tokens, opts
    assert Path("/sys/module/nvme_keyring").is_dir()


def test_the_guest_userland_has_no_tlshd_and_no_nvme_connect_tls(fabric_lab):
    """What is missing, precisely: the handshake daemon and nvme-cli's --tls."""
    assert shutil.which("tlshd") is None, ("tlshd is installed now: the kernel path can do "
                                           "TLS (see this module's doc)")
    out = subprocess.run(["nvme", "connect", "--help"], capture_output=True, text=True,
                         timeout=30)
    text = out.stdout + out.stderr
    assert "--nqn" in text  # the help text itself was read
    assert "--tls" not in text, "nvme-cli has connect --tls now: see this module's doc"


@pytest.fixture
def tls_port(fabric_lab):
    from fabric_lab import guest_userland  # (on sys.path once the lab plugin is loaded)

    if not guest_userland.in_guest():  # on the host the test only hands over to the guest
        yield None
        return
    nqn = fabric_lab.subsystem("lab-ram").nqn
    attrs = {"addr_trtype": "tcp", "addr_adrfam": "ipv4", "addr_traddr": fabric_lab.host,
             "addr_trsvcid": str(PORT), "addr_tsas": "tls1.3", "addr_treq": "required"}
    with extra_port(PORT_ID, nqn, attrs) as d:
        try:
            yield fabric_lab.host, nqn, d
        finally:
            for c in kernel.list():
                if c.subsysnqn == nqn and c.trsvcid == str(PORT):
                    kernel.disconnect(c)


def nvmet_tls_failures() -> int:
    """How many times nvmet-tcp has logged that it could not start a TLS handshake."""
    out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30).stdout
    return out.count("nvmet_tcp: failed to start TLS")


def test_nvmet_tls_port_completes_no_handshake_without_tlshd(tls_port):
    """nvmet takes a port with TLS 1.3 required; our initiator, asking it for TLS with a
    key, fails with a clear error within its connect timeout while nvmet logs that it could
    not start the handshake; one in clear text is refused too."""
    host, nqn, d = tls_port
    assert (d / "addr_tsas").read_text().strip() == "tls1.3"
    assert (d / "addr_treq").read_text().strip().startswith("required")
    uri = (f"nvme+tcp://{host}:{PORT}/{nqn}?hostnqn={HOST}&tls_key={KEY}"
           "&connect_timeout_ms=8000")
    before = nvmet_tls_failures()
    t0 = time.monotonic()
    with pytest.raises(errors.Fx100ioError) as ei:
        with fx100io.open_device(uri):
            pass
    took = time.monotonic() - t0
    print(f"TLS to nvmet without tlshd: {type(ei.value).__name__} after {took:.2f} s: {ei.value}")
    assert took < 20, f"the failed handshake took {took:.1f} s"
    assert KEY[16:40] not in str(ei.value)
    # the kernel's reason: its handshake upcall found no tlshd listening (-ESRCH)
    deadline = time.monotonic() + 10
    while nvmet_tls_failures() == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert nvmet_tls_failures() > before, "nvmet did not log 'failed to start TLS'"
    t0 = time.monotonic()
    with pytest.raises(errors.Fx100ioError) as ei:
        with fx100io.open_device(f"nvme+tcp://{host}:{PORT}/{nqn}?hostnqn={HOST}"
                                 "&connect_timeout_ms=8000"):
            pass
    print(f"clear text to nvmet's TLS port: {type(ei.value).__name__} after "
          f"{time.monotonic() - t0:.2f} s: {ei.value}")
    assert time.monotonic() - t0 < 20


def test_kernel_connect_with_tls_is_refused_and_attaches_nothing(tls_port):
    host, nqn, _ = tls_port
    before = [c.name for c in kernel.list()]
    with pytest.raises(errors.KernelSupportError, match="tlshd") as ei:
        kernel.connect(f"nvme+tcp://{host}:{PORT}/{nqn}?hostnqn={HOST}&tls_key={KEY}")
    assert KEY[16:40] not in str(ei.value)
    assert [c.name for c in kernel.list()] == before

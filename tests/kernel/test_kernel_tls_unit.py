"""The kernel path's TLS connect, without a kernel: what it asks the kernel for
(fx100io/kernel/uri_args.py Target.fabrics_options), the PSK it puts in `.nvme`
(fx100io._core.tls_psk against this suite's own derivation), and what it refuses before
anything runs.  The real connects: tests/guest/test_kernel_tls.py in the lab guest."""

from __future__ import annotations

import errno

import pytest
from support.nvme_keyring import tls_psk as independent_tls_psk
from support.tls_keys import KEY, KEY48

from fx100io import _core, errors, kernel
from fx100io.kernel import keyring, uri_args

SUB = "nqn.2026-12.io.fx100:kernel-tls"
HOST = "nqn.2014-08.org.nvmexpress:uuid:f0100000-0000-4000-8000-00000000c02a"
HID = "f0100000-0000-4000-8000-00000000c02a"
# the real function, before tests/kernel/conftest.py's autouse fixture replaces it
_TLSHD_RUNNING = keyring.tlshd_running
SECRET = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:"


@pytest.fixture
def tlshd(monkeypatch):
    monkeypatch.setattr(keyring, "tlshd_running", lambda: True)


def test_a_tls_target_asks_the_kernel_for_tls_with_our_key(tlshd):
    t = uri_args.target_of(f"nvme+tcp://127.0.0.1:4420/{SUB}?hostnqn={HOST}&hostid={HID}"
                           f"&tls_key={KEY}&queues=2&hdgst=1&dhchap_secret={SECRET}",
                           ctrl_loss_tmo=30)
    assert t.tls_key == KEY and "tls_key" not in t.secrets
    assert ("--tls", "") in t.options
    assert KEY not in repr(t)
    assert t.fabrics_options(0x1234) == (
        f"nqn={SUB},transport=tcp,traddr=127.0.0.1,trsvcid=4420,hostnqn={HOST},hostid={HID},"
        f"nr_io_queues=2,hdr_digest,ctrl_loss_tmo=30,dhchap_secret={SECRET},"
        f"tls,tls_key={0x1234}")
    assert "--tls" in uri_args.options_text(t) and KEY[16:40] not in uri_args.options_text(t)
    plain = uri_args.target_of(f"nvme+tcp://127.0.0.1:4420/{SUB}?hostnqn={HOST}")
    assert not plain.tls_key and ("--tls", "") not in plain.options


@pytest.mark.parametrize("key", [KEY, KEY48], ids=["sha256", "sha384"])
def test_the_psk_for_the_keyring_is_the_one_our_initiator_offers(key):
    """What goes into `.nvme` (C, the initiator's derivation) equals this suite's own
    derivation, which the lab's kernel and tlshd accept (tests/guest/test_kernel_tls.py)."""
    assert _core.tls_psk(key, HOST, SUB) == independent_tls_psk(key, HOST, SUB)
    identity, psk = _core.tls_psk(key, HOST, SUB)
    assert identity == f"NVMe0R0{1 if key == KEY else 2} {HOST} {SUB}"
    assert len(psk) == (32 if key == KEY else 48)
    with pytest.raises(ValueError):
        _core.tls_psk(KEY, "nqn.a b", SUB)  # (an identity is split at spaces)


def test_discovery_over_tls_is_refused_even_with_tlshd(tlshd):
    with pytest.raises(errors.KernelSupportError) as ei:
        kernel.discover(f"nvme+tcp://127.0.0.1:4420?hostnqn={HOST}&tls_key={KEY}")
    assert ei.value.errno == errno.EPROTONOSUPPORT and "discovery" in str(ei.value)
    assert "none runs" not in str(ei.value) and "userspace initiator" in str(ei.value)
    assert KEY[16:40] not in str(ei.value)


def test_without_tlshd_tls_is_refused_before_the_uri_is_read(monkeypatch):
    monkeypatch.setattr(keyring, "tlshd_running", lambda: False)
    with pytest.raises(errors.KernelSupportError, match="needs the tlshd daemon") as ei:
        uri_args.target_of(f"nvme+tcp://127.0.0.1:4420/{SUB}?tls_key=@/nonexistent/psk")
    assert ei.value.errno == errno.EPROTONOSUPPORT


@pytest.mark.parametrize("uri,kw", [
    (f"nvme+tcp://127.0.0.1:4420/{SUB}?hostnqn=H%2Ctraddr%3D10.9.9.9", {}),
    (f"nvme+tcp://127.0.0.1:4420/{SUB}?hostnqn=H%0Aconcat", {}),
    (f"nvme+tcp://127.0.0.1:4420/{SUB}?hostnqn=nqn.a%3Db", {}),
    (f"nvme+tcp://127.0.0.1:4420/{SUB}%2Cdisable_sqflow?hostnqn={HOST}", {}),
    (f"nvme+tcp://127.0.0.1:4420/{SUB}%2Ckeyring%3D1?hostnqn={HOST}", {}),
    (f"nvme+tcp://127.0.0.1:4420/{SUB}?hostnqn={HOST}", {"host_iface": "eth0,concat"}),
    (f"nvme+tcp://127.0.0.1:4420/{SUB}?hostnqn={HOST}", {"host_traddr": "10.0.0.1,traddr=1"}),
    (f"nvme+tcp://127.0.0.1:4420/{SUB}?hostnqn={HOST}", {"host_iface": "eth0=1"}),
])
@pytest.mark.parametrize("tls", [False, True], ids=["clear", "tls"])
def test_a_value_that_would_add_kernel_options_is_refused(uri, kw, tls, tlshd):
    """The kernel splits /dev/nvme-fabrics' options at ',' and newlines (a repeated key's last
    value wins): no URI value or keyword may add an option of its own."""
    if tls:
        uri += f"&tls_key={KEY}"
    with pytest.raises(errors.InvalidArgumentError, match="control character"):
        uri_args.target_of(uri, **kw)


def test_the_default_hostnqn_is_checked_too(monkeypatch, tmp_path):
    (tmp_path / "hostnqn").write_text("nqn.2014-08.org.nvmexpress:x,traddr=10.9.9.9\n")
    monkeypatch.setattr(uri_args, "ETC_NVME", tmp_path)
    with pytest.raises(errors.InvalidArgumentError, match="hostnqn"):
        uri_args.target_of(f"nvme+tcp://127.0.0.1:4420/{SUB}")


class _Keys:
    """keyring.insert_tls_psk's view of `.nvme`, without a kernel: the key found for the
    identity (None: none) and whether its payload is this PSK (None: unreadable)."""

    def __init__(self, monkeypatch, found, same):
        self.added = []
        monkeypatch.setattr(keyring, "nvme_keyring", lambda where="": 0x100)
        monkeypatch.setattr(keyring, "_syscalls", lambda where: (self, 248, 250))
        monkeypatch.setattr(keyring, "_keyctl", lambda libc, nr, op, *a: (0, 0))
        monkeypatch.setattr(keyring, "_installed_key", lambda libc, nr, ring, ident: found)
        monkeypatch.setattr(keyring, "_same_payload", lambda libc, nr, serial, psk: same)

    def syscall(self, nr, *args):  # add_key
        self.added.append(args[1].value)
        return 0x777


def test_a_key_installed_for_the_identity_is_reused_or_refused(monkeypatch):
    keys = _Keys(monkeypatch, found=None, same=None)
    assert keyring.insert_tls_psk(KEY, HOST, SUB) == (0x777, True)
    assert keys.added == [f"NVMe0R01 {HOST} {SUB}".encode()]
    keys = _Keys(monkeypatch, found=0x555, same=True)
    assert keyring.insert_tls_psk(KEY, HOST, SUB) == (0x555, False) and keys.added == []
    for same, why in ((False, "holds another PSK"), (None, "cannot be read")):
        keys = _Keys(monkeypatch, found=0x555, same=same)
        with pytest.raises(errors.DeviceBusyError, match=why) as ei:
            keyring.insert_tls_psk(KEY, HOST, SUB, "URI")
        assert keys.added == [] and "serial 1365" in str(ei.value)
        assert KEY[16:40] not in str(ei.value)


def test_a_malformed_host_nqn_is_an_fx100io_error(monkeypatch):
    _Keys(monkeypatch, found=None, same=None)
    with pytest.raises(errors.InvalidArgumentError, match="cannot derive a TLS PSK"):
        keyring.insert_tls_psk(KEY, "nqn.a b", SUB)


@pytest.mark.parametrize("created", [True, False])
def test_a_failed_connect_invalidates_only_a_key_it_added(monkeypatch, created, tlshd):
    from fx100io.kernel import connections

    gone = []
    monkeypatch.setattr(keyring, "insert_tls_psk", lambda *a: (0x777, created))
    monkeypatch.setattr(keyring, "invalidate", gone.append)
    monkeypatch.setattr(connections, "_write_fabrics",
                        lambda t, serial: (None, "could not add new controller: Connection refused"))
    t = uri_args.target_of(f"nvme+tcp://127.0.0.1:4420/{SUB}?hostnqn={HOST}&tls_key={KEY}")
    assert connections._fabrics_connect(t, "")[0] is None
    assert gone == ([0x777] if created else [])
    monkeypatch.setattr(connections, "_write_fabrics", lambda t, serial: ("nvme7", ""))
    assert connections._fabrics_connect(t, "") == ("nvme7", "")
    assert gone == ([0x777] if created else [])


@pytest.mark.parametrize("sysfs_key,holding,reused", [
    ("00000777", 0x777, True),   # connected with the key that holds our PSK
    ("00000555", 0x777, False),  # with another key of the identity (replaced since)
    ("00000777", None, False),   # the identity's key holds another PSK, or none is there
    ("", 0x777, False),          # a controller without TLS, or a kernel that does not say
    ("0", 0x777, False),
])
def test_attach_reuses_a_tls_controller_only_with_our_key(monkeypatch, tmp_path, tlshd,
                                                          sysfs_key, holding, reused):
    """attach() shares a live controller only when its sysfs tls_key is the `.nvme` key
    holding the PSK of the tls_key asked for; what cannot be told is a mismatch."""
    from fx100io.kernel import connections, sysfs

    monkeypatch.setattr(sysfs, "SYSFS", tmp_path)
    d = tmp_path / "class" / "nvme" / "nvme4"
    d.mkdir(parents=True)
    if sysfs_key:
        (d / "tls_key").write_text(sysfs_key + "\n")
    asked = []

    def serial_holding(key, hostnqn, subnqn, where=""):
        asked.append((key, hostnqn, subnqn))
        return holding

    monkeypatch.setattr(keyring, "serial_holding", serial_holding)
    # (a controller connect() made and still owns has no record: sysfs shows its queues)
    monkeypatch.setattr(connections, "record_of", lambda c: None)
    monkeypatch.setattr(connections, "sysfs_options", lambda c: {"--nr-io-queues": "2"})
    t = uri_args.target_of(f"nvme+tcp://127.0.0.1:4420/{SUB}?hostnqn={HOST}&hostid={HID}"
                           f"&tls_key={KEY}&queues=2")
    c = sysfs.Controller("nvme4", SUB, "tcp", "traddr=127.0.0.1,trsvcid=4420", "live", HOST)
    why = connections._mismatch(c, t)
    assert (why is None) == reused, why
    if not reused:
        assert "not attached with this tls_key" in why and KEY[16:40] not in why
    assert asked in ([], [(KEY, HOST, SUB)])


@pytest.mark.parametrize("kmsg,kind", [
    ("nvme nvme3: queue 0: TLS handshake complete, error -13", errors.DevicePermissionError),
    ("nvme nvme3: queue 0: TLS handshake timeout", errors.FxTimeoutError),
    # another controller's line, no handshake failure of ours: not a permission error
    ("nvme nvme1: new ctrl: NQN \"nqn.x\", addr 10.0.0.9:4420, hostnqn: nqn.y (tls)",
     errors.DeviceIOError),
])
def test_only_a_failed_tls_handshake_reads_as_a_wrong_key(kmsg, kind, tlshd):
    from fx100io.kernel.diagnose import classify_connect_failure

    t = uri_args.target_of(f"nvme+tcp://127.0.0.1:4420/{SUB}?hostnqn={HOST}&tls_key={KEY}")
    said = "could not add new controller: Connection timed out" if "timeout" in kmsg else \
        "could not add new controller: Input/output error"
    e = classify_connect_failure(t, said, kmsg)
    assert type(e) is kind, e


def test_tlshd_counts_only_in_this_network_namespace(monkeypatch, tmp_path):
    """keyring.tlshd_running itself (taken at import: tests/kernel's autouse fixture pins
    the module's attribute), on a fake /proc: a tlshd in another network namespace does
    not count."""
    import os

    proc = tmp_path / "proc"
    for pid, comm, ns in (("self", "pytest", "net:[1]"), ("10", "sshd", "net:[1]"),
                          ("20", "tlshd", "net:[2]")):
        (proc / pid / "ns").mkdir(parents=True)
        (proc / pid / "comm").write_text(comm + "\n")
        os.symlink(ns, proc / pid / "ns" / "net")
    monkeypatch.setattr(keyring, "PROC", proc)
    assert not _TLSHD_RUNNING()  # another namespace's tlshd
    os.unlink(proc / "20" / "ns" / "net")
    os.symlink("net:[1]", proc / "20" / "ns" / "net")
    assert _TLSHD_RUNNING()

"""DH-HMAC-CHAP on the initiator (csrc/host/auth_host.c) against a
controller computed by the pure-Python reference (tests/support/auth_target.py):
every hash and DH group, bidirectional, admin and I/O queues and their
reconnects, the errors a user sees (wrong secret, missing secret, secure
channel asked), hostile controller messages, and that secrets never show in
a URI, repr or error.  The same exchanges against the Linux target are in
tests/fabric/test_dhchap_lab.py."""

from __future__ import annotations

import os
import time
from urllib.parse import quote

import numpy as np
import pytest
from support import dhchap_reference as R
from support.auth_target import ASCR, ATR, HOSTILE, AuthTarget
from support.evil_target import EvilTarget

import fx100io
from fx100io import errors, fabric_uri

OPTS = "io_timeout_ms=5000&connect_timeout_ms=5000&kato_ms=0"


def secret(n: int = 32, hh: int = 0) -> str:
    return R.format_secret(os.urandom(n), hh)


def uri(t: AuthTarget, host: str | None, ctrl: str | None = None, extra: str = "") -> str:
    u = f"{t.uri}?{OPTS}{extra}"
    if host:
        u += "&dhchap_secret=" + quote(host, safe=":")
    if ctrl:
        u += "&dhchap_ctrl_secret=" + quote(ctrl, safe=":")
    return u


def roundtrip(dev: fx100io.Device) -> None:
    data = np.random.default_rng(1).integers(0, 256, 8192, dtype=np.uint8)
    assert dev.write_from_blocking(4096, data) == 8192
    back = np.zeros(8192, np.uint8)
    assert dev.read_into_blocking(4096, back) == 8192
    assert (back == data).all()


# Every hash with the small groups; the big groups (slow DH) once, with SHA-512.
@pytest.mark.parametrize("hash_id, dhgid", [(h, g) for h in (1, 2, 3) for g in range(6)
                                            if g < 4 or h == 3])
def test_hashes_and_groups(hash_id, dhgid):
    key = secret(R.HASH_LEN[hash_id], hash_id)  # nvme-cli's pairing of HH and length
    t = AuthTarget(key, hash_id=hash_id, dhgid=dhgid)
    try:
        with fx100io.open_device(uri(t, key)) as dev:
            roundtrip(dev)
        assert t.authenticated(0) == 1
        assert t.authenticated() >= 2, t.events  # the I/O queue too
        # what the host offered: Linux's lists
        assert t.offers[0] == ([1, 2, 3], [0, 1, 2, 3, 4, 5])
    finally:
        t.close()


@pytest.mark.parametrize("n,hh", [(32, 0), (48, 0), (64, 0), (48, 1), (32, 3), (64, 2)])
def test_key_lengths_and_transforms(n, hh):
    key = secret(n, hh)
    t = AuthTarget(key, hash_id=2, dhgid=1)
    try:
        with fx100io.open_device(uri(t, key)) as dev:
            roundtrip(dev)
        assert t.authenticated(0) == 1
    finally:
        t.close()


@pytest.mark.parametrize("dhgid,ioccsz", [(0, None), (3, None), (1, 4)],
                         ids=["null", "ffdhe4096", "ffdhe2048-no-incapsule"])
def test_bidirectional(dhgid, ioccsz):
    """ioccsz 4: a controller that takes no data in I/O capsules gets every
    AUTH_Send of the I/O queue through R2T."""
    key, ckey = secret(48, 2), secret(32, 1)
    t = AuthTarget(key, ckey, hash_id=2, dhgid=dhgid, **({"ioccsz": ioccsz} if ioccsz else {}))
    try:
        with fx100io.open_device(uri(t, key, ckey)) as dev:
            roundtrip(dev)
        assert (0, "success2") in t.events
        assert t.authenticated(0) == 1 and t.authenticated() >= 2
        assert t.r2t_writes >= (3 if ioccsz else 0)  # negotiate, reply, success2
    finally:
        t.close()


@pytest.mark.parametrize("delivery", ["short", "short-success"])
@pytest.mark.parametrize("bidi", [False, True], ids=["unidirectional", "bidirectional"])
def test_authentication_receive_that_ends_at_its_message(delivery, bidi):
    """SPDK's target sends only its message for our 4096-byte Authentication
    Receive, then success (a CapsuleResp, or C2HData SUCCESS): the admin and
    I/O queues authenticate (nvme_tcp/xfer.c allows that one command to end
    early; without it this fails as 'success before all read data arrived')."""
    key, ckey = secret(), (secret() if bidi else None)
    t = AuthTarget(key, ckey, hash_id=1, dhgid=1, delivery=delivery)
    try:
        with fx100io.open_device(uri(t, key, ckey)) as dev:
            roundtrip(dev)
        assert t.authenticated(0) == 1 and t.authenticated() >= 2
        assert ((0, "success2") in t.events) == bidi
        assert not any(e.startswith("failure2") for _q, e in t.events), t.events
    finally:
        t.close()


def test_success1_cut_short_is_a_truncated_message_not_a_wrong_secret():
    """Success1 whose header promises R2 (HL 32) but whose data ends 12 bytes
    early: the host says the message was truncated, and sends Failure2."""
    key, ckey = secret(), secret()
    t = AuthTarget(key, ckey, hash_id=1, scenario="success1-truncated", delivery="short")
    try:
        with pytest.raises(errors.FxProtocolError) as ei:
            fx100io.open_device(uri(t, key, ckey))
        assert "truncated message from the target: success1: response runs past the message " \
            "(only 36 bytes arrived)" in str(ei.value), str(ei.value)
        assert "dhchap_secret" not in str(ei.value)
        for _ in range(100):
            if any(e.startswith("failure2") for _q, e in t.events):
                break
            time.sleep(0.01)
        assert any(e.startswith("failure2") for _q, e in t.events), t.events
    finally:
        t.close()


def test_wrong_secret_is_permission_error_with_reason():
    t = AuthTarget(secret(), hash_id=1, dhgid=1)
    try:
        wrong = secret()
        with pytest.raises(errors.DevicePermissionError) as ei:
            fx100io.open_device(uri(t, wrong))
        msg = str(ei.value)
        assert "AUTH_Failure1 with reason 0x01 (authentication failed)" in msg, msg
        assert "wrong dhchap_secret" in msg
        assert wrong[10:-1] not in msg and wrong[10:-1] not in repr(ei.value)
        assert (0, "bad r1") in t.events
        assert t.authenticated() == 0
    finally:
        t.close()


def test_connection_closed_instead_of_failure1_is_a_permission_error():
    t = AuthTarget(secret(), hash_id=1, scenario="close-instead-of-failure1")
    try:
        with pytest.raises(errors.DevicePermissionError) as ei:
            fx100io.open_device(uri(t, secret()))
        assert "closed the connection instead of answering our DH-HMAC-CHAP reply" in \
            str(ei.value)
        assert (0, "closed instead of failure1") in t.events
    finally:
        t.close()


def test_wrong_controller_secret_fails_and_sends_failure2():
    key = secret()
    t = AuthTarget(key, secret(), hash_id=1)
    try:
        with pytest.raises(errors.DevicePermissionError) as ei:
            fx100io.open_device(uri(t, key, secret()))
        assert "does not match dhchap_ctrl_secret" in str(ei.value)
        assert "reason 0x01" in str(ei.value)
        for _ in range(100):  # Failure2 is sent before the error is raised
            if (0, "failure2 reason 0x01") in t.events:
                break
            time.sleep(0.01)
        assert (0, "failure2 reason 0x01") in t.events, t.events
        assert t.authenticated() == 0
    finally:
        t.close()


@pytest.mark.parametrize("scenario", ["bad-r2", "no-r2"])
def test_controller_that_cannot_prove_itself(scenario):
    key, ckey = secret(), secret()
    t = AuthTarget(key, ckey, hash_id=3, dhgid=1, scenario=scenario)
    try:
        with pytest.raises(errors.DevicePermissionError) as ei:
            fx100io.open_device(uri(t, key, ckey))
        assert "bidirectional authentication failed" in str(ei.value)
    finally:
        t.close()


def test_unidirectional_ignores_unasked_r2():
    """A controller key on the target but none given: the host does not ask
    the controller to prove itself, and that is fine."""
    key = secret()
    t = AuthTarget(key, secret(), hash_id=1)
    try:
        with fx100io.open_device(uri(t, key)) as dev:
            roundtrip(dev)
        assert (0, "success2") not in t.events and t.authenticated(0) == 1
    finally:
        t.close()


def test_missing_secret_is_a_clear_permission_error():
    t = AuthTarget(secret())
    try:
        with pytest.raises(errors.DevicePermissionError) as ei:
            fx100io.open_device(uri(t, None))
        assert "requires DH-HMAC-CHAP authentication; give dhchap_secret=" in str(ei.value)
        assert t.offers == []  # nothing was sent
    finally:
        t.close()


def test_secure_channel_is_refused_clearly():
    key = secret()
    t = AuthTarget(key, ascr=True)
    try:
        with pytest.raises(errors.Fx100ioError) as ei:
            fx100io.open_device(uri(t, key))
        assert ei.value.errno == 93  # EPROTONOSUPPORT
        assert "secure channel concatenation" in str(ei.value)
    finally:
        t.close()


def test_controller_without_the_hosts_key():
    """The controller asks, the host answers, the controller has no key for
    it: Failure1, a permission error."""
    t = AuthTarget(None)
    try:
        with pytest.raises(errors.DevicePermissionError):
            fx100io.open_device(uri(t, secret()))
    finally:
        t.close()


def test_hash_the_host_did_not_offer_is_refused_by_controller():
    key = secret()
    t = AuthTarget(key, hash_id=4)  # a hash id nobody offers: the controller gives up
    try:
        with pytest.raises(errors.DevicePermissionError) as ei:
            fx100io.open_device(uri(t, key))
        assert "reason 0x04 (hash function not usable)" in str(ei.value)
    finally:
        t.close()


@pytest.mark.parametrize("scenario", sorted(HOSTILE))
def test_hostile_controller_messages(scenario):
    key = secret(64, 3)
    dhgid = 1 if scenario.startswith("challenge-dh-") or scenario == "challenge-dhvlen-too-long" \
        else 0
    t = AuthTarget(key, hash_id=3, dhgid=dhgid, scenario=scenario)
    try:
        t0 = time.time()
        with pytest.raises(errors.Fx100ioError) as ei:
            fx100io.open_device(uri(t, key))
        assert time.time() - t0 < 5
        assert HOSTILE[scenario] in str(ei.value), str(ei.value)
        want = errors.DeviceIOError if scenario == "negotiate-nvme-error" else \
            errors.FxProtocolError
        assert isinstance(ei.value, want), repr(ei.value)
        if not scenario.startswith("success1"):  # there the controller was satisfied
            assert t.authenticated() == 0
        if scenario != "negotiate-nvme-error":
            for _ in range(100):
                if any(e.startswith("failure2") for _q, e in t.events):
                    break
                time.sleep(0.01)
            assert any(e.startswith("failure2") for _q, e in t.events), t.events
    finally:
        t.close()


def test_io_queue_reconnect_authenticates_again():
    key, ckey = secret(), secret()
    t = AuthTarget(key, ckey, hash_id=1, dhgid=1)
    try:
        with fx100io.open_device(uri(t, key, ckey, "&reconnect_ms=50&max_reconnects=20")) as dev:
            roundtrip(dev)
            before = t.authenticated()
            t.drop_io()
            buf = np.zeros(4096, np.uint8)
            for _ in range(50):  # the read in flight may fail; a later one reconnects
                try:
                    dev.read_into_blocking(0, buf)
                    break
                except (errors.FxConnectionError, errors.FxProtocolError,
                        errors.FxTimeoutError):
                    time.sleep(0.05)
            roundtrip(dev)
            assert t.authenticated() > before, t.events
            assert dev.queue_stats()["reconnects"] >= 1
    finally:
        t.close()


# --------------------------------------------------------- URIs and secrets

GOOD = R.format_secret(bytes(range(32)), 1)


def test_secrets_never_show():
    t = AuthTarget(GOOD, R.format_secret(bytes(range(48)), 2))
    try:
        u = uri(t, GOOD, R.format_secret(bytes(range(48)), 2))
        b64 = (GOOD[10:-1], R.format_secret(bytes(range(48)), 2)[10:-1])
        with fx100io.open_device(u) as dev:
            shown = [repr(dev), dev.uri, dev.target, dev._dev.target, str(dev.__dict__)]
        with pytest.raises(errors.Fx100ioError) as ei:
            fx100io.open_device(u.replace("kato_ms=0", "kato_ms=0&bogus=1"))
        shown += [str(ei.value), repr(ei.value), fabric_uri.redact(u)]
        for s in shown:
            for b in b64:
                assert b not in s and quote(b, safe="") not in s, s
        assert "dhchap_secret=***" in repr(dev)
    finally:
        t.close()


@pytest.mark.parametrize("bad,why", [
    ("DHHC-1:00:AAAA:", "32, 48 or 64"),
    (GOOD.replace("DHHC-1", "DHHC-2"), "starts with"),
    (GOOD[:12] + ("B" if GOOD[12] != "B" else "C") + GOOD[13:], "CRC"),
    (GOOD.replace(":01:", ":07:"), "hash field"),
    (GOOD[:-5] + "*" + GOOD[-4:], "base64"),
    ("", "DHHC-1"),
])
@pytest.mark.parametrize("key", ["dhchap_secret", "dhchap_ctrl_secret"])
def test_bad_secret_is_value_error_naming_the_key(bad, why, key):
    base = "nvme+tcp://127.0.0.1:1/nqn.x?"
    extra = f"dhchap_secret={quote(GOOD, safe=':')}&" if key == "dhchap_ctrl_secret" else ""
    u = f"{base}{extra}{key}={quote(bad, safe=':')}"
    for call in (fabric_uri.to_transport_target, fx100io.open_device):
        with pytest.raises(ValueError) as ei:
            call(u)
        msg = str(ei.value)
        assert f"URI option {key}" in msg and why in msg, msg
        if len(bad) > 14:
            assert bad[10:-3] not in msg and bad[10:-3] not in repr(ei.value)


def test_plus_in_a_secret_survives_the_uri():
    key = next(k for k in (R.format_secret(os.urandom(32)) for _ in range(1000)) if "+" in k)
    opts = fabric_uri.to_transport("nvme+tcp://h/nqn.x?dhchap_secret=" + key)
    assert opts[1] == "dhchap_secret=" + key
    assert "dhchap" not in opts[0]


def test_ctrl_secret_alone_is_refused():
    with pytest.raises(errors.InvalidArgumentError, match="needs dhchap_secret too"):
        fabric_uri.to_transport_target(f"nvme+rdma://h/nqn.x?dhchap_ctrl_secret={GOOD}")


def test_rdma_uri_takes_secrets():
    target, secrets = fabric_uri.to_transport(f"nvme+rdma://h/nqn.x?dhchap_secret={GOOD}")
    assert secrets == f"dhchap_secret={GOOD}" and "dhchap" not in target


def test_redact():
    r = fabric_uri.redact
    assert r("nvme+tcp://h/n?a=1&dhchap_secret=DHHC-1:00:xx:&b=2") == \
        "nvme+tcp://h/n?a=1&dhchap_secret=***&b=2"
    assert r("nvme+tcp://h/n?dhchap%5Fctrl%5Fsecret=x") == "nvme+tcp://h/n?dhchap%5Fctrl%5Fsecret=***"
    assert r("nvme+tcp://h/n?dhcap_secret=DHHC-1:00:xx:") == "nvme+tcp://h/n?dhcap_secret=***"
    assert r("nvme+tcp://h/n") == "nvme+tcp://h/n"
    assert r("/dev/nvme0n1") == "/dev/nvme0n1"


def test_discover_takes_secrets(tmp_path):
    """A discovery controller that does not ask: the secrets are simply not
    used; one that asks and refuses: the reason, as for a device."""
    from support.target_process import serve

    img = tmp_path / "ns.img"
    img.write_bytes(bytes(1 << 20))
    nqn = "nqn.2014-08.io.fx100:auth-discover"
    ctrl = R.format_secret(bytes(range(48)), 2)
    with serve([str(img)], nqn) as (host, port, _p):
        entries = fx100io.discover(f"nvme+tcp://{host}:{port}?dhchap_secret={GOOD}"
                                   f"&dhchap_ctrl_secret={ctrl}")
    assert nqn in {e["subnqn"] for e in entries}
    t = AuthTarget(secret())
    try:
        wrong = secret()
        with pytest.raises(errors.DevicePermissionError) as ei:
            fx100io.discover(f"nvme+tcp://127.0.0.1:{t.port}?dhchap_secret={wrong}")
        assert "reason 0x01" in str(ei.value) and wrong[10:-1] not in str(ei.value)
        assert "dhchap_secret=***" in str(ei.value)
        with pytest.raises(errors.DevicePermissionError, match="give dhchap_secret="):
            fx100io.discover(f"nvme+tcp://127.0.0.1:{t.port}")
    finally:
        t.close()
    with pytest.raises(errors.InvalidArgumentError, match="URI option dhchap_secret"):
        fx100io.discover("nvme+tcp://127.0.0.1:1?dhchap_secret=DHHC-1:00:xx:")


def test_lmcache_config_keeps_and_hides_secrets():
    from fx100io.contrib._lmcache_config import parse_options

    key = next(k for k in (R.format_secret(os.urandom(48), 2) for _ in range(1000))
               if "+" in k and "/" in k)
    pre = "storage_plugin.fx100io."
    o = parse_options(["fx100io"], {
        pre + "module_path": "fx100io.contrib.lmcache", pre + "class_name": "FX100ioBackend",
        pre + "devices": f"nvme+tcp://10.0.0.2:4420/nqn.x?dhchap_secret={key}",
        pre + "host_nqn": "nqn.2014-08.io.fx100:h"}, "FX100ioBackend")
    # the host NQN is added, and the secret reaches C as it was written
    assert fabric_uri.to_transport(o.devices[0])[1] == f"dhchap_secret={key}"
    assert key[10:-1] not in o.describe() and "dhchap_secret=***" in o.describe()


def test_bench_errors_hide_secrets():
    import subprocess
    import sys

    from support import REPO

    u = f"nvme+tcp://127.0.0.1:1/nqn.x?dhchap_secret={GOOD}&connect_timeout_ms=500"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "fx100io", "bench", "--name=j", f"--filename={u}",
                        "--rw=read", "--bs=4k", "--size=1M", "--output-format=json"],
                       capture_output=True, text=True, timeout=120, env=env)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "dhchap_secret=***" in out, out
    assert GOOD[10:-1] not in out


def test_no_stale_authentication_reason():
    """A connect that fails before its Connect (here: a silent port, a
    timeout) does not borrow the reason of an earlier failed authentication
    on the same thread."""
    import socket

    t = AuthTarget(secret())
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    try:
        with pytest.raises(errors.DevicePermissionError, match="AUTH_Failure1"):
            fx100io.open_device(uri(t, secret()))
        with pytest.raises(errors.FxTimeoutError) as ei:
            fx100io.open_device(f"nvme+tcp://127.0.0.1:{silent.getsockname()[1]}/nqn.x"
                                "?connect_timeout_ms=300&dhchap_secret=" + GOOD)
        assert "AUTH" not in str(ei.value) and "authentication" not in str(ei.value)
    finally:
        silent.close()
        t.close()


class _NoAuthOnIo(AuthTarget):
    """Authenticates the admin queue, then lets I/O queues in without."""

    def _connect_dw0(self, qid: int, data: bytes) -> int:
        dw0 = super()._connect_dw0(qid, data)
        if qid:
            self._tls.auth["ok"] = True
            dw0 &= ~(ATR | ASCR)
        return dw0


def test_controller_secret_refuses_a_controller_that_asks_for_nothing():
    """dhchap_ctrl_secret means the controller must prove itself: one whose
    Connect response asks for no authentication (admin queue, or an I/O
    queue) never does, and must not be accepted."""
    t = EvilTarget("good")
    try:
        with pytest.raises(errors.DevicePermissionError) as ei:
            fx100io.open_device(uri(t, secret(), secret()))  # type: ignore[arg-type]
        assert "did not authenticate itself" in str(ei.value)
    finally:
        t.close()
    key, ckey = secret(), secret()
    t2 = _NoAuthOnIo(key, ckey, hash_id=1, dhgid=0)
    try:
        with pytest.raises(errors.DevicePermissionError) as ei:
            with fx100io.open_device(uri(t2, key, ckey)) as dev:
                roundtrip(dev)
        assert ei.value.errno == 13
        assert t2.authenticated(0) >= 1 and t2.authenticated() == t2.authenticated(0)
    finally:
        t2.close()
    # without a controller secret, a controller asking for nothing is fine
    t3 = EvilTarget("good")
    try:
        with fx100io.open_device(uri(t3, secret())) as dev:  # type: ignore[arg-type]
            roundtrip(dev)
    finally:
        t3.close()


class _SlowAuth(AuthTarget):
    """Answers each AUTH_Send/AUTH_Receive after `delay` seconds."""

    delay = 0.45

    def _auth_command(self, c, cid, fctype, sqe, incap):  # type: ignore[no-untyped-def]
        time.sleep(self.delay)
        return super()._auth_command(c, cid, fctype, sqe, incap)


def test_authentication_is_bounded_by_connect_timeout():
    """Each AUTH command within connect_timeout_ms is not enough: the whole
    transaction (4 commands here, 1.8 s) must end within it."""
    key = secret()
    t = _SlowAuth(key, hash_id=1, dhgid=0)
    try:
        u = f"{t.uri}?io_timeout_ms=5000&connect_timeout_ms=1000&kato_ms=0&dhchap_secret=" + \
            quote(key, safe=":")
        t0 = time.monotonic()
        with pytest.raises(errors.Fx100ioError) as ei:
            fx100io.open_device(u)
        took = time.monotonic() - t0
        assert took < 1.6, took
        assert isinstance(ei.value, errors.FxTimeoutError), ei.value
        assert "did not complete within the connect's time" in str(ei.value)
    finally:
        t.close()
    t = _SlowAuth(key, hash_id=1, dhgid=0)
    t.delay = 0.05
    try:
        with fx100io.open_device(uri(t, key)) as dev:
            roundtrip(dev)
    finally:
        t.close()

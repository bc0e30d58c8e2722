"""DH-HMAC-CHAP: our NVMe/TCP initiator authenticating to the real Linux target
(nvmet, bookworm-backports 6.12 with CONFIG_NVME_TARGET_AUTH) in the fabric lab's lab-auth
subsystem: every hash with a few DH groups, bidirectional, a wrong host or controller secret
(DevicePermissionError with the reason), a missing secret, digests and authentication
together, and discovery with a secret.  The NVMe/RDMA case runs in the guest
(tests/guest/test_dhchap_rdma.py).

The lab's host entries (tools/fabric_lab/fabric_lab/lab_config.py) hold one-way and
bidirectional test secrets; nvmet picks the hash and DH group written in
hosts/<nqn>/dhchap_hash and dhchap_dhgroup, which these tests set in the guest's configfs
and put back afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from urllib.parse import quote

import numpy as np
import pytest

import fx100io
from fx100io import errors

pytest_plugins = ["support.lab_fixture"]
pytestmark = pytest.mark.lab

AUTH = "lab-auth"
HASHES = ("hmac(sha256)", "hmac(sha384)", "hmac(sha512)")
GROUPS = ("null", "ffdhe2048", "ffdhe4096")


def hosts(lab) -> tuple[tuple[str, object], tuple[str, object]]:
    """(one-way host NQN, its HostKey), (bidirectional host NQN, its HostKey)."""
    keys = lab.subsystem(AUTH).host_keys
    one = next((h, k) for h, k in keys.items() if not k.ctrl_key)
    bidir = next((h, k) for h, k in keys.items() if k.ctrl_key)
    return one, bidir


def auth_uri(lab, hostnqn: str, secret: str | None, ctrl: str | None = None, **q) -> str:
    q.setdefault("kato_ms", 0)
    q["hostnqn"] = hostnqn
    if secret:
        q["dhchap_secret"] = quote(secret, safe=":")
    if ctrl:
        q["dhchap_ctrl_secret"] = quote(ctrl, safe=":")
    query = "&".join(f"{k}={v}" for k, v in q.items())
    return f"nvme+tcp://{lab.host}:{lab.port}/{lab.subsystem(AUTH).nqn}?{query}"


@contextlib.contextmanager
def nvmet_picks(lab, hostnqn: str, hash_: str, dhgroup: str) -> Iterator[None]:
    """Make nvmet pick hash_ and dhgroup for hostnqn (configfs, in the guest)."""
    d = f"/sys/kernel/config/nvmet/hosts/{hostnqn}"

    def write(h: str, g: str) -> None:
        status, out = lab.guest(f"echo -n '{h}' > {d}/dhchap_hash && "
                                f"echo -n '{g}' > {d}/dhchap_dhgroup && "
                                f"cat {d}/dhchap_hash {d}/dhchap_dhgroup")
        assert status == 0 and h in out and g in out, out

    write(hash_, dhgroup)
    try:
        yield
    finally:
        write("hmac(sha256)", "null")


def roundtrip(dev: fx100io.Device, seed: int) -> None:
    bs = dev.block_size
    data = np.random.default_rng(seed).integers(0, 256, 16 * bs, dtype=np.uint8)
    off = (seed % 64) * bs
    assert dev.write_from_blocking(off, data) == data.nbytes
    back = np.zeros_like(data)
    assert dev.read_into_blocking(off, back) == data.nbytes
    assert np.array_equal(back, data)


@pytest.mark.parametrize("dhgroup", GROUPS)
@pytest.mark.parametrize("hash_", HASHES)
def test_every_hash_with_a_few_dh_groups(fabric_lab, hash_, dhgroup):
    (host, key), _ = hosts(fabric_lab)
    with nvmet_picks(fabric_lab, host, hash_, dhgroup):
        with fx100io.open_device(auth_uri(fabric_lab, host, key.key, queues=2)) as dev:
            roundtrip(dev, HASHES.index(hash_) * 3 + GROUPS.index(dhgroup))


@pytest.mark.parametrize("dhgroup", ["null", "ffdhe3072"])
def test_bidirectional(fabric_lab, dhgroup):
    _, (host, key) = hosts(fabric_lab)
    with nvmet_picks(fabric_lab, host, "hmac(sha384)", dhgroup):
        with fx100io.open_device(auth_uri(fabric_lab, host, key.key, key.ctrl_key)) as dev:
            roundtrip(dev, 40)


def test_without_the_secret_the_subsystem_is_refused_clearly(fabric_lab):
    (host, _key), _ = hosts(fabric_lab)
    with pytest.raises(errors.DevicePermissionError) as ei:
        fx100io.open_device(auth_uri(fabric_lab, host, None))
    assert "requires DH-HMAC-CHAP authentication; give dhchap_secret=" in str(ei.value)


def test_wrong_secret_is_a_permission_error_with_the_reason(fabric_lab):
    (host, key), (_b, bkey) = hosts(fabric_lab)
    assert bkey.key != key.key  # same key bytes, another transform: a wrong secret here
    with pytest.raises(errors.DevicePermissionError) as ei:
        fx100io.open_device(auth_uri(fabric_lab, host, bkey.key))
    msg = str(ei.value)
    assert "AUTH_Failure1 with reason 0x01 (authentication failed)" in msg, msg
    assert bkey.key[10:-1] not in msg and bkey.key[10:-1] not in repr(ei.value)
    # and the right one still works (nothing was left half-attached)
    with fx100io.open_device(auth_uri(fabric_lab, host, key.key)) as dev:
        roundtrip(dev, 41)


def test_wrong_controller_secret_fails_bidirectional_authentication(fabric_lab):
    (_h, one), (host, key) = hosts(fabric_lab)
    wrong_ctrl = one.key  # a well-formed secret that is not the controller's
    with pytest.raises(errors.DevicePermissionError) as ei:
        fx100io.open_device(auth_uri(fabric_lab, host, key.key, wrong_ctrl))
    assert "does not match dhchap_ctrl_secret" in str(ei.value)


def test_digests_and_authentication_together(fabric_lab):
    (host, key), _ = hosts(fabric_lab)
    with nvmet_picks(fabric_lab, host, "hmac(sha512)", "ffdhe2048"):
        with fx100io.open_device(auth_uri(fabric_lab, host, key.key, hdgst=1, ddgst=1,
                                          queues=2)) as dev:
            roundtrip(dev, 42)


def test_discovery_with_a_secret(fabric_lab):
    (host, key), _ = hosts(fabric_lab)
    entries = fx100io.discover(f"nvme+tcp://{fabric_lab.host}:{fabric_lab.port}"
                               f"?hostnqn={host}&dhchap_secret={quote(key.key, safe=':')}")
    assert fabric_lab.subsystem(AUTH).nqn in {e["subnqn"] for e in entries}

"""DH-HMAC-CHAP over NVMe/RDMA: our initiator authenticating to the Linux target's lab-auth
subsystem on its NVMe/RDMA port (soft-RoCE in the guest; the bodies run there).  The TCP
cases, every hash and DH group among them, are tests/fabric/test_dhchap_lab.py."""

from __future__ import annotations

import time
from urllib.parse import quote

import numpy as np
import pytest
from rdma_uris import rdma_uri

import fx100io
from fx100io import errors

pytest_plugins = ["support.lab_fixture", "guest_rdma"]
pytestmark = [pytest.mark.lab, pytest.mark.guest]


def _hosts(lab):
    keys = lab.subsystem("lab-auth").host_keys
    one = next((h, k) for h, k in keys.items() if not k.ctrl_key)
    bidir = next((h, k) for h, k in keys.items() if k.ctrl_key)
    return one, bidir


def test_rdma_one_way_and_bidirectional(rdma_lab):
    (host, key), (bhost, bkey) = _hosts(rdma_lab)
    for uri in (rdma_uri(rdma_lab, "lab-auth", hostnqn=host, kato_ms=0, queues=2,
                         dhchap_secret=quote(key.key, safe=":")),
                rdma_uri(rdma_lab, "lab-auth", hostnqn=bhost, kato_ms=0,
                         dhchap_secret=quote(bkey.key, safe=":"),
                         dhchap_ctrl_secret=quote(bkey.ctrl_key, safe=":"))):
        with fx100io.open_device(uri) as dev:
            bs = dev.block_size
            data = np.random.default_rng(7).integers(0, 256, 64 * bs, dtype=np.uint8)
            assert dev.write_from_blocking(3 * bs, data) == data.nbytes
            back = np.zeros_like(data)
            assert dev.read_into_blocking(3 * bs, back) == data.nbytes
            assert np.array_equal(back, data)


def test_rdma_wrong_and_missing_secret(rdma_lab):
    (host, _key), (_b, bkey) = _hosts(rdma_lab)
    with pytest.raises(errors.DevicePermissionError) as ei:
        fx100io.open_device(rdma_uri(rdma_lab, "lab-auth", hostnqn=host, kato_ms=0,
                                     dhchap_secret=quote(bkey.key, safe=":")))
    # Linux's target fails the controller as it sends Failure1: on NVMe/RDMA the teardown can
    # overtake the message, and then the host says the controller hung up on its reply
    msg = str(ei.value)
    assert "authentication failed" in msg and ("reason 0x01" in msg or "closed the connection" in msg)
    with pytest.raises(errors.DevicePermissionError) as ei:
        fx100io.open_device(rdma_uri(rdma_lab, "lab-auth", hostnqn=host, kato_ms=0))
    assert "give dhchap_secret=" in str(ei.value)


def test_rdma_wrong_controller_secret_fails_promptly(rdma_lab):
    """A controller key that does not match: we send AUTH_Failure2 and fail the connect, and
    do not wait out the connect budget if the target drops the queue instead of answering
    (Linux's kernel host hangs for minutes here: tests/guest/test_kernel_path.py)."""
    (_h, one), (bhost, bkey) = _hosts(rdma_lab)
    t0 = time.monotonic()
    with pytest.raises(errors.DevicePermissionError) as ei:
        fx100io.open_device(rdma_uri(rdma_lab, "lab-auth", hostnqn=bhost, kato_ms=0,
                                     dhchap_secret=quote(bkey.key, safe=":"),
                                     dhchap_ctrl_secret=quote(one.key, safe=":")))
    assert "does not match dhchap_ctrl_secret" in str(ei.value)
    assert time.monotonic() - t0 < 10
    assert one.key[10:-1] not in str(ei.value) and bkey.key[10:-1] not in str(ei.value)

"""The fabric lab's config: DH-HMAC-CHAP host keys are validated before the guest boots and
become the configfs writes the guest's /init runs (no lab needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "fabric_lab"))

from fabric_lab import lab_config  # noqa: E402
from fabric_lab.lab_config import HostKey, LabConfig, LabConfigError  # noqa: E402

HOST = "nqn.2026-11.io.fx100:test-host"
KEY = lab_config.AUTH_HOST_KEY


def _config(**host_key) -> dict:
    return {"subsystems": [{
        "nqn": "nqn.2026-11.io.fx100:sub", "allow_any_host": False, "allowed_hosts": [HOST],
        "host_keys": {HOST: {"key": KEY, **host_key}},
        "namespaces": [{"backend": "null_blk", "size_mib": 16, "block_size": 4096}]}]}


def test_default_lab_has_an_auth_subsystem_with_a_one_way_and_a_bidirectional_host():
    config = LabConfig.default()
    config.validate()
    keys = config.host_keys()
    assert keys[lab_config.AUTH_HOST_NQN] == HostKey(key=lab_config.AUTH_HOST_KEY)
    assert keys[lab_config.AUTH_BIDIR_HOST_NQN].ctrl_key == lab_config.AUTH_BIDIR_CTRL_KEY
    # the host the plain tests use is not one that must authenticate
    assert config.allowed_host_nqn() == lab_config.DEFAULT_HOST_NQN
    script = config.guest_setup_script()
    assert (f"lab_host_key {lab_config.AUTH_HOST_NQN} 'hmac(sha256)' null "
            f"{lab_config.AUTH_HOST_KEY} ''") in script
    # keys are written after the host entry exists and before a subsystem links it
    assert script.index(f"lab_host {lab_config.AUTH_HOST_NQN}") < \
        script.index(f"lab_host_key {lab_config.AUTH_HOST_NQN}") < \
        script.index("lab_allow_host nqn.2026-11.io.fx100:lab-auth ")


def test_host_keys_round_trip_through_json():
    config = LabConfig.from_dict(_config(hash="hmac(sha512)", dhgroup="ffdhe4096"))
    again = LabConfig.from_dict(config.to_dict())
    assert again.host_keys() == {HOST: HostKey(key=KEY, hash="hmac(sha512)", dhgroup="ffdhe4096")}
    assert "lab_host_key nqn.2026-11.io.fx100:test-host 'hmac(sha512)' ffdhe4096" in \
        again.guest_setup_script()


@pytest.mark.parametrize("change, message", [
    ({"key": "not-a-secret"}, "is not a DHHC-1"),
    ({"ctrl_key": "DHHC-1:07:abc=:"}, "ctrl_key of"),
    ({"hash": "sha256"}, "hash 'sha256'"),
    ({"dhgroup": "modp2048"}, "dhgroup 'modp2048'"),
])
def test_bad_host_keys_are_refused_with_the_field_named(change, message):
    with pytest.raises(LabConfigError, match=message):
        LabConfig.from_dict(_config(**change))


def test_a_key_for_a_host_the_subsystem_does_not_admit_is_refused():
    data = _config()
    data["subsystems"][0]["host_keys"] = {"nqn.2026-11.io.fx100:other": {"key": KEY}}
    with pytest.raises(LabConfigError, match="not in allowed_hosts"):
        LabConfig.from_dict(data)


def test_one_host_with_two_different_keys_is_refused():
    data = _config()
    second = dict(data["subsystems"][0], nqn="nqn.2026-11.io.fx100:sub2",
                  host_keys={HOST: {"key": lab_config.AUTH_BIDIR_HOST_KEY}})
    data["subsystems"].append(second)
    with pytest.raises(LabConfigError, match="one key per host NQN"):
        LabConfig.from_dict(data)

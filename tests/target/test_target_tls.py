"""Our target's secure channel (TLS 1.3 with a PSK) against our initiator's
control path (tests/c/test_fabric: Connect, Identify, properties, keep alive, an
I/O queue's reads and writes through fx_tcp_exec), both over real sockets on
loopback: the same key, another key, no key, a host that does not start TLS,
a target without TLS, and TLS optional."""

from __future__ import annotations

import subprocess
import time

import pytest
from support.c_tests import build_c
from support.target_process import serve, sparse_image
from support.tls_keys import KEY, KEY48, OTHER

NQN = "nqn.2026-12.io.fx100:tls"
HOST = "nqn.2014-08.org.nvmexpress:uuid:f0100000-0000-4000-8000-00000000f100"


def _build(sanitize: bool) -> str:
    return build_c("test_fabric", sanitize)


def _run(binary: str, *args: str) -> str:
    p = subprocess.run([binary, "-q", HOST, *args], capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    return out


def _image(tmp_path):
    return sparse_image(tmp_path, 64 << 20)


def _log_has(log, text: str, timeout: float = 5.0) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = log.read_text() if log.exists() else ""
        if text in got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"target log lacks {text!r}: {got[-2000:]}")


@pytest.mark.parametrize("sanitize", [False, True], ids=["plain", "asan-ubsan"])
@pytest.mark.parametrize("key, digests", [(KEY, False), (KEY, True), (KEY48, False)],
                         ids=["sha256", "sha256-digests", "sha384"])
def test_reads_and_writes_over_tls(tmp_path, sanitize, key, digests):
    binary = _build(sanitize)
    kf = tmp_path / "host.key"
    kf.write_text(key + "\n")
    with serve([_image(tmp_path)], NQN, "--tls", "required",
               "--tls-key", f"{HOST}=@{kf}") as (host, port, _proc):
        out = _run(binary, "-t", key, *(["-g", "-G"] if digests else []), host, str(port), NQN)
    assert "PASS" in out and " TLS" in out
    assert "write+read 256 blocks" in out and "data matches, guard intact" in out
    if not digests:
        assert "write+read 2051 blocks" in out
    assert "status 0x4080" in out


def test_wrong_key_missing_key_and_clear_hosts_are_refused_with_a_reason(tmp_path):
    binary = _build(False)
    log = tmp_path / "target.log"
    with serve([_image(tmp_path)], NQN, "--tls", "required", "--tls-key", f"{HOST}={KEY}",
               log=log) as (host, port, _proc):
        out = _run(binary, "-t", OTHER, "-e", "EACCES", host, str(port), NQN)
        assert "target refused our TLS PSK (wrong key)" in out
        _log_has(log, "TLS handshake with host " + HOST + " failed: the host's TLS PSK does "
                 "not match ours (wrong key)")
        # a host the target has no key for
        out = _run(binary, "-q", "nqn.2014-08.io.fx100:nobody", "-t", KEY, "-e", "EACCES",
                   host, str(port), NQN)
        assert "no TLS PSK for our identity" in out
        _log_has(log, "no TLS key for this host")
        # a host without TLS: its ICReq is never answered
        out = _run(binary, "-e", "ECONNRESET", host, str(port), NQN)
        _log_has(log, "host did not start TLS (first byte 0x00), which this target requires")
    assert KEY not in log.read_text()


def test_a_host_asking_for_tls_is_not_served_in_clear(tmp_path):
    binary = _build(False)
    with serve([_image(tmp_path)], NQN) as (host, port, _proc):
        out = _run(binary, "-t", KEY, "-e", "EPROTO", host, str(port), NQN)
    assert "did not answer with TLS" in out


def test_discovery_over_tls_reads_the_secure_channel_requirement(tmp_path):
    import fx100io
    from fx100io.errors import FxConnectionError
    with serve([_image(tmp_path)], NQN, "--tls", "required",
               "--tls-key", f"{HOST}={KEY}") as (host, port, _proc):
        entries = fx100io.discover(f"nvme+tcp://{host}:{port}/?hostnqn={HOST}&tls_key={KEY}")
        assert {e["subnqn"] for e in entries} == {NQN, "nqn.2014-08.org.nvmexpress.discovery"}
        assert {(e["treq"], e["sectype"]) for e in entries} == {("required", "tls1.3")}
        # in clear text the target never answers the ICReq
        with pytest.raises(FxConnectionError):
            fx100io.discover(f"nvme+tcp://{host}:{port}/?hostnqn={HOST}")
    with serve([_image(tmp_path)], NQN) as (host, port, _proc):
        entries = fx100io.discover(f"nvme+tcp://{host}:{port}/?hostnqn={HOST}")
        assert {(e["treq"], e["sectype"]) for e in entries} == {("not specified", "none")}


def test_tls_optional_serves_both(tmp_path):
    binary = _build(False)
    with serve([_image(tmp_path)], NQN, "--tls", "optional",
               "--tls-key", f"{HOST}={KEY}") as (host, port, _proc):
        assert "PASS" in _run(binary, "-t", KEY, host, str(port), NQN)
        assert "PASS" in _run(binary, host, str(port), NQN)

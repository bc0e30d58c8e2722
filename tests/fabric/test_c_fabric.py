"""tests/c/test_fabric: the blocking NVMe/TCP control path in C (Connect,
properties, Identify, discovery, keep alive, an I/O queue's reads and writes
through fx_tcp_exec) against two live targets: our own on loopback, and the
real Linux target in the fabric lab.  Built plain and under ASan+UBSan."""

from __future__ import annotations

import subprocess

import pytest
from support.c_tests import build_c
from support.target_process import serve

NQN = "nqn.2026-12.io.fx100:c-fabric"

pytest_plugins = ["support.lab_fixture"]


def _build(sanitize: bool) -> str:
    return build_c("test_fabric", sanitize)


def _run(binary: str, *args: str) -> str:
    p = subprocess.run([binary, *args], capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    return out


@pytest.mark.parametrize("sanitize", [False, True], ids=["plain", "asan-ubsan"])
@pytest.mark.parametrize("digests", [False, True], ids=["plain", "digests"])
def test_control_path_against_our_target(tmp_path, sanitize, digests):
    binary = _build(sanitize)
    img = tmp_path / "ns.img"
    with open(img, "wb") as f:
        f.truncate(64 << 20)
    with serve([str(img)], NQN) as (host, port, _proc):
        out = _run(binary, *(["-g", "-G"] if digests else []), host, str(port), NQN)
    assert "PASS" in out
    # The namespace and the whole write/read ladder ran, not just the connect.
    assert "write+read 256 blocks" in out and "data matches, guard intact" in out
    if not digests:  # the program skips multi-PDU H2CData with data digests (a Linux quirk)
        assert "write+read 2051 blocks" in out
    assert "status 0x4080" in out  # a read past the end reports the NVMe status


@pytest.mark.lab
def test_control_path_against_linux_target(fabric_lab):
    binary = _build(False)
    sub = fabric_lab.subsystem("lab-ram")
    out = _run(binary, "-q", fabric_lab.allowed_host_nqn, "-g", "-G",
               fabric_lab.host, str(fabric_lab.port), sub.nqn)
    assert "PASS" in out and "data matches, guard intact" in out


@pytest.mark.lab
def test_control_path_refused_host_against_linux_target(fabric_lab):
    """The allow-listed subsystem refuses an unknown host with EACCES."""
    binary = _build(False)
    sub = fabric_lab.subsystem("lab-nvme")
    out = _run(binary, "-q", "nqn.2026-12.io.fx100:not-allowed", "-e", "EACCES",
               fabric_lab.host, str(fabric_lab.port), sub.nqn)
    assert "refused with EACCES as expected" in out

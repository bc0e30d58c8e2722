"""Our C connect path and an independent one (pyverbs, tests/support/rdma_cm_check.py) against the
same nvmet-rdma port: both must agree on what the target says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fx100io import rdma_devices

pytest_plugins = ["support.lab_fixture", "guest_rdma"]
# each test body runs inside the lab guest (tests/support/lab_fixture.py: @pytest.mark.guest)
pytestmark = [pytest.mark.lab, pytest.mark.guest]

REPO = Path(__file__).resolve().parents[2]
C_CHECK = REPO / "tests" / "c" / "build" / "rdma_connect_check"


def run_json(argv: list[str]) -> dict:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no JSON from {argv[0]}: rc={p.returncode}\n{p.stdout}\n{p.stderr}"
    return json.loads(lines[-1]) | {"_stderr": p.stderr, "_rc": p.returncode}


def c_check(lab, nqn: str, hsqsize: int | None = None) -> dict:
    if not C_CHECK.exists():
        pytest.fail(f"{C_CHECK} is not built: run `make -C tests/c all` on the host first",
                    pytrace=False)
    extra = [str(hsqsize)] if hsqsize is not None else []
    return run_json([str(C_CHECK), lab.host, str(lab.rdma_port), nqn, lab.allowed_host_nqn,
                     *extra])


def py_check(lab, nqn: str, hsqsize: int | None = None) -> dict:
    extra = ["--hsqsize", str(hsqsize)] if hsqsize is not None else []
    return run_json([sys.executable, str(REPO / "tests" / "support" / "rdma_cm_check.py"), "--addr", lab.host,
                     "--port", str(lab.rdma_port), "--subnqn", nqn, "--hostnqn",
                     lab.allowed_host_nqn, *extra])


def test_the_guest_has_an_active_rdma_port(rdma_lab):
    assert rdma_devices.skip_reason() is None
    devs = rdma_devices.list_devices()
    assert any(p["state"] == "ACTIVE" for d in devs for p in d["ports"]), devs


@pytest.mark.parametrize("sub", ["lab-ram", "lab-nvme"])
def test_both_implementations_agree_on_the_admin_connect(rdma_lab, sub):
    nqn = rdma_lab.subsystem(sub).nqn
    ours, theirs = c_check(rdma_lab, nqn), py_check(rdma_lab, nqn)
    assert ours["connected"], ours
    assert theirs["connected"], theirs
    assert ours["connect_status"] == theirs["connect_status"] == 0
    assert ours["crqsize"] == theirs["crqsize"] and ours["crqsize"] >= 32
    assert ours["cap"] == theirs["cap"] and ours["cap"] != 0


def test_a_too_large_admin_queue_is_rejected_by_both(rdma_lab):
    nqn = rdma_lab.subsystem("lab-ram").nqn
    ours, theirs = c_check(rdma_lab, nqn, 200), py_check(rdma_lab, nqn, 200)
    assert not ours["connected"] and ours["errno"] == 111  # ECONNREFUSED
    assert "host submission queue size" in ours["_stderr"], ours["_stderr"]
    assert not theirs["connected"] and theirs["reject_status"] == 4, theirs

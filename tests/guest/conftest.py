"""Tests that run inside the fabric lab's guest, where soft-RoCE gives an RDMA device.

The host's test command runs them with `lab.py guest -- python3 -m pytest tests/guest`; the
host's own pytest run does not collect this folder (tests/conftest.py), because this host's
kernel has no RDMA.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["lab_fixture"]


@pytest.fixture
def rdma_lab(fabric_lab):
    """The lab, seen from inside the guest, with its NVMe/RDMA port up."""
    if fabric_lab.rdma_port is None:
        pytest.fail("the lab runs without --rdma: start it with `lab.py start --rdma`",
                    pytrace=False)
    return fabric_lab

"""What the tests in tests/guest share.  Their bodies run inside the fabric lab's guest,
where soft-RoCE gives an RDMA device (this host's kernel has none): they are marked
`@pytest.mark.guest`, and the lab plugin (tests/support/lab_fixture.py) runs each module's tests in
one pytest process in the guest and reports each outcome on the host, so they count in the
suite's totals like any other test.

A test module loads this file and the lab as plugins: `pytest_plugins = ["support.lab_fixture",
"guest_rdma"]`, which gives it the `rdma_lab` fixture.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def rdma_lab(fabric_lab):
    """The lab, seen from inside the guest, with its NVMe/RDMA port up."""
    if fabric_lab.rdma_port is None:
        pytest.fail("the lab runs without --rdma: start it with `lab.py start --rdma`",
                    pytrace=False)
    return fabric_lab

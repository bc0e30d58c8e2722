"""SharedChunkStore over the real Linux NVMe/TCP target of the fabric lab:
three host processes share the lab-ram namespace, each reads what the
others wrote, byte for byte (every value embeds its key and tag)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.shared_host import check_value
from support.shared_hosts import Host
from support.shared_redis import serve

from fx100io.store.shared import SharedChunkStore

pytest_plugins = ["support.lab_fixture"]
pytestmark = pytest.mark.lab


@pytest.fixture
def redis_server(tmp_path: Path):
    yield from serve(tmp_path)


def uri(lab) -> str:  # noqa: ANN001
    return (f"nvme+tcp://{lab.host}:{lab.port}/{lab.subsystem('lab-ram').nqn}"
            f"?hostnqn={lab.allowed_host_nqn}")


def test_three_hosts_share_the_linux_target(fabric_lab, redis_server):
    uris = [uri(fabric_lab)]
    SharedChunkStore(uris, redis_server.url, create=True).close()
    hs = []
    try:
        for _ in range(3):
            hs.append(Host(uris, redis_server.url))
        for i, h in enumerate(hs):  # sizes off the target's 512-byte blocks too
            assert h(op="put", keys=[f"lab{i}-{j}" for j in range(4)], tag=f"t{i}",
                     size=(1 << 20) + 1000 * i + 3)["ok"]
        for h in hs:
            for j in range(3):
                assert h(op="get", keys=[f"lab{j}-{n}" for n in range(4)])["found"] == \
                    [f"t{j}"] * 4
        # all three at once on one key: one of them wins, everywhere
        for i, h in enumerate(hs):
            h.send(op="put", keys=["same"], tag=f"s{i}", size=300001)
        for h in hs:
            assert h.read().get("ok")
        seen = {h(op="get", keys=["same"])["found"][0] for h in hs}
        assert len(seen) == 1 and seen <= {"s0", "s1", "s2"}
        assert hs[1](op="delete", key="lab0-0")["ok"]
        assert hs[2](op="get", keys=["lab0-0", "lab0-1"])["found"] == [None, "t0"]
        s = hs[0](op="stats")["stats"]
        assert s["chunks"] == 12 and s["leases"] == 0 and s["limbo"] == 0
    finally:
        for h in hs:
            h.close()
    # and this process, a fourth host, through its own controller association
    with SharedChunkStore(uris, redis_server.url) as st:
        buf = np.zeros(2 << 20, np.uint8)
        assert st.batch_get_blocking(["lab2-3"], [buf]) == [True]
        assert check_value("lab2-3", buf) == "t2"

"""Device URIs of the lab's NVMe/RDMA port, for the tests in tests/guest."""

from __future__ import annotations

MiB = 1 << 20


def rdma_uri(lab, sub: str, **q) -> str:
    q.setdefault("hostnqn", lab.allowed_host_nqn)
    query = "&".join(f"{k}={v}" for k, v in q.items())
    return f"nvme+rdma://{lab.host}:{lab.rdma_port}/{lab.subsystem(sub).nqn}?{query}"

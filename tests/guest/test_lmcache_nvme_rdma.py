"""The LMCache plugin with an nvme+rdma device: a full LMCacheEngine whose storage tier is
the lab's nvmet-rdma namespace, reached from inside the guest over soft-RoCE."""

from __future__ import annotations

import pytest
from rdma_uris import rdma_uri
from support.lmcache import (
    CHUNK,
    cold_cpu_tier,
    destroy_engine,
    make_config,
    make_engine,
    plugin_of,
    random_kv,
    torch,
)

pytest_plugins = ["support.lab_fixture", "guest_rdma"]
# each test body runs inside the lab guest (tests/support/lab_fixture.py: @pytest.mark.guest)
pytestmark = [pytest.mark.lab, pytest.mark.guest]

NUM_TOKENS = 3 * CHUNK + 5


def test_store_retrieve_and_restart_over_nvme_rdma(rdma_lab):
    uri = rdma_uri(rdma_lab, "lab-ram", queues=2)
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 32000, (NUM_TOKENS,), generator=gen)
    kv = random_kv(len(tokens), seed=5)

    # "always": the namespace also carries the raw-I/O tests' bytes
    first = make_engine(make_config(uri, size=None, create="always"))
    try:
        sm = first.storage_manager
        plugin_of(sm)
        first.store(tokens, kvcaches=kv)
        cold_cpu_tier(sm)
        out = torch.zeros_like(kv)
        assert int(first.retrieve(tokens, kvcaches=out).sum()) == len(tokens)
        assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))
    finally:
        destroy_engine(first)

    second = make_engine(make_config(uri, size=None, create="never"))  # a restart
    try:
        assert second.lookup(tokens) == len(tokens)
        out = torch.zeros_like(kv)
        assert int(second.retrieve(tokens, kvcaches=out).sum()) == len(tokens)
        assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))
    finally:
        destroy_engine(second)

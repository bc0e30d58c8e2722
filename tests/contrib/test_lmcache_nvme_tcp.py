"""The plugin over NVMe/TCP: a full LMCacheEngine whose storage tier is a namespace
served by fx100io's own target (a subprocess on 127.0.0.1 over a temp file).

What these prove: the KV bytes travel to the target's file and back byte for byte, a
new engine (a restart: new CPU pool, new controller, new connections) finds every
chunk through the same URI, and `create: auto` formats a blank namespace but never
one that holds someone else's data.
"""

from __future__ import annotations

import time

import pytest
from support.lmcache import (
    CHUNK,
    LogCapture,
    cold_cpu_tier,
    destroy_engine,
    make_config,
    make_engine,
    plugin_of,
    random_kv,
    torch,
)
from support.target_process import serve

NQN = "nqn.2026-11.io.fx100:lmcache-test"
NAMESPACE_BYTES = 64 << 20
NUM_TOKENS = 5 * CHUNK + 7  # five full chunks and a partial one (its tail is padded on the wire)


@pytest.fixture
def namespace(tmp_path):
    """A blank (all-zero) namespace file served over NVMe/TCP with 4 KiB blocks."""
    path = tmp_path / "ns.img"
    with open(path, "wb") as f:
        f.truncate(NAMESPACE_BYTES)
    with serve([str(path)], NQN, block_size=4096) as (host, port, proc):
        yield f"nvme+tcp://{host}:{port}/{NQN}?queues=2", path, proc


def fabric_config(uri: str, **opts):
    # No size: a fabric namespace brings its own; create stays at its default (auto).
    return make_config(uri, size=None, **opts)


def tokens_for(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 32000, (NUM_TOKENS,), generator=gen)


def chunk_bytes(kv: torch.Tensor, start: int, end: int) -> bytes:
    """A chunk exactly as LMCache hands it to the plugin (KV_2LTD, contiguous)."""
    return kv[:, :, start:end, :].contiguous().view(torch.uint8).numpy().tobytes()


def test_store_retrieve_and_restart_over_nvme_tcp(namespace):
    uri, path, target = namespace
    tokens = tokens_for(11)
    kv = random_kv(len(tokens), seed=11)

    first = make_engine(fabric_config(uri))  # create: auto formats the blank namespace
    try:
        sm = first.storage_manager
        plugin_of(sm)  # loaded, or the assertion names the backends LMCache has
        first.store(tokens, kvcaches=kv)
        cold_cpu_tier(sm)  # waits for the puts, then empties the CPU tier

        out = torch.zeros_like(kv)
        mask = first.retrieve(tokens, kvcaches=out)
        assert int(mask.sum()) == len(tokens)
        assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))
        # LMCache wrote the hits back to its CPU tier: they came from the plugin.
        assert len(sm.storage_backends["LocalCPUBackend"].get_keys()) == 6
    finally:
        t = time.monotonic()
        destroy_engine(first)
    # The plugin tears its queues down on the thread that owns them; torn down from
    # another thread an nvme+tcp queue waits out a 5 s drain, at every engine shutdown.
    assert time.monotonic() - t < 4.0, "engine shutdown stalled on the nvme+tcp queue drain"

    # The bytes are in the target's file: they crossed the wire, not just a local cache.
    on_target = path.read_bytes()
    for start in range(0, len(tokens), CHUNK):
        assert chunk_bytes(kv, start, min(start + CHUNK, len(tokens))) in on_target

    second = make_engine(fabric_config(uri))  # new engine, new pool, same namespace
    try:
        sm = second.storage_manager
        assert sm.storage_backends["LocalCPUBackend"].get_keys() == []
        assert second.lookup(tokens) == len(tokens)
        out = torch.zeros_like(kv)
        mask = second.retrieve(tokens, kvcaches=out)
        assert int(mask.sum()) == len(tokens)
        assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))
    finally:
        destroy_engine(second)
    assert target.poll() is None, "the target exited during the test"


def test_auto_create_refuses_a_namespace_with_foreign_data(tmp_path):
    """'create: auto' must not format a namespace that holds anything but zeros."""
    path = tmp_path / "foreign.img"
    foreign = bytes(range(256)) * 16
    with open(path, "wb") as f:
        f.write(foreign)
        f.truncate(NAMESPACE_BYTES)
    with serve([str(path)], NQN, block_size=4096) as (host, port, _proc), LogCapture() as logs:
        engine = make_engine(fabric_config(f"nvme+tcp://{host}:{port}/{NQN}"))
        try:
            # LMCache only logs a plugin's constructor error and goes on without it.
            assert "fx100io" not in engine.storage_manager.storage_backends
        finally:
            destroy_engine(engine)
    assert "is not an fx100io store and is not blank" in logs.text()
    assert path.read_bytes()[: len(foreign)] == foreign

"""Several paths to one NVMe/TCP namespace (fx100io/multipath.py, issue 27 part 1).

Two `fx100io target` processes on two loopback ports serve the SAME backing
file under one subsystem NQN: they stand in for two ports of one target
(each process derives the same NGUID and UUID from the NQN, the nsid and the
file).  A steady mixed read/write load with byte checks runs while one
process is SIGKILLed: no request may fail and every byte must be right;
then the dead path comes back in the background.  Also: a path that shows
another namespace is refused, every path down fails requests within
io_timeout_ms and recovery follows when one returns, and the URI forms.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import numpy as np
import pytest
from support import chunk_bytes
from support.multipath_paths import paths_uri, sparse_backing
from support.multipath_paths import wait_for as _wait_for
from support.target_process import serve, wait_port_free

import fx100io
from fx100io import errors, fabric_uri
from fx100io.multipath import MultipathDevice, path_error

NQN = "nqn.2026-12.io.fx100:multipath"
BS = 64 << 10
SIZE = 16 << 20
WAIT_S = 20.0  # the longest any wait below may take before the test fails


def mp_uri(ports: list[int], **q: object) -> str:
    return paths_uri(NQN, ports, **q)


@pytest.fixture
def backing(tmp_path):
    return sparse_backing(tmp_path, SIZE)


def wait_for(cond, what: str, seconds: float = WAIT_S) -> None:  # noqa: ANN001
    _wait_for(cond, what, seconds, 0.05)


# -- the URI ----------------------------------------------------------------

def test_uri_lists_paths():
    uri = f"nvme+tcp://10.0.0.1:4420,10.0.1.1:4421/{NQN}?policy=queue-depth&queues=2"
    paths = fabric_uri.split_paths(uri)
    assert paths == [f"nvme+tcp://10.0.0.1:4420/{NQN}?policy=queue-depth&queues=2",
                     f"nvme+tcp://10.0.1.1:4421/{NQN}?policy=queue-depth&queues=2"]
    assert fabric_uri.is_multipath(uri)
    assert fabric_uri.multipath_options(uri) == {"paths": "listed", "policy": "queue-depth",
                                                 "unidentified_ns": "refuse",
                                                 "discover_secrets": "listed"}
    one = f"nvme+tcp://10.0.0.1:4420/{NQN}"
    assert fabric_uri.split_paths(one) == [one] and not fabric_uri.is_multipath(one)
    assert fabric_uri.is_multipath(one + "?paths=discover")
    # the multipath options never reach the C device's key=value lines
    target = fabric_uri.to_transport_target(paths[0])
    assert "policy" not in target and "paths" not in target
    for bad in (f"nvme+tcp://10.0.0.1:4420,/{NQN}",
                f"nvme+tcp://10.0.0.1:4420,10.0.0.1:4420/{NQN}",
                f"nvme+tcp://10.0.0.1:4420,10.0.1.1:99999/{NQN}",
                f"nvme+tcp://10.0.0.1:4420/{NQN}?policy=fastest",
                f"nvme+tcp://10.0.0.1:4420/{NQN}?paths=all"):
        with pytest.raises(errors.InvalidArgumentError):
            fabric_uri.split_paths(bad)


def test_paths_chosen_by_ana_state():
    """Optimized paths first, non-optimized only when no optimized one is
    live, inaccessible ones never (the choice alone: a target that reports
    ANA states drives it in the lab and target tests)."""
    from fx100io import multipath as mp

    dev = object.__new__(MultipathDevice)
    dev._lock = __import__("threading").Lock()
    dev.policy, dev._rr = "round-robin", 0
    dev._paths = [mp._Path(f"nvme+tcp://127.0.0.1:{4420 + i}/{NQN}") for i in range(3)]
    for p, ana in zip(dev._paths, (mp.ANA_NONOPTIMIZED, mp.ANA_OPTIMIZED, mp.ANA_INACCESSIBLE)):
        p.state, p.ana = mp.LIVE, ana
    picked = {dev._pick() for _ in range(6)}
    assert picked == {dev._paths[1]}
    dev._paths[1].state = mp.DOWN
    assert {dev._pick() for _ in range(6)} == {dev._paths[0]}
    dev._paths[0].ana = mp.ANA_CHANGE
    assert dev._pick() is None


def test_path_errors_told_from_request_errors():
    assert path_error(-104, 0)  # ECONNRESET
    assert path_error(-110, 0)  # ETIMEDOUT
    assert path_error(-5, 0x302)  # SCT 3h SC 02h: ANA inaccessible
    assert path_error(-5, 0x303)  # ANA transition
    assert not path_error(-5, 0x4302)  # DNR: no controller will take it
    assert not path_error(-5, 0x281)  # SCT 2h media error: the caller's answer
    assert not path_error(-22, 0)  # EINVAL
    assert not path_error(4096, 0)


# -- two paths, one namespace ----------------------------------------------

def test_two_paths_one_namespace(backing):
    with serve([backing], NQN) as (_, pa, _pa), serve([backing], NQN) as (_, pb, _pb):
        with fx100io.open_device(mp_uri([pa, pb])) as dev:
            assert isinstance(dev, MultipathDevice)
            assert dev.size == SIZE and dev.block_size == 512
            a, b = (p.dev._dev.ns_ids for p in dev._paths)  # type: ignore[union-attr]
            assert a == b and any(a[0]), "the namespace must report its NGUID"
            data = chunk_bytes("two-paths", 8 * BS)
            for i in range(8):
                dev.write_from_blocking(i * BS, data[i * BS:(i + 1) * BS])
            out = np.zeros(8 * BS, np.uint8)
            for i in range(8):
                assert dev.read_into_blocking(i * BS, out[i * BS:(i + 1) * BS]) == BS
            assert np.array_equal(out, data)
            stats = dev.path_stats()
            assert [s["state"] for s in stats] == ["live", "live"]
            # our target reports ANA now: its one default group, optimized on both ports
            assert [s["ana_state"] for s in stats] == ["optimized", "optimized"]
            grp, state = dev._paths[0].dev._dev.ana_state()  # type: ignore[union-attr]
            assert grp >= 1 and state == 1
            # round-robin: both paths carried commands, every byte counted once
            assert all(s["commands"] >= 4 for s in stats), stats
            assert sum(s["bytes"] for s in stats) == 16 * BS
            assert dev.queue_stats()["failovers"] == 0


def test_path_to_another_namespace_is_refused(backing, tmp_path):
    other = tmp_path / "other.img"
    with open(other, "wb") as f:
        f.truncate(SIZE)
    with serve([backing], NQN) as (_, pa, _pa), serve([str(other)], NQN) as (_, pb, _pb):
        with pytest.raises(errors.PathMismatchError, match="another namespace"):
            fx100io.open_device(mp_uri([pa, pb]))


# -- a path dies under load ------------------------------------------------

async def _load(dev, stop: asyncio.Event, lanes: int, log: list[float]) -> int:  # noqa: ANN001
    """Each lane writes its own blocks with fresh content and reads them
    back, byte-checked, until stop; returns the requests completed."""
    n = 0

    async def lane(k: int) -> None:
        nonlocal n
        rnd = 0
        buf = np.zeros(BS, np.uint8)
        while not stop.is_set():
            off = (k * 16 + rnd % 16) * BS
            data = chunk_bytes(f"lane{k}-{rnd}", BS)
            assert await dev.write_from(off, data) == BS
            log.append(time.monotonic())
            assert await dev.read_into(off, buf) == BS
            log.append(time.monotonic())
            assert np.array_equal(buf, data), f"lane {k} round {rnd}: wrong bytes"
            n += 2
            rnd += 1

    await asyncio.gather(*(lane(k) for k in range(lanes)))
    return n


def test_kill_one_path_mid_load_no_failed_request(backing):
    with serve([backing], NQN) as (_, pa, proc_a), serve([backing], NQN) as (_, pb, proc_b):
        # kato_ms=2000: a write in flight on the killed path is re-issued once
        # that controller's keep alive ran out (multipath.py, "Writes")
        dev = fx100io.open_device(mp_uri([pa, pb], reconnect_ms=100, kato_ms=2000))

        async def main() -> tuple[int, float]:
            stop = asyncio.Event()
            log: list[float] = []
            task = asyncio.ensure_future(_load(dev, stop, 8, log))
            await asyncio.sleep(0.5)
            before = dev.path_stats()[1]["commands"]
            assert before > 0, "path b carried nothing before the kill"
            os.kill(proc_b.pid, signal.SIGKILL)
            killed = time.monotonic()
            await asyncio.sleep(1.5)
            stop.set()
            stopped = time.monotonic()
            n = await asyncio.wait_for(task, WAIT_S)
            # (until stop: the writes held for the killed controller's keep
            # alive complete after it, with no new request behind them)
            after = sorted(t for t in log if killed <= t <= stopped)
            gaps = [b - a for a, b in zip([killed, *after], after)]
            return n, max(gaps) if gaps else float("inf")

        try:
            n, gap = asyncio.run(main())
            stats = dev.path_stats()
            assert n > 0
            assert stats[1]["state"] == "down" and stats[1]["failovers"] >= 1, stats
            assert stats[0]["state"] == "live"
            # traffic moved to the survivor within a second of the kill
            assert gap < 1.0, f"longest gap with no completion: {gap:.3f} s"
            print(f"multipath failover: longest gap with no completion {gap * 1000:.1f} ms")
            proc_b.wait(timeout=10)
            wait_port_free(pb)
            # the dead path comes back in the background once its target does
            with serve([backing], NQN, port=pb):
                wait_for(lambda: dev.path_stats()[1]["state"] == "live", "path b back")
                buf = np.zeros(BS, np.uint8)
                before = dev.path_stats()[1]["commands"]
                for _ in range(4):
                    dev.read_into_blocking(0, buf)
                assert dev.path_stats()[1]["commands"] > before
        finally:
            dev.close()


def test_blocking_calls_fail_over(backing):
    with serve([backing], NQN) as (_, pa, proc_a), serve([backing], NQN) as (_, pb, _pb):
        with fx100io.open_device(mp_uri([pa, pb], policy="queue-depth")) as dev:
            data = chunk_bytes("blocking", 4 * BS)
            dev.write_from_blocking(0, data)
            os.kill(proc_a.pid, signal.SIGKILL)
            proc_a.wait(timeout=10)
            out = np.zeros_like(data)
            for _ in range(4):  # whichever path each picks, none fails
                assert dev.read_into_blocking(0, out) == out.nbytes
                assert np.array_equal(out, data)
                dev.write_from_blocking(0, data)
            assert dev.path_stats()[0]["state"] == "down"


def test_every_path_down_fails_within_io_timeout_then_recovers(backing):
    with contextlib.ExitStack() as stack:
        _, pa, proc_a = stack.enter_context(serve([backing], NQN))
        _, pb, proc_b = stack.enter_context(serve([backing], NQN))
        dev = stack.enter_context(fx100io.open_device(
            mp_uri([pa, pb], io_timeout_ms=1500, reconnect_ms=100)))
        data = chunk_bytes("all-down", BS)
        dev.write_from_blocking(0, data)
        for p in (proc_a, proc_b):
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
        buf = np.zeros(BS, np.uint8)
        t0 = time.monotonic()
        with pytest.raises(errors.FxTimeoutError, match="no path carried it") as e:
            dev.read_into_blocking(0, buf)
        assert f"127.0.0.1:{pa}" in str(e.value) and f"127.0.0.1:{pb}" in str(e.value)
        took = time.monotonic() - t0
        assert took < 1.5 + 3.0, f"the error took {took:.2f} s"

        async def read_async() -> int:
            return await dev.read_into(0, buf)

        with pytest.raises(errors.FxTimeoutError, match="no path carried it"):
            asyncio.run(read_async())
        wait_port_free(pa)
        stack.enter_context(serve([backing], NQN, port=pa))
        wait_for(lambda: dev.path_stats()[0]["state"] == "live", "path a back")
        assert dev.read_into_blocking(0, buf) == BS
        assert np.array_equal(buf, data)
        assert asyncio.run(read_async()) == BS


def test_paths_discover_finds_the_listed_path(backing):
    with serve([backing], NQN) as (_, pa, _pa):
        with fx100io.open_device(f"nvme+tcp://127.0.0.1:{pa}/{NQN}?paths=discover") as dev:
            assert isinstance(dev, MultipathDevice)
            labels = [s["path"] for s in dev.path_stats()]
            assert len(labels) == 1 and f":{pa}/" in labels[0]
            buf = np.zeros(BS, np.uint8)
            assert dev.read_into_blocking(0, buf) == BS


def test_chunk_store_over_two_paths_survives_one(backing):
    """The store takes a multipath URI as any other: chunks put through two
    paths are read back byte-exact after one path died, and puts go on."""
    with serve([backing], NQN) as (_, pa, _pa), serve([backing], NQN) as (_, pb, proc_b):
        keys = [f"k{i}" for i in range(8)]
        vals = [chunk_bytes(k, 1 << 20) for k in keys]

        async def main() -> None:
            async with fx100io.ChunkStore(mp_uri([pa, pb]), create=True) as st:
                await st.batch_put(keys, vals)
                os.kill(proc_b.pid, signal.SIGKILL)
                out = [np.zeros(1 << 20, np.uint8) for _ in keys]
                assert await st.batch_get(keys, out) == [True] * len(keys)
                assert all(np.array_equal(a, b) for a, b in zip(out, vals))
                await st.batch_put([k + "-after" for k in keys], vals)
                assert await st.batch_exists([k + "-after" for k in keys]) == len(keys)

        asyncio.run(main())

"""Multipath (fx100io/multipath.py) against our own target's ANA: ONE
`fx100io target` process with two `--listen` ports (two controllers' paths
to one namespace) and a control socket.  Under a steady byte-checked
read/write load, `target-ctl ana-state` turns a port inaccessible and back
and `close-port` kills a path: no request fails, every byte is right and
the survivor carries the traffic within a second; with both ports closed a
request fails clearly within io_timeout_ms, and I/O resumes once a port
opens again.  Also: a stalled path's ANA read does not hold up the others'.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import pytest
from support import chunk_bytes
from support.multipath_paths import paths_uri, sparse_backing
from support.target_process import serve, serve_ports

import fx100io
from fx100io import errors
from fx100io.target_ctl import control

NQN = "nqn.2026-12.io.fx100:multipath-ana"
BS = 16 << 10
SIZE = 16 << 20
WAIT_S = 20.0
LANES = 6


@pytest.fixture
def backing(tmp_path):
    return sparse_backing(tmp_path, SIZE)


def mp_uri(ports: list[int], **q: object) -> str:
    return paths_uri(NQN, ports, **q)


async def wait_until(cond, what: str, seconds: float = WAIT_S) -> float:  # noqa: ANN001
    """Seconds it took for cond() to hold (AssertionError after seconds)."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > seconds:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


class Load:
    """LANES lanes, each writing fresh content to its own blocks and reading
    it back byte-checked; every completion's time is kept."""

    def __init__(self, dev):  # noqa: ANN001
        self.dev = dev
        self.stop = asyncio.Event()
        self.times: list[float] = []
        self.done = 0

    async def lane(self, k: int) -> None:
        rnd = 0
        buf = np.zeros(BS, np.uint8)
        while not self.stop.is_set():
            off = (k * 32 + rnd % 32) * BS
            data = chunk_bytes(f"ana-lane{k}-{rnd}", BS)
            assert await self.dev.write_from(off, data) == BS
            self.times.append(time.monotonic())
            assert await self.dev.read_into(off, buf) == BS
            self.times.append(time.monotonic())
            assert np.array_equal(buf, data), f"lane {k} round {rnd}: wrong bytes"
            self.done += 2
            rnd += 1

    def start(self) -> asyncio.Future:
        return asyncio.ensure_future(asyncio.gather(*(self.lane(k) for k in range(LANES))))

    def longest_gap(self, since: float, until: float) -> float:
        ts = sorted(t for t in self.times if since <= t <= until)
        return max((b - a for a, b in zip([since, *ts], [*ts, until])), default=until - since)


def commands(dev, i: int) -> int:  # noqa: ANN001
    return int(dev.path_stats()[i]["commands"])


def test_ana_state_and_closed_ports_under_load(backing, tmp_path):
    ctl = str(tmp_path / "ctl.sock")
    with serve_ports([backing], NQN, ["127.0.0.1:0", "127.0.0.1:0"], control=ctl) as (ports, _t):
        dev = fx100io.open_device(mp_uri(ports, io_timeout_ms=3000, reconnect_ms=100,
                                         kato_ms=2000))

        async def main() -> None:
            load = Load(dev)
            task = load.start()
            try:
                await asyncio.sleep(0.5)
                assert commands(dev, 0) > 0 and commands(dev, 1) > 0

                # port 2 inaccessible: its I/O answers SCT 3h, the ANA log says so
                t0 = time.monotonic()
                control(ctl, "ana-state 2 1 inaccessible")
                await wait_until(lambda: dev.path_stats()[1]["ana_state"] == "inaccessible"
                                 or dev.path_stats()[1]["state"] != "live", "path 2 out")
                await asyncio.sleep(0.1)  # what was in flight there has come back
                before = commands(dev, 1)
                await asyncio.sleep(0.5)
                assert commands(dev, 1) == before, "I/O still went to an inaccessible path"
                assert load.longest_gap(t0, time.monotonic()) < 1.0

                # optimized again: path 2 carries I/O again
                control(ctl, "ana-state 2 1 optimized")
                took = await wait_until(lambda: commands(dev, 1) > before + 10, "path 2 back")
                assert took < 3.0, f"path 2 took {took:.2f} s to carry I/O again"

                # port 1 closed: its connections die, port 2 takes everything
                t1 = time.monotonic()
                control(ctl, "close-port 1")
                await asyncio.sleep(1.5)
                assert load.longest_gap(t1, time.monotonic()) < 1.0, \
                    f"longest gap {load.longest_gap(t1, time.monotonic()):.3f} s"
                assert dev.path_stats()[0]["state"] != "live"
                load.stop.set()
                await asyncio.wait_for(task, WAIT_S)
            finally:
                load.stop.set()
                if not task.done():
                    task.cancel()
            assert load.done > 0

            # both ports closed: a clear error within io_timeout_ms
            control(ctl, "close-port 2")
            buf = np.zeros(BS, np.uint8)
            t2 = time.monotonic()
            with pytest.raises(errors.FxTimeoutError, match="no path carried it"):
                await dev.read_into(0, buf)
            took = time.monotonic() - t2
            assert took < 3.0 + 3.0, f"the error took {took:.2f} s"

            # one port back: I/O resumes, byte-exact
            control(ctl, "open-port 1")
            await wait_until(lambda: dev.path_stats()[0]["state"] == "live", "path 1 back")
            data = chunk_bytes("after", BS)
            assert await dev.write_from(0, data) == BS
            assert await dev.read_into(0, buf) == BS
            assert np.array_equal(buf, data)
            # port 2's controller took writes and is gone: the flush says
            # so (once), within io_timeout_ms; the next one goes through
            with pytest.raises(errors.FxTimeoutError, match=f"flush.*:{ports[1]}/"):
                await dev.flush()
            await dev.flush()

        try:
            asyncio.run(main())
        finally:
            dev.close()


def test_a_stalled_path_does_not_hold_up_the_others_ana(backing, tmp_path):
    """Path 3 (another target process on the same file and NQN: the same
    namespace identifiers) is stalled; port 1 turning non-optimized is still
    seen within about ANA_POLL_S (each path's ANA is read by its own
    thread: one reader for all would wait out path 3's admin timeout)."""
    ctl = str(tmp_path / "ctl.sock")
    with serve_ports([backing], NQN, ["127.0.0.1:0", "127.0.0.1:0"], control=ctl) as (ports, _t), \
            serve([backing], NQN) as (_, p3, proc3):
        dev = fx100io.open_device(mp_uri([*ports, p3], io_timeout_ms=8000, reconnect_ms=100))
        try:
            assert [s["ana_state"] for s in dev.path_stats()] == ["optimized"] * 3
            os.kill(proc3.pid, signal.SIGSTOP)
            time.sleep(1.5)  # path 3's ANA reader is stuck in its Get Log Page now
            control(ctl, "ana-state 1 1 non-optimized")
            t0 = time.monotonic()
            while dev.path_stats()[0]["ana_state"] != "non-optimized":
                assert time.monotonic() - t0 < 3.0, "path 1's ANA change waited on path 3"
                time.sleep(0.02)
        finally:
            if proc3.poll() is None:
                os.kill(proc3.pid, signal.SIGCONT)
            dev.close()

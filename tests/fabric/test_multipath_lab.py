"""Multipath and ANA against the real Linux target (nvmet-tcp) in the fabric lab.

The test adds a second port (10.88.0.2:4427) to the lab's target through
configfs, exports lab-ram on it too, and changes the ANA state of group 1
on each port while a mixed read/write load with byte checks runs through a
two-path device: non-optimized takes a path out of the rotation while an
optimized one is there, inaccessible moves its traffic with no failed
request.  The port is removed and every state restored at the end.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from support import chunk_bytes

import fx100io

pytest_plugins = ["support.lab_fixture"]
pytestmark = pytest.mark.lab

NVMET = "/sys/kernel/config/nvmet"
PORT_ID = 27
PORT = 4427
BS = 64 << 10


def sh(lab, cmd: str) -> str:  # noqa: ANN001
    rc, out = lab.guest(cmd)
    assert rc == 0, f"{cmd}: {out}"
    return out


def ana(lab, port_id: int | str, state: str) -> None:  # noqa: ANN001
    sh(lab, f"echo {state} > {NVMET}/ports/{port_id}/ana_groups/1/ana_state")


@pytest.fixture
def second_port(fabric_lab):
    nqn = fabric_lab.subsystem("lab-ram").nqn
    main = sh(fabric_lab, f"grep -l '^{fabric_lab.port}$' {NVMET}/ports/*/addr_trsvcid"
              " | head -1").strip().split("/")[-2]
    d = f"{NVMET}/ports/{PORT_ID}"
    fabric_lab.guest(f"rm -f {d}/subsystems/{nqn}; rmdir {d}")  # a run that died before
    sh(fabric_lab, f"mkdir {d} && echo tcp > {d}/addr_trtype && echo ipv4 > {d}/addr_adrfam"
                   f" && echo {fabric_lab.host} > {d}/addr_traddr && echo {PORT} > {d}/addr_trsvcid"
                   f" && ln -s {NVMET}/subsystems/{nqn} {d}/subsystems/{nqn}")
    try:
        yield main, nqn
    finally:
        ana(fabric_lab, main, "optimized")
        fabric_lab.guest(f"rm -f {d}/subsystems/{nqn}; rmdir {d}")


def wait_for(cond, what: str, seconds: float = 15.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_ana_states_move_traffic_with_no_failed_request(fabric_lab, second_port):
    main, nqn = second_port
    host = fabric_lab.host
    uri = (f"nvme+tcp://{host}:{fabric_lab.port},{host}:{PORT}/{nqn}"
           f"?hostnqn={fabric_lab.allowed_host_nqn}&reconnect_ms=100")
    with fx100io.open_device(uri) as dev:
        ids = [p.dev._dev.ns_ids for p in dev._paths]  # type: ignore[attr-defined]
        assert ids[0] == ids[1] and any(any(b) for b in ids[0]), ids
        st = dev.path_stats()  # type: ignore[attr-defined]
        assert [(s["ana_group"], s["ana_state"]) for s in st] == [(1, "optimized")] * 2, st

        ana(fabric_lab, PORT_ID, "non-optimized")
        wait_for(lambda: dev.path_stats()[1]["ana_state"] == "non-optimized", "non-optimized")
        before = [s["commands"] for s in dev.path_stats()]
        buf = np.zeros(BS, np.uint8)
        for _ in range(8):
            dev.read_into_blocking(0, buf)
        after = [s["commands"] for s in dev.path_stats()]
        assert after[1] == before[1] and after[0] == before[0] + 8, (before, after)

        async def load(stop: asyncio.Event) -> int:
            n = 0

            async def lane(k: int) -> None:
                nonlocal n
                out = np.zeros(BS, np.uint8)
                rnd = 0
                while not stop.is_set():
                    off = (k * 8 + rnd % 8) * BS
                    data = chunk_bytes(f"lab-ana-{k}-{rnd}", BS)
                    assert await dev.write_from(off, data) == BS
                    assert await dev.read_into(off, out) == BS
                    assert np.array_equal(out, data), f"lane {k} round {rnd}"
                    n += 2
                    rnd += 1

            await asyncio.gather(*(lane(k) for k in range(4)))
            return n

        async def main_flow() -> int:
            stop = asyncio.Event()
            task = asyncio.ensure_future(load(stop))
            await asyncio.sleep(0.5)
            # the only optimized path becomes inaccessible: traffic moves to the
            # non-optimized one, no request fails
            await asyncio.to_thread(ana, fabric_lab, main, "inaccessible")
            await asyncio.sleep(1.5)
            mid = dev.path_stats()[1]["commands"]
            await asyncio.sleep(0.5)
            assert dev.path_stats()[1]["commands"] > mid, dev.path_stats()
            await asyncio.to_thread(ana, fabric_lab, main, "optimized")
            await asyncio.sleep(2.0)
            stop.set()
            return await asyncio.wait_for(task, 30)

        assert asyncio.run(main_flow()) > 0
        wait_for(lambda: dev.path_stats()[0]["state"] == "live"
                 and dev.path_stats()[0]["ana_state"] == "optimized", "path 0 optimized again")


@pytest.fixture
def referral(fabric_lab, second_port):
    """A referral on the lab's port to the second one: Linux's discovery
    log lists only the port it is read on, and names the others so."""
    main, _ = second_port
    r = f"{NVMET}/ports/{main}/referrals/fxmp"
    fabric_lab.guest(f"echo 0 > {r}/enable; rmdir {r}")
    sh(fabric_lab, f"mkdir {r} && echo tcp > {r}/addr_trtype && echo ipv4 > {r}/addr_adrfam"
                   f" && echo {fabric_lab.host} > {r}/addr_traddr && echo {PORT} > {r}/addr_trsvcid"
                   f" && echo 1 > {r}/enable")
    try:
        yield second_port
    finally:
        fabric_lab.guest(f"echo 0 > {r}/enable; rmdir {r}")


def test_paths_discover_follows_the_referral(fabric_lab, referral):
    _, nqn = referral
    uri = (f"nvme+tcp://{fabric_lab.host}:{fabric_lab.port}/{nqn}"
           f"?hostnqn={fabric_lab.allowed_host_nqn}&paths=discover")
    with fx100io.open_device(uri) as dev:
        st = dev.path_stats()  # type: ignore[attr-defined]
        assert [s["path"].split("/")[2] for s in st] == \
            [f"{fabric_lab.host}:{fabric_lab.port}", f"{fabric_lab.host}:{PORT}"], st
        buf = np.zeros(BS, np.uint8)
        for _ in range(4):
            assert dev.read_into_blocking(0, buf) == BS
        assert all(s["commands"] >= 2 for s in dev.path_stats())

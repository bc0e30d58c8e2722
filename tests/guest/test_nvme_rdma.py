"""Our NVMe/RDMA initiator against the real Linux target (nvmet-rdma over soft-RoCE).

Their bodies run inside the lab guest (this host's kernel has no RDMA; see guest_rdma.py),
where the guest's rxe0 device reaches the guest's own nvmet-rdma port.  Everything there runs under QEMU's
software emulation: these tests prove bytes and behaviour, not speed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from rdma_uris import MiB, rdma_uri
from support import chunk_bytes

import fx100io
from fx100io import errors

pytest_plugins = ["support.lab_fixture", "guest_rdma"]
# each test body runs inside the lab guest (tests/support/lab_fixture.py: @pytest.mark.guest)
pytestmark = [pytest.mark.lab, pytest.mark.guest]


def test_discovery_over_rdma_lists_both_ports(rdma_lab):
    entries = fx100io.discover(f"nvme+rdma://{rdma_lab.host}:{rdma_lab.rdma_port}"
                               f"?hostnqn={rdma_lab.allowed_host_nqn}")
    nvme = [e for e in entries if e["subtype"] == "nvme"]
    by_type = {(e["trtype"], e["subnqn"]) for e in nvme}
    for sub in rdma_lab.subsystems:
        assert ("rdma", sub.nqn) in by_type, entries
    for e in nvme:
        if e["trtype"] == "rdma":
            assert e["traddr"] == rdma_lab.host and e["trsvcid"] == str(rdma_lab.rdma_port)


@pytest.mark.parametrize("sub", ["lab-ram", "lab-nvme"])
def test_round_trips_from_one_block_to_64_mib_at_odd_offsets(rdma_lab, sub):
    ns = rdma_lab.subsystem(sub).namespaces[0]
    with fx100io.open_device(rdma_uri(rdma_lab, sub)) as dev:
        assert dev.block_size == ns.block_size and dev.size == ns.size_bytes
        bs = dev.block_size
        pool = fx100io.BufferPool(130 * MiB)
        # one block (in-capsule write), a few, past 128 KiB, 1 MiB (one command), 3 MiB + a
        # block (split by max_xfer), 64 MiB
        sizes = [bs, 3 * bs, (128 << 10) + bs, MiB, 3 * MiB + bs, 64 * MiB]
        off = 7 * bs  # odd block offsets
        for i, n in enumerate(sizes):
            data = pool.alloc(n)
            data[:] = chunk_bytes(f"{sub}-{i}", n)
            assert dev.write_from_blocking(off, data) == n
            out = pool.alloc(n)
            out[:] = 0
            assert dev.read_into_blocking(off, out) == n
            assert np.array_equal(out, data), f"size {n} at offset {off}"
            off += n + 3 * bs
            del data, out


def test_reads_land_in_pool_memory_without_a_copy(rdma_lab):
    """Registered memory: the target's RDMA WRITE puts the bytes in the caller's buffer
    (bytes_direct); memory in no pool goes through a bounce buffer (bytes_copied)."""
    with fx100io.open_device(rdma_uri(rdma_lab, "lab-ram")) as dev:
        data = chunk_bytes("direct", 4 * MiB)
        pool = fx100io.BufferPool(8 * MiB)
        src = pool.alloc(4 * MiB)
        src[:] = data
        dev.write_from_blocking(0, src)
        before = dev.queue_stats()
        out = pool.alloc(4 * MiB)
        dev.read_into_blocking(0, out)
        mid = dev.queue_stats()
        assert np.array_equal(out, data)
        assert mid["bytes_direct"] - before["bytes_direct"] == 4 * MiB
        assert mid["bytes_copied"] == before["bytes_copied"]
        assert mid["fixed_ios"] - before["fixed_ios"] == 4  # 1 MiB commands
        plain = bytearray(4 * MiB)
        dev.read_into_blocking(0, plain)
        after = dev.queue_stats()
        assert bytes(plain) == data.tobytes()
        assert after["bytes_copied"] - mid["bytes_copied"] == 4 * MiB
        assert after["bytes_direct"] == mid["bytes_direct"]


def test_registered_foreign_memory_is_direct_too(rdma_lab):
    """register_memory() (as LMCache's pinned pool is registered) gets the same keys."""
    backing = np.zeros(2 * MiB, np.uint8)
    with fx100io.register_memory(backing), fx100io.open_device(rdma_uri(rdma_lab, "lab-ram")) as dev:
        data = chunk_bytes("foreign", 2 * MiB)
        dev.write_from_blocking(8 * MiB, data)
        before = dev.queue_stats()
        dev.read_into_blocking(8 * MiB, backing)
        after = dev.queue_stats()
        assert np.array_equal(backing, data)
        assert after["bytes_direct"] - before["bytes_direct"] == 2 * MiB
        assert after["bytes_copied"] == before["bytes_copied"]


def test_several_queues_and_async_batches(rdma_lab):
    with fx100io.open_device(rdma_uri(rdma_lab, "lab-nvme", queues=4, qsize=32)) as dev:
        pool = fx100io.BufferPool(64 * MiB)
        n = 256 << 10

        async def go():
            srcs = []
            for i in range(48):
                buf = pool.alloc(n)
                buf[:] = chunk_bytes(f"q{i}", n)
                srcs.append(buf)
            await asyncio.gather(*(dev.write_from(i * n, b) for i, b in enumerate(srcs)))
            await dev.flush()
            outs = [pool.alloc(n) for _ in srcs]
            got = await asyncio.gather(*(dev.read_into(i * n, o) for i, o in enumerate(outs)))
            return srcs, outs, got

        srcs, outs, got = asyncio.run(go())
        assert got == [n] * len(srcs)
        for s, o in zip(srcs, outs):
            assert np.array_equal(s, o)


def test_blocking_calls_from_threads(rdma_lab):
    with fx100io.open_device(rdma_uri(rdma_lab, "lab-ram", queues=2)) as dev:
        bad: list = []

        def worker(t: int) -> None:
            for i in range(4):
                off = (t * 4 + i) * (256 << 10)
                data = chunk_bytes(f"thr{t}-{i}", 256 << 10)
                dev.write_from_blocking(off, data)
                out = np.empty(256 << 10, np.uint8)
                dev.read_into_blocking(off, out)
                if not np.array_equal(out, data):
                    bad.append((t, i))

        ths = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        assert bad == []


def test_chunk_store_created_filled_closed_and_reopened(rdma_lab):
    u = rdma_uri(rdma_lab, "lab-nvme", queues=2)
    keys = [f"kv-{i}" for i in range(6)]
    sizes = [1, 4095, 4096, 100_000, MiB, (2 * MiB) + 17]
    with fx100io.ChunkStore(u, create=True) as st:
        st.batch_put_blocking(keys, [chunk_bytes(k, n) for k, n in zip(keys, sizes)])
    with fx100io.ChunkStore(u) as st:  # a new controller association finds them
        outs = [np.empty(n, np.uint8) for n in sizes]
        assert st.batch_get_blocking(keys, outs) == [True] * 6
        for o, k, n in zip(outs, keys, sizes):
            assert np.array_equal(o, chunk_bytes(k, n))


def test_bytes_land_on_the_real_device(rdma_lab):
    data = chunk_bytes("guest-check", 64 << 10)
    with fx100io.open_device(rdma_uri(rdma_lab, "lab-ram")) as dev:
        dev.write_from_blocking(MiB, data)
        dev.flush_blocking()
    out = subprocess.run(["dd", "if=/dev/ram0", "bs=4096", "skip=256", "count=16",
                          "iflag=direct"], capture_output=True, check=True).stdout
    assert hashlib.md5(out).hexdigest() == hashlib.md5(data.tobytes()).hexdigest()


def test_host_not_allowed_and_unknown_subsystem(rdma_lab):
    sub = rdma_lab.subsystem("lab-nvme")
    with pytest.raises(errors.DevicePermissionError, match="does not allow host"):
        fx100io.open_device(f"nvme+rdma://{rdma_lab.host}:{rdma_lab.rdma_port}/{sub.nqn}"
                            "?hostnqn=nqn.2026-11.io.fx100:intruder")
    with pytest.raises(errors.DeviceNotFoundError):
        fx100io.open_device(f"nvme+rdma://{rdma_lab.host}:{rdma_lab.rdma_port}/"
                            "nqn.2026-11.io.fx100:none")


def test_a_missing_namespace_is_not_called_an_rdma_problem(rdma_lab):
    with pytest.raises(errors.DeviceNotFoundError) as ei:
        fx100io.open_device(rdma_uri(rdma_lab, "lab-ram", ns=9))
    assert "RDMA" not in str(ei.value), str(ei.value)


def test_no_rdma_port_there_is_a_clear_error(rdma_lab):
    """The TCP port speaks no RDMA CM: the connect is refused (or times out), clearly."""
    with pytest.raises(errors.Fx100ioError) as ei:
        fx100io.open_device(f"nvme+rdma://{rdma_lab.host}:4999/{rdma_lab.subsystem('lab-ram').nqn}"
                            f"?hostnqn={rdma_lab.allowed_host_nqn}&connect_timeout_ms=3000")
    assert "RDMA" in str(ei.value) or "refused" in str(ei.value) or "timed out" in str(ei.value)


def test_unaligned_io_is_refused_clearly(rdma_lab):
    with fx100io.open_device(rdma_uri(rdma_lab, "lab-ram")) as dev:
        with pytest.raises(errors.InvalidArgumentError, match="whole blocks"):
            dev.read_into_blocking(100, bytearray(512))
        with pytest.raises(errors.Fx100ioError):
            dev.read_into_blocking(dev.size, bytearray(512))  # past the namespace


def test_bench_job_over_nvme_rdma(rdma_lab):
    u = rdma_uri(rdma_lab, "lab-ram")
    p = subprocess.run([sys.executable, "-m", "fx100io", "bench", "--name=t", "--rw=randrw",
                        "--bs=4k", "--iodepth=8", "--size=4m", "--direct=1",
                        "--ioengine=nvme+rdma", f"--filename={u}", "--output-format=json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    job = json.loads(p.stdout)["jobs"][0]
    assert job["read"]["io_bytes"] + job["write"]["io_bytes"] == 4 * MiB
    assert job["error"] == 0 and job["fx100io"]["ioengine"] == "nvme+rdma"
    # no Python per I/O: the C loop over the device's queue, every I/O counted once
    assert job["fx100io"]["io_loop"] == "c" and job["fx100io"]["io_loop_backend"] == "nvme+rdma queue"
    assert job["read"]["total_ios"] + job["write"]["total_ios"] == 1024


def _our_rc_qps() -> int:
    """RC queue pairs this process owns on the guest's RDMA devices (iproute2's rdma tool)."""
    out = subprocess.run(["rdma", "-j", "resource", "show", "qp"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return sum(1 for q in json.loads(out or "[]")
               if q.get("pid") == os.getpid() and q.get("type") == "RC")


def test_two_queue_pairs_per_thread_by_default(rdma_lab):
    # One queue pair per thread caps its reads at what rxe can move on one CPU
    # (docs/nvme-rdma.md, "Speed"): without `queues`, a thread's queue connects two.
    counts = {}
    for opts in ({}, {"queues": 1}):
        with fx100io.open_device(rdma_uri(rdma_lab, "lab-ram", **opts)) as dev:
            data = chunk_bytes(f"qps-{opts}", 64 << 10)
            assert dev.write_from_blocking(0, data) == len(data)
            out = np.empty(len(data), np.uint8)
            assert dev.read_into_blocking(0, out) == len(data)
            assert np.array_equal(out, data)
            counts[bool(opts)] = _our_rc_qps()
    # the admin queue's pair and the I/O queues' pairs
    assert counts[False] == counts[True] + 1, counts

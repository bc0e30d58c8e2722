"""Our NVMe/TCP initiator against the real Linux target (nvmet-tcp) in the fabric lab."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from support import chunk_bytes

import fx100io
from fx100io import errors

pytest_plugins = ["support.lab_fixture"]
pytestmark = pytest.mark.lab


def uri(lab, sub, **q) -> str:
    q.setdefault("hostnqn", lab.allowed_host_nqn)
    query = "&".join(f"{k}={v}" for k, v in q.items())
    return f"nvme+tcp://{lab.host}:{lab.port}/{lab.subsystem(sub).nqn}?{query}"


def test_discovery_lists_what_the_host_may_see(fabric_lab):
    entries = fx100io.discover(f"nvme+tcp://{fabric_lab.host}:{fabric_lab.port}"
                               f"?hostnqn={fabric_lab.allowed_host_nqn}")
    nqns = {e["subnqn"] for e in entries if e["subtype"] == "nvme"}
    assert nqns == {s.nqn for s in fabric_lab.subsystems}
    for e in entries:
        assert e["trtype"] == "tcp" and e["traddr"] == fabric_lab.host
        assert e["trsvcid"] == str(fabric_lab.port)


@pytest.mark.parametrize("sub", ["lab-ram", "lab-nvme"])
@pytest.mark.parametrize("digests", [0, 1], ids=["plain", "digests"])
@pytest.mark.parametrize("queues", [1, 3])
def test_identify_write_read_back(fabric_lab, sub, digests, queues):
    ns = fabric_lab.subsystem(sub).namespaces[0]
    with fx100io.open_device(uri(fabric_lab, sub, queues=queues, hdgst=digests,
                                 ddgst=digests)) as dev:
        assert dev.block_size == ns.block_size
        assert dev.size == ns.size_bytes
        assert dev.aligned_only
        bs = dev.block_size
        rng = np.random.default_rng(queues * 10 + digests)
        pool = fx100io.BufferPool(16 << 20)

        async def go():
            # sizes from one block to past MDTS/MAXH2CDATA, at scattered offsets
            jobs = []
            for i, n in enumerate([bs, 8 * bs, 96 << 10, 1 << 20, 3 << 20]):
                off = int(rng.integers(0, (dev.size - n) // bs)) * bs
                data = pool.alloc(n)
                data[:] = chunk_bytes(f"{sub}-{queues}-{digests}-{i}", n)
                jobs.append((off, data))
            await asyncio.gather(*(dev.write_from(off, d) for off, d in jobs))
            await dev.flush()
            outs = [pool.alloc(d.nbytes) for _, d in jobs]
            got = await asyncio.gather(*(dev.read_into(off, o) for (off, _), o in zip(jobs, outs)))
            return jobs, outs, got

        jobs, outs, got = asyncio.run(go())
        assert got == [d.nbytes for _, d in jobs]
        for (_, d), o in zip(jobs, outs):
            assert np.array_equal(o, d)


def test_bytes_land_on_the_real_device(fabric_lab):
    """What our initiator writes is on the guest's block device, read there
    by the guest kernel itself (dd of /dev/ram0)."""
    data = chunk_bytes("guest-check", 64 << 10)
    with fx100io.open_device(uri(fabric_lab, "lab-ram")) as dev:
        dev.write_from_blocking(1 << 20, data)
        dev.flush_blocking()
    rc, out = fabric_lab.guest("dd if=/dev/ram0 bs=4096 skip=256 count=16 2>/dev/null | md5sum")
    assert rc == 0, out
    import hashlib
    assert hashlib.md5(data.tobytes()).hexdigest() in out


def test_chunk_store_over_nvme_tcp(fabric_lab):
    u = uri(fabric_lab, "lab-nvme", queues=2)
    keys = [f"kv-{i}" for i in range(6)]
    sizes = [1, 4095, 4096, 100_000, 1 << 20, (2 << 20) + 17]
    with fx100io.ChunkStore(u, create=True) as st:
        st.batch_put_blocking(keys, [chunk_bytes(k, n) for k, n in zip(keys, sizes)])
    with fx100io.ChunkStore(u) as st:  # a new controller association finds them
        outs = [np.empty(n, np.uint8) for n in sizes]
        assert st.batch_get_blocking(keys, outs) == [True] * 6
        for o, k, n in zip(outs, keys, sizes):
            assert np.array_equal(o, chunk_bytes(k, n))


def test_host_not_allowed(fabric_lab):
    sub = fabric_lab.subsystem("lab-nvme")
    assert not sub.allow_any_host
    with pytest.raises(errors.DevicePermissionError, match="does not allow host"):
        fx100io.open_device(f"nvme+tcp://{fabric_lab.host}:{fabric_lab.port}/{sub.nqn}"
                            "?hostnqn=nqn.2026-11.io.fx100:intruder")


def test_unknown_subsystem_and_bad_uris(fabric_lab):
    with pytest.raises(errors.DeviceNotFoundError):
        fx100io.open_device(f"nvme+tcp://{fabric_lab.host}:{fabric_lab.port}/nqn.2026-11.io.fx100:none")
    with pytest.raises(errors.InvalidArgumentError, match="unknown URI option"):
        fx100io.open_device(uri(fabric_lab, "lab-ram", bogus=1))
    with pytest.raises(errors.InvalidArgumentError):
        fx100io.open_device(f"nvme+tcp://{fabric_lab.host}:{fabric_lab.port}/")


def test_unaligned_io_is_refused_clearly(fabric_lab):
    with fx100io.open_device(uri(fabric_lab, "lab-ram")) as dev:
        with pytest.raises(errors.InvalidArgumentError, match="whole blocks"):
            dev.read_into_blocking(100, bytearray(512))
        with pytest.raises(errors.InvalidArgumentError, match="whole blocks"):
            dev.write_from_blocking(0, b"x" * 100)
        with pytest.raises(errors.Fx100ioError):
            dev.read_into_blocking(dev.size, bytearray(512))  # past the namespace: LBA range


def test_blocking_from_threads_share_one_controller(fabric_lab):
    import threading
    with fx100io.open_device(uri(fabric_lab, "lab-ram", queues=2)) as dev:
        bad = []

        def worker(t):
            for i in range(5):
                off = (t * 5 + i) * (128 << 10)
                data = chunk_bytes(f"thr{t}-{i}", 128 << 10)
                dev.write_from_blocking(off, data)
                out = np.empty(128 << 10, np.uint8)
                dev.read_into_blocking(off, out)
                if not np.array_equal(out, data):
                    bad.append((t, i))

        ths = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        assert bad == []


def test_tshark_decodes_our_initiator(fabric_lab, tmp_path):
    """Wireshark's NVMe/TCP dissector reads every PDU we send and receive,
    digests on and off, reads and R2T-driven writes, with nothing malformed."""
    from support.tshark_capture import capture, decode
    pcap = tmp_path / "initiator.pcapng"
    with capture(fabric_lab.port, pcap):
        for q in ({}, {"hdgst": 1, "ddgst": 1}):
            with fx100io.open_device(uri(fabric_lab, "lab-ram", **q)) as dev:
                data = chunk_bytes("tshark", 512 * 600)
                dev.write_from_blocking(0, data)
                out = np.empty_like(data)
                dev.read_into_blocking(0, out)
                assert np.array_equal(out, data)
    counts, bad = decode(pcap, fabric_lab.port)
    assert bad == [], bad[:5]
    # ICReq, ICResp, CapsuleCmd, CapsuleResp, H2CData, C2HData, R2T all seen
    for t in (0x0, 0x1, 0x4, 0x5, 0x6, 0x7, 0x9):
        assert counts[t] > 0, (t, counts)


@pytest.mark.parametrize("digests", [0, 1], ids=["plain", "digests"])
def test_many_small_reads_in_flight_then_mixed_with_large(fabric_lab, digests):
    """64 small reads in flight on one queue (their PDUs received in bulk and
    parsed out of one buffer), then small and large reads in flight together
    (the large ones received straight into their buffers): every byte right."""
    with fx100io.open_device(uri(fabric_lab, "lab-ram", queues=1, hdgst=digests,
                                 ddgst=digests)) as dev:
        bs = dev.block_size
        pool = fx100io.BufferPool(32 << 20)
        region = 8 << 20
        data = pool.alloc(region)
        data[:] = chunk_bytes(f"lab-small-{digests}", region)
        small = [(i * 3 * 4096, 4096) for i in range(64)]
        mixed = [(o, n) for (o, n) in small[:16]] + [(1 << 20, 1 << 20), (5 << 20, 3 * bs)]

        async def go():
            await dev.write_from(0, data)
            await dev.flush()
            results = []
            for pieces in (small, mixed):
                before = dev.queue_stats()
                outs = [pool.alloc(n) for _, n in pieces]
                got = await asyncio.gather(*(dev.read_into(o, b) for (o, _), b in zip(pieces, outs)))
                results.append((pieces, outs, got, before, dev.queue_stats()))
            return results

        (sp, so, sg, s0, s1), (mp, mo, mg, _, _) = asyncio.run(go())
        assert sg == [n for _, n in sp] and mg == [n for _, n in mp]
        for pieces, outs in ((sp, so), (mp, mo)):
            for (o, n), b in zip(pieces, outs):
                assert np.array_equal(b, data[o:o + n]), (o, n)
        assert s1["bytes_copied"] - s0["bytes_copied"] == 64 * 4096

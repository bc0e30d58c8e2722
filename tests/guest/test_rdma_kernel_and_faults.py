"""NVMe/RDMA against the guest kernel's own initiator, and when the target goes away.

The guest kernel's `nvme connect -t rdma` and our initiator share the lab-ram namespace: what
one writes, the other reads.  Then the nvmet-rdma port is disabled under I/O (configfs), as a
target restart or a pulled port would: every request ends in right bytes or a clear error,
never wrong bytes or a hang, and the queue reconnects once the port is back.
"""

from __future__ import annotations

import glob
import os
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from rdma_uris import MiB, rdma_uri
from support import chunk_bytes

import fx100io
from fx100io import errors

pytest_plugins = ["support.lab_fixture", "guest_rdma"]
# each test body runs inside the lab guest (tests/support/lab_fixture.py: @pytest.mark.guest)
pytestmark = [pytest.mark.lab, pytest.mark.guest]

NVMET = Path("/sys/kernel/config/nvmet")


def _block_device_of(nqn: str) -> str | None:
    """/dev/nvmeXnY of the kernel's controller(s) for subsystem nqn, if attached."""
    for sub in glob.glob("/sys/class/nvme-subsystem/*"):
        if Path(sub, "subsysnqn").read_text().strip() != nqn:
            continue
        for ns in sorted(glob.glob(f"{sub}/nvme*n*")):
            name = os.path.basename(ns)
            if os.path.exists(f"/sys/block/{name}") and os.path.exists(f"/dev/{name}"):
                return f"/dev/{name}"
    return None


@contextmanager
def kernel_attached(lab, nqn: str):
    subprocess.run(["nvme", "connect", "-t", "rdma", "-a", lab.host, "-s", str(lab.rdma_port),
                    "-n", nqn, "-q", lab.allowed_host_nqn], check=True, capture_output=True,
                   text=True, timeout=60)
    try:
        dev = None
        for _ in range(100):
            dev = _block_device_of(nqn)
            if dev:
                break
            time.sleep(0.1)
        assert dev, f"nvme connect -t rdma made no block device for {nqn}"
        yield dev
    finally:
        subprocess.run(["nvme", "disconnect", "-n", nqn], capture_output=True, timeout=60)
    assert _block_device_of(nqn) is None


def dd(*args: str) -> bytes:
    return subprocess.run(["dd", *args, "status=none"], check=True, capture_output=True,
                          timeout=120).stdout


def test_kernel_writes_we_read_and_the_other_way(rdma_lab, tmp_path):
    nqn = rdma_lab.subsystem("lab-ram").nqn
    theirs = chunk_bytes("kernel-wrote", 2 * MiB).tobytes()
    ours = chunk_bytes("we-wrote", 2 * MiB)
    src = tmp_path / "theirs.bin"
    src.write_bytes(theirs)
    with kernel_attached(rdma_lab, nqn) as blk:
        dd(f"if={src}", f"of={blk}", "bs=1M", "seek=20", "oflag=direct", "conv=fsync")
        with fx100io.open_device(rdma_uri(rdma_lab, "lab-ram")) as dev:
            out = np.empty(2 * MiB, np.uint8)
            dev.read_into_blocking(20 * MiB, out)
            assert out.tobytes() == theirs
            dev.write_from_blocking(40 * MiB, ours)
            dev.flush_blocking()
        got = dd(f"if={blk}", "bs=1M", "skip=40", "count=2", "iflag=direct")
        assert got == ours.tobytes()


def _rdma_port_dir() -> Path:
    for port in NVMET.glob("ports/*"):
        if (port / "addr_trtype").read_text().strip() == "rdma":
            return port
    raise AssertionError("no nvmet rdma port in configfs")


@contextmanager
def rdma_port_disabled():
    """Unlink every subsystem from the nvmet-rdma port (the port goes down and its
    controllers with it), and link them back afterwards."""
    port = _rdma_port_dir()
    links = sorted(p.name for p in (port / "subsystems").iterdir())
    for name in links:
        os.unlink(port / "subsystems" / name)
    try:
        yield
    finally:
        for name in links:
            os.symlink(NVMET / "subsystems" / name, port / "subsystems" / name)


def test_port_disabled_under_io_gives_right_bytes_or_clear_errors(rdma_lab):
    u = rdma_uri(rdma_lab, "lab-ram", io_timeout_ms=5000, reconnect_ms=200, max_reconnects=50,
                 kato_ms=2000)
    n = 256 << 10
    blocks = [chunk_bytes(f"outage-{i}", n) for i in range(16)]
    with fx100io.open_device(u) as dev:
        for i, b in enumerate(blocks):
            dev.write_from_blocking(i * n, b)
        wrong: list[int] = []
        errs: list[str] = []
        ok = [0]
        stop = threading.Event()

        def reader() -> None:
            out = np.empty(n, np.uint8)
            i = 0
            while not stop.is_set():
                k = i % len(blocks)
                try:
                    dev.read_into_blocking(k * n, out)
                except errors.Fx100ioError as e:
                    errs.append(type(e).__name__)
                    continue
                finally:
                    i += 1
                if not np.array_equal(out, blocks[k]):
                    wrong.append(k)
                ok[0] += 1

        th = threading.Thread(target=reader)
        th.start()
        try:
            time.sleep(1.0)
            with rdma_port_disabled():
                time.sleep(2.0)
            # the port is back: reads go on over re-made queues (and a re-opened controller)
            deadline = time.monotonic() + 60
            before = ok[0]
            while ok[0] < before + 20 and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            stop.set()
            th.join(timeout=120)
        assert not th.is_alive(), "a read hung"
        assert wrong == []
        assert ok[0] >= before + 20, f"no reads after the port came back ({errs[-5:]})"
        # after the outage, a fresh read on this thread works too
        out = np.empty(n, np.uint8)
        dev.read_into_blocking(3 * n, out)
        assert np.array_equal(out, blocks[3])


def test_a_long_outage_fails_requests_clearly_then_recovers(rdma_lab):
    u = rdma_uri(rdma_lab, "lab-ram", io_timeout_ms=3000, reconnect_ms=200, max_reconnects=3,
                 kato_ms=2000, connect_timeout_ms=2000)
    data = chunk_bytes("long-outage", 64 << 10)
    with fx100io.open_device(u) as dev:
        dev.write_from_blocking(0, data)
        with rdma_port_disabled():
            out = np.empty(64 << 10, np.uint8)
            t = time.monotonic()
            with pytest.raises((errors.FxConnectionError, errors.FxTimeoutError)):
                for _ in range(3):  # the first may still find the old queue
                    dev.read_into_blocking(0, out)
            assert time.monotonic() - t < 60
        out = np.empty(64 << 10, np.uint8)
        deadline = time.monotonic() + 60
        while True:
            try:
                dev.read_into_blocking(0, out)
                break
            except (errors.FxConnectionError, errors.FxTimeoutError):
                assert time.monotonic() < deadline, "never reconnected after the port came back"
                time.sleep(0.5)
        assert np.array_equal(out, data)
        assert dev.queue_stats()["reconnects"] >= 1

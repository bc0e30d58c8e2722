"""`fx100io bench` over NVMe/TCP in the C I/O loop (csrc/bench_loop.c's
fx_queue backend), against our own target on loopback over a real file.

Counts are exact (no --time_based: every job issues exactly --size once),
written data is read back from the namespace file byte for byte, and the
read/write mix of a job is the same as the io_uring backend's on a local
file with the same seed (one pattern generator for both backends)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.bench import bench, popen_until_jobs_run

REPO = Path(__file__).resolve().parents[2]
KiB, MiB = 1 << 10, 1 << 20
NQN = "nqn.2026-11.io.fx100:benchq"
NS_SIZE = 4 * MiB
SEED = 4242


def _core_missing() -> str | None:
    try:
        from fx100io import _core

        _core.BenchLoop  # noqa: B018
    except (ImportError, AttributeError) as e:
        return f"fx100io core not built ({e})"
    return None


pytestmark = pytest.mark.skipif(_core_missing() is not None, reason=str(_core_missing()))




def initial_bytes() -> bytes:
    return np.random.default_rng(99).integers(0, 256, size=NS_SIZE, dtype=np.uint8).tobytes()


@pytest.fixture
def target(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(URI, namespace file) of our target serving a 4 MiB file of known bytes."""
    from support.target_process import serve

    ns = tmp_path / "ns.img"
    ns.write_bytes(initial_bytes())
    with serve([str(ns)], NQN, block_size=4096) as (host, port, _):
        yield f"nvme+tcp://{host}:{port}/{NQN}", ns


def write_buffers(bs: int, depth: int) -> list[bytes]:
    """The payloads a write job sends (workload._buffers, same seed)."""
    rng = np.random.default_rng(SEED)
    return [rng.integers(0, 256, size=bs, dtype=np.uint8).tobytes() for _ in range(depth)]


CASES = [
    ("read", 4 * KiB, 1),
    ("randread", 4 * KiB, 32),
    ("read", 128 * KiB, 32),
    ("write", 4 * KiB, 1),
    ("write", 128 * KiB, 32),
    ("randwrite", 4 * KiB, 32),
    ("randwrite", 64 * KiB, 1),
    ("rw", 4 * KiB, 32),
    ("randrw", 4 * KiB, 1),
    ("randrw", 128 * KiB, 32),
]


@pytest.mark.parametrize(("rw", "bs", "depth"), CASES, ids=[f"{r}-{b // KiB}k-qd{d}" for r, b, d in CASES])
def test_counts_and_bytes_are_exact(target, tmp_path: Path, rw: str, bs: int, depth: int) -> None:
    uri, ns = target
    size = 2 * MiB
    common = [f"--rw={rw}", f"--bs={bs}", f"--iodepth={depth}", f"--size={size}", f"--randseed={SEED}",
              "--rwmixread=60", "--output-format=json"]
    rc, out, err = bench("--name=q", *common, "--ioengine=nvme+tcp", f"--filename={uri}")
    assert rc == 0, err
    job = json.loads(out)["jobs"][0]
    assert job["error"] == 0
    fx = job["fx100io"]
    assert fx["io_loop"] == "c" and fx["io_loop_backend"] == "nvme+tcp queue", fx
    assert "io_uring_features" not in fx
    r, w = job["read"], job["write"]
    n = size // bs
    assert r["total_ios"] + w["total_ios"] == n
    assert r["io_bytes"] == r["total_ios"] * bs and w["io_bytes"] == w["total_ios"] * bs
    assert r["short_ios"] == w["short_ios"] == 0
    assert r["clat_ns"]["N"] == r["total_ios"] and w["clat_ns"]["N"] == w["total_ios"]

    data = ns.read_bytes()
    init = initial_bytes()
    assert data[size:] == init[size:]  # nothing past the region
    if rw in ("read", "randread"):
        assert w["total_ios"] == 0 and data == init
        return
    if rw in ("write", "randwrite"):
        assert r["total_ios"] == 0
        bufs = set(write_buffers(bs, depth))
        # every block of the region was written once, with one of the buffers
        for i in range(n):
            assert data[i * bs:(i + 1) * bs] in bufs, f"block {i}"
        return
    # A mix: the same job on a local file (the io_uring backend, the same
    # seed) issues the same reads and writes; at iodepth 1 every write uses
    # the one buffer in the same order, so the files end up byte-equal.
    local = tmp_path / "local.img"
    local.write_bytes(init)
    rc, out, err = bench("--name=q", *common, "--ioengine=io_uring", f"--filename={local}")
    assert rc == 0, err
    ljob = json.loads(out)["jobs"][0]
    assert ljob["fx100io"]["io_loop"] == "c" and ljob["fx100io"]["io_loop_backend"] == "io_uring"
    assert (ljob["read"]["total_ios"], ljob["write"]["total_ios"]) == (r["total_ios"], w["total_ios"])
    assert 0 < r["total_ios"] < n
    if depth == 1:
        assert data == local.read_bytes()
    else:
        # A buffer that a read filled goes out with the next write from it,
        # so every block now holds a write payload or some block's first bytes.
        allowed = set(write_buffers(bs, depth)) | {init[i:i + bs] for i in range(0, NS_SIZE, bs)}
        changed = [i for i in range(n) if data[i * bs:(i + 1) * bs] != init[i * bs:(i + 1) * bs]]
        assert changed
        assert all(data[i * bs:(i + 1) * bs] in allowed for i in changed)


def test_normal_report_names_the_queue_backend(target, capfd) -> None:
    uri, _ = target
    rc, out, err = bench("--name=q", "--rw=randread", "--bs=4k", "--iodepth=8", "--size=256k",
                         "--ioengine=nvme+tcp", f"--filename={uri}")
    assert rc == 0, err
    assert "I/O loop     : C (nvme+tcp queue)" in out
    assert "Python I/O loop" not in err + capfd.readouterr().err


def test_verify_keeps_the_python_loop_and_says_why(target, capfd) -> None:
    uri, _ = target
    rc, out, err = bench("--name=q", "--rw=write", "--bs=4k", "--iodepth=4", "--size=128k",
                         "--verify=crc32c", "--ioengine=nvme+tcp", f"--filename={uri}",
                         "--output-format=json")
    assert rc == 0, err
    err += capfd.readouterr().err
    assert "runs on the Python I/O loop, not the C loop (--verify checks blocks in Python)" in err
    job = json.loads(out)["jobs"][0]
    assert job["fx100io"]["io_loop"] == "python" and "io_loop_backend" not in job["fx100io"]
    assert job["write"]["total_ios"] == 32


def test_region_past_the_end_is_refused(target) -> None:
    uri, _ = target
    rc, _, err = bench("--name=q", "--rw=read", "--bs=4k", "--offset=3m", "--size=2m",
                       "--ioengine=nvme+tcp", f"--filename={uri}")
    assert rc == 1
    assert "job 'q': --offset + --size = 5242880 bytes runs past the end of" in err, err
    assert f"({NS_SIZE} bytes)" in err


# ------------------------------------------------------------ the binding


@pytest.fixture
def device(target) -> Iterator[tuple[object, Path]]:
    import fx100io

    uri, ns = target
    dev = fx100io.open_device(uri, queue_depth=32)
    try:
        yield dev, ns
    finally:
        dev.close()


def _bufs(count: int, bs: int, fill: int) -> tuple[object, list[np.ndarray]]:
    import fx100io

    pool = fx100io.BufferPool(bs * count)
    bufs = [pool.alloc(bs) for _ in range(count)]
    for b in bufs:
        b[:] = fill
    return pool, bufs


def test_stamped_write_pass_lands_byte_exact(device) -> None:
    """A random-order write pass through the queue, 32 in flight: every
    block written exactly once, carrying its own offset (BL_STAMP) and the
    buffer's bytes; then each block read back alone into a buffer equals the
    file."""
    from fx100io import _core

    dev, ns = device
    bs, n = 4096, 512
    pool, bufs = _bufs(32, bs, 0xC3)
    q = dev.raw_queue()
    bl = _core.BenchLoop(q, 0, n, bs, bufs, random=True, random_map=True, read_fraction=0.0,
                         seed=5, passes=1, flags=_core.BL_STAMP)
    assert bl.backend == "queue" and bl.features == [] and bl.refused == {}
    while not bl.run(0):
        pass
    assert bl.counters() == (0, 0, n, n * bs)
    assert sum(bl.depths()) == n
    assert bl.close()
    data = ns.read_bytes()
    for i in range(n):
        blk = data[i * bs:(i + 1) * bs]
        assert int.from_bytes(blk[:8], "little") == i * bs
        assert blk[8:] == b"\xc3" * (bs - 8)
    assert data[n * bs:] == initial_bytes()[n * bs:]

    (one,) = bufs[:1]
    for i in (0, 7, n - 1, n, 1023):
        bl = _core.BenchLoop(q, i * bs, 1, bs, [one], passes=1)
        while not bl.run(0):
            pass
        assert bl.counters() == (1, bs, 0, 0)
        assert bl.close()
        assert bytes(one) == data[i * bs:(i + 1) * bs], i
    del bufs, one
    pool.close()


def test_read_past_the_end_fails_with_offset_and_queue_stays_usable(device) -> None:
    """Reads past the namespace fail (the target answers LBA Out of Range):
    the run ends with the NVMe status, the offset of the first such read and
    its direction, after the ones before it are done and the rest drained."""
    from fx100io import _core
    from fx100io.errors import NvmeStatusError

    dev, ns = device
    bs = 4096
    pool, bufs = _bufs(4, bs, 0)
    q = dev.raw_queue()
    first = NS_SIZE - 2 * bs
    bl = _core.BenchLoop(q, first, 3, bs, bufs, passes=1)  # the last one past the end
    with pytest.raises(OSError) as ei:
        while not bl.run(0):
            pass
    e = ei.value
    assert e.offset == NS_SIZE and e.is_read is True, e
    assert isinstance(e, NvmeStatusError) and e.status & 0xFF == 0x80, e  # LBA Out of Range
    assert f"read at offset {NS_SIZE}" in str(e)
    assert bl.inflight == 0
    assert bl.counters()[:2] == (2, 2 * bs)
    assert bl.close()
    out = bytearray(bs)
    assert dev.read_into_blocking(first, out) == bs
    assert bytes(out) == ns.read_bytes()[first:first + bs]
    del bufs
    pool.close()


def test_stop_drains_the_queue(device) -> None:
    """An unbounded loop stopped after one slice: it drains, leaves nothing
    in flight on the queue, and the device reads correctly afterwards."""
    from fx100io import _core

    dev, ns = device
    bs = 4096
    pool, bufs = _bufs(16, bs, 0)
    q = dev.raw_queue()
    bl = _core.BenchLoop(q, 0, 256, bs, bufs, random=True, passes=0)
    assert bl.run(0) is False
    assert bl.inflight > 0
    bl.stop()
    while not bl.run(0):
        pass
    assert bl.inflight == 0 and q.pending == 0
    assert bl.counters()[0] > 0
    assert bl.close()
    assert q.reap() == []
    out = bytearray(bs)
    assert dev.read_into_blocking(5 * bs, out) == bs
    assert bytes(out) == ns.read_bytes()[5 * bs:6 * bs]
    del bufs
    pool.close()


def test_io_uring_flags_do_not_apply_to_a_queue(device) -> None:
    from fx100io import _core

    dev, _ = device
    pool, bufs = _bufs(1, 4096, 0)
    with pytest.raises(OSError) as ei:
        _core.BenchLoop(dev.raw_queue(), 0, 1, 4096, bufs, flags=_core.BL_REGRING)
    assert ei.value.errno == 22
    del bufs
    pool.close()


# ------------------------------------------------------------ whole runs


def test_ctrl_c_stops_a_queue_job_and_it_still_reports(target) -> None:
    uri, _ = target
    p, seen, reader = popen_until_jobs_run([sys.executable, "-m", "fx100io.bench",
        "--name=c", "--rw=randread", "--bs=4k", "--iodepth=16", "--size=1m", "--time_based",
        "--runtime=60", "--ioengine=nvme+tcp", f"--filename={uri}", "--output-format=json", "--eta=always"])
    p.send_signal(signal.SIGINT)
    out = p.stdout.read().decode() if p.stdout else ""
    p.wait(timeout=60)
    reader.join(10)
    assert p.returncode == 0, seen.decode(errors="replace")
    job = json.loads(out)["jobs"][0]
    assert job["fx100io"]["io_loop"] == "c" and job["fx100io"]["io_loop_backend"] == "nvme+tcp queue"
    assert job["read"]["io_bytes"] > 0 and job["error"] == 0
    assert job["read"]["io_bytes"] == job["read"]["total_ios"] * 4096


def test_target_killed_mid_run_ends_the_job_with_a_clear_error(tmp_path: Path) -> None:
    """The target dies under a running job: the job ends (no hang) with an
    error naming the I/O, its offset and the transport's reason."""
    from support.target_process import serve

    ns = tmp_path / "ns.img"
    ns.write_bytes(b"\0" * NS_SIZE)
    with serve([str(ns)], NQN, block_size=4096) as (host, port, tp):
        uri = f"nvme+tcp://{host}:{port}/{NQN}?max_reconnects=0&reconnect_ms=10"
        p, seen, reader = popen_until_jobs_run([sys.executable, "-m", "fx100io.bench",
            "--name=k", "--rw=randrw", "--bs=4k", "--iodepth=32", "--size=1m", "--time_based",
            "--runtime=120", "--ioengine=nvme+tcp", f"--filename={uri}", "--eta=always"])
        tp.kill()
        tp.wait()
        out = p.stdout.read().decode() if p.stdout else ""
        p.wait(timeout=90)
        reader.join(10)
    err = seen.decode(errors="replace")
    assert p.returncode != 0, out + err
    text = out + err
    assert "I/O loop     : C (nvme+tcp queue)" in text, text
    assert "bytes at offset" in text and "failed" in text, text
    assert os.path.getsize(ns) == NS_SIZE


def test_queue_closed_under_the_loop_is_never_touched(device) -> None:
    """The device's queue closed while the loop has I/O on it: run() says
    the queue is closed and close() gives up at once (keeping the buffers)
    rather than wait on a queue that is gone."""
    from fx100io import _core
    from fx100io.errors import Fx100ioError

    dev, _ = device
    pool, bufs = _bufs(8, 4096, 0)
    q = dev.raw_queue()
    bl = _core.BenchLoop(q, 0, 64, 4096, bufs, passes=0)
    assert bl.run(0) is False and bl.inflight > 0
    q.close()
    with pytest.raises(Fx100ioError) as ei:
        bl.run(0)
    assert ei.value.errno == 9
    assert bl.close() is False  # gave up on what was in flight: buffers kept
    assert bl.close() is True  # idempotent: nothing left to close
    del bufs


def test_c_loop_refusal_for_queue_targets(tmp_path: Path) -> None:
    import types

    from fx100io import _core
    from fx100io.bench import workload
    from fx100io.bench.options import parse_cli, resolve_job

    uri = f"nvme+tcp://127.0.0.1:4420/{NQN}"
    target = types.SimpleNamespace(path=None, created=False)

    def job(*extra: str):
        return resolve_job(parse_cli(["--name=z", f"--filename={uri}", "--rw=randread", *extra]).jobs[0])

    assert workload.c_loop_refusal(job(), target) is None
    assert workload.c_loop_on_queue(job(), target)
    assert workload.open_c_loop_fd(job(), target, 0) is None
    assert workload.c_loop_refusal(job("--verify=crc32c"), target) == "--verify checks blocks in Python"
    assert not workload.c_loop_on_queue(job("--verify=crc32c"), target)
    why = workload.c_loop_refusal(job(f"--iodepth={_core.BL_MAX_DEPTH + 1}"), target)
    assert why == f"iodepth={_core.BL_MAX_DEPTH + 1} is more than the C loop's {_core.BL_MAX_DEPTH}"
    rdma = resolve_job(parse_cli(["--name=z", f"--filename=nvme+rdma://127.0.0.1:4420/{NQN}"]).jobs[0])
    assert workload.c_loop_refusal(rdma, target) is None

"""The C I/O loop of `fx100io bench` (csrc/bench_loop.c, _core.BenchLoop):
what it writes lands where it says, its histogram agrees with its counts,
failed I/O comes back as clear exceptions, and the bench uses it for files
while keeping the Python loop for what it cannot do.  No timing is asserted."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
KiB, MiB = 1 << 10, 1 << 20

_core = pytest.importorskip("fx100io._core")
if not hasattr(_core, "BenchLoop"):
    pytest.skip("fx100io core built without the bench loop", allow_module_level=True)

import fx100io  # noqa: E402
from fx100io.bench import cli  # noqa: E402
from fx100io.bench.errors import BenchError  # noqa: E402
from fx100io.bench.options import DEFAULT_PERCENTILES  # noqa: E402
from fx100io.bench.stats import DirStats, bucket_index  # noqa: E402

ALL_OPTS = _core.BL_REGFILES | _core.BL_FIXEDBUFS | _core.BL_REGRING


def run_to_end(bl: _core.BenchLoop) -> None:
    while not bl.run(time.monotonic_ns() + 50_000_000):
        pass


def bufs_of(pool: fx100io.BufferPool, n: int, bs: int, fill: int) -> list[np.ndarray]:
    out = [pool.alloc(bs) for _ in range(n)]
    for b in out:
        b[:] = fill
    return out


@pytest.fixture
def pool():
    p = fx100io.BufferPool(4 * MiB)
    yield p
    p.close()


def make_file(path: Path, size: int, byte: int = 0) -> None:
    with open(path, "wb") as f:
        f.write(bytes([byte]) * size)


@pytest.mark.parametrize("flags", [0, ALL_OPTS, _core.BL_SQPOLL | ALL_OPTS])
@pytest.mark.parametrize("random,random_map", [(False, True), (True, True)])
@pytest.mark.parametrize("batch_submit", [0, 1, 5])
def test_each_block_written_once_where_the_loop_says(tmp_path: Path, pool, flags, random, random_map,
                                                      batch_submit) -> None:
    """Writes stamped with their offset: reading the file back shows every
    block of the region written exactly once per pass (a permutation), the
    rest of each block is the buffer's bytes, and nothing outside the region
    was touched."""
    bs, n, start = 4 * KiB, 300, 8 * KiB
    f = tmp_path / "w.img"
    make_file(f, start + n * bs + 8 * KiB, 0xEE)
    fd = os.open(f, os.O_RDWR | os.O_DIRECT)
    try:
        bufs = bufs_of(pool, 16, bs, 0x5A)
        bl = _core.BenchLoop(fd, start, n, bs, bufs, random=random, random_map=random_map,
                             read_fraction=0.0, seed=7, passes=1, flags=flags | _core.BL_STAMP,
                             batch_submit=batch_submit)
        run_to_end(bl)
        rios, rbytes, wios, wbytes = bl.counters()
        assert (rios, rbytes, wios, wbytes) == (0, 0, n, n * bs)
        assert bl.inflight == 0
        assert sum(bl.depths()) == n
        bl.close()
    finally:
        os.close(fd)
    data = f.read_bytes()
    assert data[:start] == b"\xee" * start
    assert data[start + n * bs :] == b"\xee" * (8 * KiB)
    for i in range(n):
        blk = data[start + i * bs : start + (i + 1) * bs]
        assert int.from_bytes(blk[:8], "little") == start + i * bs
        assert blk[8:] == b"\x5a" * (bs - 8)


def issue_order(pool, n: int, passes: int, *, random: bool = True, random_map: bool = True,
                seed: int = 0) -> list[int]:
    """Block numbers in the order the loop issues its writes: one I/O in
    flight into a pipe (which ignores the offset and keeps the order), each
    write stamped with its offset."""
    bs = 4 * KiB
    r, w = os.pipe()
    got = bytearray()

    def drain() -> None:
        while len(got) < n * passes * bs:
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            got.extend(chunk)

    import threading

    t = threading.Thread(target=drain)
    t.start()
    try:
        bl = _core.BenchLoop(w, 0, n, bs, bufs_of(pool, 1, bs, 2), random=random, random_map=random_map,
                             read_fraction=0.0, seed=seed, passes=passes, flags=_core.BL_STAMP)
        run_to_end(bl)
        bl.close()
    finally:
        os.close(w)
        t.join(60)
        os.close(r)
    assert len(got) == n * passes * bs
    return [int.from_bytes(got[i * bs : i * bs + 8], "little") // bs for i in range(n * passes)]


def test_random_passes_are_permutations_with_different_orders(pool) -> None:
    """Each pass of a random map issues every block once, in an order that
    is neither sequential nor the previous pass's; the same seed gives the
    same orders, another seed others."""
    n = 64
    order = issue_order(pool, n, 2, seed=5)
    p1, p2 = order[:n], order[n:]
    assert sorted(p1) == list(range(n)) and sorted(p2) == list(range(n))
    assert p1 != list(range(n)) and p2 != list(range(n)) and p1 != p2
    assert issue_order(pool, n, 2, seed=5) == order
    assert issue_order(pool, n, 2, seed=6) != order
    assert issue_order(pool, n, 1, random=False) == list(range(n))


def test_uniform_random_repeats_blocks(pool) -> None:
    """Without a random map blocks are drawn independently: some twice,
    some never, all inside the region."""
    n = 64
    order = issue_order(pool, n, 2, random_map=False, seed=1)
    assert len(order) == 2 * n and all(0 <= b < n for b in order)
    assert 0 < len(set(order)) < n


def test_mixed_reads_and_writes_add_up(tmp_path: Path, pool) -> None:
    bs, n = 4 * KiB, 512
    f = tmp_path / "m.img"
    make_file(f, n * bs)
    fd = os.open(f, os.O_RDWR | os.O_DIRECT)
    try:
        bl = _core.BenchLoop(fd, 0, n, bs, bufs_of(pool, 8, bs, 3), random=True, read_fraction=0.5,
                             passes=1, flags=ALL_OPTS)
        run_to_end(bl)
        rios, rbytes, wios, wbytes = bl.counters()
        assert rios + wios == n and rios > 0 and wios > 0
        assert rbytes == rios * bs and wbytes == wios * bs
        bl.close()
    finally:
        os.close(fd)


def test_histogram_buckets_match_the_python_layout() -> None:
    values = [0, 1, 127, 255, 256, 257, 511, 512, 1000, 4095, 4096, 10**6, 2**40 + 12345, 2**63 - 1]
    values += np.random.default_rng(1).integers(0, 2**62, size=2000).tolist()
    want = bucket_index(np.array(values, dtype=np.int64)).tolist()
    assert [_core.bench_bucket(v) for v in values] == want
    assert _core.bench_bucket(2**64 - 1) == want[values.index(2**63 - 1)]  # clamped, never out of range
    assert len(DirStats().counts) == _core.BL_NBUCKETS


def test_percentiles_consistent_with_counts(tmp_path: Path, pool) -> None:
    bs, n = 4 * KiB, 2000
    f = tmp_path / "h.img"
    make_file(f, n * bs)
    fd = os.open(f, os.O_RDONLY | os.O_DIRECT)
    try:
        bl = _core.BenchLoop(fd, 0, n, bs, bufs_of(pool, 8, bs, 0), random=True, passes=1, flags=ALL_OPTS)
        run_to_end(bl)
        d = bl.stats(True)
        counts = np.frombuffer(d["counts"], dtype=np.uint64)
        assert int(counts.sum()) == d["ios"] == n
        assert d["bytes"] == n * bs and d["short_ios"] == 0
        assert 0 < d["min_ns"] <= d["max_ns"]
        assert d["min_ns"] * n <= d["sum_ns"] <= d["max_ns"] * n
        nz = np.nonzero(counts)[0]
        assert _core.bench_bucket(d["min_ns"]) == nz[0] and _core.bench_bucket(d["max_ns"]) == nz[-1]
        ds = DirStats()
        ds.load(d["ios"], d["bytes"], d["short_ios"], counts, d["min_ns"], d["max_ns"], d["sum_ns"], d["sumsq"])
        pcts = tuple(float(p) for p in DEFAULT_PERCENTILES.split(":")) + (100.0,)
        py = ds.percentiles(pcts)
        c = [bl.percentile(True, p) for p in pcts]
        assert c == [py[p] for p in pcts]
        assert c == sorted(c)
        # the top rank lands in the max's bucket (reported as its midpoint, clamped)
        assert _core.bench_bucket(c[-1]) == _core.bench_bucket(d["max_ns"]) and c[-1] <= d["max_ns"]
        # The write side saw nothing and says so.
        assert bl.stats(False)["ios"] == 0 and bl.percentile(False, 50) == 0
        bl.close()
    finally:
        os.close(fd)


def test_misaligned_direct_io_is_a_clear_einval(tmp_path: Path, pool) -> None:
    bs = 4 * KiB
    f = tmp_path / "a.img"
    make_file(f, 64 * KiB)
    fd = os.open(f, os.O_RDONLY | os.O_DIRECT)
    try:
        raw = pool.alloc(2 * bs)
        bl = _core.BenchLoop(fd, 0, 16, bs, [raw[1 : 1 + bs]], passes=1)
        with pytest.raises(OSError) as ei:
            run_to_end(bl)
        assert ei.value.errno == errno.EINVAL
        assert ei.value.offset == 0 and ei.value.is_read is True
        assert "read at offset 0" in str(ei.value)
        assert bl.inflight == 0  # the rest drained before the error came back
        bl.close()
        # A misaligned offset, through registered buffers and file this time.
        bl = _core.BenchLoop(fd, 512 + 1, 4, bs, bufs_of(pool, 2, bs, 0), passes=1, flags=ALL_OPTS)
        with pytest.raises(OSError) as ei:
            run_to_end(bl)
        assert ei.value.errno == errno.EINVAL and ei.value.offset % bs == 513 % bs
        bl.close()
    finally:
        os.close(fd)


def test_reading_past_the_end_is_an_eof_error(tmp_path: Path, pool) -> None:
    bs = 4 * KiB
    f = tmp_path / "e.img"
    make_file(f, 4 * bs)
    fd = os.open(f, os.O_RDONLY | os.O_DIRECT)
    try:
        bl = _core.BenchLoop(fd, 0, 8, bs, bufs_of(pool, 1, bs, 0), passes=1, flags=ALL_OPTS)
        with pytest.raises(EOFError) as ei:
            run_to_end(bl)
        assert ei.value.offset == 4 * bs and "returned 0 bytes" in str(ei.value)
        assert bl.counters()[0] == 4
        bl.close()
    finally:
        os.close(fd)


def test_bad_arguments_refused(tmp_path: Path, pool) -> None:
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        b = bufs_of(pool, 1, 4096, 0)
        with pytest.raises(OSError):
            _core.BenchLoop(fd, 0, 0, 4096, b)  # empty region
        with pytest.raises(ValueError):
            _core.BenchLoop(fd, 0, 1, 8192, b)  # buffer smaller than bs
        with pytest.raises(ValueError):
            _core.BenchLoop(fd, 0, 1, 4096, [])
        with pytest.raises(OSError):
            _core.BenchLoop(-1, 0, 1, 4096, b)
    finally:
        os.close(fd)


def test_stop_drains_and_ends_a_time_based_loop(tmp_path: Path, pool) -> None:
    bs, n = 4 * KiB, 256
    f = tmp_path / "s.img"
    make_file(f, n * bs)
    fd = os.open(f, os.O_RDONLY | os.O_DIRECT)
    try:
        bl = _core.BenchLoop(fd, 0, n, bs, bufs_of(pool, 8, bs, 0), random=True, passes=0, flags=ALL_OPTS)
        assert bl.run(time.monotonic_ns() + 20_000_000) is False  # unbounded: only the slice ended
        bl.stop()
        assert bl.run(time.monotonic_ns() + 10**12) is True
        assert bl.inflight == 0
        ios = bl.counters()[0]
        assert ios > 0 and bl.stats(True)["ios"] == ios
        bl.close()
        with pytest.raises(ValueError):
            bl.run(0)
    finally:
        os.close(fd)


# ------------------------------------------------------------ through the bench


def bench(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = cli.run([*argv, "--output-format=json"], stdout=out, stderr=err)
    assert rc == 0, err.getvalue()
    return rc, out.getvalue()


@pytest.mark.parametrize("opts", [[], ["--fixedbufs=0", "--registerfiles=0"], ["--sqthread_poll"],
                                  ["--iodepth_batch_submit=0"], ["--iodepth_batch=3"]])
def test_bench_randwrite_bytes_read_back(tmp_path: Path, opts: list[str]) -> None:
    """Every block of the region holds one of the job's write buffers (made
    from --randseed as the workload makes them), none is left unwritten."""
    f = tmp_path / "w.img"
    bs, depth, size = 4 * KiB, 4, 1 * MiB
    _, out = bench("--name=w", f"--filename={f}", "--rw=randwrite", f"--bs={bs}", f"--size={size}",
                   f"--iodepth={depth}", "--direct=1", "--randseed=99", *opts)
    job = json.loads(out)["jobs"][0]
    assert job["write"]["io_bytes"] == size and job["write"]["total_ios"] == size // bs
    rng = np.random.default_rng(99)
    payloads = {rng.integers(0, 256, size=bs, dtype=np.uint8).tobytes() for _ in range(depth)}
    data = f.read_bytes()
    assert len(data) == size
    assert all(data[i : i + bs] in payloads for i in range(0, size, bs))
    # clat percentiles in the report come from the same histogram as the count
    pct = job["write"]["clat_ns"]["percentile"]
    vals = [pct[k] for k in sorted(pct, key=float)]
    assert vals == sorted(vals) and vals[-1] <= job["write"]["clat_ns"]["max"]


def test_bench_read_job_through_c_loop_counts_and_depths(tmp_path: Path) -> None:
    f = tmp_path / "r.img"
    make_file(f, 2 * MiB, 1)
    _, out = bench("--name=r", f"--filename={f}", "--rw=randread", "--bs=4k", "--iodepth=16",
                   "--direct=1", "--loops=2")
    job = json.loads(out)["jobs"][0]
    assert job["read"]["total_ios"] == 2 * 512 and job["read"]["io_bytes"] == 4 * MiB
    assert job["read"]["clat_ns"]["N"] == 2 * 512
    assert sum(job["iodepth_level"].values()) == pytest.approx(100.0, abs=0.5)


@pytest.mark.parametrize("engine", ["io_uring", "psync"])  # the C loop, the Python loop
def test_io_size_ends_early_or_wraps_around_the_region(tmp_path: Path, engine: str) -> None:
    """--io_size less than the region ends the job early, more wraps around it
    (every block once per pass with the random map); --number_ios caps each
    loop."""
    f = tmp_path / "w.img"
    bs, size = 4 * KiB, 1 * MiB
    make_file(f, size)
    common = ["--name=w", f"--filename={f}", f"--ioengine={engine}", f"--bs={bs}", f"--size={size}",
              "--iodepth=4", "--direct=1"]
    for opts, ios in ((["--rw=randread", "--io_size=256k"], 64),
                      (["--rw=randread", "--io_limit=2560k"], 640),
                      (["--rw=randread", "--io_size=2560k", "--number_ios=300"], 300),
                      (["--rw=read", "--number_ios=7", "--loops=3"], 21)):
        job = json.loads(bench(*common, *opts)[1])["jobs"][0]
        assert job["read"]["total_ios"] == ios and job["read"]["io_bytes"] == ios * bs, opts
    # a random write of 2.5 passes: the random map gives every block two or
    # three writes, so every block holds a write buffer, none the zeros it had
    job = json.loads(bench(*common, "--rw=randwrite", "--io_size=2560k", "--randseed=5")[1])["jobs"][0]
    assert job["write"]["total_ios"] == 640
    data = f.read_bytes()
    assert len(data) == size
    assert all(any(data[i:i + bs]) for i in range(0, size, bs))


def test_bench_misaligned_region_error_is_clear(tmp_path: Path) -> None:
    f = tmp_path / "x.img"
    make_file(f, 1 * MiB)
    err = io.StringIO()
    rc = cli.run(["--name=x", f"--filename={f}", "--rw=read", "--bs=4k", "--offset=100", "--direct=1"],
                 stdout=io.StringIO(), stderr=err)
    assert rc == 1 and "multiple of the target's block size" in err.getvalue()


def test_workload_io_error_names_the_io(tmp_path: Path) -> None:
    """An EINVAL inside the C loop ends the job with a message naming the
    direction, the offset and the errno text."""
    from fx100io.bench import workload
    from fx100io.bench.options import RawJob, resolve_job
    from fx100io.bench.targets import open_target

    f = tmp_path / "y.img"
    make_file(f, 256 * KiB)
    job = resolve_job(RawJob("y", {"filename": str(f), "rw": "read", "bs": "4k", "direct": "1",
                                   "iodepth": "2"}, "test"))
    target = open_target(job, 2)
    pool = fx100io.BufferPool(64 * KiB)
    fd = os.open(f, os.O_RDONLY | os.O_DIRECT)
    try:
        raw = pool.alloc(3 * 4096)
        bufs = [raw[1 : 1 + 4096], raw[4097 : 4097 + 4096]]  # not aligned for O_DIRECT
        loop = workload.IoLoop(job, target, bufs, workload.NullSlot(), fd)
        pat = workload.AccessPattern(0, 64, 4096, False, True, 1.0, 1, 1)
        with pytest.raises(BenchError) as ei:
            loop.run(pat, workload.Phase(), None)
        msg = str(ei.value)
        assert "read of 4096 bytes at offset" in msg and "Invalid argument" in msg
    finally:
        os.close(fd)
        target.close()
        del bufs, raw
        pool.close()


def test_verify_job_says_it_runs_in_python(tmp_path: Path) -> None:
    f = tmp_path / "v.img"
    p = subprocess.run(
        [sys.executable, "-m", "fx100io.bench", "--name=v", f"--filename={f}", "--size=256k",
         "--rw=randwrite", "--verify=crc32c", "--output-format=json"],
        check=False, capture_output=True, text=True, timeout=120, cwd=str(REPO),
    )
    assert p.returncode == 0, p.stderr
    assert "runs on the Python I/O loop" in p.stderr and "--verify" in p.stderr
    assert json.loads(p.stdout)["jobs"][0]["write"]["io_bytes"] == 256 * KiB
    # A plain io_uring file job says nothing: it takes the C loop.
    p = subprocess.run(
        [sys.executable, "-m", "fx100io.bench", "--name=n", f"--filename={f}", "--size=256k",
         "--rw=randread", "--output-format=json"],
        check=False, capture_output=True, text=True, timeout=120, cwd=str(REPO),
    )
    assert p.returncode == 0 and p.stderr == ""


def test_refused_option_is_logged_once_for_all_clones(tmp_path: Path, monkeypatch, capfd) -> None:
    real = _core.BenchLoop

    class Refusing:
        def __init__(self, *a, **kw):
            self._bl = real(*a, **kw)

        @property
        def refused(self):
            return {"sqpoll": errno.EPERM}

        def __getattr__(self, name):
            return getattr(self._bl, name)

    monkeypatch.setattr(_core, "BenchLoop", Refusing)
    f = tmp_path / "q.img"
    make_file(f, 256 * KiB)
    bench("--name=q", f"--filename={f}", "--rw=read", "--bs=4k", "--iodepth=4", "--numjobs=3")
    err = capfd.readouterr().err
    assert err.count("the kernel refused sqpoll") == 1, err


def test_c_loop_refusals_say_why(tmp_path: Path, monkeypatch, capsys) -> None:
    """An iodepth the C loop cannot take and an O_DIRECT open the filesystem
    refuses send the job to the Python loop with a reason that says so."""
    import types

    from fx100io.bench import workload
    from fx100io.bench.options import parse_cli, resolve_job

    f = tmp_path / "z.img"
    make_file(f, 64 * KiB)
    target = types.SimpleNamespace(path=str(f), created=False)

    def job(*extra: str):
        return resolve_job(parse_cli(["--name=z", f"--filename={f}", "--rw=randread", *extra]).jobs[0])

    why = workload.c_loop_refusal(job(f"--iodepth={_core.BL_MAX_DEPTH + 1}"), target)
    assert why == f"iodepth={_core.BL_MAX_DEPTH + 1} is more than the C loop's {_core.BL_MAX_DEPTH}"
    assert workload.c_loop_refusal(job(f"--iodepth={_core.BL_MAX_DEPTH}"), target) is None

    def no_direct(path, flags, *a):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return os.open(path, flags, *a)

    monkeypatch.setattr(workload.os, "open", no_direct)
    assert workload.open_c_loop_fd(job("--direct=1"), target, 0) is None
    err = capsys.readouterr().err
    assert f"cannot open {f} with O_DIRECT (direct=1): its filesystem does not support it" in err, err


def test_refused_option_is_logged_and_the_job_still_runs(tmp_path: Path, monkeypatch, capsys) -> None:
    """Where the kernel refuses an option (SQPOLL without privilege, say) the
    job runs without it and says so in one line on stderr."""
    real = _core.BenchLoop

    class Refusing:
        def __init__(self, *a, **kw):
            self._bl = real(*a, **{**kw, "flags": kw["flags"] & ~_core.BL_SQPOLL})

        @property
        def refused(self):
            return {"sqpoll": errno.EPERM}

        def __getattr__(self, name):
            return getattr(self._bl, name)

    monkeypatch.setattr(_core, "BenchLoop", Refusing)
    f = tmp_path / "q.img"
    make_file(f, 256 * KiB)
    _, out = bench("--name=q", f"--filename={f}", "--rw=read", "--bs=4k", "--iodepth=4", "--direct=1",
                   "--sqthread_poll")
    assert json.loads(out)["jobs"][0]["read"]["io_bytes"] == 256 * KiB
    err = capsys.readouterr().err
    assert "job 'q': the kernel refused sqpoll (EPERM: Operation not permitted); running without it" in err


def test_loop_after_loop_keeps_its_registrations(tmp_path: Path, pool) -> None:
    """A job makes a loop per phase (layout, ramp, run): closing one gives its
    registered ring slot back, so the tenth still gets every option."""
    f = tmp_path / "k.img"
    make_file(f, 64 * KiB)
    fd = os.open(f, os.O_RDONLY | os.O_DIRECT)
    try:
        b = bufs_of(pool, 2, 4096, 0)
        for _ in range(40):
            bl = _core.BenchLoop(fd, 0, 4, 4096, b, flags=ALL_OPTS)
            assert {"registered ring fd", "registerfiles", "fixedbufs"} <= set(bl.features), bl.refused
            run_to_end(bl)
            assert bl.counters()[0] == 4
            bl.close()
    finally:
        os.close(fd)


# ------------------------------------------------------------ lifetime


def test_loop_refuses_other_threads(tmp_path: Path, pool) -> None:
    """run() and close() from a thread other than the creator's raise a
    clear error (its ring is registered to the creator) instead of failing
    as an I/O or freeing the ring under the creator; the creator goes on."""
    import threading

    bs, n = 4 * KiB, 32
    f = tmp_path / "t.img"
    make_file(f, n * bs)
    fd = os.open(f, os.O_RDONLY | os.O_DIRECT)
    try:
        bl = _core.BenchLoop(fd, 0, n, bs, bufs_of(pool, 4, bs, 0), flags=ALL_OPTS)
        caught: list[BaseException] = []

        def other() -> None:
            for call in (lambda: bl.run(time.monotonic_ns() + 10_000_000), bl.close):
                try:
                    call()
                except BaseException as e:  # noqa: BLE001
                    caught.append(e)

        t = threading.Thread(target=other)
        t.start()
        t.join(60)
        assert [type(e) for e in caught] == [_core.BenchLoopThreadError] * 2, caught
        assert "thread" in str(caught[0])
        run_to_end(bl)
        assert bl.counters()[0] == n
        assert bl.close() is True
    finally:
        os.close(fd)


def test_close_that_gives_up_keeps_the_buffers(pool) -> None:
    """I/O that never completes (reads of an empty pipe): close() with a
    short limit says it gave up, and the buffers stay referenced for good
    (the kernel could still write into them)."""
    bs = 4 * KiB
    r, w = os.pipe()
    try:
        bufs = bufs_of(pool, 2, bs, 0)
        bl = _core.BenchLoop(r, 0, 1, bs, bufs, passes=0)
        assert bl.run(0) is False
        assert bl.inflight == 2
        assert bl.close(limit_ns=20_000_000) is False
        kept = _core._bench_leaked[-1]
        assert [m.obj for m in kept] == bufs
        assert bl.close() is True  # closed already
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("flags", [0, ALL_OPTS])
def test_io_that_never_completes_fails_the_run_instead_of_hanging(pool, flags) -> None:
    """A ring that took I/O and posts no completion for the stall limit
    (reads of an empty pipe stand for completions the kernel lost) ends
    the run with a clear ETIMEDOUT naming the ring, not a wait for good;
    the buffers the kernel may still use are kept."""
    bs = 4 * KiB
    r, w = os.pipe()
    try:
        bufs = bufs_of(pool, 4, bs, 0)
        bl = _core.BenchLoop(r, 0, 1, bs, bufs, passes=0, flags=flags, stall_s=0.5)
        t0 = time.monotonic()
        with pytest.raises(OSError) as ei:
            for _ in range(200):  # 50 ms slices; the limit ends it long before
                bl.run(time.monotonic_ns() + 50_000_000)
        assert time.monotonic() - t0 < 10
        e = ei.value
        assert e.errno == errno.ETIMEDOUT
        assert e.offset is None and e.is_read is None
        assert "no completion on the I/O loop's ring for 0.5 s with 4 I/Os in flight" in str(e)
        assert bl.close(limit_ns=20_000_000) is False
        assert [m.obj for m in _core._bench_leaked[-1]] == bufs
    finally:
        os.close(r)
        os.close(w)


def test_stall_limit_must_not_be_negative(tmp_path: Path, pool) -> None:
    with open(os.devnull, "rb") as f, pytest.raises(ValueError, match="stall_s"):
        _core.BenchLoop(f.fileno(), 0, 1, 4096, bufs_of(pool, 1, 4096, 0), stall_s=-1)


def test_bad_read_fraction_refused(tmp_path: Path, pool) -> None:
    f = tmp_path / "r.img"
    make_file(f, 64 * KiB)
    fd = os.open(f, os.O_RDONLY)
    try:
        for bad in (float("nan"), 1.5, -0.5):
            with pytest.raises(OSError) as ei:
                _core.BenchLoop(fd, 0, 4, 4096, bufs_of(pool, 1, 4096, 0), read_fraction=bad)
            assert ei.value.errno == errno.EINVAL
    finally:
        os.close(fd)


# ------------------------------------------------------------ through the bench, lifetime and report


@pytest.mark.parametrize("opts, want", [([], 1), (["--iodepth_batch_submit=0"], 0),
                                         (["--iodepth_batch=6"], 6)])
def test_files_submit_each_io_at_once_unless_told(tmp_path: Path, monkeypatch, opts, want) -> None:
    """fio's default for iodepth_batch_submit (1) is the bench's on files:
    a refill handed over as one batch is served slower by virtualised
    disks.  The job's own value reaches the loop."""
    f = tmp_path / "b.img"
    make_file(f, 256 * KiB, 3)
    seen: list[int] = []
    real = _core.BenchLoop

    def recording(*args, **kwargs):
        seen.append(kwargs["batch_submit"])
        return real(*args, **kwargs)

    monkeypatch.setattr(_core, "BenchLoop", recording)
    _, out = bench("--name=b", f"--filename={f}", "--rw=randread", "--bs=4k", "--iodepth=8",
                   "--direct=1", *opts)
    assert json.loads(out)["jobs"][0]["read"]["total_ios"] == 64
    assert seen and set(seen) == {want}


def test_a_read_job_on_the_c_loop_imports_neither_numpy_nor_asyncio(tmp_path: Path) -> None:
    """numpy's import costs about a quarter of a second of CPU, more than a
    short job's I/O, and asyncio's about 25 ms: a read job on the C loop (the
    common case) reports without either, and a write job, whose payload is
    made with numpy, still runs."""
    f = tmp_path / "n.img"
    make_file(f, 256 * KiB, 5)
    code = (
        "import io, sys\n"
        "from fx100io.bench import cli\n"
        "out = io.StringIO()\n"
        f"rc = cli.run(['--name=n', '--filename={f}', '--rw=randread', '--bs=4k', '--iodepth=4', "
        "'--direct=1', '--output-format=json'], stdout=out, stderr=sys.stderr)\n"
        "import json\n"
        "print(rc, json.loads(out.getvalue())['jobs'][0]['read']['total_ios'], 'numpy' in sys.modules,\n"
        "      'asyncio' in sys.modules)\n"
        f"rc = cli.run(['--name=w', '--filename={f}', '--rw=randwrite', '--bs=4k', '--iodepth=4', "
        "'--direct=1', '--output-format=json'], stdout=io.StringIO(), stderr=sys.stderr)\n"
        "print(rc, 'numpy' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=str(Path(__file__).resolve().parents[2]))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "64", "False", "False", "0", "True"], (r.stdout, r.stderr)


def test_report_says_which_loop_and_its_io_uring_features(tmp_path: Path) -> None:
    """The JSON and text reports name the I/O loop the measured phase ran
    on and, for the C loop, the io_uring features it ran with."""
    f = tmp_path / "l.img"
    make_file(f, 256 * KiB)
    common = ["--name=l", f"--filename={f}", "--rw=randread", "--bs=4k", "--iodepth=4", "--direct=1"]
    _, out = bench(*common)
    fx = json.loads(out)["jobs"][0]["fx100io"]
    assert fx["io_loop"] == "c"
    bl_fd = os.open(f, os.O_RDONLY | os.O_DIRECT)
    try:
        pool = fx100io.BufferPool(64 * KiB)
        bl = _core.BenchLoop(bl_fd, 0, 4, 4096, bufs_of(pool, 4, 4096, 0),
                             flags=_core.BL_REGRING | _core.BL_REGFILES | _core.BL_FIXEDBUFS)
        want = bl.features
        bl.close()
        pool.close()
    finally:
        os.close(bl_fd)
    assert sorted(fx["io_uring_features"]) == sorted(want)
    assert fx["io_uring_refused"] == {}
    _, out = bench(*common, "--fixedbufs=0", "--registerfiles=0")
    fx = json.loads(out)["jobs"][0]["fx100io"]
    assert "fixedbufs" not in fx["io_uring_features"] and "registerfiles" not in fx["io_uring_features"]
    _, out = bench(*common, "--ioengine=psync")
    fx = json.loads(out)["jobs"][0]["fx100io"]
    assert fx["io_loop"] == "psync" and "io_uring_features" not in fx
    text, err = io.StringIO(), io.StringIO()
    assert cli.run(common, stdout=text, stderr=err) == 0, err.getvalue()
    line = [x for x in text.getvalue().splitlines() if "I/O loop" in x]
    assert line == [f"  I/O loop     : C (io_uring: {', '.join(want)})"]


class _Recorder:
    """A BenchLoop that notes what it was made with and how it ends, in a
    file (the bench's job processes are forked)."""

    log: Path = Path("/dev/null")
    real = _core.BenchLoop

    def __init__(self, *a, **kw) -> None:
        self._bl = self.real(*a, **kw)
        self.note(f"new seed={kw['seed']} random={kw['random']} rf={kw['read_fraction']}")

    def note(self, line: str) -> None:
        with open(self.log, "a") as f:
            f.write(line + "\n")

    def __getattr__(self, name):
        return getattr(self._bl, name)


def test_numjobs_clones_get_different_access_patterns(tmp_path: Path, monkeypatch) -> None:
    """Each clone of a numjobs job seeds its pattern with its number mixed
    in: two clones of a random job do not issue the same offsets."""
    f = tmp_path / "c.img"
    make_file(f, 256 * KiB)
    log = tmp_path / "loops.log"
    monkeypatch.setattr(_Recorder, "log", log)
    monkeypatch.setattr(_core, "BenchLoop", _Recorder)
    bench("--name=c", f"--filename={f}", "--rw=randread", "--bs=4k", "--iodepth=2", "--numjobs=2",
          "--randseed=1234")
    seeds = [ln.split()[1] for ln in log.read_text().splitlines() if "random=True" in ln]
    assert len(seeds) == 2 and seeds[0] != seeds[1], seeds
    assert "seed=1234" in seeds


@pytest.mark.parametrize("stuck", [False, True])
def test_run_c_drains_after_an_exception_and_gives_up_on_stuck_io(tmp_path: Path, monkeypatch, capfd,
                                                                   stuck) -> None:
    """An exception in Python while the C loop has I/O in flight: the job
    drains it before closing; I/O that never comes back is given up on
    after the drain limit (close() told not to wait) instead of hanging."""
    from fx100io.bench import workload

    f = tmp_path / "d.img"
    make_file(f, 1 * MiB)
    log = tmp_path / "loops.log"

    class Failing(_Recorder):
        drains = 0

        def counters(self):
            raise BenchError("boom from Python")

        @property
        def inflight(self):
            return 1 if stuck else self._bl.inflight

        def run(self, t):
            if self._bl.inflight or not stuck:
                return self._bl.run(t)
            Failing.drains += 1
            if Failing.drains > 3000:
                self.note("drained forever")
                raise AssertionError("the drain has no deadline")
            time.sleep(0.001)
            return False

        def close(self, limit_ns=_core.BL_DRAIN_LIMIT_NS):
            self.note(f"close limit={limit_ns} inflight={self._bl.inflight}")
            if self._bl.inflight:  # the real loop must not leak in the test
                self._bl.stop()
                run_to_end(self._bl)
            return self._bl.close() and not stuck

    monkeypatch.setattr(_Recorder, "log", log)
    monkeypatch.setattr(_core, "BenchLoop", Failing)
    monkeypatch.setattr(workload, "DRAIN_LIMIT_NS", 50_000_000)
    out, err = io.StringIO(), io.StringIO()
    cli.run(["--name=d", f"--filename={f}", "--rw=randread", "--bs=4k", "--iodepth=8", "--time_based",
             "--runtime=5", "--output-format=json"], stdout=out, stderr=err)
    notes = log.read_text().splitlines()
    assert "drained forever" not in notes
    closes = [ln for ln in notes if ln.startswith("close")]
    if stuck:
        assert closes == ["close limit=0 inflight=0"], notes
        assert "gave up on them" in capfd.readouterr().err
    else:
        assert closes == [f"close limit={_core.BL_DRAIN_LIMIT_NS} inflight=0"], notes
    assert "boom from Python" in out.getvalue() + err.getvalue()


def _thread_error_job(tmp_path: Path, monkeypatch, raise_first: type[BaseException] | None):
    """An IoLoop over a file whose BenchLoop.run raises BenchLoopThreadError (as from a wrong
    thread), on its first call or (raise_first: what the first call raises instead, with
    I/O said to be in flight) while the loop drains."""
    from fx100io.bench import workload
    from fx100io.bench.options import RawJob, resolve_job
    from fx100io.bench.targets import open_target

    real = _core.BenchLoop
    made = []

    class WrongThread:
        def __init__(self, *a, **kw):
            self._bl = real(*a, **kw)
            self.calls = 0
            made.append(self._bl)

        @property
        def inflight(self):
            return 1 if raise_first is not None else self._bl.inflight

        def run(self, until):
            self.calls += 1
            if self.calls == 1 and raise_first is not None:
                raise raise_first("a failure in Python while I/O is in flight")
            raise _core.BenchLoopThreadError("BenchLoop used from thread 2, but ...")

        def __getattr__(self, name):
            return getattr(self._bl, name)

    monkeypatch.setattr(_core, "BenchLoop", WrongThread)
    f = tmp_path / "t.img"
    make_file(f, 256 * KiB)
    job = resolve_job(RawJob("t", {"filename": str(f), "rw": "read", "bs": "4k", "direct": "1",
                                   "iodepth": "2"}, "test"))
    target = open_target(job, 2)
    pool = fx100io.BufferPool(64 * KiB)
    fd = os.open(f, os.O_RDONLY | os.O_DIRECT)
    bufs = [pool.alloc(4096), pool.alloc(4096)]
    loop = workload.IoLoop(job, target, bufs, workload.NullSlot(), fd)
    try:
        with pytest.raises(_core.BenchLoopThreadError) as ei:
            loop.run(workload.AccessPattern(0, 64, 4096, False, True, 1.0, 1, 1),
                     workload.Phase(), None)
        return ei.value
    finally:
        for bl in made:
            bl.close()
        os.close(fd)
        target.close()
        del bufs, loop
        pool.close()


def test_a_loop_thread_error_is_a_bug_not_an_io_error(tmp_path: Path, monkeypatch) -> None:
    """BenchLoopThreadError is an OSError (every fx100io error is) but a programming error:
    the job does not turn it into a BenchError about the target, nor drop it while it drains."""
    e = _thread_error_job(tmp_path, monkeypatch, None)
    assert not isinstance(e, BenchError) and "used from thread" in str(e)
    e = _thread_error_job(tmp_path, monkeypatch, KeyError)
    assert isinstance(e.__context__, KeyError)  # raised while draining after the first

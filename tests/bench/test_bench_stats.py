"""Latency histogram, access patterns and verify headers of `fx100io bench`."""

from __future__ import annotations

import numpy as np
import pytest

from fx100io.bench import verify
from fx100io.bench.checksum import crc32c, crc32c_python
from fx100io.bench.pattern import AccessPattern, FeistelPermutation
from fx100io.bench.results import depth_bucket
from fx100io.bench.stats import DirStats, SystemCpu, bucket_index, bucket_value


def test_bucket_value_is_within_one_percent() -> None:
    v = np.unique(np.geomspace(1, 1e12, 5000).astype(np.int64))
    rep = bucket_value(bucket_index(v))
    assert np.all(np.abs(rep - v) <= np.maximum(v * 0.008, 1))
    small = np.arange(256)
    assert np.array_equal(bucket_value(bucket_index(small)), small)  # exact below 256 ns


def test_percentiles_match_numpy_nearest_rank() -> None:
    rng = np.random.default_rng(3)
    x = rng.lognormal(11, 1, 50_000).astype(np.int64)  # ~60 us median, long tail
    d = DirStats()
    for v in x.tolist():
        d.add(v, 4096)
    pcts = (1.0, 50.0, 90.0, 99.0, 99.9)
    got = d.percentiles(pcts)
    for p in pcts:
        want = np.percentile(x, p, method="inverted_cdf")
        assert abs(got[p] - want) <= want * 0.01, (p, got[p], want)
    assert d.n == d.ios == len(x) and d.bytes == 4096 * len(x)
    assert d.min_ns == x.min() and d.max_ns == x.max()
    assert d.mean_ns == pytest.approx(x.mean())
    assert d.stdev_ns == pytest.approx(x.std(ddof=1), rel=1e-6)


@pytest.mark.parametrize("n,pct,want_rank", [
    (1000, 99.9, 999), (10000, 99.99, 9999), (30, 10.0, 3), (1000, 99.91, 1000), (100, 50.5, 51),
    (1, 0.001, 1), (7, 100.0, 7),
])
def test_percentile_rank_is_exact(n: int, pct: float, want_rank: int) -> None:
    """Nearest rank ceil(pct / 100 * n) without the float product's error:
    samples 1..n ns (exact buckets up to 255), the percentile is the rank."""
    d = DirStats()
    small = n <= 255
    for v in range(1, n + 1):
        d.add(v if small else (10 if v < n else 200), 1)
    got = d.percentiles((pct,))[pct]
    if small:
        assert got == want_rank
    else:
        assert got == (10 if want_rank < n else 200)


def test_merge_equals_one_histogram() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.integers(1, 10**7, 1000), rng.integers(1, 10**5, 3000)
    da, db, dall = DirStats(), DirStats(), DirStats()
    for v in a.tolist():
        da.add(v, 1)
        dall.add(v, 1)
    for v in b.tolist():
        db.add(v, 1)
        dall.add(v, 1)
    da.merge(db)
    assert da.percentiles((50.0, 99.0)) == dall.percentiles((50.0, 99.0))
    assert (da.n, da.bytes, da.min_ns, da.max_ns) == (dall.n, dall.bytes, dall.min_ns, dall.max_ns)


def test_fraction_below_sums_to_100() -> None:
    d = DirStats()
    for v in (100, 1_500, 20_000, 3_000_000):
        d.add(v, 1)
    parts = d.fraction_below([1000, 10_000, 1 << 62])
    assert parts == [25.0, 25.0, 50.0]


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 65537])
def test_feistel_is_a_permutation(n: int) -> None:
    x = FeistelPermutation(n, 99)(np.arange(n))
    assert np.array_equal(np.sort(x), np.arange(n))


def test_random_pattern_visits_every_block_once_per_pass() -> None:
    p = AccessPattern(8192, 1000, 4096, random=True, random_map=True, read_fraction=1.0, seed=1, passes=2)
    offs = [o for o, _ in p]
    assert len(offs) == 2000
    for half in (offs[:1000], offs[1000:]):
        assert sorted(half) == [8192 + 4096 * i for i in range(1000)]
    assert offs[:1000] != sorted(offs[:1000])  # actually shuffled
    assert offs[:1000] != offs[1000:]  # a new order each pass


def test_sequential_mixed_pattern() -> None:
    p = AccessPattern(0, 10_000, 512, random=False, random_map=True, read_fraction=0.7, seed=5, passes=1)
    ios = list(p)
    assert [o for o, _ in ios] == [512 * i for i in range(10_000)]
    reads = sum(1 for _, r in ios if r)
    assert 6700 < reads < 7300


def test_time_based_pattern_wraps() -> None:
    p = AccessPattern(0, 3, 4096, random=False, random_map=True, read_fraction=0.0, seed=0, passes=None)
    it = iter(p)
    assert [next(it)[0] for _ in range(7)] == [0, 4096, 8192, 0, 4096, 8192, 0]


def test_depth_buckets_follow_fio() -> None:
    # fio: "16= covers depths from 16 to 31"
    assert [depth_bucket(d) for d in (1, 2, 3, 4, 7, 8, 16, 31, 32, 63, 64, 1000)] == [
        0,
        1,
        1,
        2,
        2,
        3,
        4,
        4,
        5,
        5,
        6,
        6,
    ]


def test_crc32c_check_value() -> None:
    assert crc32c_python(b"123456789") == 0xE3069283
    assert crc32c(b"123456789") == 0xE3069283


def test_verify_header_catches_flip_and_misplacement() -> None:
    buf = bytearray(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    verify.stamp(buf, 40960, 4096, 1)
    assert verify.check(buf, 40960, 4096) is None
    assert "wrong place" in verify.check(buf, 8192, 4096)
    buf[1000] ^= 0x01
    assert "crc32c mismatch" in verify.check(buf, 40960, 4096)
    assert "no verify header" in verify.check(bytearray(4096), 0, 4096)


def test_system_cpu_from_proc_stat_deltas() -> None:
    a = {"user": 100, "nice": 0, "system": 50, "idle": 800, "iowait": 0, "irq": 0, "softirq": 50, "steal": 0}
    b = {
        "user": 150,
        "nice": 10,
        "system": 90,
        "idle": 900,
        "iowait": 20,
        "irq": 10,
        "softirq": 70,
        "steal": 0,
    }
    s = SystemCpu.between(a, b)
    assert s.usr == pytest.approx(24.0)  # (50 user + 10 nice) of 250 ticks
    assert s.sys == pytest.approx(16.0)
    assert s.idle == pytest.approx(40.0)
    assert s.busy == pytest.approx(100.0 - 40.0 - 8.0)


def test_percentile_table_picks_the_unit_that_keeps_digits() -> None:
    from fx100io.bench.report_normal import _percentile_lines

    d = DirStats()
    for v in [300_000] * 99 + [24_000_000]:  # 300 us typical, one 24 ms outlier
        d.add(v, 4096)
    lines = _percentile_lines(d, (50.0, 99.99))
    assert lines[0].endswith("(usec):")
    assert "50.00th=[  300]" in lines[1] and "99.99th=[" in lines[1]
    d2 = DirStats()
    d2.add(5_000, 1)
    assert _percentile_lines(d2, (50.0,))[0].endswith("(nsec):")


def test_bandwidth_windows_cover_only_the_moving_phase() -> None:
    from fx100io.bench.stats import Series

    r, w = DirStats(), DirStats()
    s = Series()
    t = 0
    s.sample(0, r, w)  # phases start with a sample at t=0, as the workload does
    for _ in range(10):  # 1 s of writes at 1 MiB per 100 ms, no reads
        w.bytes += 1 << 20
        w.ios += 1
        t += 100_000_000
        s.sample(t, r, w)
    for _ in range(10):  # then 1 s of reads
        r.bytes += 2 << 20
        r.ios += 2
        t += 100_000_000
        s.sample(t, r, w)
    wbw, _ = s.windows(500_000_000, "write")
    rbw, riops = s.windows(500_000_000, "read")
    assert wbw == [10240.0, 10240.0]  # KiB/s; no zero windows from the read phase
    assert rbw == [20480.0, 20480.0] and riops == [20.0, 20.0]

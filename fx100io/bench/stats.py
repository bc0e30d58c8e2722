"""Latency histograms, per-direction counters, bandwidth series and CPU use.

Latencies go into a log-linear histogram (128 linear sub-buckets per power
of two, so any reported percentile is within 0.8% of the true sample) rather
than a list of every sample: a long time_based run at a million IOPS would
otherwise hold gigabytes.  The hot path only appends to an array; numpy
buckets the samples in batches, which keeps Python work per I/O tiny.  Jobs
on the C I/O loop bring their histogram from C, and nothing here imports
numpy for them: it costs a quarter of a second of CPU at start-up, more
than a short job's I/O (fio starts in a tenth of that).
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import resource
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

SUB_BITS = 7
SUB = 1 << SUB_BITS  # linear sub-buckets per power of two
EXACT = 2 * SUB  # values below this are stored exactly
NBUCKETS = EXACT + (64 - SUB_BITS - 1) * SUB
FLUSH_EVERY = 1 << 15


def bucket_index(values: Any) -> np.ndarray:
    """Histogram bucket of each latency (ns, non-negative int64)."""
    import numpy as np

    v = np.asarray(values, dtype=np.int64)
    idx = v.copy()
    big = v >= EXACT
    if big.any():
        vb = v[big]
        # frexp's exponent is the bit length for integers below 2**53.
        _, bitlen = np.frexp(vb.astype(np.float64))
        shift = bitlen.astype(np.int64) - (SUB_BITS + 1)
        top = vb >> shift  # in [SUB, 2*SUB)
        idx[big] = EXACT + (shift - 1) * SUB + (top - SUB)
    return idx


def bucket_value(idx: Any) -> np.ndarray:
    """Representative (midpoint) latency of each bucket index."""
    import numpy as np

    i = np.asarray(idx, dtype=np.int64)
    out = i.copy()
    big = i >= EXACT
    if big.any():
        ib = i[big] - EXACT
        shift = ib // SUB + 1
        top = ib % SUB + SUB
        low = top << shift
        out[big] = low + ((np.int64(1) << shift) >> 1)
    return out


def bucket_mid(i: int) -> int:
    """bucket_value of one index, without numpy."""
    if i < EXACT:
        return i
    shift = (i - EXACT) // SUB + 1
    top = (i - EXACT) % SUB + SUB
    return (top << shift) + ((1 << shift) >> 1)


def nearest_rank(pct: float, n: int) -> int:
    """ceil(pct / 100 * n), at least 1, in integers (as csrc/bench_loop.c):
    pct in millionths, so p99.9 of 1000 samples is rank 999, where the float
    product 999.0000000000001 would round up to 1000."""
    ppm = int(pct * 1e6 + 0.5)
    return max(1, -(-ppm * n // 100_000_000))


class DirStats:
    """Counters and latency distribution of one direction (read or write)."""

    def __init__(self) -> None:
        self.ios = 0
        self.bytes = 0
        self.short_ios = 0
        self.counts = array("q", bytes(8 * NBUCKETS))  # per bucket
        self._n = 0
        self.min_ns = 0
        self.max_ns = 0
        self.sum_ns = 0
        self.sumsq = 0.0
        self._pending = array("q")

    # -- hot path
    def add(self, lat_ns: int, nbytes: int) -> None:
        self.ios += 1
        self.bytes += nbytes
        self._pending.append(lat_ns)
        if len(self._pending) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        import numpy as np  # only the Python I/O loop gets here

        v = np.frombuffer(self._pending, dtype=np.int64).copy()
        self._pending = array("q")
        v[v < 0] = 0
        np.add.at(np.frombuffer(self.counts, dtype=np.int64), bucket_index(v), 1)
        vmin, vmax = int(v.min()), int(v.max())
        self.min_ns = vmin if self._n == 0 else min(self.min_ns, vmin)
        self.max_ns = max(self.max_ns, vmax)
        self._n += len(v)
        self.sum_ns += int(v.sum())
        vf = v.astype(np.float64)
        self.sumsq += float(np.dot(vf, vf))

    def load(
        self, ios: int, nbytes: int, short_ios: int, counts: Any, min_ns: int, max_ns: int,
        sum_ns: int, sumsq: float,
    ) -> None:
        """Take every counter from an outside accountant (the C I/O loop,
        whose histogram has this layout): replaces what was there.  counts:
        NBUCKETS integers (a sequence, or the C loop's native uint64 bytes)."""
        if isinstance(counts, (bytes, bytearray, memoryview)):
            counts = memoryview(counts).cast("B").cast("Q")
        if len(counts) != NBUCKETS:
            raise ValueError(f"histogram of {len(counts)} buckets, expected {NBUCKETS}")
        self._pending = array("q")
        self.ios = ios
        self.bytes = nbytes
        self.short_ios = short_ios
        self.counts = array("q", (int(c) for c in counts))
        self._n = sum(self.counts)
        self.min_ns = min_ns if self._n else 0
        self.max_ns = max_ns
        self.sum_ns = sum_ns
        self.sumsq = sumsq

    # -- summaries
    @property
    def n(self) -> int:
        """Latency samples recorded (equals ios)."""
        self.flush()
        return self._n

    @property
    def mean_ns(self) -> float:
        self.flush()
        return self.sum_ns / self._n if self._n else 0.0

    @property
    def stdev_ns(self) -> float:
        """Sample standard deviation (n-1), as fio reports."""
        self.flush()
        if self._n < 2:
            return 0.0
        var = (self.sumsq - self.sum_ns * self.sum_ns / self._n) / (self._n - 1)
        return math.sqrt(max(var, 0.0))

    def percentiles(self, pcts: tuple[float, ...]) -> dict[float, int]:
        """Nearest-rank percentiles, bucket midpoints clamped to [min, max]."""
        self.flush()
        if self._n == 0:
            return dict.fromkeys(pcts, 0)
        cum = list(itertools.accumulate(self.counts))
        out = {}
        for p in pcts:
            rank = nearest_rank(p, self._n)
            idx = bisect.bisect_left(cum, rank)  # the first bucket that reaches the rank
            out[p] = min(max(bucket_mid(idx), self.min_ns), self.max_ns)
        return out

    def fraction_below(self, bounds_ns: list[int]) -> list[float]:
        """Share of I/Os (percent) in (previous bound, bound] for each bound."""
        self.flush()
        if self._n == 0:
            return [0.0] * len(bounds_ns)
        filled = [(bucket_mid(i), c) for i, c in enumerate(self.counts) if c]
        cum = [sum(c for v, c in filled if v <= b) for b in bounds_ns]
        out = []
        prev = 0
        for c in cum:
            out.append(100.0 * (c - prev) / self._n)
            prev = c
        return out

    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """(latency ns, count) of the non-empty buckets, for plotting."""
        import numpy as np

        self.flush()
        counts = np.frombuffer(self.counts, dtype=np.int64)
        nz = np.nonzero(counts)[0]
        return bucket_value(nz), counts[nz].copy()

    def merge(self, other: DirStats) -> None:
        self.flush()
        other.flush()
        self.ios += other.ios
        self.bytes += other.bytes
        self.short_ios += other.short_ios
        if other._n:
            self.min_ns = other.min_ns if self._n == 0 else min(self.min_ns, other.min_ns)
            self.max_ns = max(self.max_ns, other.max_ns)
        self.counts = array("q", map(sum, zip(self.counts, other.counts)))
        self._n += other._n
        self.sum_ns += other.sum_ns
        self.sumsq += other.sumsq

    def __getstate__(self) -> dict:
        self.flush()
        state = self.__dict__.copy()
        state["_pending"] = b""
        return state

    def __setstate__(self, state: dict) -> None:
        state["_pending"] = array("q")
        self.__dict__.update(state)


class Series:
    """Cumulative bytes and I/Os per direction, sampled every ``interval_ns``.

    It feeds the live status line, fio's bw_min/max/mean (fio samples every
    500 ms by default) and the bandwidth-over-time plot.
    """

    def __init__(self, interval_ns: int = 100_000_000) -> None:
        self.interval_ns = interval_ns
        self.t_ns: list[int] = []
        self.rbytes: list[int] = []
        self.wbytes: list[int] = []
        self.rios: list[int] = []
        self.wios: list[int] = []

    def sample(self, t_ns: int, r: DirStats, w: DirStats) -> None:
        self.t_ns.append(t_ns)
        self.rbytes.append(r.bytes)
        self.wbytes.append(w.bytes)
        self.rios.append(r.ios)
        self.wios.append(w.ios)

    def windows(self, window_ns: int, which: str) -> tuple[list[float], list[float]]:
        """(KiB/s, IOPS) per full window of ``window_ns`` for 'read'/'write'."""
        b = self.rbytes if which == "read" else self.wbytes
        n = self.rios if which == "read" else self.wios
        bw: list[float] = []
        iops: list[float] = []
        # Only the span where this direction moved: the KV workload writes in
        # one phase and reads in the next, and the idle phase is not a
        # 0 KiB/s sample of the other direction.
        moving = [i for i in range(1, len(b)) if b[i] != b[i - 1]]
        if not moving:
            return bw, iops
        first, last = moving[0] - 1, moving[-1]
        last_t, last_b, last_n = self.t_ns[first], b[first], n[first]
        for t, cb, cn in zip(
            self.t_ns[first + 1 : last + 1], b[first + 1 : last + 1], n[first + 1 : last + 1]
        ):
            if t - last_t >= window_ns:
                dt = (t - last_t) / 1e9
                bw.append((cb - last_b) / 1024 / dt)
                iops.append((cn - last_n) / dt)
                last_t, last_b, last_n = t, cb, cn
        return bw, iops


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"min": 0, "max": 0, "mean": 0.0, "dev": 0.0, "samples": 0}
    mean = sum(values) / len(values)
    dev = math.sqrt(sum((x - mean) ** 2 for x in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return {"min": min(values), "max": max(values), "mean": mean, "dev": dev, "samples": len(values)}


# -------------------------------------------------------------------- CPU


@dataclass
class Rusage:
    """Process CPU and scheduling counters (getrusage of this process)."""

    utime: float
    stime: float
    ctx: int
    majf: int
    minf: int

    @classmethod
    def now(cls) -> Rusage:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return cls(r.ru_utime, r.ru_stime, r.ru_nvcsw + r.ru_nivcsw, r.ru_majflt, r.ru_minflt)

    def __sub__(self, o: Rusage) -> Rusage:
        return Rusage(
            self.utime - o.utime,
            self.stime - o.stime,
            self.ctx - o.ctx,
            self.majf - o.majf,
            self.minf - o.minf,
        )


_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def read_proc_stat() -> dict[str, int]:
    """The aggregate 'cpu' line of /proc/stat in clock ticks ({} if unreadable)."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("cpu "):
                    parts = [int(x) for x in line.split()[1:]]
                    return dict(zip(_STAT_FIELDS, parts + [0] * (len(_STAT_FIELDS) - len(parts))))
    except OSError:
        pass
    return {}


@dataclass
class SystemCpu:
    """Machine-wide CPU over the run, in percent of all CPUs.

    getrusage misses work io_uring does in kernel threads (io-wq, SQPOLL) and
    in interrupt context, so we also report /proc/stat deltas for the run.
    """

    usr: float = 0.0
    sys: float = 0.0
    irq: float = 0.0
    softirq: float = 0.0
    iowait: float = 0.0
    idle: float = 0.0
    steal: float = 0.0
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)

    @property
    def busy(self) -> float:
        # (shares of one total: the float sum can land a hair above 100)
        return min(100.0, self.usr + self.sys + self.irq + self.softirq + self.steal)

    @property
    def busy_cpus(self) -> float:
        return self.busy / 100.0 * self.cpus

    @classmethod
    def between(cls, a: dict[str, int], b: dict[str, int]) -> SystemCpu:
        if not a or not b:
            return cls()
        # (iowait may go backwards in /proc/stat: a field never counts below 0)
        d = {k: max(0, b.get(k, 0) - a.get(k, 0)) for k in _STAT_FIELDS}
        total = sum(d.values())
        if total <= 0:
            return cls()

        def pct(*keys: str) -> float:
            return 100.0 * sum(d[k] for k in keys) / total

        return cls(
            usr=pct("user", "nice"),
            sys=pct("system"),
            irq=pct("irq"),
            softirq=pct("softirq"),
            iowait=pct("iowait"),
            idle=pct("idle"),
            steal=pct("steal"),
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "usr": self.usr,
            "sys": self.sys,
            "irq": self.irq,
            "softirq": self.softirq,
            "iowait": self.iowait,
            "idle": self.idle,
            "steal": self.steal,
            "busy": self.busy,
            "cpus": self.cpus,
            "busy_cpus": self.busy_cpus,
        }

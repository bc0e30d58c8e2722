"""Which offsets a job touches, in which order, and whether each reads or writes.

Random jobs visit every block exactly once per pass by default, like fio's
random map, so a fixed-size random job moves exactly --size bytes.  Instead
of materialising a permutation (2 GB of indices for a 1 TB device at 4k) we
use a keyed Feistel network, a bijection on a power-of-two domain, and
cycle-walk the indices that land past the region: O(1) memory, and numpy
computes it a batch at a time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

BATCH = 4096
_MASK64 = (1 << 64) - 1


class FeistelPermutation:
    """A pseudo-random permutation of range(n), keyed by ``seed``."""

    ROUNDS = 4

    def __init__(self, n: int, seed: int) -> None:
        import numpy as np

        if n < 1:
            raise ValueError("empty domain")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        bits += bits & 1  # even, so the two halves are equal
        self.half = bits // 2
        self.half_mask = np.uint64((1 << self.half) - 1)
        rng = np.random.default_rng(seed & _MASK64)
        self.keys = [np.uint64(int(k)) for k in rng.integers(1, 1 << 62, size=self.ROUNDS)]

    def _round(self, x: np.ndarray, key: np.uint64) -> np.ndarray:
        import numpy as np

        # A cheap mixing function (multiply-xorshift); it needs only to look
        # random, the Feistel structure makes the whole a bijection anyway.
        with np.errstate(over="ignore"):
            h = (x ^ key) * np.uint64(0x9E3779B97F4A7C15)
            h ^= h >> np.uint64(29)
            h *= np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(32)
        return h & self.half_mask

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        import numpy as np

        half = np.uint64(self.half)
        left = x >> half
        right = x & self.half_mask
        for key in self.keys:
            left, right = right, left ^ self._round(right, key)
        return (left << half) | right

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        import numpy as np

        x = self._encrypt(idx.astype(np.uint64))
        # Cycle-walk: re-encrypt values outside [0, n) until they fall inside;
        # this keeps the map a bijection on range(n).
        out = x >= np.uint64(self.n)
        while out.any():
            x[out] = self._encrypt(x[out])
            out = x >= np.uint64(self.n)
        return x.astype(np.int64)


class AccessPattern:
    """Yields (byte offset, is_read) for one job.

    ``passes`` is the number of walks over the region (fio's loops) or None
    for time_based jobs, which wrap around until the clock stops them.
    ``limit`` (fio's io_size, number_ios) ends it after that many I/Os,
    wrapping around the region as often as that takes, in place of passes.
    """

    def __init__(
        self,
        start: int,
        nblocks: int,
        bs: int,
        random: bool,
        random_map: bool,
        read_fraction: float,
        seed: int,
        passes: int | None,
        limit: int | None = None,
    ) -> None:
        self.start = start
        self.nblocks = nblocks
        self.bs = bs
        self.random = random
        self.random_map = random_map
        self.read_fraction = read_fraction
        self.seed = seed
        self.passes = None if limit is not None else passes
        self.limit = limit
        self._rng: np.random.Generator | None = None

    @property
    def rng(self) -> np.random.Generator:
        import numpy as np

        # Made on first use: a job that runs in the C I/O loop (which makes
        # its own pattern) never needs it, and numpy.random costs start-up.
        if self._rng is None:
            self._rng = np.random.default_rng(self.seed & _MASK64)
        return self._rng

    @property
    def total_ios(self) -> int | None:
        if self.limit is not None:
            return self.limit
        return None if self.passes is None else self.nblocks * self.passes

    def _directions(self, n: int) -> list[bool]:

        if self.read_fraction >= 1.0:
            return [True] * n
        if self.read_fraction <= 0.0:
            return [False] * n
        return (self.rng.random(n) < self.read_fraction).tolist()

    def __iter__(self) -> Iterator[tuple[int, bool]]:
        if self.limit is None:
            return self._walk()
        return itertools.islice(self._walk(), self.limit)

    def _walk(self) -> Iterator[tuple[int, bool]]:
        import numpy as np

        pass_no = 0
        while self.passes is None or pass_no < self.passes:
            perm = None
            if self.random and self.random_map:
                perm = FeistelPermutation(self.nblocks, self.seed + 7919 * pass_no)
            for first in range(0, self.nblocks, BATCH):
                count = min(BATCH, self.nblocks - first)
                blocks: np.ndarray
                if not self.random:
                    blocks = np.arange(first, first + count, dtype=np.int64)
                elif perm is not None:
                    blocks = perm(np.arange(first, first + count, dtype=np.int64))
                else:
                    blocks = self.rng.integers(0, self.nblocks, size=count, dtype=np.int64)
                offsets = (blocks * self.bs + self.start).tolist()
                yield from zip(offsets, self._directions(count))
            pass_no += 1

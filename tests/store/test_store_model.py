"""ChunkStore against a plain dict, as a Hypothesis state machine.

Rules: put, batch_put of 1..5000 keys, delete, get, exists, close + reopen,
batches of more than one index segment, and a writer process killed with
SIGKILL at a random moment; each example runs on a store with a tiny index
(a compaction every few puts, big batches refused), a small one (batches of
several segments that trigger compactions) or a normal one, with or
without a small capacity (evictions), on one device or two.

The model maps each key to the set of values it may hold: one value once
a put was acknowledged, more when a put was cut short (the killed writer's
last put, a failed batch over two devices); None in the set means absent
is allowed.  ``may_evict`` holds keys that were stored when an eviction
could have happened: for those a miss is also allowed, but never another
value.  Every value embeds its key and a version, so an older value, a
value of another key or garbage can never pass.  Whatever the store shows
resolves the model (a key read back once has that value from then on).

tools/soak_store.py runs this machine with random seeds for as long as
asked; the test here is a bounded, derandomized run.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import pytest
from support import IN_CI, REPO
from support.store_model_values import BLOCK, SIZES, SMALL_KEYS, make_value

import fx100io
from fx100io import errors

if not IN_CI:  # in CI the test command installs it: missing is a failure
    pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (  # noqa: E402
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

WRITER = r"""
import sys
sys.path.insert(0, "tests")
import fx100io
from support.store_model_values import SMALL_KEYS, SIZES, blocks, make_value
paths, capacity, tag, seed = sys.argv[1].split(","), sys.argv[2], sys.argv[3], int(sys.argv[4])
st = fx100io.ChunkStore(paths, capacity=None if capacity == "-" else int(capacity))
out = sys.stdout
out.write("R\n"); out.flush()
i = 0
while True:
    n = 1 + (seed + i) % 4
    keys = [SMALL_KEYS[(seed * 7 + i * 5 + j * 11) % len(SMALL_KEYS)] for j in range(n)]
    keys = list(dict.fromkeys(keys))
    size = SIZES[(seed + i) % len(SIZES)]
    vals = [make_value(k, f"w{tag}-{i}", size) for k in keys]
    s = st.stats()
    need = sum(blocks(len(v)) for v in vals)
    may_evict = int(s["bytes_used"] + need > s["capacity"] // len(paths))
    out.write(f"T {i} {size} {may_evict} {' '.join(keys)}\n"); out.flush()
    try:
        st.batch_put_blocking(keys, vals)
    except fx100io.errors.DeviceFullError:  # e.g. a tiny index that is full
        out.write(f"F {i} {st.stats()['evictions']}\n"); out.flush()
    else:
        out.write(f"A {i} {st.stats()['evictions']}\n"); out.flush()
    i += 1
"""


def split(buf, cuts: list[int]) -> list[memoryview]:
    """buf as consecutive pieces, cut at the given positions (clamped to its size)."""
    mv = memoryview(buf)
    at = sorted({0, mv.nbytes} | {min(c, mv.nbytes) for c in cuts})
    return [mv[a:b] for a, b in zip(at, at[1:])] or [mv]


def logged(f):
    """Record each step; on the first failure of an example, print the
    steps and the error as they happened (a replay of a failure that
    depends on the killed writer's timing may go differently)."""
    @functools.wraps(f)
    def step(self, **kw):
        self.history.append(f"{f.__name__}({', '.join(f'{k}={v!r}' for k, v in kw.items())})")
        try:
            return f(self, **kw)
        except BaseException as exc:
            type(self).last_failure = exc
            if self.report_first_failure and not self.reported:
                self.reported = True
                print("first failure of this example, after these steps:\n  "
                      + "\n  ".join(self.history) + "\n" + traceback.format_exc(),
                      file=sys.stderr, flush=True)
            raise
    return step


class StoreModel(RuleBasedStateMachine):
    report_first_failure = False  # tools/soak_store.py turns it on
    last_failure: BaseException | None = None

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="fx100io-model-")
        self.store: fx100io.ChunkStore | None = None
        self.model: dict[str, set] = {}
        self.may_evict: set[str] = set()
        self.version = 0
        self.kills = 0
        self.history: list[str] = []
        self.reported = False

    # ------------------------------------------------------------ setup
    @initialize(ndevs=st.sampled_from([1, 1, 2]),
                index=st.sampled_from(["tiny", "small", "normal"]),
                capacity=st.sampled_from([None, 48 * BLOCK, 400 * BLOCK]))
    @logged
    def setup(self, ndevs, index, capacity):
        self.paths = [os.path.join(self.dir, f"d{i}.img") for i in range(ndevs)]
        self.capacity = capacity
        self.opts = dict(capacity=capacity)
        # tiny: 16 KiB halves, a compaction every few puts, and batches of
        # more than ~300 keys do not fit at all (a clear DeviceFullError);
        # small: 512 KiB, a compaction every other batch of thousands of
        # keys, each such commit several segments long
        sizes = dict(tiny=16 << 10, small=512 << 10, normal=2 << 20)
        fx100io.ChunkStore(self.paths, create=True, size=48 << 20,
                           index_size=sizes[index]).close()
        self.store = fx100io.ChunkStore(self.paths, **self.opts)

    def teardown(self):
        try:
            if self.store is not None and not self.store.closed:
                logged(StoreModel.check_all)(self)
                self.store.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------ helpers
    def next_version(self) -> str:
        self.version += 1
        return f"v{self.version}"

    def evictions(self) -> int:
        return self.store.stats()["evictions"]

    def mark_evictable(self) -> None:
        self.may_evict |= {k for k, vals in self.model.items() if vals != {None}}

    def allowed(self, key: str) -> set:
        vals = set(self.model.get(key, {None}))
        if key in self.may_evict:
            vals.add(None)
        return vals

    def observe(self, key: str, got) -> None:
        """The store shows key as got (bytes, or None for absent)."""
        ok = self.allowed(key)
        assert got in ok, (f"{key!r}: the store has "
                           f"{'nothing' if got is None else bytes(got[:40])!r}, the model "
                           f"allows {sorted(repr(v[:40]) if v else 'absent' for v in ok)}")
        if got is None:
            self.model.pop(key, None)
            self.may_evict.discard(key)
        else:
            self.model[key] = {bytes(got)}

    def read(self, keys: list[str], cuts: list[int] | None = None) -> None:
        sizes = [self.store.chunk_size(k) for k in keys]
        outs = [bytearray(n or 0) for n in sizes]
        bufs = outs if cuts is None else [split(o, cuts) for o in outs]
        hits = self.store.batch_get_blocking(keys, bufs)
        for k, n, hit, out in zip(keys, sizes, hits, outs):
            if n is not None:
                assert hit, f"{k!r} is listed but its chunk did not read back"
            self.observe(k, bytes(out) if hit else None)

    def check_all(self) -> None:
        listed = {k.decode() for k in self.store.keys()}
        for k in listed - set(self.model):
            raise AssertionError(f"{k!r} is in the store but was never acknowledged, or was "
                                 "deleted")
        self.read(sorted(listed | set(self.model)))

    def put_many(self, keys: list[str], size: int, cuts: list[int] | None = None) -> None:
        version = self.next_version()
        vals = {k: make_value(k, version, size) for k in keys}  # the last of a key wins
        before = self.evictions()
        bufs = [vals[k] if cuts is None else split(vals[k], cuts) for k in keys]
        try:
            self.store.batch_put_blocking(keys, bufs)
        except errors.DeviceFullError:
            if self.evictions() > before:
                self.mark_evictable()
            if len(self.paths) > 1:  # one device's commit may have gone through
                for k, v in vals.items():
                    self.model.setdefault(k, {None}).add(v)
            return
        if self.evictions() > before:
            self.mark_evictable()
        for k, v in vals.items():
            self.model[k] = {v}
            self.may_evict.discard(k)

    # ------------------------------------------------------------ rules
    @precondition(lambda self: self.store is not None)
    @rule(key=st.sampled_from(SMALL_KEYS), size=st.sampled_from(SIZES))
    @logged
    def put(self, key, size):
        self.put_many([key], size)

    @precondition(lambda self: self.store is not None)
    @rule(key=st.sampled_from(SMALL_KEYS), size=st.sampled_from(SIZES),
          cuts=st.lists(st.integers(0, 1 << 17), max_size=4))
    @logged
    def put_pieces(self, key, size, cuts):
        """A chunk written from several buffers (a host page's K and V apart)."""
        self.put_many([key], size, cuts)

    @precondition(lambda self: self.store is not None)
    @rule(keys=st.lists(st.sampled_from(SMALL_KEYS), min_size=1, max_size=6),
          cuts=st.lists(st.integers(0, 1 << 17), max_size=4))
    @logged
    def get_pieces(self, keys, cuts):
        """Chunks read into several buffers, cut anywhere."""
        self.read(list(dict.fromkeys(keys)), cuts)

    @precondition(lambda self: self.store is not None)
    @rule(start=st.integers(0, 6000), n=st.one_of(st.integers(1, 40), st.integers(1, 5000)),
          size=st.sampled_from([0, 1, 100]), small=st.booleans())
    @logged
    def batch_put(self, start, n, size, small):
        keys = [f"b{(start + i) % 6000}" for i in range(n)]
        if small:  # overlap the keys the other rules use
            keys[:len(SMALL_KEYS)] = SMALL_KEYS[:n]
        self.put_many(keys, size)

    @precondition(lambda self: self.store is not None)
    @rule(start=st.integers(0, 6000), n=st.integers(2049, 5000), size=st.sampled_from([0, 1]))
    @logged
    def batch_put_several_segments(self, start, n, size):
        """A commit of more than one index segment (SEGMENT_RECORDS each)."""
        self.put_many([f"b{(start + i) % 6000}" for i in range(n)], size)

    @precondition(lambda self: self.store is not None)
    @rule(key=st.one_of(st.sampled_from(SMALL_KEYS), st.integers(0, 6000).map(lambda i: f"b{i}")))
    @logged
    def delete(self, key):
        existed = self.store.delete_blocking(key)
        ok = self.allowed(key)
        assert (None in ok) if not existed else (ok != {None}), \
            f"delete({key!r}) returned {existed}; the model allows {ok}"
        self.model.pop(key, None)
        self.may_evict.discard(key)

    @precondition(lambda self: self.store is not None)
    @rule(keys=st.lists(st.sampled_from(SMALL_KEYS), min_size=1, max_size=6))
    @logged
    def get(self, keys):
        self.read(list(dict.fromkeys(keys)))

    @precondition(lambda self: self.store is not None)
    @rule(keys=st.lists(st.sampled_from(SMALL_KEYS), min_size=0, max_size=6))
    @logged
    def exists(self, keys):
        n = self.store.batch_exists_blocking(keys)
        assert 0 <= n <= len(keys)
        for k in keys[:n]:
            assert self.allowed(k) != {None}, f"exists counts {k!r}, which the model has not"
        if n < len(keys):
            assert None in self.allowed(keys[n]), f"exists stops at {keys[n]!r}, which is stored"

    @precondition(lambda self: self.store is not None)
    @rule()
    @logged
    def reopen(self):
        self.store.close()
        self.store = fx100io.ChunkStore(self.paths, **self.opts)
        self.check_all()

    @precondition(lambda self: self.store is not None)
    @rule(delay=st.floats(0.0, 0.4), seed=st.integers(0, 1000))
    @logged
    def killed_writer(self, delay, seed):
        self.store.close()  # the writer needs the devices' locks
        self.kills += 1
        cap = "-" if self.capacity is None else str(self.capacity)
        p = subprocess.Popen(
            [sys.executable, "-c", WRITER, ",".join(self.paths), cap, str(self.kills), str(seed)],
            cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        try:
            assert p.stdout.readline() == b"R\n", p.stderr.read().decode()[-2000:]
            time.sleep(delay)
        finally:
            p.send_signal(signal.SIGKILL)
            out, err = p.communicate()
        assert p.returncode == -signal.SIGKILL, err.decode()[-2000:]
        self.apply_writer_log(out.decode(), self.kills)
        self.store = fx100io.ChunkStore(self.paths, **self.opts)
        self.check_all()

    def apply_writer_log(self, text: str, tag: int) -> None:
        lines = text.split("\n")[:-1]  # a line cut by the kill has no newline
        pending = None
        evictions = 0
        for line in lines:
            f = line.split()
            if f[0] == "T":
                i, size, may_evict, keys = int(f[1]), int(f[2]), f[3] == "1", f[4:]
                pending = (keys, {k: make_value(k, f"w{tag}-{i}", size) for k in keys},
                           may_evict)
            elif f[0] == "A":
                assert pending is not None
                keys, vals, _ = pending
                if int(f[2]) > evictions:
                    evictions = int(f[2])
                    self.mark_evictable()
                for k in keys:
                    self.model[k] = {vals[k]}
                    self.may_evict.discard(k)
                pending = None
            elif f[0] == "F":  # the put failed and said so
                assert pending is not None
                keys, vals, _ = pending
                if int(f[2]) > evictions:
                    evictions = int(f[2])
                    self.mark_evictable()
                if len(self.paths) > 1:  # one device's commit may have gone through
                    for k in keys:
                        self.model.setdefault(k, {None}).add(vals[k])
                pending = None
        if pending is not None:  # killed inside this put: either outcome, per key
            keys, vals, may_evict = pending
            if may_evict:
                self.mark_evictable()
            for k in keys:
                self.model.setdefault(k, {None}).add(vals[k])

    @invariant()
    def listed_keys_are_allowed(self):
        if self.store is None or self.store.closed:
            return
        for k in self.store.keys()[:200]:
            assert self.allowed(k.decode()) != {None}, f"{k!r} listed but not in the model"


def model_settings(**kw) -> settings:
    """No shrinking by default: the killed writer's timing makes a replay
    differ, and a shrink of a failure of this machine can run for many
    minutes; the unshrunk steps are printed."""
    base = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.generate], print_blob=True)
    base.update(kw)
    return settings(**base)


TestStoreModel = StoreModel.TestCase
TestStoreModel.settings = model_settings(max_examples=20, stateful_step_count=25,
                                         derandomize=True)

"""The index log alone (fx100io.store.local.index_log), without a ChunkStore:
appends, compaction (with the commit that triggers it folded in), replay
after a reopen, torn segments, the scrub after the tail, and a commit that
cannot fit."""

from __future__ import annotations

import pytest

from fx100io import errors
from fx100io.device import open_device
from fx100io.store.core.superblock import new_set_id
from fx100io.store.local import index_log, layout
from fx100io.store.local.index_log import REC_DEL, REC_PUT, IndexLog, Live, Record


class Harness:
    """A log on a real file, with the plain dict it should hold."""

    def __init__(self, path, index_half: int):
        self.path = str(path)
        self.dev = open_device(self.path, create=True, size=(2 << 20) + 2 * index_half)
        self.sb = layout.plan(self.dev.size, self.dev.block_size, 0, 1, new_set_id(),
                              index_half, self.path)
        self.log = IndexLog.format(self.dev, self.sb)
        self.model: dict[bytes, Live] = {}
        self.compactions = 0  # over every reopen

    def live(self):
        return list(self.model.values())

    def commit(self, recs):
        def apply(seq):
            index_log.apply_records(self.model, recs, lambda k, o, n, c: Live(k, o, n, c, seq))
        return self.log.commit(recs, self.live, apply)

    def replay(self) -> dict[bytes, tuple]:
        self.compactions += self.log.compactions
        self.log, found = IndexLog.open(self.dev, self.sb)
        return {k: (e.off, e.length, e.crc) for k, e in found.items()}

    def expected(self) -> dict[bytes, tuple]:
        return {k: (e.off, e.length, e.crc) for k, e in self.model.items()}

    def close(self):
        self.dev.close()


@pytest.fixture
def h(tmp_path):
    hs = []

    def make(index_half=64 << 10):
        hs.append(Harness(tmp_path / f"log{len(hs)}.img", index_half))
        return hs[-1]
    yield make
    for x in hs:
        x.close()


def put(key: str, off: int, n: int = 100, crc: int = 7) -> Record:
    return Record(REC_PUT, key.encode(), 0, off, n, crc)


def dele(key: str, off: int, n: int = 100) -> Record:
    return Record(REC_DEL, key.encode(), 0, off, n, 0)


def test_append_and_replay(h):
    x = h()
    x.commit([put("a", 0), put("b", 4096)])
    x.commit([put("a", 8192, crc=9), dele("b", 4096), put("c", 12288)])
    assert x.replay() == {b"a": (8192, 100, 9), b"c": (12288, 100, 7)} == x.expected()
    x.commit([put("d", 16384)])  # appends after the replayed tail
    assert x.replay() == x.expected()
    assert x.log.compactions == 0


def test_stale_del_keeps_the_newer_version(h):
    x = h()
    x.commit([put("k", 0)])
    x.commit([put("k", 4096), dele("k", 0)])  # the DEL names the version it removes
    assert x.replay() == {b"k": (4096, 100, 7)}


def test_compaction_folds_in_the_commit_that_triggers_it(h, monkeypatch):
    """Many rounds over the same keys in a small log, with DELs in every
    other commit: each commit is several segments, so compactions are
    triggered by commits of several shapes; after each one the replayed log
    equals the model."""
    monkeypatch.setattr(index_log, "SEGMENT_RECORDS", 64)
    x = h(64 << 10)
    keys = [f"k{i:04d}" for i in range(700)]  # ~33 KiB of records: 2 per half
    for rnd in range(8):
        recs = [put(k, (rnd * 1000 + i) * 4096) for i, k in enumerate(keys)]
        if rnd % 2:
            recs += [dele(k, (rnd * 1000 + i) * 4096) for i, k in enumerate(keys[:50])]
        x.commit(recs)
        assert x.replay() == x.expected(), f"round {rnd}"
    assert x.compactions >= 3


def test_multi_segment_commit_triggering_compaction(h, monkeypatch):
    """The stale-read bug, at the log's level: a commit of several segments
    does not fit after the tail; none of its records may be lost."""
    monkeypatch.setattr(index_log, "SEGMENT_RECORDS", 16)
    x = h(64 << 10)
    keys = [f"key{i:03d}" for i in range(100)]  # 7 segments per round
    for rnd in range(40):
        x.commit([put(k, (rnd * 100 + i) * 4096) for i, k in enumerate(keys)])
        assert x.replay() == x.expected(), f"round {rnd}"
    assert x.compactions >= 2


def test_pending_del_and_supersede_in_a_compaction(h):
    x = h(16 << 10)  # a header and 3 blocks of log per half
    x.commit([put("keep", 0), put("gone", 4096), put("old", 8192)])
    x.commit([put("f0", 12288)])
    x.commit([put("f1", 16384)])
    assert x.log.tail == x.sb.index_half and x.log.compactions == 0
    # one commit: a DEL of a live key, a PUT replacing a live key, a new key
    x.commit([dele("gone", 4096), put("old", 20480, crc=5), put("f2", 40960)])
    assert x.log.compactions == 1
    got = x.replay()
    assert got == x.expected()
    assert sorted(got) == [b"f0", b"f1", b"f2", b"keep", b"old"]
    assert got[b"old"] == (20480, 100, 5)


def test_torn_segment_ends_the_log(h):
    x = h()
    x.commit([put("a", 0)])
    x.commit([put("b", 4096)])
    torn_at = x.sb.index_off + x.log.half * x.sb.index_half + x.log.tail - 4096
    with open(x.path, "r+b") as f:  # flip a byte inside b's segment
        f.seek(torn_at + 70)
        byte = f.read(1)
        f.seek(torn_at + 70)
        f.write(bytes([byte[0] ^ 1]))
    assert x.replay() == {b"a": (0, 100, 7)}
    x.model.pop(b"b")
    x.commit([put("c", 8192)])  # overwrites the torn segment
    assert x.replay() == {b"a": (0, 100, 7), b"c": (8192, 100, 7)}


def test_leftover_after_tail_is_scrubbed(h):
    x = h()
    x.commit([put("a", 0)])
    from fx100io import _core
    ghost = _core.encode_segment(x.log.generation, x.log.seq + 2, [put("ghost", 4096)])
    x.log.write_at(x.log.half, x.log.tail + 4096, ghost)
    x.dev.flush_blocking()
    assert x.replay() == {b"a": (0, 100, 7)}  # not chained, and erased
    x.commit([put("b", 8192)])  # ends right before where the ghost was
    assert x.replay() == x.expected() == {b"a": (0, 100, 7), b"b": (8192, 100, 7)}


def test_commit_too_large_changes_nothing(h):
    x = h(16 << 10)
    x.commit([put("a", 0)])
    before = (x.log.generation, x.log.half, x.log.tail, x.log.seq)
    applied = []
    big = [put(f"big{i:04d}", 4096 * i) for i in range(400)]  # ~19 KiB
    with pytest.raises(errors.DeviceFullError, match="index"):
        x.log.commit(big, x.live, applied.append)
    assert applied == []
    assert (x.log.generation, x.log.half, x.log.tail, x.log.seq) == before
    assert x.replay() == {b"a": (0, 100, 7)}
    x.commit([put("b", 4096)])
    assert x.replay() == x.expected()


def test_failure_inside_a_compaction_keeps_the_old_half(h, monkeypatch):
    """A compaction that fails after writing part of the new half (an I/O
    error, or a crash) leaves the old half live and complete."""
    x = h(16 << 10)
    x.commit([put("a", 0)])
    x.commit([put("b", 4096)])
    writes = []
    real = x.log.write_at

    def failing(half, pos, data):
        writes.append(pos)
        if pos == 0:  # the header: the switch that must not happen
            raise errors.Fx100ioError(5, "injected")
        real(half, pos, data)
    monkeypatch.setattr(x.log, "write_at", failing)
    with pytest.raises(errors.Fx100ioError, match="injected"):
        x.log.compact(x.live)
    monkeypatch.undo()
    assert writes[-1] == 0
    # The header's write failed: whether it landed is unknown, so the log
    # takes no commit until a reopen has decided which half is live.
    with pytest.raises(errors.DeviceIOError, match="in doubt"):
        x.commit([put("c", 8192)])
    assert x.replay() == x.expected() == {b"a": (0, 100, 7), b"b": (4096, 100, 7)}
    x.log.compact(x.live)
    x.commit([put("c", 8192)])
    assert x.replay() == x.expected()


@pytest.mark.parametrize("fails", ["header-flush", "header-write-after-landing"])
def test_compaction_failing_after_its_header_was_issued_loses_nothing(h, monkeypatch, fails):
    """The header of the new half was written (or its write reported failed
    after it landed) and the flush after it failed: replay may take the new
    half.  No later commit may be acknowledged into either half, or it could
    be lost (before: later commits went into the old half and a reopen
    served the previous version of an overwritten key)."""
    x = h(16 << 10)
    x.commit([put("a", 0)])
    x.commit([put("b", 4096)])
    real_write, real_flush = x.log.write_at, x.dev.flush_blocking
    header = {"written": False}

    def write_at(half, pos, data):
        real_write(half, pos, data)
        if pos == 0:
            header["written"] = True
            if fails == "header-write-after-landing":
                raise errors.Fx100ioError(5, "injected write error after landing")

    def flush():
        if header["written"]:
            header["written"] = False
            raise errors.Fx100ioError(5, "injected flush failure")
        real_flush()
    monkeypatch.setattr(x.log, "write_at", write_at)
    monkeypatch.setattr(x.dev, "flush_blocking", flush)
    with pytest.raises(errors.Fx100ioError, match="injected"):
        x.log.compact(x.live)
    monkeypatch.undo()
    with pytest.raises(errors.DeviceIOError, match="in doubt"):
        x.commit([put("a", 12288, crc=99)])
    assert x.replay() == x.expected() == {b"a": (0, 100, 7), b"b": (4096, 100, 7)}
    x.commit([put("c", 8192)])
    x.commit([put("a", 12288, crc=99)])
    assert x.replay() == x.expected()


def test_a_retried_compaction_uses_a_newer_generation(h, monkeypatch):
    """Leftover segments of a failed compaction carry its generation; a
    retry in the same process always goes past it, so a retry can never
    chain into them."""
    x = h(16 << 10)
    x.commit([put("a", 0)])
    gens = []
    real = x.log.write_at

    def failing(half, pos, data):
        if pos == 0:
            raise errors.Fx100ioError(5, "injected")
        real(half, pos, data)
    for _ in range(20):
        x.log._in_doubt = None  # a failed header write, retried without a reopen
        monkeypatch.setattr(x.log, "write_at", failing)
        with pytest.raises(errors.Fx100ioError):
            x.log.compact(x.live)
        gens.append(x.log._tried_gen)
    assert gens == sorted(gens) and len(set(gens)) == len(gens)


def test_failed_append_is_never_replayed(h, monkeypatch):
    """A commit whose write fails after part of it reached the device must
    not come back: the next commit compacts into the other half instead of
    appending after the partial segments (which a later flush would make
    durable, and a replay would then apply)."""
    monkeypatch.setattr(index_log, "SEGMENT_RECORDS", 1)
    x = h()
    x.commit([put("k", 0, crc=1)])
    real = x.log.write_at
    calls = []

    def second_fails(half, pos, data):
        calls.append(pos)
        if len(calls) == 2:
            raise errors.Fx100ioError(5, "injected")
        real(half, pos, data)
    monkeypatch.setattr(x.log, "write_at", second_fails)
    with pytest.raises(errors.Fx100ioError, match="injected"):
        x.log.commit([put("k", 4096, crc=2), put("j", 8192)], x.live)  # not applied
    monkeypatch.setattr(x.log, "write_at", real)
    x.commit([put("other", 12288)])
    assert x.replay() == x.expected() == {b"k": (0, 100, 1), b"other": (12288, 100, 7)}

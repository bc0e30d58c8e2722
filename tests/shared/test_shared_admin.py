"""Admin paths against a live pool: every path that formats, installs,
rebuilds or deletes runs against a pool with chunks in it, and then the
pool's chunks are read back byte-exact.  A refusal changes no byte of any
namespace and no key of Redis."""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import chunk_bytes
from support.shared_redis import serve

import fx100io
from fx100io import errors
from fx100io.cli import main as cli_main
from fx100io.store.core.superblock import new_set_id
from fx100io.store.shared import IndexLostError, SharedChunkStore
from fx100io.store.shared import format as fmt
from fx100io.store.shared.index import RedisIndex
from fx100io.store.shared.rebuild import rebuild

MiB = 1 << 20
SIZES = {"a": 5000, "b": MiB + 7, "c": 3 * MiB, "d": 1}


@pytest.fixture
def redis_server(tmp_path: Path):
    yield from serve(tmp_path)


def file_digests(paths: list[str]) -> dict[str, str]:
    return {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths}


def redis_snapshot(r: Any) -> dict[bytes, Any]:
    """Every key of Redis with its type and content (field order aside)."""
    out: dict[bytes, Any] = {}
    for k in r.scan_iter(count=1000):
        t = r.type(k)
        if t == b"hash":
            out[k] = ("hash", r.hgetall(k))
        elif t == b"zset":
            out[k] = ("zset", r.zrange(k, 0, -1, withscores=True))
        elif t == b"string":
            out[k] = ("string", r.get(k))
        else:
            out[k] = (t, r.dump(k))
    return out


def value(key: str, tag: str = "1") -> np.ndarray:
    return chunk_bytes(f"{key}#{tag}", SIZES[key])


def assert_chunks(st: Any, want: dict[str, np.ndarray]) -> None:
    """Every chunk of want reads back byte-exact from st."""
    for k, v in want.items():
        buf = np.zeros(v.nbytes + 4096, np.uint8)
        assert st.batch_get_blocking([k], [buf]) == [True], k
        assert np.array_equal(buf[:v.nbytes], v), k


class LivePlain:
    """A ChunkStore open in this process, with chunks in it."""

    def __init__(self, tmp_path: Path, srv: Any):
        self.srv = srv
        self.uris = [str(tmp_path / "plain.img")]
        self.st = fx100io.ChunkStore(self.uris, create=True, size=32 * MiB)
        self.want = {k: value(k) for k in SIZES}
        self.st.batch_put_blocking(list(self.want), list(self.want.values()))

    def create_again(self, **kw: Any) -> None:
        fx100io.ChunkStore(self.uris, create=True, size=32 * MiB).close()

    def refused(self) -> type[BaseException]:
        return errors.DeviceBusyError

    def reopen(self) -> Any:
        self.st.close()
        return fx100io.ChunkStore(self.uris)


class LiveShared:
    """A SharedChunkStore pool named "prod" on two namespaces, open in this
    process, with chunks in it."""

    def __init__(self, tmp_path: Path, srv: Any):
        self.srv = srv
        self.uris = [str(tmp_path / f"ns{i}.img") for i in range(2)]
        self.st = SharedChunkStore(self.uris, srv.url, create=True, size=32 * MiB, name="prod")
        self.want = {k: value(k) for k in SIZES}
        self.st.batch_put_blocking(list(self.want), list(self.want.values()))

    def create_again(self, **kw: Any) -> None:
        SharedChunkStore(self.uris, self.srv.url, create=True, size=32 * MiB, **kw).close()

    def refused(self) -> type[BaseException]:
        return errors.NotAStoreError

    def reopen(self) -> Any:
        self.st.close()
        return SharedChunkStore(self.uris, self.srv.url)


class LiveSharedUnderPlain(LiveShared):
    """A live shared pool, and a ChunkStore create over its namespace."""

    def create_again(self, **kw: Any) -> None:
        fx100io.ChunkStore(self.uris[:1], create=True, size=32 * MiB).close()

    def refused(self) -> type[BaseException]:
        return errors.NotAStoreError


class LivePlainUnderShared(LivePlain):
    """A live ChunkStore, and a SharedChunkStore create over its namespace."""

    def create_again(self, **kw: Any) -> None:
        SharedChunkStore(self.uris, self.srv.url, create=True, size=32 * MiB).close()

    def refused(self) -> type[BaseException]:
        return errors.NotAStoreError


STORES = [
    pytest.param(LivePlain, {}, id="ChunkStore"),
    pytest.param(LivePlainUnderShared, {}, id="SharedChunkStore-over-a-ChunkStore"),
    pytest.param(LiveShared, {"name": "prod"}, id="SharedChunkStore-same-name"),
    pytest.param(LiveShared, {"name": "other"}, id="SharedChunkStore-other-name"),
    pytest.param(LiveShared, {}, id="SharedChunkStore-default-name"),
    # ChunkStore's create looks at what the device holds: a shared pool's namespace
    pytest.param(LiveSharedUnderPlain, {}, id="ChunkStore-over-a-shared-pool"),
]


@pytest.mark.parametrize("live, kw", STORES)
def test_create_over_a_live_store_is_refused_and_changes_nothing(tmp_path, redis_server,
                                                                 live, kw):
    pool = live(tmp_path, redis_server)
    files = file_digests(pool.uris)
    keys = redis_snapshot(redis_server.client())
    with pytest.raises(pool.refused()):
        pool.create_again(**kw)
    assert file_digests(pool.uris) == files, "a refused create wrote to the namespaces"
    assert redis_snapshot(redis_server.client()) == keys, "a refused create left keys changed"
    assert_chunks(pool.st, pool.want)  # the live handle still works
    pool.st.batch_put_blocking(["e"], [b"after"])  # and writes
    st = pool.reopen()
    try:
        assert_chunks(st, pool.want)
    finally:
        st.close()


def test_create_with_force_over_a_live_pool_wipes_it(tmp_path, redis_server):
    pool = LiveShared(tmp_path, redis_server)
    pool.create_again(name="other", force=True)
    with pytest.raises(IndexLostError):  # the live pool's index names other namespaces now
        pool.st.batch_put_blocking(["x"], [b"x"])
    pool.st.close()
    with SharedChunkStore(pool.uris, redis_server.url) as st:
        assert st.keys() == [] and st.batch_get_blocking(["a"], [bytearray(MiB)]) == [False]


# ------------------------------------------------------------ pool names
BAD_NAMES = ["p*", "team[1]", "a?", "x\\y", "{x}", "a:b", "", "-a", ".a", "a b", "é",
             "a" * 65, "pool\n", "a^b"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_name_outside_the_rule_is_refused_everywhere(tmp_path, redis_server, name):
    pool = LiveShared(tmp_path, redis_server)
    keys = redis_snapshot(redis_server.client())
    new = str(tmp_path / "new.img")
    rule = "A-Z a-z 0-9"
    with pytest.raises(errors.InvalidArgumentError, match=rule):
        SharedChunkStore([new], redis_server.url, create=True, size=16 * MiB, name=name)
    assert not os.path.exists(new)
    with pytest.raises(errors.InvalidArgumentError, match=rule):
        SharedChunkStore(pool.uris, redis_server.url, name=name)
    with pytest.raises(errors.InvalidArgumentError, match=rule):
        rebuild(pool.uris, redis_server.url, name=name)
    assert redis_snapshot(redis_server.client()) == keys
    assert_chunks(pool.st, pool.want)
    pool.st.close()


@pytest.mark.parametrize("name", ["a", "prod-2", "team_1.v2", "A" * 64, "7"])
def test_names_within_the_rule_make_pools(tmp_path, redis_server, name):
    with SharedChunkStore([str(tmp_path / "n.img")], redis_server.url, create=True,
                          size=16 * MiB, name=name) as st:
        st.batch_put_blocking(["k"], [b"v"])
    with SharedChunkStore([str(tmp_path / "n.img")], redis_server.url, name=name) as st:
        assert st.batch_get_blocking(["k"], [bytearray(1)]) == [True]


@pytest.mark.parametrize("name", ["p*", "team[1]", "é"])
def test_a_pool_an_older_fxio_named_outside_the_rule_opens_and_rebuilds_without_a_name(
        tmp_path, redis_server, monkeypatch, capsys, name):
    """Pools made before the name rule keep working: opened without name=,
    rebuilt without --name; given the name, the refusal says so."""
    uris = [str(tmp_path / f"ns{i}.img") for i in range(2)]
    with monkeypatch.context() as m:
        m.setattr(fmt, "check_name", lambda n, given_for="": n)  # the older rule
        st = SharedChunkStore(uris, redis_server.url, create=True, size=32 * MiB, name=name)
    want = {k: value(k) for k in SIZES}
    st.batch_put_blocking(list(want), list(want.values()))
    st.close()
    with pytest.raises(errors.InvalidArgumentError, match="without name="):
        SharedChunkStore(uris, redis_server.url, name=name)
    with SharedChunkStore(uris, redis_server.url) as st:
        assert_chunks(st, want)
    redis_server.client().flushall()  # the index is lost
    assert cli_main(["shared-rebuild", "--index", redis_server.url, "--name", name,
                     *uris]) == 1
    assert "without --name" in capsys.readouterr().err
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["shared-rebuild", "--index", redis_server.url, *uris]) == 0
    assert json.loads(out.getvalue())["chunks"] == len(want)
    with SharedChunkStore(uris, redis_server.url) as st:
        assert_chunks(st, want)
        assert sorted(st.keys()) == sorted(k.encode() for k in want)


@pytest.mark.parametrize("glob, victim", [("p*", "prod"), ("team[1]", "team1"),
                                          ("a?c", "abc"), ("x\\y", "xy")])
def test_installing_an_index_never_reaches_another_pools_keys(tmp_path, redis_server, glob,
                                                              victim):
    """The index's key pattern is escaped whatever the name (pools made by
    an older fx100io may have such names; a name is checked before, too)."""
    uris = [str(tmp_path / "v.img")]
    st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB, name=victim)
    want = {"a": value("a"), "c": value("c")}
    st.batch_put_blocking(list(want), list(want.values()))
    theirs = {k: v for k, v in redis_snapshot(redis_server.client()).items()
              if k.startswith(f"fx100io:{{{victim}}}".encode())}
    idx = RedisIndex(redis_server.url, glob, new_set_id())
    try:
        idx.install(1, [MiB], [[(4096, MiB)]])
    finally:
        idx.close()
    after = redis_snapshot(redis_server.client())
    assert {k: v for k, v in after.items() if k in theirs} == theirs
    assert_chunks(st, want)
    st.close()


# ------------------------------------------------------------ claims
def test_a_create_that_died_after_its_claim_holds_the_name_until_the_claim_ends(
        tmp_path, redis_server):
    """A create that claimed the name and died before writing: another
    create of the name is refused (nothing written) until the claim's
    deadline, then goes ahead."""
    uris = [str(tmp_path / "a.img")]
    dead = RedisIndex(redis_server.url, "pool", new_set_id())
    dead.claim("deadhost", 1500, False)
    dead.close()
    with pytest.raises(errors.DeviceBusyError, match="being created by deadhost"):
        SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)
    assert not os.path.exists(uris[0])
    time.sleep(1.6)
    with SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB) as st:
        st.batch_put_blocking(["k"], [b"v"])
        assert st.batch_get_blocking(["k"], [bytearray(1)]) == [True]


def test_a_create_that_died_after_formatting_is_taken_over_once_its_claim_ended(
        tmp_path, redis_server, monkeypatch):
    uris = [str(tmp_path / f"ns{i}.img") for i in range(2)]

    def die(self: Any, capacity: Any) -> None:
        raise KeyboardInterrupt("died before installing the index")

    with monkeypatch.context() as m:
        m.setattr(SharedChunkStore, "_install", die)
        with pytest.raises(KeyboardInterrupt):
            SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB, lease_s=1.5)
    # the claim stays: hosts see a pool being created, not an empty one
    with SharedChunkStore(uris, redis_server.url) as half:
        with pytest.raises(IndexLostError, match="being created"):
            half.batch_put_blocking(["k"], [b"v"])
    # a create of the name waits for that claim, elsewhere or on the same
    # namespaces (they carry its set id, but it may still be writing)
    for where in ([str(tmp_path / "elsewhere.img")], uris):
        with pytest.raises(errors.DeviceBusyError):
            SharedChunkStore(where, redis_server.url, create=True, size=16 * MiB)
    files = file_digests(uris)
    assert file_digests(uris) == files
    time.sleep(1.6)  # the claim ended: its create is dead
    with SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB) as st:
        st.batch_put_blocking(["k"], [b"v"])
    with SharedChunkStore(uris, redis_server.url) as st:
        assert st.batch_get_blocking(["k"], [bytearray(1)]) == [True]


def test_a_create_of_another_name_formats_the_namespaces_of_a_create_that_died(
        tmp_path, redis_server, monkeypatch):
    """Once the dead create's claim ended, its half-formatted namespaces are
    free for a create of any name, and its name is free again."""
    uris = [str(tmp_path / f"ns{i}.img") for i in range(2)]

    def die(self: Any, capacity: Any) -> None:
        raise KeyboardInterrupt("died before installing the index")

    with monkeypatch.context() as m:
        m.setattr(SharedChunkStore, "_install", die)
        with pytest.raises(KeyboardInterrupt):
            SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB, name="x",
                             lease_s=1)
    with pytest.raises(errors.NotAStoreError, match="being created"):
        SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB, name="y")
    time.sleep(1.1)
    with SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB, name="y") as st:
        st.batch_put_blocking(["k"], [value("a")])
        assert_chunks(st, {"k": value("a")})
    assert redis_server.client().keys("fx100io:{x}*") == []


def test_a_running_create_is_not_taken_over_by_another_of_its_name(tmp_path, redis_server,
                                                                   monkeypatch):
    """A second create of the name over the same namespaces, started once
    the first wrote its first superblock, is refused; the first completes."""
    uris = [str(tmp_path / f"ns{i}.img") for i in range(2)]
    real = SharedChunkStore._write_superblock
    seen: list[Any] = []

    def write(d: Any, sb: Any) -> Any:
        ns = real(d, sb)
        if not seen:
            seen.append(True)  # (a nested create that went ahead would write too)
            with pytest.raises(errors.DeviceBusyError, match="being created"):
                SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)
        return ns

    monkeypatch.setattr(SharedChunkStore, "_write_superblock", staticmethod(write))
    st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)
    monkeypatch.setattr(SharedChunkStore, "_write_superblock", staticmethod(real))
    assert seen
    want = {k: value(k) for k in SIZES}
    st.batch_put_blocking(list(want), list(want.values()))
    st.close()
    with SharedChunkStore(uris, redis_server.url) as st:
        assert_chunks(st, want)


def test_a_create_whose_claim_was_taken_writes_nothing_more(tmp_path, redis_server,
                                                            monkeypatch):
    """Another create takes the name with force while the first is between
    two superblocks: the first writes no more, puts back what it wrote, and
    the second's pool works."""
    uris = [str(tmp_path / f"ns{i}.img") for i in range(2)]
    other = [str(tmp_path / "other.img")]
    real = SharedChunkStore._write_superblock
    won: list[Any] = []

    def write(d: Any, sb: Any) -> Any:
        ns = real(d, sb)
        if not won:
            won.append(None)  # (the nested create writes superblocks too)
            won[0] = SharedChunkStore(other, redis_server.url, create=True, size=16 * MiB,
                                      force=True)
        return ns

    monkeypatch.setattr(SharedChunkStore, "_write_superblock", staticmethod(write))
    with pytest.raises(errors.NotAStoreError, match="claim of this create .* is gone"):
        SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)
    monkeypatch.setattr(SharedChunkStore, "_write_superblock", staticmethod(real))
    # the first namespace's superblock went back (zeros), the second was never written
    assert Path(uris[0]).read_bytes()[:fmt.BLOCK] == bytes(fmt.BLOCK)
    assert Path(uris[1]).read_bytes()[:fmt.BLOCK] == bytes(fmt.BLOCK)
    won[0].batch_put_blocking(["k"], [value("b")])
    assert_chunks(won[0], {"k": value("b")})
    won[0].close()


@pytest.mark.parametrize("ndevs", [1, 2])
def test_two_creates_of_other_names_over_the_same_namespaces_do_not_both_win(
        tmp_path, redis_server, monkeypatch, ndevs):
    """Create "a" looked at the namespaces; create "b" then runs all of its
    create over them before "a" writes a byte (their claims are on other
    names): "a" refuses without writing, "b"'s pool keeps its chunks."""
    import fx100io.store.shared.store as store_mod
    uris = [str(tmp_path / f"ns{i}.img") for i in range(ndevs)]
    real = store_mod.open_device
    b: list[Any] = []

    def opening(uri: str, **kw: Any) -> Any:
        if kw.get("create") and not b:
            b.append(None)  # (the nested create opens them too)
            b[0] = SharedChunkStore(uris, redis_server.url, create=True, name="b",
                                    size=16 * MiB)
        return real(uri, **kw)

    monkeypatch.setattr(store_mod, "open_device", opening)
    with pytest.raises(errors.NotAStoreError, match="changed since this create looked"):
        SharedChunkStore(uris, redis_server.url, create=True, name="a", size=16 * MiB)
    monkeypatch.setattr(store_mod, "open_device", real)
    assert redis_server.client().hget("fx100io:{a}:meta", "set_id") is None  # name given back
    want = {k: value(k) for k in SIZES}
    b[0].batch_put_blocking(list(want), list(want.values()))
    assert_chunks(b[0], want)
    b[0].close()
    with SharedChunkStore(uris, redis_server.url, name="b") as st:
        assert_chunks(st, want)


def test_a_create_whose_namespace_was_formatted_by_another_installs_nothing(
        tmp_path, redis_server, monkeypatch):
    """Two creates of other names over the same two namespaces interleave
    their superblocks; at the install, the first finds the second's
    superblock on a namespace and refuses, installing nothing, and puts back
    the block it wrote (it still holds its superblock)."""
    uris = [str(tmp_path / f"ns{i}.img") for i in range(2)]
    idx = RedisIndex(redis_server.url, "a", new_set_id())
    real_install = RedisIndex.install

    def install(self: Any, *a: Any, **kw: Any) -> Any:
        if self.name == "a":  # meanwhile "b" formats the second namespace
            sb = fmt.plan(16 * MiB, 1, 2, new_set_id(), "b", uris[1])
            with fx100io.open_device(uris[1]) as d:
                SharedChunkStore._write_superblock(d, sb)
        return real_install(self, *a, **kw)

    monkeypatch.setattr(RedisIndex, "install", install)
    with pytest.raises(errors.NotAStoreError, match="no longer holds this create's"):
        SharedChunkStore(uris, redis_server.url, create=True, name="a", size=16 * MiB)
    idx.close()
    assert redis_server.client().keys("fx100io:{a}*") == []
    assert Path(uris[0]).read_bytes()[:fmt.BLOCK] == bytes(fmt.BLOCK)
    assert Path(uris[1]).read_bytes()[:16] == fmt.SB_MAGIC


def test_create_refuses_a_pool_whose_index_is_not_in_this_redis(tmp_path, redis_server):
    """A pool whose index was lost, or is kept in another Redis (here db 1):
    create refuses without force, and says how to recover it."""
    uris = [str(tmp_path / f"ns{i}.img") for i in range(2)]
    other_db = redis_server.url[:-1] + "1"
    st = SharedChunkStore(uris, other_db, create=True, size=32 * MiB, name="prod")
    want = {k: value(k) for k in SIZES}
    st.batch_put_blocking(list(want), list(want.values()))
    files = file_digests(uris)
    keys = redis_snapshot(redis_server.client())
    for name in ("prod", "other"):
        with pytest.raises(errors.NotAStoreError, match="fx100io shared-rebuild"):
            SharedChunkStore(uris, redis_server.url, create=True, size=32 * MiB, name=name)
    assert file_digests(uris) == files
    assert redis_snapshot(redis_server.client()) == keys
    assert_chunks(st, want)
    st.close()
    # force formats it all the same
    with SharedChunkStore(uris, redis_server.url, create=True, size=32 * MiB, force=True) as st:
        assert st.keys() == []


# ------------------------------------------------------------ rebuild and delete
def test_rebuild_of_a_live_pool_keeps_every_chunk(tmp_path, redis_server):
    """`fx100io shared-rebuild` while the pool is open with chunks in it (some
    overwritten, one deleted): the index it installs serves exactly the
    chunks that were there, byte-exact, to the open handle and a new one."""
    pool = LiveShared(tmp_path, redis_server)
    pool.st.batch_put_blocking(["b"], [value("b", "2")])
    pool.want["b"] = value("b", "2")
    assert pool.st.delete_blocking("d")
    del pool.want["d"]
    out = io.StringIO()
    with redirect_stdout(out):
        rc = cli_main(["shared-rebuild", "--index", redis_server.url, *pool.uris])
    assert rc == 0
    assert json.loads(out.getvalue())["chunks"] == len(pool.want)
    assert_chunks(pool.st, pool.want)
    assert pool.st.batch_get_blocking(["d"], [bytearray(16)]) == [False]
    with SharedChunkStore(pool.uris, redis_server.url) as st:
        assert_chunks(st, pool.want)
        assert sorted(st.keys()) == sorted(k.encode() for k in pool.want)
    pool.st.close()


def test_rebuild_refuses_a_bad_name_from_the_command_line(tmp_path, redis_server, capsys):
    pool = LiveShared(tmp_path, redis_server)
    keys = redis_snapshot(redis_server.client())
    assert cli_main(["shared-rebuild", "--index", redis_server.url, "--name", "p*",
                             *pool.uris]) == 1
    assert "A-Z a-z 0-9" in capsys.readouterr().err
    assert redis_snapshot(redis_server.client()) == keys
    assert_chunks(pool.st, pool.want)
    pool.st.close()


def test_rebuild_refuses_while_another_host_creates_the_pool(tmp_path, redis_server):
    pool = LiveShared(tmp_path, redis_server)
    pool.st.close()
    redis_server.client().flushall()  # the index is lost ...
    creator = RedisIndex(redis_server.url, "prod", new_set_id())
    creator.claim("otherhost", 60_000, False)  # ... and another host creates "prod"
    creator.close()
    with pytest.raises(errors.NotAStoreError, match="creating"):
        rebuild(pool.uris, redis_server.url)


def test_rebuild_replaces_the_claim_of_a_create_that_died_once_it_ended(
        tmp_path, redis_server, monkeypatch):
    """A create that died after formatting leaves its claim: shared-rebuild
    waits for it (the create may be running), then, without --force,
    installs an index of the namespaces."""
    uris = [str(tmp_path / f"ns{i}.img") for i in range(2)]

    def die(self: Any, capacity: Any) -> None:
        raise KeyboardInterrupt("died before installing the index")

    with monkeypatch.context() as m:
        m.setattr(SharedChunkStore, "_install", die)
        with pytest.raises(KeyboardInterrupt):
            SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB, lease_s=1)
    with pytest.raises(errors.NotAStoreError, match="creating"):
        rebuild(uris, redis_server.url)
    time.sleep(1.1)
    assert rebuild(uris, redis_server.url)["chunks"] == 0
    with SharedChunkStore(uris, redis_server.url) as st:
        st.batch_put_blocking(["k"], [value("a")])
        assert_chunks(st, {"k": value("a")})


def test_of_two_creates_of_one_name_at_once_one_wins_and_the_other_writes_nothing(
        tmp_path, redis_server):
    import threading
    sides = {s: [str(tmp_path / f"{s}{i}.img") for i in range(2)] for s in ("x", "y")}
    go = threading.Barrier(2)
    out: dict[str, Any] = {}

    def create(side: str) -> None:
        go.wait()
        try:
            st = SharedChunkStore(sides[side], redis_server.url, create=True, size=16 * MiB)
        except (errors.DeviceBusyError, errors.NotAStoreError) as e:
            out[side] = e
        else:
            out[side] = st

    ts = [threading.Thread(target=create, args=(s,)) for s in sides]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    won = [s for s, v in out.items() if isinstance(v, SharedChunkStore)]
    assert len(won) == 1, out
    lost = "y" if won == ["x"] else "x"
    assert not any(os.path.exists(u) for u in sides[lost]), "the refused create wrote"
    st = out[won[0]]
    st.batch_put_blocking(["k"], [value("b")])
    assert_chunks(st, {"k": value("b")})
    st.close()


def test_chunkstore_create_with_force_formats_a_shared_namespace(tmp_path, redis_server) -> None:
    """force=True is the way to reuse a shared pool's namespace as a local
    store: it formats, and the local store works."""
    pool = LiveSharedUnderPlain(tmp_path, redis_server)
    pool.st.close()
    with fx100io.ChunkStore(pool.uris[:1], create=True, size=32 * MiB, force=True) as st:
        want = {"a": value("a", "local")}
        st.batch_put_blocking(list(want), list(want.values()))
        assert_chunks(st, want)

"""SharedChunkStore over a replicated index: the index= URL forms (one
server, Sentinel, Cluster), index_replicas (a put or delete waits for its
replicas, and fails clearly when they do not confirm), and a Sentinel
failover under load (SIGKILL of the primary, behind a replication gap, while
three host processes put and get): every put acknowledged is read back byte-exact afterwards, and
gets resume within the failover time plus 2 s.  Real redis-server and
sentinel processes on loopback (tests/support/shared_redis.py)."""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from support.shared_hosts import Host
from support.shared_redis import RedisClusterSet, RedisSentinelSet, RedisServer, serve

from fx100io import errors
from fx100io.cli import main as cli_main
from fx100io.store.shared import IndexUnavailableError, SharedChunkStore
from fx100io.store.shared.index import IndexNotReplicatedError, glob_escape
from fx100io.store.shared.index_url import parse_index_url

MiB = 1 << 20


def get(st: SharedChunkStore, key: str, n: int = 4096) -> bytes | None:
    b = bytearray(n)
    return bytes(b) if st.batch_get_blocking([key], [b]) == [True] else None


@pytest.fixture
def redis_server(tmp_path: Path):
    yield from serve(tmp_path)


def _running(servers: RedisSentinelSet | RedisClusterSet):
    """A fixture's body: servers started, then stopped (also after a start that failed)."""
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()


@pytest.fixture
def sentinels(tmp_path: Path):
    yield from _running(RedisSentinelSet(tmp_path / "sentinel"))


@pytest.fixture
def cluster(tmp_path: Path):
    yield from _running(RedisClusterSet(tmp_path / "cluster"))


# ------------------------------------------------------------ URL forms
def test_urls_parse_into_their_deployment():
    t = parse_index_url("redis+sentinel://:pw@s1:26379,s2/mymaster/3?ssl=true"
                        "&sentinel_password=sp&socket_timeout=0.25&index_replicas=2")
    assert (t.kind, t.hosts, t.service, t.db, t.replicas) == (
        "sentinel", [("s1", 26379), ("s2", 26379)], "mymaster", 3, 2)
    assert t.opts == {"password": "pw", "ssl": True, "socket_timeout": 0.25}
    assert t.sentinel_opts == {"password": "sp"}
    t = parse_index_url("redis+cluster://u:pw@n1:7000,[::1]:7001/")
    assert (t.kind, t.hosts, t.opts) == ("cluster", [("n1", 7000), ("::1", 7001)],
                                         {"username": "u", "password": "pw"})
    t = parse_index_url("redis://:pw@h:6380/2?index_replicas=0&socket_timeout=1")
    assert (t.kind, t.replicas) == ("single", 0)
    assert "index_replicas" not in t.url and "socket_timeout=1" in t.url
    assert parse_index_url("unix:///run/redis.sock?db=1").kind == "single"


@pytest.mark.parametrize("url, why", [
    ("http://h:1/", "unknown scheme"),
    ("h:6379", "unknown scheme"),
    ("redis+sentinel://:SECRETPW@s1:26379/", "no service name"),
    ("redis+sentinel://:SECRETPW@s1:2x/m", "not a port number"),
    ("redis+sentinel://s1/m/x?password=SECRETPW", "database"),
    ("redis+sentinel://s1/m?sentinel_password=SECRETPW&bogus=1", "unknown option 'bogus'"),
    ("redis+cluster://:SECRETPW@n1:7000/1", "only database 0"),
    ("redis+cluster://:SECRETPW@n1:7000/?ssl=maybe", "ssl must be"),
    ("redis+cluster://:SECRETPW@/", "no host"),
    ("redis://:SECRETPW@h:1/0?index_replicas=-1", "index_replicas"),
    ("redis+cluster://n1:7000/?socket_timeout=0&password=SECRETPW", "positive"),
])
def test_bad_urls_are_refused_clearly_without_their_password(tmp_path, url, why):
    with pytest.raises(errors.InvalidArgumentError) as e:
        parse_index_url(url)
    assert why in str(e.value) and "SECRETPW" not in str(e.value)
    with pytest.raises(errors.InvalidArgumentError) as e:
        SharedChunkStore([str(tmp_path / "ns.img")], url, create=True, size=16 * MiB)
    assert "SECRETPW" not in str(e.value)


def test_a_pool_over_sentinel_puts_gets_and_waits_for_its_replicas(tmp_path, sentinels):
    uris = [str(tmp_path / "ns.img")]
    st = SharedChunkStore(uris, sentinels.url(), create=True, size=16 * MiB)
    try:
        assert st._index.replicas() == 1  # the primary has replicas: 1 by default
        st.batch_put_blocking(["a", "b"], [b"alpha", b"beta"])
        assert get(st, "a")[:5] == b"alpha" and get(st, "b")[:4] == b"beta"
        # the put's WAIT returned: both replicas hold the entry already
        for s in sentinels.servers[1:]:
            assert s.client().hexists(f"{st._index.prefix}:idx", b"a")
        assert st.delete_blocking("b") and get(st, "b") is None
        other = SharedChunkStore(uris, sentinels.url("index_replicas=2"))
        other.batch_put_blocking(["c"], [b"gamma"])
        assert get(st, "c")[:5] == b"gamma"
        # one replica down: index_replicas=2 cannot be met, and says so
        sentinels.servers[2].stop(signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(IndexNotReplicatedError, match="confirmed by 1 of the 2 replicas"):
            other.batch_put_blocking(["d"], [b"delta"])
        assert time.monotonic() - t0 < 2 * other._index.timeout + 1
        with pytest.raises(IndexNotReplicatedError):
            other.delete_blocking("c")
        assert isinstance(IndexNotReplicatedError(5, "x", "u"), IndexUnavailableError)
        # the default (1) is met by the replica left
        st.batch_put_blocking(["e"], [b"epsilon"])
        assert get(other, "e")[:7] == b"epsilon"
        other.close()
        # the primary loses the pool's index: shared-rebuild over the Sentinel URL
        r = sentinels.primary().client()
        r.delete(*r.scan_iter(match=glob_escape(st._index.prefix) + ":*"))
        assert get(st, "e") is None
        out = io.StringIO()
        with redirect_stdout(out):
            assert cli_main(["shared-rebuild", "--index", sentinels.url(), *uris]) == 0
        assert json.loads(out.getvalue())
        time.sleep(1.1)  # the index was 'lost' for retry_after
        assert get(st, "e")[:7] == b"epsilon" and get(st, "a")[:5] == b"alpha"
    finally:
        st.close()


def test_index_replicas_is_a_keyword_too_and_must_agree_with_the_url(tmp_path, redis_server):
    uris = [str(tmp_path / "ns.img")]
    st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)
    assert st._index.replicas() == 0  # no replica: puts wait for none
    st.batch_put_blocking(["a"], [b"a"])
    st.close()
    with pytest.raises(errors.InvalidArgumentError, match="index_replicas"):
        SharedChunkStore(uris, redis_server.url + "?index_replicas=1", index_replicas=2)
    st = SharedChunkStore(uris, redis_server.url, index_replicas=1)
    with pytest.raises(IndexNotReplicatedError, match="confirmed by 0 of the 1"):
        st.batch_put_blocking(["b"], [b"b"])
    assert get(st, "a")[:1] == b"a"
    st.close()


def test_the_default_turns_to_waiting_once_a_replica_is_seen(tmp_path, redis_server):
    """A pool opened while its primary has no replica (a replica reconnecting, the moments
    after a failover) waits for one as soon as the primary has one: the default is never
    settled at 0 for the process's life."""
    uris = [str(tmp_path / "ns.img")]
    st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)
    assert st._index.replicas() == 0
    st.batch_put_blocking(["a"], [b"a"])
    replica = RedisServer(tmp_path / "replica")
    replica.start(extra=["--replicaof", "127.0.0.1", str(redis_server.port)])
    try:
        primary = redis_server.client()
        deadline = time.monotonic() + 20
        while primary.info("replication").get("slave0", {}).get("state") != "online":
            assert time.monotonic() < deadline, "the replica never came online"
            time.sleep(0.05)
        assert st._index.replicas() == 1
        st.batch_put_blocking(["b"], [b"b"])  # waited for by the replica
        assert replica.client().keys("*")  # the index reached the replica
        replica.stop(signal.SIGKILL)
        while int(primary.info("replication")["connected_slaves"]) > 0:
            assert time.monotonic() < deadline, "the primary never saw the replica go"
            time.sleep(0.05)
        with pytest.raises(IndexNotReplicatedError):  # 1 stays: a clear error, not silence
            st.batch_put_blocking(["c"], [b"c"])
        assert get(st, "b")[:1] == b"b"
    finally:
        replica.stop(signal.SIGKILL)
        st.close()


def test_install_and_wipe_wait_for_their_replicas_as_puts_do(tmp_path, redis_server, capsys):
    """A create's install, a create with force's wipe of another pool, and a rebuild's install
    WAIT for index_replicas: with the replica there each returns with its change on the
    replica; with it gone each raises IndexNotReplicatedError naming the step."""
    replica = RedisServer(tmp_path / "replica")
    replica.start(extra=["--replicaof", "127.0.0.1", str(redis_server.port)])
    try:
        primary = redis_server.client()
        deadline = time.monotonic() + 20
        while primary.info("replication").get("slave0", {}).get("state") != "online":
            assert time.monotonic() < deadline, "the replica never came online"
            time.sleep(0.05)
        url = redis_server.url + "?index_replicas=1"
        old = [str(tmp_path / "old.img")]
        st = SharedChunkStore(old, url, create=True, size=16 * MiB, name="old")
        st.batch_put_blocking(["a"], [b"a"])
        st.close()
        # the install waited: the replica holds the new pool's index when create returns
        uris = [str(tmp_path / "ns.img")]
        st = SharedChunkStore(uris, url, create=True, size=16 * MiB, name="new")
        prefix = st._index.prefix
        assert replica.client().hget(f"{prefix}:meta", "set_id") == st._index.set_id.encode()
        st.batch_put_blocking(["b"], [b"b"])
        st.close()
        replica.stop(signal.SIGKILL)
        while int(primary.info("replication")["connected_slaves"]) > 0:
            assert time.monotonic() < deadline, "the primary never saw the replica go"
            time.sleep(0.05)
        # a create with force over "old"'s namespace wipes old's index first: it waits
        with pytest.raises(IndexNotReplicatedError, match="wipe was confirmed by 0 of the 1"):
            SharedChunkStore(old, url, create=True, size=16 * MiB, name="other", force=True)
        # a rebuild's install waits too, and the CLI says so
        assert cli_main(["shared-rebuild", "--index", url, *uris]) != 0
        assert "install was confirmed by 0 of the 1" in capsys.readouterr().err
        # the change itself is on the primary (not durable against a failover, as a put's)
        assert primary.hexists(f"{prefix}:idx", b"b")
        with pytest.raises(IndexNotReplicatedError, match="install was confirmed by 0 of the 1"):
            SharedChunkStore([str(tmp_path / "third.img")], url, create=True, size=16 * MiB,
                             name="third")
        st = SharedChunkStore(uris, redis_server.url + "?index_replicas=0")
        assert get(st, "b")[:1] == b"b"
        st.close()
    finally:
        replica.stop(signal.SIGKILL)


def _online(primary, deadline: float) -> None:
    while primary.info("replication").get("slave0", {}).get("state") != "online":
        assert time.monotonic() < deadline, "the replica never came online"
        time.sleep(0.05)


def test_an_admin_change_whose_connection_reconnected_to_another_server_is_not_confirmed(
        tmp_path, redis_server):
    """call_waited: fn commits on primary P, P dies, and a server with a replica comes up at
    P's address (a restarted node; under Sentinel the pool would reconnect to the new primary).
    The WAIT's pooled connection is silently re-made there, with the CLIENT ID fn's had on P
    (IDs are per-server counters; the test lines them up). A WAIT on a connection that wrote
    nothing counts every replica at once, so the change, lost with P, must still not be
    reported replicated: IndexNotReplicatedError, and the key is indeed not on the new
    server."""
    replica = RedisServer(tmp_path / "replica")
    replica.start(extra=["--replicaof", "127.0.0.1", str(redis_server.port)])
    heir = RedisServer(tmp_path / "heir", port=redis_server.port)
    try:
        deadline = time.monotonic() + 30
        _online(redis_server.client(), deadline)
        url = redis_server.url + "?index_replicas=1"
        st = SharedChunkStore([str(tmp_path / "ns.img")], url, create=True, size=16 * MiB,
                              name="k1")
        index = st._index
        st.close()
        for _ in range(100):  # fn's CLIENT ID on P well above what the new server starts at
            redis_server.client().client_id()

        def fn(r, p):
            ident = r.client_id()
            with r.pipeline(transaction=True) as pipe:
                pipe.set(f"{p}:k1probe", b"x")
                pipe.execute()
            redis_server.stop(signal.SIGKILL)
            heir.start()
            _online(heir.client(), deadline)
            while True:  # hand out IDs on the new server up to the one before fn's
                got = heir.client().client_id()
                assert got < ident, "the new server's CLIENT IDs passed fn's; cannot line up"
                if got == ident - 1:
                    return ident

        with pytest.raises(IndexNotReplicatedError, match="did not provably go down one"):
            index.call_waited("install", fn)
        assert heir.client().get(f"{index.prefix}:k1probe") is None  # the change was lost
    finally:
        heir.stop(signal.SIGKILL)
        replica.stop(signal.SIGKILL)


def test_a_user_that_may_not_run_info_is_told_to_give_index_replicas(tmp_path, redis_server):
    """An ACL without @dangerous (no INFO) cannot find out the default: opening says so and
    names the option, and with index_replicas given the pool works."""
    r = redis_server.client()
    r.execute_command("ACL", "SETUSER", "app", "on", ">apppw", "~*", "+@all", "-@dangerous")
    url = f"redis://app:apppw@127.0.0.1:{redis_server.port}/0"
    uris = [str(tmp_path / "ns.img")]
    with pytest.raises(errors.InvalidArgumentError, match="index_replicas") as e:
        SharedChunkStore(uris, url, create=True, size=16 * MiB)
    assert "apppw" not in str(e.value)
    st = SharedChunkStore(uris, url + "?index_replicas=0", create=True, size=16 * MiB,
                          force=True)
    st.batch_put_blocking(["a"], [b"a"])
    assert get(st, "a")[:1] == b"a"
    st.close()


def _lose_and_rebuild(st: SharedChunkStore, r, url: str, uris: list[str], key: str) -> dict:
    """Delete st's pool's keys through r (its index is lost: key misses), run `fx100io
    shared-rebuild --index url` over the pool's devices, and wait out retry_after; its
    JSON report."""
    r.delete(*r.scan_iter(match=glob_escape(st._index.prefix) + ":*"))
    assert get(st, key) is None
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["shared-rebuild", "--index", url, *uris]) == 0
    time.sleep(1.1)  # the index was 'lost' for retry_after
    return json.loads(out.getvalue())


def test_a_pool_over_a_cluster_and_its_rebuild(tmp_path, cluster):
    pools = {}
    for name in ("alpha", "beta", "gamma"):  # names whose slots spread over the nodes
        uris = [str(tmp_path / f"{name}.img")]
        st = SharedChunkStore(uris, cluster.url(), create=True, size=16 * MiB, name=name)
        st.batch_put_blocking([f"{name}-k"], [name.encode()])
        pools[name] = (uris, st)
    nodes = {st._index.sync_client().connection_pool.connection_kwargs["port"]
             for _u, st in pools.values()}
    assert len(nodes) >= 2, "the test's names should land on more than one node"
    for name, (_u, st) in pools.items():
        assert get(st, f"{name}-k")[:len(name)] == name.encode()
    # alpha's index is lost (its keys only: other pools may share its node):
    # rebuild over the cluster URL
    uris, st = pools["alpha"]
    assert _lose_and_rebuild(st, st._index.sync_client(), cluster.url(), uris, "alpha-k")
    assert get(st, "alpha-k")[:5] == b"alpha"
    # another create over alpha's namespace asks alpha's own node about it
    with pytest.raises(errors.NotAStoreError):
        SharedChunkStore(uris, cluster.url(), create=True, size=16 * MiB, name="delta")
    # the node serving beta's slot dies (no replica to promote): beta's gets
    # miss and its puts fail within the timeout; the pools on other nodes go on
    _u, beta = pools["beta"]
    port = beta._index.sync_client().connection_pool.connection_kwargs["port"]
    next(s for s in cluster.servers if s.port == port).stop(signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(IndexUnavailableError):
        beta.batch_put_blocking(["beta-2"], [b"b2"])
    assert time.monotonic() - t0 < 3 * beta._index.timeout + 1
    assert get(beta, "beta-k") is None
    for name, (_u, st) in pools.items():
        if st._index.sync_client().connection_pool.connection_kwargs["port"] != port:
            st.batch_put_blocking([f"{name}-2"], [b"2"])
            assert get(st, f"{name}-2")[:1] == b"2"
    for _u, st in pools.values():
        st.close()


# ------------------------------------------------------------ failover
GAP_S = 0.7  # under the sentinels' down-after (1 s) and the cluster's node timeout (2 s)


def _stop(server: RedisServer) -> None:
    """SIGSTOP server and wait until each of its threads is stopped (a running thread
    stops only when it next enters the kernel: on a loaded machine, milliseconds later)."""
    pid = server.proc.pid
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while True:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:  # "pid (comm) S ...": the state follows the last ')'
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except (FileNotFoundError, ProcessLookupError):
                pass
        if all(st in "tT" for st in states):
            return
        assert time.monotonic() < deadline, f"redis-server {pid} did not stop: {states}"
        time.sleep(0.01)


def _kill_primary_behind_a_gap(primary: RedisServer, replicas: list[RedisServer]) -> None:
    """Open a replication gap, then SIGKILL the primary inside it: the replicas are stopped
    and their links cut on the primary, so for GAP_S the primary acknowledges writes that no
    replica will ever get (a replica resumed reads only what was sent before the cut, then
    EOF).  Without WAIT, puts acknowledged in the gap are lost in the failover; with it, they
    raise IndexNotReplicatedError.  The replicas resume right after the kill."""
    for r in replicas:
        _stop(r)
    try:
        assert primary.client().client_kill_filter(_type="replica") == len(replicas)
        time.sleep(GAP_S)
        primary.stop(signal.SIGKILL)
    finally:
        for r in replicas:
            os.kill(r.proc.pid, signal.SIGCONT)


class _SentinelFailover:
    """The Sentinel side of the failover test: the sentinels' primary is killed with every
    other server as its replica; a promotion is the sentinels naming another primary; the
    probes run for 9 s."""

    label, limit_s = "failover", 9.0

    def __init__(self, sentinels: RedisSentinelSet) -> None:
        self.set = sentinels

    def url(self) -> str:
        return self.set.url()

    def pick(self, st: SharedChunkStore) -> tuple[RedisServer, list[RedisServer]]:
        self.old = self.set.primary()
        return self.old, [s for s in self.set.servers if s is not self.old]

    def promoted(self) -> bool:
        return self.set.primary() is not self.old

    def step(self, t_promoted: float | None) -> None:
        pass

    def done(self, probes_acked: list[tuple[int, float]]) -> bool:
        return False

    def note(self, t_kill: float) -> str:
        return ""

    def after(self, st: SharedChunkStore, uris: list[str], probes_acked: list) -> None:
        pass


class _ClusterFailover:
    """The Cluster side: three primaries with a replica each; the primary serving the pool's
    slot is killed and the cluster promotes its replica.  The killed node is then started
    again (as a supervisor would) and rejoins as the new primary's replica, so puts, which
    wait for index_replicas=1, resume; the probes run until a put is acknowledged after that
    (at most 20 s).  Afterwards the new primary loses the pool's index and `fx100io
    shared-rebuild` against the cluster URL brings it back."""

    label, limit_s = "cluster failover", 20.0

    def __init__(self, cluster: RedisClusterSet) -> None:
        self.set = cluster
        self.t_restarted: float | None = None

    def url(self) -> str:
        return self.set.url()

    def pick(self, st: SharedChunkStore) -> tuple[RedisServer, list[RedisServer]]:
        assert st._index.replicas() == 1
        self.old = self.set.server(st._index.sync_client().connection_pool.connection_kwargs["port"])
        self.heir = self.set.replica_of(self.old)
        return self.old, [self.heir]

    def promoted(self) -> bool:
        return self.heir.client().info("replication")["role"] == "master"

    def step(self, t_promoted: float | None) -> None:
        if t_promoted is not None and self.t_restarted is None and \
                time.monotonic() - t_promoted > 0.5:
            self.set.restart(self.old)
            self.t_restarted = time.monotonic()

    def done(self, probes_acked: list[tuple[int, float]]) -> bool:
        return self.t_restarted is not None and bool(probes_acked) and \
            probes_acked[-1][1] > self.t_restarted

    def note(self, t_kill: float) -> str:
        return (f" (the old primary restarted at {(self.t_restarted or t_kill) - t_kill:.2f} s,"
                " as the new one's replica)")

    def after(self, st: SharedChunkStore, uris: list[str], probes_acked: list) -> None:
        report = _lose_and_rebuild(st, self.heir.client(), self.url(), uris, "anchor")
        assert report["chunks"] > len(probes_acked)
        assert get(st, "anchor")[:6] == b"anchor"
        i, _ = probes_acked[-1]
        assert get(st, f"probe-{i}").rstrip(b"\0") == b"probe-%d" % i


@pytest.fixture
def cluster_with_replicas(tmp_path: Path):
    yield from _running(RedisClusterSet(tmp_path / "cluster", replicas=1))


@pytest.mark.parametrize("kind", ["sentinel", "cluster"])
def test_failover_under_load_loses_no_acknowledged_put(tmp_path, request, kind):
    """The primary is SIGKILLed behind a replication gap (_kill_primary_behind_a_gap) while
    three host processes put: puts acknowledged in the gap would be lost without WAIT (with
    index_replicas=0 this test fails: acknowledged keys missing); with it, none is.  Every
    put acknowledged before, during and after reads back byte-exact, and gets resume within
    the failover time + 2 s.  What differs between Sentinel and Cluster is in
    _SentinelFailover and _ClusterFailover."""
    fo = (_SentinelFailover(request.getfixturevalue("sentinels")) if kind == "sentinel"
          else _ClusterFailover(request.getfixturevalue("cluster_with_replicas")))
    uris = [str(tmp_path / "ns.img")]
    url = fo.url()
    st = SharedChunkStore(uris, url, create=True, size=256 * MiB, name="fo")
    st.batch_put_blocking(["anchor"], [b"anchor"])
    hosts = [Host(uris, url) for _ in range(3)]
    replies: list[list[dict]] = [[] for _ in hosts]

    def collect(i: int) -> None:
        while True:
            r = hosts[i].read(timeout=60)
            replies[i].append(r)
            if r.get("done") or "wrong" in r or ("err" in r and "failed" not in r):
                return
    readers = [threading.Thread(target=collect, args=(i,), daemon=True) for i in range(3)]
    try:
        for i, h in enumerate(hosts):
            h.send(op="put_loop", keys=[f"h{i}-{j}" for j in range(3000)], size=4096,
                   tag=f"h{i}", batch=2, count=900, seconds=14)
        for t in readers:
            t.start()
        time.sleep(3)
        _kill_primary_behind_a_gap(*fo.pick(st))
        t_kill = time.monotonic()
        # probe: gets of a chunk put before the kill, and puts, every 20 ms
        last_miss = last_put_fail = t_promoted = None
        put_fails: dict[str, float] = {}  # exception class -> when last seen
        probes_acked: list[tuple[int, float]] = []  # (n, when) of the probe puts acknowledged
        n = 0
        while time.monotonic() - t_kill < fo.limit_s and not fo.done(probes_acked):
            now = time.monotonic()
            if t_promoted is None and fo.promoted():
                t_promoted = now
            fo.step(t_promoted)
            got = get(st, "anchor")
            assert got is None or got[:6] == b"anchor"
            if got is None:
                last_miss = now
            now = time.monotonic()
            try:
                st.batch_put_blocking([f"probe-{n}"], [b"probe-%d" % n])
                probes_acked.append((n, now))
            except IndexUnavailableError as e:
                last_put_fail = now
                put_fails[type(e).__name__] = now - t_kill
            n += 1
            time.sleep(0.02)
        for t in readers:
            t.join(timeout=60)
        assert t_promoted is not None, f"no replica was promoted in {fo.limit_s:.0f} s"
        failover_s = t_promoted - t_kill
        gets_back_s = (last_miss - t_kill) if last_miss else 0.0
        puts_back_s = (last_put_fail - t_kill) if last_put_fail else 0.0
        print(f"\n{fo.label}: a new primary {failover_s:.2f} s after the SIGKILL; gets missed "
              f"until {gets_back_s:.2f} s, puts failed until {puts_back_s:.2f} s after it "
              "(last seen of each error: "
              + ", ".join(f"{k} {v:.2f} s" for k, v in put_fails.items()) + ")"
              + fo.note(t_kill))
        assert gets_back_s <= failover_s + 2.0, (gets_back_s, failover_s)
        acked = [(r["keys"], r["tag"]) for rs in replies for r in rs if "acked" in r]
        failed = sum("failed" in r for rs in replies for r in rs)
        assert all(any(r.get("done") for r in rs) for rs in replies), \
            [rs[-1:] for rs in replies]
        print(f"{fo.label}: {len(acked)} puts acknowledged, {failed} failed")
        assert len(acked) > 30
        # puts resumed after the failover, and every acknowledged probe reads back
        assert any(when > t_promoted for _, when in probes_acked), "no put after the failover"
        for i, _ in probes_acked:
            got = get(st, f"probe-{i}")
            assert got is not None and got.rstrip(b"\0") == b"probe-%d" % i, i
        # every acknowledged put reads back byte-exact (the hosts check the bytes)
        for i, h in enumerate(hosts):
            mine = [(k, tag) for keys, tag in acked for k in keys if k.startswith(f"h{i}-")]
            for at in range(0, len(mine), 200):
                part = mine[at:at + 200]
                found = h(op="get", keys=[k for k, _t in part], timeout=120)["found"]
                assert found == [t for _k, t in part]
        assert get(st, "anchor")[:6] == b"anchor"
        for h in hosts:
            h.kill()
        fo.after(st, uris, probes_acked)
    finally:
        for h in hosts:
            h.kill()
        st.close()


def test_the_plugin_takes_sentinel_and_cluster_urls_and_hides_their_passwords():
    pytest.importorskip("lmcache")
    from support.lmcache import PLUGIN, plugin_extra

    from fx100io.contrib._lmcache_config import parse_options
    for url in ("redis+sentinel://:SECRETPW@s1:26379,s2:26379/mymaster/0"
                "?sentinel_password=SECRETPW",
                "redis+cluster://u:SECRETPW@n1:7000,n2:7000/?password=SECRETPW"):
        opts = parse_options([PLUGIN], plugin_extra("file:///tmp/x.img", shared_index=url),
                             "FX100ioBackend")
        assert opts.shared_index == url  # the store gets it whole
        assert "SECRETPW" not in opts.describe() and "SECRETPW" not in repr(opts)

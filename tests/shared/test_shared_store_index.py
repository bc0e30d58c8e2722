"""SharedChunkStore: stale bytes after a rebuild, a put that stalls Redis,
Redis errors that are not connection failures, pools of the same name,
an evicting Redis, secrets in messages, connections per thread."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support.shared_host import make_value
from support.shared_redis import RedisServer, serve

from fx100io import errors
from fx100io.store.shared import IndexLostError, IndexUnavailableError, SharedChunkStore
from fx100io.store.shared import format as fmt
from fx100io.store.shared.rebuild import rebuild
from fx100io.uri_redact import redact

MiB = 1 << 20


@pytest.fixture
def redis_server(tmp_path: Path):
    yield from serve(tmp_path)


def get(st: SharedChunkStore, key: str, n: int = 4096) -> bytes | None:
    b = bytearray(n)
    return bytes(b) if st.batch_get_blocking([key], [b]) == [True] else None


# ------------------------------------------------------------ 1. stale bytes
def test_rebuild_never_brings_back_an_overwritten_value(tmp_path, redis_server):
    uris = [str(tmp_path / "ns.img")]
    st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)

    def put(k: str, v: bytes) -> None:
        st.batch_put_blocking([k], [v])
    put("X", b"x")
    put("S", b"s")
    put("K", b"v1-old")
    st.delete_blocking("X")
    put("K", b"v2-new")  # replaces v1
    st.delete_blocking("K")
    put("Y", b"y")  # reuses v2's extent
    assert get(st, "K") is None
    redis_server.client().flushdb()
    rebuild(uris, redis_server.url)
    assert get(st, "K") is None
    assert get(st, "S")[:1] == b"s" and get(st, "Y")[:1] == b"y"
    st.close()


def test_rebuild_never_brings_back_an_evicted_chunk_after_a_delete(tmp_path, redis_server):
    uris = [str(tmp_path / "ns.img")]
    ext1 = fmt.extent_len(MiB)
    st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB, capacity=3 * ext1)
    st.batch_put_blocking(["K"], [make_value("K", "v1", MiB)])
    st.batch_put_blocking(["f0"], [make_value("f0", "1", MiB)])
    st.batch_put_blocking(["f1"], [make_value("f1", "1", 2 * MiB)])  # evicts K, the LRU
    assert not st.contains("K") and st.stats()["evictions"] == 1
    assert st.delete_blocking("f1")
    st.batch_put_blocking(["K"], [make_value("K", "v2", 3 * MiB // 2)])  # elsewhere
    assert st.delete_blocking("K")
    redis_server.client().flushdb()
    rebuild(uris, redis_server.url)
    assert not st.contains("K")
    st.close()


def test_versions_stay_above_what_the_namespaces_hold_after_index_loss(tmp_path, redis_server):
    uris = [str(tmp_path / "ns.img")]
    st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)
    st.batch_put_blocking(["a"], [b"1"])
    r = redis_server.client()
    ver_a = int(r.hget("fx100io:{pool}:idx", "a").split()[-1])
    r.set("fx100io:{pool}:ver", 0)  # a counter rolled back (failover, lost AOF second)
    st.batch_put_blocking(["b"], [b"2"])
    assert int(r.hget("fx100io:{pool}:idx", "b").split()[-1]) > ver_a
    st.close()


# ------------------------------------------------------------ 2. fragmentation
def test_a_put_into_a_fragmented_pool_is_quick(tmp_path, redis_server):
    uris = [str(tmp_path / "ns.img")]
    n = 20000
    st = SharedChunkStore(uris, redis_server.url, create=True, size=n * 8192 + 4 * MiB)
    keys = [f"k{i}" for i in range(n)]
    for i in range(0, n, 2000):
        st.batch_put_blocking(keys[i:i + 2000], [b"x"] * 2000)
    r = redis_server.client()
    # every other chunk deleted, straight in the index (fast): 10,000 holes
    for i in range(0, n, 2000):
        for k in keys[i:i + 2000:2]:
            st._index.run_sync("drop", [k])
    assert st.stats()["devices"][0]["free_extents"] >= n // 2
    r.slowlog_reset()
    r.config_set("slowlog-log-slower-than", 0)
    t0 = time.monotonic()
    st.batch_put_blocking(["big"], [np.zeros(8 * MiB, np.uint8)])
    took = time.monotonic() - t0
    worst = max(e["duration"] for e in r.slowlog_get(128))
    assert worst < 200_000, f"a script ran {worst} us"
    assert took < 5
    assert st.chunk_size("big") == 8 * MiB
    st.close()


def test_lru_ties_go_by_order_not_by_name(tmp_path, redis_server):
    uris = [str(tmp_path / "ns.img")]
    ext = fmt.extent_len(1)
    st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB, capacity=3 * ext)
    st.batch_put_blocking(["z", "m", "a"], [b"1", b"2", b"3"])  # one batch, one ms
    st.batch_put_blocking(["n"], [b"4"])
    assert not st.contains("z") and st.contains("a") and st.contains("m")
    st.close()


# ------------------------------------------------------------ 3. Redis errors
def test_busy_redis_is_unavailable_not_a_raw_error(tmp_path, redis_server):
    uris = [str(tmp_path / "ns.img")]
    st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB, retry_after=0.2)
    st.batch_put_blocking(["a"], [b"hello"])
    r = redis_server.client()
    r.config_set("busy-reply-threshold", 50)
    p = subprocess.Popen(
        ["redis-cli", "-p", str(redis_server.port), "EVAL",
         "local s=tonumber(redis.call('TIME')[1]) while tonumber(redis.call('TIME')[1]) < s+3 "
         "do end return 1", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        assert st.batch_get_blocking(["a"], [bytearray(4096)]) == [False]
        time.sleep(0.3)
        assert st.batch_exists_blocking(["a"]) == 0
        time.sleep(0.3)
        with pytest.raises(IndexUnavailableError):
            st.batch_put_blocking(["b"], [b"x"])
        assert st._index.down
    finally:
        p.wait(timeout=20)
    time.sleep(0.3)
    assert get(st, "a")[:5] == b"hello"
    st.close()


def test_a_demoted_primary_is_unavailable_not_a_raw_error(tmp_path, redis_server):
    uris = [str(tmp_path / "ns.img")]
    st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)
    st.batch_put_blocking(["a"], [b"hello"])
    st.close()
    other = RedisServer(tmp_path / "r2")
    other.start()
    try:
        redis_server.client().replicaof("127.0.0.1", other.port)  # now a replica
        st = SharedChunkStore(uris, redis_server.url)
        with pytest.raises(IndexUnavailableError):
            st.batch_put_blocking(["b"], [b"x"])
        st.close()
    finally:
        other.stop()


# ------------------------------------------------------------ 4. name collision
def test_create_refuses_to_wipe_another_pools_index(tmp_path, redis_server):
    a = SharedChunkStore([str(tmp_path / "a.img")], redis_server.url, create=True,
                         size=16 * MiB)
    a.batch_put_blocking(["k"], [b"A"])
    with pytest.raises(errors.NotAStoreError, match="force"):
        SharedChunkStore([str(tmp_path / "b.img")], redis_server.url, create=True,
                         size=16 * MiB)
    assert get(a, "k")[:1] == b"A"
    b = SharedChunkStore([str(tmp_path / "b.img")], redis_server.url, create=True,
                         size=16 * MiB, force=True)
    with pytest.raises(IndexLostError, match="same name"):
        a.batch_put_blocking(["k2"], [b"A"])
    with pytest.raises(errors.NotAStoreError, match="force"):  # nor does a rebuild
        rebuild([str(tmp_path / "a.img")], redis_server.url)
    assert b.batch_exists_blocking(["k"]) == 0
    a.close()
    b.close()


# ------------------------------------------------------------ 5. evicting Redis
def test_a_redis_that_evicts_keys_is_refused(tmp_path, redis_server):
    redis_server.client().config_set("maxmemory-policy", "allkeys-lru")
    with pytest.raises(errors.InvalidArgumentError, match="noeviction"):
        SharedChunkStore([str(tmp_path / "a.img")], redis_server.url, create=True,
                         size=16 * MiB)
    redis_server.client().config_set("maxmemory-policy", "volatile-lru")  # our keys have no TTL
    SharedChunkStore([str(tmp_path / "a.img")], redis_server.url, create=True,
                     size=16 * MiB).close()


# ------------------------------------------------------------ 6. secrets
def test_not_a_store_errors_hide_secrets(tmp_path, redis_server):
    p = tmp_path / "blank.img"
    p.write_bytes(bytes(MiB))
    uri = f"file://{p}?dhchap_secret=DHHC-1:00:c2VjcmV0:"
    for fn in (lambda: SharedChunkStore([uri], redis_server.url),
               lambda: rebuild([uri], redis_server.url)):
        with pytest.raises(errors.Fx100ioError) as ei:
            fn()
        assert "c2VjcmV0" not in str(ei.value) and "c2VjcmV0" not in repr(ei.value)


def test_redact_catches_encoded_and_misplaced_secrets():
    for u in ("nvme+tcp://h/n?dhchap_secret%3DDHHC-1:00:c2VjcmV0:",
              "nvme+tcp://h/n#dhchap_secret=DHHC-1:00:c2VjcmV0:",
              "nvme+tcp://DHHC-1:00:c2VjcmV0:@h/n",
              "nvme+tcp://user:DHHC-1:00:c2VjcmV0:@h/n",
              "nvme+tcp://h/n?x=1&dhchap%5fsecret%3ddhhc-1:00:c2VjcmV0:"):
        assert "c2VjcmV0" not in redact(u), u
    assert redact("nvme+tcp://h/n?a=1") == "nvme+tcp://h/n?a=1"


# ------------------------------------------------------------ 7. connections
def test_short_lived_threads_leave_no_connections(tmp_path, redis_server):
    uris = [str(tmp_path / "ns.img")]
    st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)
    st.batch_put_blocking(["a"], [b"x"])
    r = redis_server.client()
    n0 = len(r.client_list())

    def work() -> None:
        assert st.batch_get_blocking(["a"], [bytearray(4096)]) == [True]
    for _ in range(3):
        ts = [threading.Thread(target=work) for _ in range(20)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    # at most one per call in flight at once (20), not one per thread that called (60)
    assert len(r.client_list()) <= n0 + 21
    st.close()
    assert len(r.client_list()) <= n0 - 1  # the store's sync client went too


# ------------------------------------------------------------ 8. small ones
def test_sub_millisecond_leases_are_refused(tmp_path, redis_server):
    for what in ("lease_s", "pin_s"):
        with pytest.raises(errors.InvalidArgumentError, match=what):
            SharedChunkStore([str(tmp_path / "a.img")], redis_server.url, create=True,
                             size=16 * MiB, **{what: 0.0004})


def test_keys_is_empty_while_redis_is_down(tmp_path, redis_server):
    uris = [str(tmp_path / "ns.img")]
    st = SharedChunkStore(uris, redis_server.url, create=True, size=16 * MiB)
    st.batch_put_blocking(["a"], [b"x"])
    redis_server.stop()
    assert st.keys() == []
    assert not st.contains("a")
    st.close()


def test_star_import_without_redis():
    code = ("import sys; sys.modules['redis'] = None\n"
            "from fx100io import *\n"
            "print(ChunkStore.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(Path(__file__).parents[2]))
    assert out.returncode == 0, out.stderr
    assert "ChunkStore" in out.stdout

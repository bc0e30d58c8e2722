"""SharedChunkStore across host processes against a plain dict, as a
Hypothesis state machine (the shared twin of test_store_model.py).

Three host processes share each example's pool; every rule names the host
that acts.  Rules: put (a batch), two hosts putting the same keys at
once, get, exists, delete, and on some examples a small capacity
(evictions).  The model maps each key to the set of values it may hold:
one once a put was acknowledged, either of two after concurrent puts
(resolved by the first read), plus "absent" for keys that an eviction may
have taken.  A rule wipes the pool's index from Redis and rebuilds it from
the namespaces: no deleted chunk, no older value may come back.  Values embed key, tag and size and are checked by the host
that reads them, so wrong bytes can never pass.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from support import IN_CI
from support.shared_hosts import Host
from support.shared_redis import RedisServer

from fx100io.store.shared import SharedChunkStore
from fx100io.store.shared.index import glob_escape, prefix_of
from fx100io.store.shared.rebuild import rebuild

if not IN_CI:
    pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (  # noqa: E402
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

KEYS = [f"m{i}" for i in range(10)]
SIZES = [1, 100, 4096, 5000, 65536, 300000]
EXT = 4096 + 300000 // 4096 * 4096 + 4096

_ctx: dict = {}
_pools = itertools.count()


class SharedModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.model: dict[str, set] = {}
        self.may_evict = False
        self.tags = itertools.count()

    @initialize(ndevs=st.sampled_from([1, 2]), small=st.booleans())
    def setup(self, ndevs: int, small: bool) -> None:
        n = next(_pools)
        d: Path = _ctx["dir"]
        uris = [str(d / f"p{n}-{i}.img") for i in range(ndevs)]
        self.may_evict = small
        cap = 4 * ndevs * EXT if small else None
        self.uris, self.name, self.cap = uris, f"m{n}", cap
        SharedChunkStore(uris, _ctx["redis"].url, create=True, size=16 << 20,
                         name=f"m{n}", capacity=cap).close()
        for h in _ctx["hosts"]:
            assert h(op="open", uris=uris, index=_ctx["redis"].url, opts={})["ok"]

    def host(self, i: int) -> Host:
        return _ctx["hosts"][i]

    def _tag(self) -> str:
        return f"t{next(self.tags)}"

    @rule(h=st.integers(0, 2), keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4,
                                             unique=True), size=st.sampled_from(SIZES))
    def put(self, h: int, keys: list[str], size: int) -> None:
        tag = self._tag()
        assert self.host(h)(op="put", keys=keys, tag=tag, size=size).get("ok")
        for k in keys:
            self.model[k] = {tag}

    @rule(a=st.integers(0, 2), b=st.integers(0, 2), key=st.sampled_from(KEYS),
          size=st.sampled_from(SIZES))
    def put_same_key_at_once(self, a: int, b: int, key: str, size: int) -> None:
        if a == b:
            b = (a + 1) % 3
        ta, tb = self._tag(), self._tag()
        self.host(a).send(op="put", keys=[key], tag=ta, size=size)
        self.host(b).send(op="put", keys=[key], tag=tb, size=size)
        assert self.host(a).read().get("ok") and self.host(b).read().get("ok")
        self.model[key] = {ta, tb}

    @rule(h=st.integers(0, 2), keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=5))
    def get(self, h: int, keys: list[str]) -> None:
        found = self.host(h)(op="get", keys=keys)["found"]
        for k, tag in zip(keys, found):
            allowed = self.model.get(k, {None}) | ({None} if self.may_evict else set())
            assert tag in allowed, (k, tag, allowed)
            self.model[k] = {tag} if tag is not None else set()
            if tag is None:
                self.model.pop(k)

    @rule(h=st.integers(0, 2), keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=5))
    def exists(self, h: int, keys: list[str]) -> None:
        n = self.host(h)(op="exists", keys=keys)["n"]
        want = 0
        for k in keys:
            if k not in self.model:
                break
            want += 1
        if self.may_evict:
            assert n <= want
        else:
            assert n == want

    @rule(h=st.integers(0, 2), key=st.sampled_from(KEYS))
    def delete(self, h: int, key: str) -> None:
        ok = self.host(h)(op="delete", key=key)["ok"]
        if not self.may_evict:
            assert ok == (key in self.model)
        self.model.pop(key, None)

    @rule()
    def lose_index_and_rebuild(self) -> None:
        r = _ctx["redis"].client()
        gone = list(r.scan_iter(match=glob_escape(prefix_of(self.name)) + ":*"))
        if gone:
            r.delete(*gone)
        rebuild(self.uris, _ctx["redis"].url, name=self.name, capacity=self.cap)

    @invariant()
    def accounting(self) -> None:
        if not _ctx["hosts"] or not hasattr(self, "may_evict"):
            return
        s = _ctx["hosts"][0](op="stats")["stats"]
        if "chunks" not in s:
            return
        assert s["leases"] == 0 and s["pins"] == 0 and s["limbo"] == 0
        if not self.may_evict:
            assert s["chunks"] == len(self.model)
        assert s["bytes_used"] <= s["capacity"]

    def teardown(self) -> None:
        if _ctx["hosts"] and self.model is not None:
            for h in range(3):  # every key, read by every host
                self.get(h=h, keys=KEYS)


@pytest.fixture(scope="module")
def shared_hosts(tmp_path_factory):
    d = tmp_path_factory.mktemp("shared-model")
    srv = RedisServer(d / "redis")
    srv.start()
    hs = []
    try:
        hs = [Host([""], srv.url) for _ in range(3)]
        _ctx.update(dir=d, redis=srv, hosts=hs)
        yield
    finally:
        for h in hs:
            h.close()
        _ctx.clear()
        srv.stop()


def test_shared_store_against_a_dict(shared_hosts):
    SharedModel.TestCase.settings = settings(
        max_examples=30, stateful_step_count=30, deadline=None, derandomize=True,
        suppress_health_check=list(HealthCheck), database=None)
    SharedModel.TestCase().runTest()

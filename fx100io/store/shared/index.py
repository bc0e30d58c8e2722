"""The Redis side of a shared pool: the scripts of ``lua`` called from
asyncio (one client per event loop) or, for the few synchronous calls of
the API, from a plain client; short socket timeouts, and no call at all
for ``retry_after`` seconds after Redis failed to answer, so a cache whose
index is down costs its callers microseconds, not timeouts."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

try:
    import redis
    import redis.asyncio as aredis
    from redis.asyncio.cluster import ClusterNode as AClusterNode
    from redis.asyncio.cluster import RedisCluster as ARedisCluster
    from redis.asyncio.retry import Retry as ARetry
    from redis.asyncio.sentinel import Sentinel as ASentinel
    from redis.backoff import NoBackoff
    from redis.cluster import ClusterNode, RedisCluster
    from redis.exceptions import NoPermissionError, RedisClusterException
    from redis.retry import Retry
    from redis.sentinel import Sentinel
except ImportError as e:  # only the shared pool needs it
    raise ImportError(f"fx100io.SharedChunkStore needs the redis package (pip install redis): "
                      f"{e}") from e

from fx100io.errors import (
    DeviceBusyError,
    DeviceFullError,
    Fx100ioError,
    InvalidArgumentError,
    NotAStoreError,
)
from fx100io.store.shared import lua
from fx100io.store.shared.index_url import IndexTarget, parse_index_url
from fx100io.uri_redact import redact_url

log = logging.getLogger("fx100io")

# what Redis, the connection, the sentinels or the cluster may raise: the
# index is unavailable (RedisClusterException, "no node serves the slot",
# is no RedisError)
_ERRORS = (redis.RedisError, OSError, RedisClusterException)


class IndexUnavailableError(Fx100ioError, ConnectionError):
    """The pool's Redis index did not answer, or answered with an error of
    its own (down, unreachable, loading, busy with a long script, a replica
    after a failover, out of memory, ...)."""


class IndexNotReplicatedError(IndexUnavailableError):
    """An index change (a put's publish, a delete) was made on the Redis
    primary, but fewer replicas than index_replicas confirmed it within the
    index timeout: a failover now could lose it.  The change may stand (the
    primary has it) or be lost; the caller must treat the put or delete as
    not done.  result: what the script returned (the caller still erases
    the headers of the extents it retired)."""

    def __init__(self, errno_: int, msg: str, url: str, result: Any = None):
        super().__init__(errno_, msg, url)
        self.result = result


# The scripts whose change, lost in a failover, could make a get return
# the wrong bytes, or bring back what a caller was told is gone: a lost
# publish brings back the key's older version (its extent retired and,
# once reused, holding another chunk's bytes: the CRC32C catches that, but
# before reuse the old bytes are served as if current); a lost delete
# brings the key back.  Their callers wait for index_replicas replicas
# (WAIT) before they return.  A lost alloc, renew, abort, pin, unpin, drop
# or tomb_done costs space or a miss only: a lost alloc's lease is gone on
# the new primary, so that put's renew fails and it publishes nothing (and
# any of its writes that land in an extent handed out again fail the other
# chunk's CRC32C check: a miss); a lost tomb_done or abort keeps an extent
# held until its hold or lease expires.
WAITED = frozenset({"publish", "delete"})


class IndexLostError(Fx100ioError):
    """Redis answers but holds no index of this pool: it lost its data, or
    another pool uses the same name.  ``fx100io shared-rebuild`` re-derives
    the index from the namespaces."""


@dataclass
class Hit:
    dev: int
    off: int
    ext: int
    length: int
    crc: int
    ver: int
    pin: bytes


def _password(url: str) -> str | None:
    """The password a Redis URL carries, if any (to scrub it from messages)."""
    try:
        from urllib.parse import parse_qs, urlsplit
        parts = urlsplit(url)
        pw = parts.password or (parts.username if parts.username and parts.password is None
                                else None)
        return pw or next(iter(parse_qs(parts.query).get("password", [])), None)
    except ValueError:
        return None


def _tomb(m: bytes | str) -> tuple[int, int, int]:
    d, off, ext = (int(x) for x in (m.decode() if isinstance(m, bytes) else m).split(":"))
    return d, off, ext


def _claim_running(until: str | None, sec: int, usec: int) -> bool:
    """Whether a claim whose claim_until is until (ms, Redis's clock) is
    still running at Redis's TIME (sec, usec)."""
    return int(until or 0) > int(sec) * 1000 + int(usec) // 1000


class _OneSocket:
    """Counts what a fresh client's pool does from here on: the connections
    it makes and each (re)connect of them.  One connection connected once
    means every command went down one socket to one server session."""

    def __init__(self, r: Any) -> None:
        self.made = 0
        self.connects = 0
        pool = r.connection_pool
        make = pool.make_connection

        def counted() -> Any:
            conn = make()
            self.made += 1
            # (a weak method: the callback dies with this object)
            conn.register_connect_callback(self._connected)
            return conn
        pool.make_connection = counted

    def _connected(self, _conn: Any) -> None:
        self.connects += 1

    def proven(self) -> bool:
        return self.made == 1 and self.connects == 1


def glob_escape(text: str) -> str:
    """text as a literal in a Redis MATCH pattern: every glob character
    (and the backslash) escaped, so a name never matches another's keys."""
    return "".join("\\" + c if c in "*?[]^-\\" else c for c in text)


def prefix_of(name: str) -> str:
    """The prefix of every key of the index of the pool called name."""
    return f"fx100io:{{{name}}}"


def parse_entry(v: bytes) -> tuple[int, int, int, int, int, int]:
    d, off, ext, length, crc, ver = (int(x) for x in v.split())
    return d, off, ext, length, crc, ver


class RedisIndex:
    """The index of one pool in one Redis deployment (see index_url): one
    server, the primary that Sentinel names (asked again on every new
    connection, so a failover is followed once the sentinels agree), or
    the Cluster node that serves the pool's hash slot (all its keys share
    the tag {name}, so one node holds the whole index; asked of the
    cluster again after any error, so a MOVED or a dead node is followed
    on the next call)."""

    def __init__(self, url: str, name: str, set_id: bytes, *, timeout: float = 0.5,
                 retry_after: float = 1.0, replicas: int | None = None):
        self.target: IndexTarget = parse_index_url(url)
        if replicas is not None:
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                raise InvalidArgumentError(22, "index_replicas must be an int >= 0, got "
                                           f"{replicas!r}")
            if self.target.replicas is not None and self.target.replicas != replicas:
                raise InvalidArgumentError(
                    22, f"index_replicas={replicas} but the index URL {redact_url(url)!r} says "
                    f"index_replicas={self.target.replicas}")
            self.target.replicas = replicas
        self._url = url  # may carry a password: only the clients see it
        self.url = redact_url(url)  # for messages, logs, reprs and stats
        self.name = name
        self.prefix = prefix_of(name)
        self.set_id = set_id.hex()
        self.timeout = timeout
        self.retry_after = retry_after
        self._down_until = 0.0
        self._mu = threading.Lock()
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary())
        self._sync: redis.Redis | None = None
        self._sync_gen = 0
        self._sync_scripts: dict[str, Any] = {}
        # cluster: bumped on every error, so each client asks the cluster
        # again which node serves the pool's slot
        self._gen = 0
        self._default_replicas: int | None = None

    # ------------------------------------------------------------ clients
    def _opts(self) -> dict[str, Any]:
        o: dict[str, Any] = dict(socket_timeout=self.timeout, socket_connect_timeout=self.timeout)
        o.update(self.target.opts)  # the URL's own timeouts, password, ssl
        return o

    def _sentinel_opts(self) -> dict[str, Any]:
        o = self._opts()
        s: dict[str, Any] = {k: o[k] for k in ("socket_timeout", "socket_connect_timeout", "ssl") if k in o}
        s.update(self.target.sentinel_opts)
        return s

    def _cluster_opts(self) -> dict[str, Any]:
        return {k: v for k, v in self._opts().items()
                if k in ("socket_timeout", "socket_connect_timeout", "password", "username",
                         "ssl")}

    def _node_of_slot_sync(self) -> tuple[str, int]:
        """The Cluster node serving this pool's slot, as the cluster says now."""
        rc = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in self.target.hosts],
                          retry=Retry(NoBackoff(), 0), **self._cluster_opts())
        try:
            node = rc.get_node_from_key(self.prefix)
            if node is None:
                raise RedisClusterException(f"no node serves the slot of {self.prefix}")
            return node.host, int(node.port)
        finally:
            rc.close()

    async def _node_of_slot(self) -> tuple[str, int]:
        rc = ARedisCluster(startup_nodes=[AClusterNode(h, p) for h, p in self.target.hosts],
                           retry=ARetry(NoBackoff(), 0), **self._cluster_opts())
        try:
            await rc.initialize()
            node = rc.get_node_from_key(self.prefix)
            if node is None:
                raise RedisClusterException(f"no node serves the slot of {self.prefix}")
            return node.host, int(node.port)
        finally:
            await rc.aclose()

    async def _new_aclient(self) -> Any:
        t, retry = self.target, ARetry(NoBackoff(), 0)
        if t.kind == "sentinel":
            mgr = ASentinel(t.hosts, sentinel_kwargs=self._sentinel_opts(), **self._opts())
            r = mgr.master_for(t.service, db=t.db, retry=retry)
            r._fx_sentinels = mgr.sentinels  # closed with r (see _aclose)
            return r
        if t.kind == "cluster":
            host, port = await self._node_of_slot()
            return aredis.Redis(host=host, port=port, retry=retry, **self._opts())
        return aredis.Redis.from_url(t.url, retry=retry, **self._opts())

    def _new_sync(self) -> redis.Redis:
        t, retry = self.target, Retry(NoBackoff(), 0)
        if t.kind == "sentinel":
            mgr = Sentinel(t.hosts, sentinel_kwargs=self._sentinel_opts(), **self._opts())
            r = mgr.master_for(t.service, db=t.db, retry=retry)
            r._fx_sentinels = mgr.sentinels  # type: ignore[attr-defined]  # see _close_sync
            return r
        if t.kind == "cluster":
            host, port = self._node_of_slot_sync()
            return redis.Redis(host=host, port=port, retry=retry, **self._opts())
        return redis.Redis.from_url(t.url, retry=retry, **self._opts())

    @staticmethod
    async def _aclose(r: Any) -> None:
        """Close an asyncio client and, for Sentinel, its sentinels' clients."""
        await r.aclose()
        for s in getattr(r, "_fx_sentinels", ()):
            await s.aclose()

    @staticmethod
    def _close_sync(r: Any) -> None:
        r.close()
        for s in getattr(r, "_fx_sentinels", ()):
            s.close()

    async def _aclient(self) -> tuple[Any, dict[str, Any]]:
        loop = asyncio.get_running_loop()
        with self._mu:
            c = self._clients.get(loop)
            gen = self._gen
        if c is not None and c[2] == gen:
            return c[0], c[1]
        if c is not None:  # a cluster node that failed: ask the cluster again
            with self._mu:
                self._clients.pop(loop, None)
            await self._aclose(c[0])
        r = await self._new_aclient()
        with self._mu:
            won = self._clients.get(loop)
            if won is None or won[2] < gen:
                won = self._clients[loop] = (
                    r, {k: r.register_script(s) for k, s in lua.SCRIPTS.items()}, gen)
        if won[0] is not r:  # another call of this loop asked the cluster meanwhile
            await self._aclose(r)
        return won[0], won[1]

    def sync_client(self) -> redis.Redis:
        with self._mu:
            if self._sync is not None and self._sync_gen != self._gen:
                self._close_sync(self._sync)
                self._sync = None
            if self._sync is None:
                self._sync = self._new_sync()
                self._sync_gen = self._gen
                self._sync_scripts = {k: self._sync.register_script(s)
                                      for k, s in lua.SCRIPTS.items()}
            return self._sync

    def _replicas_of(self, info: dict[str, Any]) -> int:
        """index_replicas: as given, else 1 once the primary has been seen
        with a replica connected, else 0.  Only 1 is kept: a 0 seen while a
        replica reconnects, or in the moments after a failover before the
        new primary has its replicas, is asked again at the next change, so
        a process never settles on no WAIT for its life because it opened at
        the wrong moment."""
        if self.target.replicas is not None:
            return self.target.replicas
        if self._default_replicas is None and int(info.get("connected_slaves", 0)) > 0:
            self._default_replicas = 1
        return self._default_replicas or 0

    def _known_replicas(self) -> bool:
        return self.target.replicas is not None or self._default_replicas is not None

    def _no_info(self) -> InvalidArgumentError:
        return InvalidArgumentError(
            1, f"the pool's index at {self.url}: this Redis user may not run INFO, so "
            "index_replicas cannot be found out: give index_replicas=N in the index URL "
            "(0: acknowledge without waiting for replicas)", self.url)

    def replicas(self) -> int:
        """index_replicas (see _replicas_of), asking the primary if need be."""
        if self._known_replicas():
            return self._replicas_of({})

        def ask(r: Any, _p: str) -> Any:
            try:
                return r.info("replication")
            except NoPermissionError:
                return None
        info = self.call_sync(ask)
        if info is None:
            raise self._no_info()
        return self._replicas_of(info)

    async def _areplicas(self, r: Any) -> int:
        if self._known_replicas():
            return self._replicas_of({})
        try:
            info = await r.info("replication")
        except NoPermissionError:
            raise self._no_info() from None
        return self._replicas_of(info)

    def _wait_ms(self) -> int:
        # WAIT must end before the socket timeout does, the script's own
        # round trip included (the URL's socket_timeout, where it gives one)
        timeout = float(self._opts().get("socket_timeout") or self.timeout)
        return max(1, int(timeout * 1000 * 3 / 4))

    def _short(self, name: str, n: int, acked: int, result: Any) -> IndexNotReplicatedError:
        return IndexNotReplicatedError(
            5, f"the pool's index at {self.url}: {name} was confirmed by {acked} of the "
            f"{n} replicas index_replicas asks for within {self._wait_ms()} ms (a replica "
            "down or lagging?): not durable against a failover", self.url, result)

    @property
    def down(self) -> bool:
        return time.monotonic() < self._down_until

    def _unavailable(self, why: object) -> IndexUnavailableError:
        return IndexUnavailableError(
            111, f"the pool's index at {self.url} is unavailable ({why}); "
            f"not retried for {self.retry_after:g} s", self.url)

    def _scrub(self, text: object) -> str:
        """text without the URL's password, should a client library quote it."""
        out = str(text)
        if self._url != self.url:
            out = out.replace(self._url, self.url)
        pw = _password(self._url)
        return out.replace(pw, "***") if pw else out

    def _translate(self, e: Exception) -> Exception:
        """Our scripts' own errors as such; every other error of Redis or
        of the connection (refused, timeout, BUSY, READONLY, OOM, LOADING,
        MOVED, ...) makes the index unavailable for retry_after seconds."""
        msg = self._scrub(e)
        if isinstance(e, redis.ResponseError):
            if "FXLOST" in msg:
                return IndexLostError(2, msg.split("FXLOST ", 1)[-1], self.url)
            if "FXFULL" in msg:
                return DeviceFullError(28, msg.split("FXFULL ", 1)[-1], self.url)
            if "FXBAD" in msg:
                return NotAStoreError(22, msg.split("FXBAD ", 1)[-1], self.url)
            if "FXLIVE" in msg:
                return NotAStoreError(17, f"pool {self.name!r}: "
                                      + msg.split("FXLIVE ", 1)[-1], self.url)
            if "FXBUSY" in msg:
                return DeviceBusyError(16, f"pool {self.name!r}: "
                                       + msg.split("FXBUSY ", 1)[-1], self.url)
        self._down_until = time.monotonic() + self.retry_after
        if self.target.kind == "cluster":
            with self._mu:
                self._gen += 1
        log.warning("fx100io: index %s unavailable: %s", self.url, msg)
        return self._unavailable(msg)

    async def run(self, name: str, args: list[Any]) -> Any:
        if self.down:
            raise self._unavailable("it failed moments ago")
        try:
            r, scripts = await self._aclient()
            n = await self._areplicas(r) if name in WAITED else 0
            if n == 0:
                return await scripts[name](keys=[self.prefix], args=[self.set_id, *args])
            # WAIT counts the writes of its own connection: the script and
            # the WAIT go down one connection, in one pipeline
            async with r.pipeline(transaction=False) as pipe:
                await scripts[name](keys=[self.prefix], args=[self.set_id, *args], client=pipe)
                pipe.execute_command("WAIT", n, self._wait_ms())
                result, acked = await pipe.execute()
        except Fx100ioError:
            raise
        except _ERRORS as e:
            raise self._translate(e) from e
        if int(acked) < n:
            raise self._short(name, n, int(acked), result)
        return result

    def run_sync(self, name: str, args: list[Any]) -> Any:
        if self.down:
            raise self._unavailable("it failed moments ago")
        try:
            self.sync_client()
            return self._sync_scripts[name](keys=[self.prefix], args=[self.set_id, *args])
        except Fx100ioError:
            raise
        except _ERRORS as e:
            raise self._translate(e) from e

    async def call(self, fn: Any) -> Any:
        """await fn(client, prefix) on this loop's client, failing fast."""
        if self.down:
            raise self._unavailable("it failed moments ago")
        try:
            r, _scripts = await self._aclient()
            return await fn(r, self.prefix)
        except Fx100ioError:
            raise
        except _ERRORS as e:
            raise self._translate(e) from e

    def call_sync(self, fn: Any) -> Any:
        """fn(client, prefix) on the synchronous client, failing fast."""
        if self.down:
            raise self._unavailable("it failed moments ago")
        try:
            return fn(self.sync_client(), self.prefix)
        except Fx100ioError:
            raise
        except _ERRORS as e:
            raise self._translate(e) from e

    def call_waited(self, what: str, fn: Callable[[redis.Redis, str], Any]) -> Any:
        """fn(client, prefix) for an admin change (install, wipe), then WAIT
        index_replicas as a put does, so that a create or rebuild that
        returns has its index on the replicas a failover may promote.  WAIT
        counts the writes of its own connection, and a transaction with WATCH
        gives its connection back to the client's pool when it ends: fn runs
        on a client of its own, made for this call and used by this thread
        only, so the WAIT that follows gets the one connection fn wrote on.
        _OneSocket proves it: the client made one connection and it connected
        once.  A CLIENT ID compare could not: redis-py silently reconnects a
        pooled connection whose server died (under Sentinel to the new
        primary), and CLIENT IDs are per-server counters, so a WAIT on a
        fresh connection there could carry fn's ID and count replicas that
        never saw fn's writes.  Any reconnect reads as "not confirmed"."""
        if self.down:
            raise self._unavailable("it failed moments ago")
        try:
            n = self.replicas()
            r = self._new_sync()
            try:
                if n == 0:
                    return fn(r, self.prefix)
                one = _OneSocket(r)
                result = fn(r, self.prefix)
                with r.pipeline(transaction=False) as pipe:
                    pipe.execute_command("WAIT", n, self._wait_ms())
                    (acked,) = pipe.execute()
                same = one.proven()
            finally:
                self._close_sync(r)
        except (Fx100ioError, redis.WatchError):  # (a WatchError is the caller's to name)
            raise
        except _ERRORS as e:
            raise self._translate(e) from e
        if not same:
            raise IndexNotReplicatedError(
                5, f"the pool's index at {self.url}: {what} and its WAIT did not provably go "
                "down one connection (the client reconnected, perhaps to another server), so "
                "its replication cannot be told: run it again", self.url, result)
        if int(acked) < n:
            raise self._short(what, n, int(acked), result)
        return result

    # ------------------------------------------------------------ scripts
    async def alloc(self, lease_ms: int, wants: list[tuple[int, int]]
                    ) -> tuple[list[tuple[int, int]] | None, list[tuple[int, int, int]]]:
        """(allocations, tombs): allocations (off, ver) per want, or None
        where chunks had to be evicted first; tombs: the evicted extents,
        held until their headers are erased (then tomb_done)."""
        args: list[Any] = [lease_ms]
        for d, ext in wants:
            args += [d, ext]
        out = await self.run("alloc", args)
        allocs = ([(int(off), int(ver)) for off, ver in out[1]] if int(out[0]) == 1
                  else None)
        tombs = out[2] if allocs is not None else out[1]
        return allocs, [_tomb(m) for m in tombs]

    async def publish(self, hold_ms: int, rows: list[tuple[int, int, int, int, bytes, int, int]]
                      ) -> tuple[list[int], list[tuple[int, int, int]]]:
        """(per row 1/0/-1, the extents that left the index, held for
        hold_ms until their headers are erased)."""
        args: list[Any] = [hold_ms]
        for row in rows:
            args += list(row)
        try:
            codes, tombs = await self.run("publish", args)
        except IndexNotReplicatedError as e:
            codes, tombs = e.result
            e.result = [int(x) for x in codes], [_tomb(m) for m in tombs]
            raise
        return [int(x) for x in codes], [_tomb(m) for m in tombs]

    async def abort(self, leases: list[str]) -> int:
        return int(await self.run("abort", list(leases)))

    async def get_begin(self, token: str, pin_ms: int, keys: list[bytes]) -> list[Hit | None]:
        out: list[Hit | None] = []
        for r in await self.run("get_begin", [token, pin_ms, *keys]):
            if r is None:
                out.append(None)
            else:
                out.append(Hit(*parse_entry(r[0]), pin=r[1]))
        return out

    async def get_end(self, pins: list[bytes]) -> None:
        if pins:
            await self.run("get_end", pins)

    async def renew(self, lease_ms: int, leases: list[str]) -> list[bool]:
        """Push the deadline of each lease lease_ms ahead; False for a lease
        that is gone (expired and reclaimed, or aborted)."""
        return [bool(x) for x in await self.run("renew", [lease_ms, *leases])]

    async def exists(self, keys: list[bytes]) -> int:
        return int(await self.run("exists", keys))

    async def drop(self, key: bytes, ver: int | None = None) -> bool:
        return bool(await self.run("drop", [key] if ver is None else [key, ver]))

    async def delete(self, key: bytes, hold_ms: int) -> tuple[int, int, int] | None:
        """Drop key from the index, holding its extent (d, off, ext) for
        hold_ms until tomb_done; None if the key is not there."""
        try:
            r = await self.run("delete", [hold_ms, key])
        except IndexNotReplicatedError as e:
            r = e.result
            e.result = None if r is None else (int(r[0]), int(r[1]), int(r[2]))
            raise
        return None if r is None else (int(r[0]), int(r[1]), int(r[2]))

    async def tomb_done(self, extents: list[tuple[int, int, int]]) -> int:
        return int(await self.run("tomb_done", [f"{d}:{off}:{ext}" for d, off, ext in extents]))

    # ------------------------------------------------------------ setup
    def meta_set_id(self) -> str | None:
        v = self.call_sync(lambda r, p: r.hget(f"{p}:meta", "set_id"))
        return None if v is None else v.decode()

    def check_policy(self) -> None:
        """What opening, creating and rebuilding check of Redis: its
        maxmemory-policy (see _check_policy), and index_replicas's default,
        asked of the primary as the pool opens (where Redis is down, at the
        first put or delete instead)."""
        self._check_policy()
        if not self.down:
            try:
                self.replicas()
            except IndexUnavailableError:
                pass

    def _check_policy(self) -> None:
        """Refuse a Redis that may evict keys under memory pressure: it would
        drop the index's own keys (free lists, leases, pins), not just
        chunks.  Best effort: CONFIG may be disabled or renamed."""
        try:
            got: Any = self.sync_client().config_get("maxmemory-policy")
        except redis.ResponseError as e:  # CONFIG disabled, renamed, or ACL-denied
            log.debug("fx100io: cannot read maxmemory-policy of %s: %s", self.url,
                      self._scrub(e))
            return
        except _ERRORS as e:
            self._translate(e)  # down: the calls that follow fail fast
            return
        raw = got.get("maxmemory-policy", got.get(b"maxmemory-policy"))
        policy = raw.decode() if isinstance(raw, bytes) else raw
        # volatile-* policies evict only keys with a TTL; the index sets none
        if policy and policy != "noeviction" and not policy.startswith("volatile-"):
            raise InvalidArgumentError(
                22, f"Redis at {self.url} has maxmemory-policy {policy}: it may evict the "
                "index's own keys (free lists, leases, pins) under memory pressure; set "
                "maxmemory-policy noeviction (the pool evicts chunks itself, under its "
                "capacity)", self.url)

    def claim(self, host: str, claim_ms: int, force: bool) -> list[Any]:
        """Claim this pool's name for a create, before it writes any byte
        (see lua.CLAIM).  Returns what unclaim() needs to give the name back."""
        return list(self.run_sync("claim", [host, claim_ms, int(force)]))

    def renew_claim(self, claim_ms: int) -> None:
        """Push this create's claim claim_ms ahead, before it writes a
        superblock; NotAStoreError where the claim is no longer its own."""
        if not int(self.run_sync("claim_renew", [claim_ms])):
            raise NotAStoreError(
                17, f"the claim of this create on pool {self.name!r} is gone (another create "
                "took it over, with force or after the claim's deadline): writing nothing "
                "more", self.url)

    def unclaim(self, prev: list[Any]) -> None:
        """Give back a claim (a create refused before it wrote a byte)."""
        self.run_sync("unclaim", prev)

    def _elsewhere(self, name: str) -> bool:
        """Whether another pool's keys may be on another node (a Cluster
        spreads names over its primaries: {name} picks the slot)."""
        return self.target.kind == "cluster" and name != self.name

    def _other(self, name: str, set_id: bytes, fn: Callable[[RedisIndex], Any]) -> Any:
        other = RedisIndex(self._url, name, set_id, timeout=self.timeout,
                           retry_after=self.retry_after, replicas=self.target.replicas)
        try:
            return fn(other)
        finally:
            other.close()

    def pool_of(self, name: str, set_id: bytes) -> str | None:
        """Whether Redis holds the index of the pool called name whose
        namespaces carry set_id: "live" (installed), "claim" (being
        created: the claim's deadline has not passed), "dead" (a claim
        whose deadline passed: that create died), or None (nothing of
        that pool here: its index lost, in another Redis, or never made)."""
        if self._elsewhere(name):
            got_other: str | None = self._other(name, set_id, lambda o: o.pool_of(name, set_id))
            return got_other

        def go(r: redis.Redis, _p: str) -> tuple[Any, ...]:
            with r.pipeline(transaction=True) as pipe:
                pipe.hmget(f"{prefix_of(name)}:meta", "set_id", "fmt", "claim_until")
                pipe.time()
                return tuple(pipe.execute())
        got, (sec, usec) = self.call_sync(go)
        sid, kind, until = (None if v is None else v.decode() for v in got)
        if sid != set_id.hex():
            return None
        if kind != "claim":
            return "live"
        return "claim" if _claim_running(until, sec, usec) else "dead"

    def wipe_pool(self, name: str, set_id: bytes) -> None:
        """Delete the index of the pool called name, if it is still the one
        of the namespaces that carry set_id (create with force formats them:
        that pool's hosts must see its index lost, not allocate on them)."""
        if self._elsewhere(name):
            self._other(name, set_id, lambda o: o.wipe_pool(name, set_id))
            return
        p = prefix_of(name)

        def go(r: redis.Redis, _p: str) -> None:
            with r.pipeline(transaction=True) as pipe:
                pipe.watch(f"{p}:meta")
                if pipe.hget(f"{p}:meta", "set_id") != set_id.hex().encode():
                    return
                old = list(pipe.scan_iter(match=f"{glob_escape(p)}:*", count=1000))
                pipe.multi()
                pipe.delete(*old)
                pipe.execute()
        try:
            self.call_waited("wipe", go)
        except redis.WatchError:
            raise NotAStoreError(
                16, f"pool {name!r}: its index changed while it was being wiped (another "
                "create or rebuild at the same time?): nothing was wiped", self.url) from None

    def install(self, ndevs: int, caps: list[int], free: list[list[tuple[int, int]]],
                entries: Sequence[tuple[bytes, str, int]] = (), used: list[int] | None = None,
                ver: int = 0, replace: str = "any",
                check: Callable[[], None] | None = None) -> None:
        """Replace whatever Redis holds under this pool's prefix by a fresh
        index (format, rebuild), in one transaction: scripts see the old
        index or the new one, never a half-written one.  replace: "any"
        replaces any index there; "same" only one of this pool (or none, or
        a create's claim whose deadline passed: that create died), refusing
        another pool's of the same name and a create's claim still running;
        "claimed" only this create's own claim (see claim()).  check, if
        given, runs once the index is watched and before it is replaced
        (create re-reads its superblocks there); it raises to refuse.  The
        check and the replacement are one transaction (WATCH): a claim or
        an index that appears between them makes this raise, not replace."""
        def go(r: redis.Redis, p: str) -> None:
            with r.pipeline(transaction=True) as pipe:
                pipe.watch(f"{p}:meta")
                got: Any = pipe.hmget(f"{p}:meta", "set_id", "fmt", "claim_until")
                sid, kind, until = (None if v is None else v.decode() for v in got)
                if replace == "claimed" and (sid != self.set_id or kind != "claim"):
                    raise NotAStoreError(
                        17, f"the claim of this create on pool {self.name!r} is gone (another "
                        "create took it over, with force?): the namespaces just formatted are "
                        "not this pool's", self.url)
                if replace == "same" and kind == "claim":
                    sec, usec = pipe.time()
                    if _claim_running(until, sec, usec):
                        raise NotAStoreError(
                            17, f"another host is creating a pool named {self.name!r} (its "
                            "claim has not ended): wait for it, or pass force=True", self.url)
                elif replace == "same" and sid is not None and sid != self.set_id:
                    raise NotAStoreError(
                        17, f"Redis holds the index of another pool named {self.name!r} "
                        "(other namespaces): pass another name, or force=True to wipe that "
                        "pool's index", self.url)
                if check is not None:
                    check()
                ver_now = int(pipe.get(f"{p}:ver") or 0)
                # the name is checked (format.check_name) and escaped all the same:
                # a pattern must never reach another pool's keys
                old = list(pipe.scan_iter(match=f"{glob_escape(p)}:*", count=1000))
                pipe.multi()
                self._fill(pipe, p, old, ver_now, ndevs, caps, free, entries, used, ver)
                pipe.execute()
        try:
            self.call_waited("install", go)
        except redis.WatchError:
            raise NotAStoreError(
                16, f"pool {self.name!r}: its index changed while it was being installed "
                "(another create or rebuild at the same time?): nothing was installed",
                self.url) from None

    def _fill(self, pipe: Any, p: str, old: list[Any], ver_now: int, ndevs: int,
              caps: list[int], free: list[list[tuple[int, int]]],
              entries: Sequence[tuple[bytes, str, int]], used: list[int] | None,
              ver: int) -> None:
        """Queue on pipe the commands that replace the keys old by a fresh index."""
        if old:
            pipe.delete(*old)
        meta: dict[Any, Any] = {"set_id": self.set_id, "fmt": 2, "ndevs": ndevs}
        for d, cap in enumerate(caps):
            meta[f"cap:{d}"] = cap
        pipe.hset(f"{p}:meta", mapping=meta)
        # never back: versions already handed out may be on the namespaces
        pipe.set(f"{p}:ver", max(ver, ver_now))
        for d, extents in enumerate(free):
            if extents:
                pipe.zadd(f"{p}:free:{d}", {str(o): o for o, _ in extents})
                pipe.zadd(f"{p}:fsz:{d}", {str(o): n for o, n in extents})
                pipe.hset(f"{p}:flen:{d}", mapping={str(o): n for o, n in extents})
            pipe.hset(f"{p}:used", str(d), 0 if used is None else used[d])
        for key, value, atime in entries:
            pipe.hset(f"{p}:idx", key, value)
            pipe.zadd(f"{p}:at:{value.split()[0]}", {key: atime})

    # ------------------------------------------------------------ lifetime
    async def aclose_loop(self) -> None:
        with self._mu:
            c = self._clients.pop(asyncio.get_running_loop(), None)
        if c is not None:
            await self._aclose(c[0])

    def close(self) -> None:
        with self._mu:
            clients = list(self._clients.items())
            self._clients.clear()
            sync, self._sync = self._sync, None
        for loop, (r, _s, _g) in clients:
            if not loop.is_closed() and not loop.is_running():
                try:
                    loop.run_until_complete(self._aclose(r))
                except Exception:  # noqa: BLE001 (best effort: the sockets go with the loop)
                    pass
        if sync is not None:
            self._close_sync(sync)

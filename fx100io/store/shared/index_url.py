"""The index= URL of a shared pool, parsed in one place: which Redis
deployment holds the index (one server, a Sentinel-watched primary, or a
Cluster) and the options fx100io itself reads from it (index_replicas).
Every message shows the URL with its passwords redacted.

Forms:
  redis://[[user]:pw@]host[:port][/db][?opts]      one server (redis-py's form)
  rediss://...                                     the same over TLS
  unix://[[user]:pw@]/path/redis.sock[?db=N]       a local socket
  redis+sentinel://[[user]:pw@]h1:p1,h2:p2/service[/db][?opts]
  redis+cluster://[[user]:pw@]n1:p1,n2:p2/[?opts]

Options of the sentinel and cluster forms (query keys): password, username,
ssl (true/false), socket_timeout, socket_connect_timeout (seconds), and
for sentinel sentinel_password, sentinel_username.  index_replicas=N (all
forms) is fx100io's own: how many replicas must confirm an index change
before a put or delete returns (see RedisIndex); it is taken out of the
URL before redis-py sees it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from fx100io.errors import InvalidArgumentError
from fx100io.uri_redact import redact_url

SINGLE_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"

_BOOL = {"1": True, "true": True, "yes": True, "on": True,
         "0": False, "false": False, "no": False, "off": False}
_COMMON = {"password", "username", "ssl", "socket_timeout", "socket_connect_timeout",
           "index_replicas"}
_SENTINEL_ONLY = {"sentinel_password", "sentinel_username"}


@dataclass
class IndexTarget:
    """What index= names.  kind: "single", "sentinel" or "cluster".  url:
    for "single", the redis-py URL (index_replicas taken out); hosts: the
    sentinels' or the cluster seed nodes' (host, port); service and db: the
    Sentinel master's name and database; opts: redis-py connection keywords
    (password, username, ssl, timeouts); sentinel_opts: those of the
    sentinels themselves; replicas: index_replicas, None for the default."""
    kind: str
    url: str = field(default="", repr=False)  # may carry a password
    hosts: list[tuple[str, int]] = field(default_factory=list)
    service: str = ""
    db: int = 0
    opts: dict[str, Any] = field(default_factory=dict, repr=False)  # passwords
    sentinel_opts: dict[str, Any] = field(default_factory=dict, repr=False)
    replicas: int | None = None


def _bad(url: str, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(22, f"bad index URL {redact_url(url)!r}: {why} (forms: "
                                "redis://host:port/db, rediss://..., unix:///path.sock, "
                                "redis+sentinel://h1:p1,h2:p2/service[/db], "
                                "redis+cluster://n1:p1,n2:p2/)")


def _replicas(url: str, text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise _bad(url, f"index_replicas must be an integer >= 0, got {text!r}")
    return n


def _hosts(url: str, netloc: str, default_port: int) -> list[tuple[str, int]]:
    out = []
    for part in netloc.split(","):
        if part.endswith("]") or ":" not in part:
            host, port = part, str(default_port)
        else:
            host, _colon, port = part.rpartition(":")
        host = host.strip("[]")
        if not host:
            raise _bad(url, "a host is empty")
        try:
            p = int(port)
        except ValueError:
            p = -1
        if not 0 < p < 65536:
            raise _bad(url, f"port {port!r} is not a port number")
        out.append((host, p))
    return out


def _timeout(url: str, key: str, text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v > 0:
        raise _bad(url, f"{key} must be a positive number of seconds, got {text!r}")
    return v


def parse_index_url(url: object) -> IndexTarget:
    """The IndexTarget of index=url; InvalidArgumentError (password
    redacted) for anything else."""
    if not isinstance(url, str):
        raise InvalidArgumentError(22, f"index must be a Redis URL string, got {type(url).__name__}")
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme in SINGLE_SCHEMES:
        return _single(url)
    if scheme in (SENTINEL_SCHEME, CLUSTER_SCHEME):
        return _multi(url, scheme)
    raise _bad(url, f"unknown scheme {scheme + '://' if scheme else '(none)'}")


def _single(url: str) -> IndexTarget:
    """redis://, rediss://, unix://: redis-py parses them; only
    index_replicas is taken out (redis-py would refuse nothing, but pass it
    to the connection as an unknown keyword)."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # ValueError for a port that is not a number
    except ValueError as e:
        raise _bad(url, str(e).replace(url, redact_url(url))) from None
    replicas = None
    keep = []
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        if k == "index_replicas":
            replicas = _replicas(url, v)
        else:
            keep.append((k, v))
    if parts.scheme != "unix" and not parts.hostname:
        raise _bad(url, "no host")
    if parts.scheme == "unix" and not parts.path:
        raise _bad(url, "no socket path")
    clean = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(keep), parts.fragment))
    return IndexTarget("single", url=clean, replicas=replicas)


def _multi(url: str, scheme: str) -> IndexTarget:
    rest = url.split("://", 1)[1]
    rest, _hash, _frag = rest.partition("#")
    rest, _q, query = rest.partition("?")
    netloc, _slash, path = rest.partition("/")
    opts: dict[str, Any] = {}
    if "@" in netloc:
        userinfo, _at, netloc = netloc.rpartition("@")
        user, colon, pw = userinfo.partition(":")
        if colon:
            if pw:
                opts["password"] = unquote(pw)
            if user:
                opts["username"] = unquote(user)
        elif userinfo:
            opts["password"] = unquote(userinfo)  # redis://pw@host, as redis-py reads it
    if not netloc:
        raise _bad(url, "no host")
    hosts = _hosts(url, netloc, 26379 if scheme == SENTINEL_SCHEME else 6379)
    t = IndexTarget("sentinel" if scheme == SENTINEL_SCHEME else "cluster", hosts=hosts)
    known = _COMMON | (_SENTINEL_ONLY if scheme == SENTINEL_SCHEME else set())
    for k, v in parse_qsl(query, keep_blank_values=True):
        if k not in known:
            raise _bad(url, f"unknown option {k!r} (known: {', '.join(sorted(known))})")
        if k == "index_replicas":
            t.replicas = _replicas(url, v)
        elif k == "ssl":
            if v.lower() not in _BOOL:
                raise _bad(url, f"ssl must be true or false, got {v!r}")
            opts["ssl"] = _BOOL[v.lower()]
        elif k in ("socket_timeout", "socket_connect_timeout"):
            opts[k] = _timeout(url, k, v)
        elif k in _SENTINEL_ONLY:
            t.sentinel_opts[k.removeprefix("sentinel_")] = v
        else:
            opts[k] = v
    segs = [s for s in path.split("/") if s]
    if scheme == SENTINEL_SCHEME:
        if not segs:
            raise _bad(url, "no service name (redis+sentinel://h1:p1,h2:p2/mymaster/0)")
        if len(segs) > 2:
            raise _bad(url, "the path is /service or /service/db")
        t.service = unquote(segs[0])
        if len(segs) == 2:
            try:
                t.db = int(segs[1])
            except ValueError:
                t.db = -1
            if t.db < 0:
                raise _bad(url, f"database {segs[1]!r} is not a number >= 0")
    elif segs and segs != ["0"]:
        raise _bad(url, "a Redis Cluster has only database 0")
    t.opts = opts
    return t

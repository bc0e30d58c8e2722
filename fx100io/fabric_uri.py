"""NVMe-oF device URIs and host identity.

``nvme+tcp://HOST:PORT/SUBNQN?ns=1&queues=4&hdgst=1&ddgst=1&hostnqn=...``
``nvme+rdma://HOST:PORT/SUBNQN?ns=1&queues=4&qsize=128&hostnqn=...``
``nvme+tcp://HOST1:PORT1,HOST2:PORT2/SUBNQN?policy=queue-depth`` (several
paths to one namespace: fx100io/multipath.py; options paths and policy)

Query options: ns (namespace id, 1), queues (I/O connections per thread, 1; nvme+rdma: 2),
hdgst / ddgst (header / data digests, 0), hostnqn and hostid (default: this
machine's stable identity, see :func:`host_identity`), kato_ms (keep alive
timeout, 30000), connect_timeout_ms (10000), io_timeout_ms (a command with
no answer for this long fails and its connection is re-made, 30000),
max_xfer (bytes per NVMe command, 1 MiB, capped by the controller's MDTS),
reconnect_ms (pause after a failed connect attempt, 200) and max_reconnects
(failed connect attempts a waiting request sits through, 3).  hdgst and
ddgst are NVMe/TCP's; qsize (entries per I/O queue, 2..128, at most what
the controller allows; the controller's limit by default) is NVMe/RDMA's.
hostid may be written as a UUID.  The options are declared once, in
fx100io/fabric_options.py (types, ranges, transports, the kernel path's
nvme-cli flags, which are secret).

In-band authentication (DH-HMAC-CHAP, both transports): dhchap_secret is the
host's secret and dhchap_ctrl_secret the controller's (which also makes the
controller prove itself: bidirectional authentication), in the
``DHHC-1:HH:<base64>:`` form that ``nvme gen-dhchap-key`` prints and
nvme-cli's --dhchap-secret / --dhchap-ctrl-secret take, written as is ('+'
in a secret stays a '+'; percent-encoding also works).  They are
used only when the subsystem asks for authentication, never logged, and
shown as ``***`` wherever a URI is printed (:func:`redact`).  A wrong secret
fails the open with DevicePermissionError carrying the controller's reason.
With dhchap_ctrl_secret, a controller that asks for no authentication (on
the admin queue or any I/O queue) is refused too (DevicePermissionError: it
never proved itself); discovery controllers are exempt.  The whole
authentication of a queue stays within connect_timeout_ms.
A value the transport could not take
exactly as written (an NQN over 223 bytes, a number out of range, control
characters) is refused with InvalidArgumentError, never cut or wrapped.

Lost connections: commands in flight on a connection that drops, or that
get no answer within io_timeout_ms, fail (FxConnectionError, FxTimeoutError).
The connection is then re-made in the background by a thread of the queue,
never by the calling thread or the event loop: TCP connect, ICReq, Connect
and, when the target forgot the controller, its full re-open.  One attempt
runs at a time per queue, reconnect_ms apart after a failure, and only while
requests want the connection.  A request submitted while no connection is
live waits for one; it fails when max_reconnects attempts have failed since
it began waiting, with the last attempt's error (FxConnectionError for a
refused connect, FxTimeoutError when connect_timeout_ms ran out), or when
io_timeout_ms has passed (FxTimeoutError), whichever comes first.
max_reconnects=0 fails it at once (an attempt still starts, so a later
request can succeed).  Closing the device cancels an attempt in progress and
fails requests still waiting with DeviceClosedError.
"""

from __future__ import annotations

import os
import re
import stat
import uuid
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

from fx100io import _core
from fx100io import fabric_options as fo
from fx100io.errors import InvalidArgumentError, KernelSupportError, error_from_errno
from fx100io.uri_redact import REDACTED, SECRET_OPTIONS, redact  # noqa: F401 - re-exported

DEFAULT_PORT = 4420
NQN_PREFIX = "nqn.2014-08.org.nvmexpress:uuid:"
_NAMESPACE = uuid.UUID("6f1c3e52-9a4b-4f0e-8d2a-f100d100f100")

SCHEMES = {fo.TCP: "tcp", fo.RDMA: "rdma"}
# The option table (fabric_options) seen by kind, as the parser below uses it:
# URI key -> C target key for integers, the booleans, the free-text ones
INT_OPTIONS = {o.name: o.key for o in fo.OPTIONS if o.kind == fo.INT}
BOOL_OPTIONS = tuple(o.name for o in fo.OPTIONS if o.kind == fo.BOOL)
STR_OPTIONS = tuple(o.name for o in fo.OPTIONS if o.kind == fo.TEXT)
# options that only one transport has
TRANSPORT_ONLY = {o.name: o.schemes[0] for o in fo.OPTIONS if len(o.schemes) == 1}


def host_identity() -> tuple[str, str]:
    """(host NQN, host ID hex) stable for this machine: FX100IO_HOSTNQN /
    FX100IO_HOSTID if set, else derived from /etc/machine-id, so a target's
    allow-list keeps recognising the machine across runs."""
    env_nqn, env_id = os.environ.get("FX100IO_HOSTNQN"), os.environ.get("FX100IO_HOSTID")
    try:
        with open("/etc/machine-id") as f:
            seed = f.read().strip()
    except OSError:
        seed = os.uname().nodename
    u = uuid.uuid5(_NAMESPACE, seed or "fx100io")
    return env_nqn or f"{NQN_PREFIX}{u}", (env_id or u.hex).replace("-", "")


# What the C transport's fields hold (parse_kv in csrc/transport/tcp.c):
# anything longer or larger would be cut or wrap silently there.
HOST_MAX = 255  # bytes
NQN_MAX = 223  # bytes: the NVMe limit on an NQN
INT_RANGES = {o.name: o.range for o in fo.OPTIONS if o.range is not None}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _bad(message: str, uri: str) -> InvalidArgumentError:
    """The error for a bad URI: it names the URI with its secrets hidden."""
    return InvalidArgumentError(22, message, redact(uri))


def _text(what: str, value: str, limit: int, uri: str) -> str:
    """A string option as the C side will read it: one line, no NUL, fits."""
    if not value or len(value.encode()) > limit or _CONTROL.search(value):
        raise _bad(f"{what} must be 1 to {limit} bytes without control characters", uri)
    return value


def _secret(key: str, value: str, uri: str) -> str:
    """A DH-HMAC-CHAP secret or a TLS key, inline or read from the file @PATH
    names, checked by the C parser that will read it; the error names the
    option (and the file), never the value."""
    where = ""
    if value.startswith("@"):
        where = f" (in {value[1:]})"
        value = _secret_file(key, value[1:], uri)
    if key == "tls_key":
        why = _core.tls_key_error(value) if value and not _CONTROL.search(value) else \
            "must be a NVMeTLSkey-1:HH:<base64>: key (as nvme gen-tls-key prints) or @FILE"
    else:
        why = _core.dhchap_secret_error(value) if value and not _CONTROL.search(value) else \
            "must be a DHHC-1:HH:<base64>: secret (as nvme gen-dhchap-key prints) or @FILE"
    if why:
        raise _bad(f"URI option {key}{where}: {why}", uri)
    return value


# a key file holds one key of at most a few hundred characters; more is not a key file
_KEY_FILE_MAX = 4096


def _secret_file(key: str, path: str, uri: str) -> str:
    """The key in the file at path, its surrounding whitespace dropped (`nvme
    gen-tls-key > FILE` ends in a newline)."""
    try:
        # O_NONBLOCK: a FIFO (or a device) named by mistake must not hang the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise _bad(f"URI option {key}: {path} is not a regular file", uri)
            data = os.read(fd, _KEY_FILE_MAX + 1)
        finally:
            os.close(fd)
    except OSError as e:
        if isinstance(e, InvalidArgumentError):  # ours, from inside the try
            raise
        raise _bad(f"URI option {key}: cannot read {path}: {e.strerror}", uri) from None
    if len(data) > _KEY_FILE_MAX:
        raise _bad(f"URI option {key}: {path} is not a key file (over {_KEY_FILE_MAX} bytes)",
                   uri)
    return data.decode("ascii", "replace").strip()


def _hostid(value: str, uri: str) -> str:
    hid = value.replace("-", "").lower()
    if not re.fullmatch(r"[0-9a-f]{32}", hid):
        raise _bad("hostid must be 32 hex digits (a UUID)", uri)
    return hid


def scheme_of(uri: str) -> str:
    """nvme+tcp or nvme+rdma; InvalidArgumentError for anything else."""
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if scheme not in SCHEMES:
        raise _bad("an NVMe-oF URI starts with nvme+tcp:// or nvme+rdma://", uri)
    return scheme


def _endpoint(uri: str) -> tuple[SplitResult, str, str]:
    """The URI's parts, host and port, checked."""
    scheme = scheme_of(uri)
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:
        raise _bad("malformed URI (bad port or IPv6 address)", uri) from None
    if not parts.hostname:
        raise _bad(f"{scheme} URI needs a host: {scheme}://HOST:PORT/SUBNQN", uri)
    if port == 0:
        raise _bad("bad port in URI (1..65535)", uri)
    host = _text("the host", parts.hostname, HOST_MAX, uri)
    return parts, host, str(port or DEFAULT_PORT)


def _raw_query(query: str) -> dict[str, str]:
    """Each key's last value percent-decoded but with '+' kept: base64 (a
    secret) has '+', which form decoding (parse_qs) would turn into a space."""
    out = {}
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        out[unquote(key.replace("+", " "))] = unquote(value)
    return out


def parse(uri: str) -> dict[str, str]:
    """Parse an nvme+tcp or nvme+rdma URI into the transport's options (all
    strings).  Raises InvalidArgumentError for anything the transport could
    not take exactly as written."""
    parts, host, port = _endpoint(uri)
    scheme = scheme_of(uri)
    subnqn = unquote(parts.path.lstrip("/"))
    if subnqn:
        _text("the subsystem NQN", subnqn, NQN_MAX, uri)
    opts = {"host": host, "port": port, "subnqn": subnqn}
    raw = _raw_query(parts.query)
    for key, values in parse_qs(parts.query, keep_blank_values=True).items():
        v = values[-1]
        if TRANSPORT_ONLY.get(key, scheme) != scheme:
            raise _bad(f"URI option {key} is for {TRANSPORT_ONLY[key]} URIs, not {scheme}", uri)
        spec = fo.BY_NAME.get(key)
        if spec is None:
            known = sorted(fo.BY_NAME)
            raise _bad(f"unknown URI option {key!r} (known: {', '.join(known)})", uri)
        if spec.kind == fo.INT:
            lo, hi = spec.range or (0, 0)
            # [0-9], not str.isdigit(): that also takes "²" and other scripts' digits
            if not re.fullmatch(r"[0-9]{1,20}", v) or not lo <= int(v) <= hi:
                raise _bad(f"URI option {key} must be an integer in {lo}..{hi}"
                           + spec.range_note, uri)
            opts[spec.key] = str(int(v))
        elif spec.kind == fo.BOOL:
            if v not in ("0", "1", "true", "false"):
                raise _bad(f"URI option {key} must be 0 or 1", uri)
            opts[spec.key] = "1" if v in ("1", "true") else "0"
        elif spec.kind == fo.TEXT:
            opts[spec.key] = v
        elif spec.kind == fo.CHOICE:
            if v not in spec.choices:
                raise _bad(f"URI option {key} must be one of {', '.join(spec.choices)}", uri)
            # the multipath layer's (multipath_options): no C device reads it
            if not spec.multipath:
                opts[spec.key] = v
        else:
            opts[spec.key] = _secret(key, raw[key], uri)
    _secrets_pair(opts, uri)
    nqn, hid = host_identity()
    opts["hostnqn"] = _text("the host NQN", opts.get("hostnqn", nqn), NQN_MAX, uri)
    opts["hostid"] = _hostid(opts.get("hostid", hid), uri)
    return opts


def split_authority(uri: str) -> list[str]:
    """The grammar of several paths to one subsystem, and only that: the
    one-path URIs of ``nvme+tcp://10.0.0.1:4420,10.0.1.1:4420/NQN?...``, in
    order, each with the whole path and query; [uri] for a one-path URI; an
    empty path refused. The userspace initiator (split_paths) and the kernel
    path (kernel.split_paths) each check the parts with their own rules."""
    scheme = scheme_of(uri)
    rest = uri.split("://", 1)[1]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    hosts = netloc.split(",")
    if len(hosts) == 1:
        return [uri]
    if any(not h.strip() for h in hosts):
        raise _bad("an empty path in the URI's HOST:PORT list", uri)
    return [f"{scheme}://{h}{tail}" for h in hosts]


def split_paths(uri: str) -> list[str]:
    """The one-path URIs of a URI whose authority lists several paths to
    one subsystem (split_authority), each checked as parse() checks a URI;
    a path listed twice is refused."""
    out = split_authority(uri)
    if len(out) == 1:
        parse(uri)
        return out
    seen = set()
    for one in out:
        opts = parse(one)
        where = (opts["host"], opts["port"])
        if where in seen:
            raise _bad(f"path {where[0]}:{where[1]} is listed twice", uri)
        seen.add(where)
    return out


def is_multipath(uri: str) -> bool:
    """Whether an NVMe-oF URI asks for the multipath layer: several paths
    in its authority, or paths=discover."""
    return len(split_paths(uri)) > 1 or multipath_options(uri)["paths"] == "discover"


def multipath_options(uri: str) -> dict[str, str]:
    """The multipath options of a URI (fabric_options rows with
    multipath=True), each its default when absent; checked by parse()."""
    q = {k: v[-1] for k, v in parse_qs(urlsplit(uri).query, keep_blank_values=True).items()}
    return {o.name: q.get(o.name, o.choices[0]) for o in fo.OPTIONS if o.multipath}


def _secrets_pair(opts: dict[str, str], uri: str) -> None:
    if "dhchap_ctrl_secret" in opts and "dhchap_secret" not in opts:
        raise _bad("URI option dhchap_ctrl_secret needs dhchap_secret too (the controller "
                   "proves itself only to a host that authenticates)", uri)
    # a key asks for TLS; TLS with no key has nothing to offer (there is no keyring here)
    if "tls_key" in opts:
        if opts.get("tls") == "0":
            raise _bad("URI options tls=0 and tls_key contradict each other (a TLS key asks "
                       "for a secure channel)", uri)
        opts["tls"] = "1"
    elif opts.get("tls") == "1":
        raise _bad("URI option tls=1 needs tls_key (the configured PSK, NVMeTLSkey-1:...: "
                   "or @FILE)", uri)


def to_transport(uri: str) -> tuple[str, str]:
    """(target, secrets): the C transport's key=value lines, and the
    secrets' lines apart (given to C only, never kept in a message)."""
    opts = parse(uri)
    if not opts["subnqn"]:
        raise _bad(f"{scheme_of(uri)} URI needs a subsystem NQN as its path", uri)
    target = "\n".join(f"{k}={v}" for k, v in opts.items() if k not in SECRET_OPTIONS)
    secrets = "\n".join(f"{k}={opts[k]}" for k in SECRET_OPTIONS if k in opts)
    return target, secrets


def to_transport_target(uri: str) -> str:
    return to_transport(uri)[0]


def _auth_reason(e: OSError) -> str | None:
    """The C side's words for an authentication failure of this thread's
    last connect, when that is why e happened."""
    # EIO, EACCES, EPROTO, EPROTONOSUPPORT, ETIMEDOUT (an AUTH command unanswered)
    if e.errno in (5, 13, 71, 93, 110):
        why = _core.auth_error()
        if why:
            return why
    return None


def open_fabric_dev(transport: str, target: str, readonly: bool,
                    secrets: str = "") -> _core.Dev:
    """Open the C device; says which endpoint failed."""
    where = dict(line.split("=", 1) for line in target.split("\n"))
    label = f"{transport}://{where['host']}:{where['port']}/{where['subnqn']}"
    try:
        return _core.Dev(transport, target, False, readonly, False, 0, secrets)
    except OSError as e:
        err = error_from_errno(e.errno or 5, label)
        why = _auth_reason(e)
        if why:
            err.strerror = why
        elif e.errno == 13:
            err.strerror = f"the target does not allow host {where['hostnqn']}"
        elif e.errno == 2:
            err.strerror = "the target has no such subsystem (or refused the Connect parameters)"
        elif e.errno == 6 and transport == "nvme+rdma":
            err.strerror = ("no RDMA device reaches this address (this host has no RDMA stack, "
                            "or no RDMA device on the route: see `fx100io rdma-devices`)")
        elif e.errno == 111 and transport == "nvme+rdma":
            err.strerror = ("the RDMA connection was refused (no NVMe/RDMA port there, or the "
                            "target rejected the queue: the reason is logged)")
        raise err from None


def discovery_target(uri: str) -> tuple[str, str, str, str]:
    """(host, port, host NQN, host ID) of a discovery URI
    nvme+tcp://HOST[:PORT][?hostnqn=...&hostid=...&dhchap_secret=...] (or
    nvme+rdma://), checked as parse() does."""
    return discovery_options(uri)[:4]  # type: ignore[return-value]


def discovery_options(uri: str) -> tuple[str, str, str, str, str, str]:
    """discovery_target() and the two DH-HMAC-CHAP secrets ("" when absent).  A
    URI asking for TLS is refused: the kernel path reads these (see discover())."""
    *opts, tls_key = _discovery_options(uri)
    if tls_key:
        # never read a discovery log in clear text when TLS was asked for; the kernel path
        # refuses such a URI before it gets here (kernel/uri_args.refuse_tls), in these words
        from fx100io.kernel.uri_args import TLS_REFUSAL

        raise KernelSupportError(93, TLS_REFUSAL, redact(uri))
    return tuple(opts)  # type: ignore[return-value]


def _discovery_options(uri: str) -> tuple[str, str, str, str, str, str, str]:
    """discovery_options() and the TLS key ("" when the URI asks for no TLS)."""
    if not uri.lower().startswith(("nvme+tcp://", "nvme+rdma://")):
        raise _bad("discover() takes nvme+tcp://HOST[:PORT] or nvme+rdma://HOST[:PORT]", uri)
    parts, host, port = _endpoint(uri)
    nqn, hid = host_identity()
    q = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    raw = _raw_query(parts.query)
    secrets = {k: _secret(k, raw[k], uri) for k in SECRET_OPTIONS if k in raw}
    if "tls" in q:
        if q["tls"] not in ("0", "1", "true", "false"):
            raise _bad("URI option tls must be 0 or 1", uri)
        secrets["tls"] = "1" if q["tls"] in ("1", "true") else "0"
    _secrets_pair(secrets, uri)
    if secrets.get("tls") == "1" and scheme_of(uri) != "nvme+tcp":
        raise _bad("URI option tls is for nvme+tcp URIs", uri)
    return (host, port, _text("the host NQN", q.get("hostnqn", nqn), NQN_MAX, uri),
            _hostid(q.get("hostid", hid), uri), secrets.get("dhchap_secret", ""),
            secrets.get("dhchap_ctrl_secret", ""), secrets.get("tls_key", ""))


def discover(uri: str, timeout_ms: int = 10000) -> list[dict[str, object]]:
    """The discovery log of nvme+tcp://HOST[:PORT] or nvme+rdma://HOST[:PORT]
    (read over that transport): one dict per entry with subnqn, traddr,
    trsvcid (port), trtype ("tcp", "rdma"), adrfam, subtype ("nvme",
    "discovery", ...), portid, cntlid, treq (the secure channel: "not specified",
    "required", "not required") and sectype ("none", "tls1.2", "tls1.3").  With
    tls_key (nvme+tcp) the log is read over a TLS secure channel."""
    host, port, hostnqn, hostid, secret, ctrl_secret, tls_key = _discovery_options(uri)
    try:
        return _core.discover(host, port, hostnqn, hostid, timeout_ms, SCHEMES[scheme_of(uri)],
                              secret, ctrl_secret, tls_key)
    except OSError as e:
        err = error_from_errno(e.errno or 5, redact(uri))
        why = _auth_reason(e)
        if why:
            err.strerror = why
        elif e.errno == 6 and scheme_of(uri) == "nvme+rdma":
            err.strerror = ("no RDMA device reaches this address (this host has no RDMA stack, "
                            "or no RDMA device on the route: see `fx100io rdma-devices`)")
        raise err from None

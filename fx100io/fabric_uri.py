"""NVMe-oF device URIs and host identity.

``nvme+tcp://HOST:PORT/SUBNQN?ns=1&queues=4&hdgst=1&ddgst=1&hostnqn=...``

Query options: ns (namespace id, 1), queues (I/O connections per thread, 1),
hdgst / ddgst (header / data digests, 0), hostnqn and hostid (default: this
machine's stable identity, see :func:`host_identity`), kato_ms (keep alive
timeout, 30000), connect_timeout_ms (10000), io_timeout_ms (a command with
no answer for this long fails and its connection is re-made, 30000),
max_xfer (bytes per NVMe command, 1 MiB, capped by the controller's MDTS).
"""

from __future__ import annotations

import os
import uuid
from urllib.parse import parse_qs, unquote, urlsplit

from fx100io import _core
from fx100io.errors import InvalidArgumentError, error_from_errno

DEFAULT_PORT = 4420
NQN_PREFIX = "nqn.2014-08.org.nvmexpress:uuid:"
_NAMESPACE = uuid.UUID("6f1c3e52-9a4b-4f0e-8d2a-f100d100f100")

INT_OPTIONS = {"ns": "nsid", "queues": "queues", "kato_ms": "kato_ms",
               "connect_timeout_ms": "connect_timeout_ms", "io_timeout_ms": "io_timeout_ms",
               "max_xfer": "max_xfer"}
BOOL_OPTIONS = ("hdgst", "ddgst")
STR_OPTIONS = ("hostnqn", "hostid")


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


def parse(uri: str) -> dict[str, str]:
    """Parse an nvme+tcp URI into the transport's options (all strings)."""
    parts = urlsplit(uri)
    if not parts.hostname:
        raise InvalidArgumentError(22, "nvme+tcp URI needs a host: nvme+tcp://HOST:PORT/SUBNQN", uri)
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise InvalidArgumentError(22, "bad port in URI", uri) from None
    subnqn = unquote(parts.path.lstrip("/"))
    opts = {"host": parts.hostname, "port": str(port), "subnqn": subnqn}
    for key, values in parse_qs(parts.query, keep_blank_values=True).items():
        v = values[-1]
        if key in INT_OPTIONS:
            if not v.isdigit() or (int(v) == 0 and key != "kato_ms"):
                raise InvalidArgumentError(22, f"URI option {key} must be a positive integer"
                                           " (kato_ms: 0 turns keep alive off)", uri)
            opts[INT_OPTIONS[key]] = v
        elif key in BOOL_OPTIONS:
            if v not in ("0", "1", "true", "false"):
                raise InvalidArgumentError(22, f"URI option {key} must be 0 or 1", uri)
            opts[key] = "1" if v in ("1", "true") else "0"
        elif key in STR_OPTIONS:
            opts[key] = v
        else:
            raise InvalidArgumentError(22, f"unknown URI option {key!r} (known: "
                                       f"{', '.join(sorted([*INT_OPTIONS, *BOOL_OPTIONS, *STR_OPTIONS]))})",
                                       uri)
    nqn, hid = host_identity()
    opts.setdefault("hostnqn", nqn)
    opts.setdefault("hostid", hid)
    if len(opts["hostid"]) != 32:
        raise InvalidArgumentError(22, "hostid must be 32 hex digits", uri)
    return opts


def to_transport_target(uri: str) -> str:
    opts = parse(uri)
    if not opts["subnqn"]:
        raise InvalidArgumentError(22, "nvme+tcp URI needs a subsystem NQN as its path", uri)
    return "\n".join(f"{k}={v}" for k, v in opts.items())


def open_fabric_dev(transport: str, target: str, readonly: bool) -> _core.Dev:
    """Open the C device; says which endpoint failed."""
    where = dict(line.split("=", 1) for line in target.split("\n"))
    label = f"nvme+tcp://{where['host']}:{where['port']}/{where['subnqn']}"
    try:
        return _core.Dev(transport, target, False, readonly, False, 0)
    except OSError as e:
        err = error_from_errno(e.errno or 5, label)
        if e.errno == 13:
            err.strerror = f"the target does not allow host {where['hostnqn']}"
        elif e.errno == 2:
            err.strerror = "the target has no such subsystem (or refused the Connect parameters)"
        raise err from None


def discover(uri: str, timeout_ms: int = 10000) -> list[dict[str, object]]:
    """The discovery log of nvme+tcp://HOST[:PORT]: one dict per entry with
    subnqn, traddr, trsvcid (port), trtype ("tcp", "rdma"), adrfam, subtype
    ("nvme", "discovery", ...), portid, cntlid."""
    parts = urlsplit(uri)
    if parts.scheme != "nvme+tcp" or not parts.hostname:
        raise InvalidArgumentError(22, "discover() takes nvme+tcp://HOST[:PORT]", uri)
    nqn, hid = host_identity()
    q = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    try:
        return _core.discover(parts.hostname, str(parts.port or DEFAULT_PORT),
                              q.get("hostnqn", nqn), q.get("hostid", hid), timeout_ms)
    except OSError as e:
        raise error_from_errno(e.errno or 5, uri) from None

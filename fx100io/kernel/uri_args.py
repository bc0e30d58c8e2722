"""A fabric URI (and connect()'s keywords) as the arguments of ``nvme connect``: see
fx100io.kernel's documentation for which option becomes which nvme-cli flag."""

from __future__ import annotations

import errno
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote_plus, urlsplit, urlunsplit

from fx100io import fabric_options, fabric_uri, uri_redact
from fx100io.errors import InvalidArgumentError, KernelSupportError
from fx100io.kernel import keyring
from fx100io.kernel.nvme_cli import NVME_CLI

ETC_NVME = Path("/etc/nvme")
SECRET_KEYS = fabric_options.SECRET_OPTIONS


# URI options of the userspace initiator that the kernel has no per-controller knob for
USERSPACE_ONLY = tuple(o.name for o in fabric_options.OPTIONS if o.userspace_only)


# keyword-only options of connect() that only the kernel path has: name -> (nvme-cli option,
# kind)
KERNEL_ONLY = {"ctrl_loss_tmo": ("--ctrl-loss-tmo", int), "reconnect_delay": ("--reconnect-delay", int),
               "host_iface": ("--host-iface", str), "host_traddr": ("--host-traddr", str),
               "duplicate_connect": ("--duplicate-connect", bool)}


# nvme-cli option -> the URI key / keyword that gives it, for messages (hostnqn and hostid
# are the endpoint's identity, never the subject of an option message)
OPTION_NAMES = {**{o.kernel_flag: o.name for o in fabric_options.OPTIONS
                   if o.kernel_flag and o.kind != fabric_options.TEXT},
                **{opt: name for name, (opt, _) in KERNEL_ONLY.items()}}
DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery"

# TLS on the kernel path (docs/kernel-path.md, "TLS"): the kernel's NVMe/TCP TLS (Linux 6.12
# has it, host and target) does no handshake itself; it hands the socket to the tlshd daemon
# (ktls-utils, which Debian 12 does not package) and fails without it.  Debian 12's nvme-cli
# (2.4+really2.3, libnvme 1.3) has no `connect --tls` (libnvme gained the keyring and tls_key
# options in 1.4), so a TLS connect puts the PSK in `.nvme` itself (kernel/keyring.py) and
# writes the kernel's options to /dev/nvme-fabrics (connections._connect).  Refused, before
# the URI's values are read: any TLS connect while no tlshd runs, and discovery over TLS
# (read through nvme-cli).  tests/guest/test_kernel_tls.py runs all of it in the lab guest.
TLS_REFUSAL = ("TLS (tls=1 or a tls_key) on the kernel path needs the tlshd daemon (ktls-utils, "
               "not packaged in Debian 12) running on this host to do the kernel's handshakes, "
               "and none runs; and the kernel path never reads a discovery log over TLS (it "
               "reads them through nvme-cli, and Debian 12's 2.3 has no `--tls`).  It never "
               "reaches in clear text a target that TLS was asked for; use the userspace "
               "initiator (path=\"user\", the default), which does TLS itself")
# the refusal of a TLS discovery where tlshd runs (TLS_REFUSAL would say none runs)
TLS_DISCOVERY_REFUSAL = ("the kernel path never reads a discovery log over TLS: it reads them "
                         "through nvme-cli, and Debian 12's 2.3 has no `--tls`.  It never reaches "
                         "in clear text a target that TLS was asked for; use the userspace "
                         "initiator (path=\"user\", the default), which does TLS itself")


# the kernel splits what is written to /dev/nvme-fabrics at ',' and '\n' into key=value
# options, the last of a repeated key winning: a value holding them would add options the URI
# never named (a second traddr, a keyring=), so such values are refused, as are '=' and the
# other control characters
_FABRICS_UNSAFE = re.compile(r"[,=\x00-\x1f\x7f]")


def check_fabrics_value(what: str, value: str, uri: str) -> str:
    """value, refused (InvalidArgumentError) when it would not reach the kernel's
    /dev/nvme-fabrics parser as one option value."""
    if _FABRICS_UNSAFE.search(value):
        raise InvalidArgumentError(22, f"{what} {value!r} holds ',', '=' or a control character, "
                                   "which the kernel's connect options cannot carry in a value",
                                   redact(uri))
    return value


def asks_for_tls(uri: str, secrets_kw: Mapping[str, Any] | None = None) -> bool:
    """Whether uri or the keywords ask for TLS in any form: a tls_key (whatever its value,
    a @FILE not read), or tls=1/true."""
    q = parse_qs(urlsplit(uri).query, keep_blank_values=True)
    tls = q.get("tls", ["0"])[-1].strip().lower()
    return "tls_key" in q or tls in ("1", "true") or (secrets_kw or {}).get("tls_key") is not None


def refuse_tls(uri: str, secrets_kw: Mapping[str, Any] | None = None,
               connect: bool = False) -> None:
    """KernelSupportError (EPROTONOSUPPORT, TLS_REFUSAL) when uri or the keywords ask for
    TLS and this call cannot do it: a discovery (connect False), or a connect while no tlshd
    runs.  It runs before anything else reads the URI, so the reason comes before any
    complaint about how TLS was asked for."""
    if not asks_for_tls(uri, secrets_kw):
        return
    running = keyring.tlshd_running()
    if connect and running:
        return
    raise KernelSupportError(errno.EPROTONOSUPPORT,
                             TLS_DISCOVERY_REFUSAL if running else TLS_REFUSAL, redact(uri))


@dataclass(frozen=True)
class Target:
    """A connect request: where, as whom, with which options (secrets kept apart)."""

    transport: str  # "tcp" | "rdma"
    traddr: str
    trsvcid: str
    subnqn: str
    hostnqn: str
    hostid: str  # UUID form
    nsid: int = 1
    options: tuple[tuple[str, str], ...] = ()  # (nvme-cli option, value or "") in order
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    hostid_given: bool = True  # False: the default, which may yield to the kernel's (in_use_hostid)
    tls_key: str = field(default="", repr=False, compare=False)  # configured PSK text: TLS

    def fabrics_options(self, tls_key_serial: int) -> str:
        """What ``nvme connect`` would write to /dev/nvme-fabrics (secrets included: never
        logged), with ``tls,tls_key=<serial>``: for a TLS connect, which nvme-cli 2.3 cannot
        ask for."""
        parts = [f"nqn={self.subnqn}", f"transport={self.transport}", f"traddr={self.traddr}",
                 f"trsvcid={self.trsvcid}", f"hostnqn={self.hostnqn}", f"hostid={self.hostid}"]
        for opt, value in self.options:
            if opt == "--tls":
                continue
            name = opt[2:].replace("-", "_")
            parts.append(name if value == "" else f"{name}={value}")
        for key in ("dhchap_secret", "dhchap_ctrl_secret"):
            if key in self.secrets:
                parts.append(f"{key}={self.secrets[key]}")
        return ",".join([*parts, "tls", f"tls_key={tls_key_serial}"])

    def argv(self, nvme: str = NVME_CLI) -> list[str]:
        """``nvme connect`` without secrets (they go in a config file)."""
        argv = [nvme, "connect", "--transport", self.transport, "--traddr", self.traddr,
                "--trsvcid", self.trsvcid, "--nqn", self.subnqn, "--hostnqn", self.hostnqn,
                "--hostid", self.hostid]
        for opt, value in self.options:
            argv += [opt] if value == "" else [f"{opt}={value}"]
        # no --verbose: at -vv libnvme logs the whole option string, secrets included
        return argv + ["--output-format=json"]

    def config_json(self) -> list[dict[str, Any]]:
        """nvme-cli's JSON configuration (libnvme's config.json) that carries the secrets:
        the host key on the host, the controller key on this subsystem's port.  The host
        must name both hostnqn and hostid, or libnvme makes a second host without the key."""
        host: dict[str, Any] = {"hostnqn": self.hostnqn, "hostid": self.hostid}
        if "dhchap_secret" in self.secrets:
            host["dhchap_key"] = self.secrets["dhchap_secret"]
        port: dict[str, Any] = {"transport": self.transport, "traddr": self.traddr,
                                "trsvcid": self.trsvcid}
        if "dhchap_ctrl_secret" in self.secrets:
            port["dhchap_ctrl_key"] = self.secrets["dhchap_ctrl_secret"]
        host["subsystems"] = [{"nqn": self.subnqn, "ports": [port]}]
        return [host]


def uuid_form(hostid_hex: str) -> str:
    return str(uuid.UUID(hex=hostid_hex))


def default_host_identity() -> tuple[str, str]:
    """(host NQN, host ID as a UUID) nvme-cli would use: /etc/nvme/hostnqn and hostid,
    each falling back to fx100io's stable identity."""
    nqn, hid = fabric_uri.host_identity()
    try:
        nqn = (ETC_NVME / "hostnqn").read_text().strip() or nqn
    except OSError:
        pass
    try:
        text = (ETC_NVME / "hostid").read_text().strip()
        hid = uuid.UUID(text).hex if text else hid
    except (OSError, ValueError):
        pass
    return nqn, uuid_form(hid)


def check_secret(key: str, value: Any, uri: str) -> str:
    """A secret given as a keyword must be a string; fabric_uri.parse() checks its form (the
    message names the option, never the value)."""
    if not isinstance(value, str):
        raise InvalidArgumentError(22, f"{key} must be a DH-HMAC-CHAP secret in the form "
                                   "`nvme gen-dhchap-key` prints (DHHC-1:0N:<base64>:)",
                                   redact(uri))
    return value


def redact(uri: str) -> str:
    """The URI with secret values replaced, for messages (fx100io.uri_redact's rule)."""
    return uri_redact.redact(uri)


def query_keys(uri: str) -> set[str]:
    """The option names uri's query spells out.  fabric_uri.parse() fills in hostnqn and
    hostid when they are absent, and the kernel path's defaults for them differ (nvme-cli's
    /etc/nvme identity), so it needs to know which ones the URI gave; values are read by
    fabric_uri.parse() only."""
    return {unquote_plus(pair.partition("=")[0]) for pair in urlsplit(uri).query.split("&")
            if pair}


def with_query(uri: str, values: Mapping[str, Any], drop: tuple[str, ...] = ()) -> str:
    """uri with query options set to values (True/False as 1/0) and the options drop left
    out; every other pair is kept byte for byte (a secret's "+" stays a plus).  For
    connect()'s keywords and the commands' --hostnqn / --hostid."""
    parts = urlsplit(uri)
    kept = [pair for pair in parts.query.split("&")
            if pair and unquote_plus(pair.partition("=")[0]) not in {*drop, *values}]
    for k, v in values.items():
        text = ("1" if v else "0") if isinstance(v, bool) else str(v)
        kept.append(f"{quote(k, safe='')}={quote(text, safe=':@/')}")
    return urlunsplit(parts._replace(query="&".join(kept)))


def split_paths(uri: str) -> list[str]:
    """The one-path URIs of a URI whose authority lists several paths to one subsystem
    (``nvme+tcp://10.0.0.1:4420,10.0.1.1:4421/NQN?...``: fabric_uri.split_authority, the
    grammar the userspace multipath reads too), in order; [uri] for a one-path URI.  A path
    listed twice is refused; each part is checked by target_of()."""
    if not isinstance(uri, str):
        raise InvalidArgumentError(22, f"expected an nvme+tcp:// or nvme+rdma:// URI, got {uri!r}")
    out = fabric_uri.split_authority(uri)
    if len(out) == 1:
        return out
    seen: set[tuple[str, int | None]] = set()
    for one in out:
        try:
            parts = urlsplit(one)
            where = ((parts.hostname or "").lower(), parts.port or fabric_uri.DEFAULT_PORT)
        except ValueError:
            raise InvalidArgumentError(22, "malformed path in the URI's HOST:PORT list (bad "
                                       "port or IPv6 address)", redact(uri)) from None
        if where in seen:
            raise InvalidArgumentError(22, f"path {where[0]}:{where[1]} is listed twice",
                                       redact(uri))
        seen.add(where)
    return out


def target_of(uri: str, **opts: Any) -> Target:
    """What ``nvme connect`` gets for uri plus keyword overrides (see the module's doc)."""
    if not isinstance(uri, str):
        raise InvalidArgumentError(22, f"expected an nvme+tcp:// or nvme+rdma:// URI, got {uri!r}")
    if len(split_paths(uri)) > 1:
        raise InvalidArgumentError(22, "this call takes one path; the URI lists several "
                                   "(kernel.connect() and kernel.disconnect() take several: "
                                   "the kernel's multipath then serves one block device)",
                                   redact(uri))
    kernel_only = {k: opts.pop(k) for k in [*opts] if k in KERNEL_ONLY}
    secrets_kw = {k: opts.pop(k) for k in [*opts] if k in SECRET_KEYS}
    if opts:  # URI keys given as keywords: merged into the query, checked as the URI is
        uri = with_query(uri, opts)
    fabric_uri.scheme_of(uri)
    refuse_tls(uri, secrets_kw, connect=True)
    secrets_kw = {k: check_secret(k, v, redact(uri)) for k, v in secrets_kw.items()
                  if v is not None}
    given = query_keys(uri)
    named = given | secrets_kw.keys()
    if fabric_uri.multipath_options(uri)["paths"] == "discover":
        # the one userspace-only option whose silent drop would connect less than asked
        raise InvalidArgumentError(22, "paths=discover is the userspace initiator's; the kernel "
                                   "path connects the paths the URI lists (find them with "
                                   "fx100io discover)", redact(uri))
    if "dhchap_ctrl_secret" in named and "dhchap_secret" not in named:
        raise InvalidArgumentError(22, "dhchap_ctrl_secret (bidirectional authentication) needs "
                                   "dhchap_secret too", redact(uri))
    try:
        # fabric_uri's one parser reads every value, the secrets given as keywords too; the
        # userspace-only options are left out: ignored here, even malformed, as they always were
        p = fabric_uri.parse(with_query(uri, secrets_kw, drop=USERSPACE_ONLY))
    except InvalidArgumentError as e:
        e.target = redact(uri)
        raise
    secrets = {k: p[k] for k in SECRET_KEYS if k in p}
    tls_key = secrets.pop("tls_key", "")
    if p.get("tls") == "1" and not tls_key:
        # never attach in clear text what asked for TLS (fabric_uri.parse wants the key)
        raise KernelSupportError(errno.EPROTONOSUPPORT, TLS_REFUSAL, redact(uri))
    if not p["subnqn"]:
        raise InvalidArgumentError(22, "the URI needs a subsystem NQN as its path "
                                   "(nvme+tcp://HOST:PORT/SUBNQN)", redact(uri))
    transport = fabric_uri.SCHEMES[fabric_uri.scheme_of(uri)]
    dnqn, did = default_host_identity()
    hostnqn = p["hostnqn"] if "hostnqn" in given else dnqn
    hostid = uuid_form(p["hostid"]) if "hostid" in given else did
    options: list[tuple[str, str]] = [("--tls", "")] if tls_key else []
    if "queues" in p:
        options.append(("--nr-io-queues", p["queues"]))
    if "qsize" in p:
        options.append(("--queue-size", p["qsize"]))
    if "kato_ms" in p:
        ms = int(p["kato_ms"])
        if ms == 0:
            raise InvalidArgumentError(22, "kato_ms=0 (keep alive off) cannot be asked of the "
                                       "kernel's initiator; give a timeout, or leave kato_ms out "
                                       "for the kernel's default", redact(uri))
        options.append(("--keep-alive-tmo", str(math.ceil(ms / 1000))))
    if p.get("hdgst") == "1":
        options.append(("--hdr-digest", ""))
    if p.get("ddgst") == "1":
        options.append(("--data-digest", ""))
    for k, v in kernel_only.items():
        opt, kind = KERNEL_ONLY[k]
        if kind is bool:
            if v:
                options.append((opt, ""))
        elif kind is int:
            if isinstance(v, bool) or not isinstance(v, int) or v < -1:
                raise InvalidArgumentError(22, f"{k} must be an int (seconds; -1: forever)")
            options.append((opt, str(v)))
        else:
            fabric_uri._text(k, str(v), fabric_uri.HOST_MAX, redact(uri))
            options.append((opt, check_fabrics_value(k, str(v), uri)))
    for what, value in (("the subsystem NQN", p["subnqn"]), ("hostnqn", hostnqn),
                        ("the address", p["host"]), ("the port", p["port"])):
        check_fabrics_value(what, value, uri)
    return Target(transport, p["host"], p["port"], p["subnqn"], hostnqn, hostid,
                  int(p.get("nsid", "1")), tuple(options), secrets, "hostid" in given, tls_key)


def options_text(t: Target) -> str:
    """The connect command as a user could type it (no secrets), for messages and --dry-run."""
    return " ".join(quote(a, safe="/:=.,@-_") for a in t.argv())

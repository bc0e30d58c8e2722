"""The kernel path: NVMe-oF namespaces attached by the Linux kernel's own
initiator (nvme-fabrics with nvme-tcp or nvme-rdma), driven through nvme-cli
(``nvme ... -o json``, nvme-cli 2.x) and read back from sysfs
(``/sys/class/nvme``, ``/sys/class/nvme-subsystem``).

The same URIs as the userspace path::

    nvme+tcp://HOST[:PORT]/SUBNQN?hostnqn=...&queues=4&hdgst=1&ddgst=1&kato_ms=10000
    nvme+rdma://HOST[:PORT]/SUBNQN?hostnqn=...&dhchap_secret=DHHC-1:...

How URI options reach ``nvme connect``: hostnqn -> ``--hostnqn``, hostid ->
``--hostid`` (as a UUID: the kernel takes no other form), queues ->
``--nr-io-queues``, hdgst / ddgst -> ``--hdr-digest`` / ``--data-digest``,
kato_ms -> ``--keep-alive-tmo`` (seconds, rounded up; 0 cannot be said to the
kernel and is refused), qsize -> ``--queue-size``, dhchap_secret /
dhchap_ctrl_secret -> the host and controller keys (never on the command
line: see below).  ns picks the namespace :func:`open_device` uses.  The
userspace initiator's connect_timeout_ms, io_timeout_ms, max_xfer,
reconnect_ms and max_reconnects have no per-controller kernel equivalent and
are ignored here.  Keyword arguments of :func:`connect` take the same names
and override the URI; ctrl_loss_tmo, reconnect_delay (seconds), host_iface,
host_traddr and duplicate_connect are kernel-only.

Without hostnqn / hostid in the URI, the kernel path uses the machine's
nvme-cli identity (``/etc/nvme/hostnqn``, ``/etc/nvme/hostid``), as ``nvme
connect`` does, and fx100io's own (:func:`fx100io.host_identity`) only when
those files are missing.

DH-HMAC-CHAP secrets are handed to nvme-cli in a JSON configuration file
(``--config``, mode 0600 in a private temporary directory, removed as soon as
nvme-cli returns), so they appear in no process's argv, log line or
exception.  The kernel keeps them in ``/sys/class/nvme/nvmeX/dhchap_secret``
(readable by root only).  A kernel built without NVMe in-band authentication
(CONFIG_NVME_AUTH; Debian's 6.1) accepts and ignores the secrets: connect()
then disconnects again and raises :class:`KernelSupportError` rather than
hand back an unauthenticated controller.  A process killed while nvme-cli runs
leaves its file behind; the next connect (of any process of that user) removes
the files of processes that are gone.

:func:`attach` (``open_device(..., path="kernel")``, ``ChunkStore``) shares a
controller between the threads and processes of a host (one process per GPU):
each process that uses it holds a shared ``flock`` on
``/run/fx100io/ctrl-<name>.lock`` (let go when the process ends, however it
ends), and the last one detaches it, only if fx100io attached it
(``/run/fx100io/ctrl-<name>.json``).  Connects to one target are serialised
across processes (``/run/fx100io/connect-<hash>.lock``); a failed connect
detaches only the controller it made.  A live controller is reused only with
the same DH-HMAC-CHAP secrets (compared with sysfs) and options; one with other
secrets or options is refused (DeviceBusyError naming the option), one that
the kernel is reconnecting is waited for (up to ``timeout``).  Before the path
is handed out, its block device is checked in sysfs to be the URI's subsystem
and namespace.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import errno
import hashlib
import hmac
import json
import logging
import math
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from fx100io import fabric_uri, locks, uri_redact
from fx100io.errors import (
    DeviceBusyError,
    DeviceIOError,
    DeviceNotFoundError,
    DevicePermissionError,
    Fx100ioError,
    FxConnectionError,
    FxTimeoutError,
    InvalidArgumentError,
    KernelSupportError,
    NvmeCliNotFoundError,
)

log = logging.getLogger("fx100io")

# Where the kernel's view lives; tests point these at captured trees.
SYSFS = Path("/sys")
DEVDIR = Path("/dev")
ETC_NVME = Path("/etc/nvme")
NVME_CLI = "nvme"
# lock files and records shared by this host's processes (tmpfs: gone at reboot, as the
# controllers are); a flock is let go when its process dies, so a dead process counts as no user
RUNDIR = Path("/run/fx100io")
# where nvme-cli's secret configuration files are made (tmpfs: never on a disk)
SECRET_TMPDIR = "/dev/shm"

SECRET_KEYS = uri_redact.SECRET_OPTIONS
# URI options of the userspace initiator that the kernel has no per-controller knob for
USERSPACE_ONLY = ("connect_timeout_ms", "io_timeout_ms", "max_xfer", "reconnect_ms",
                  "max_reconnects")
# keyword-only options of connect() that only the kernel path has: name -> (nvme-cli option,
# kind)
KERNEL_ONLY = {"ctrl_loss_tmo": ("--ctrl-loss-tmo", int), "reconnect_delay": ("--reconnect-delay", int),
               "host_iface": ("--host-iface", str), "host_traddr": ("--host-traddr", str),
               "duplicate_connect": ("--duplicate-connect", bool)}
# nvme-cli option -> the URI key / keyword that gives it, for messages
OPTION_NAMES = {"--nr-io-queues": "queues", "--queue-size": "qsize", "--keep-alive-tmo": "kato_ms",
                "--hdr-digest": "hdgst", "--data-digest": "ddgst",
                **{opt: name for name, (opt, _) in KERNEL_ONLY.items()}}
DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery"
TRANSPORT_MODULES = {"tcp": "nvme-tcp", "rdma": "nvme-rdma"}
# seconds for one nvme-cli call: past the kernel's own admin command timeout (nvme_core's
# admin_timeout, 60 s), which a connect can sit out (seen once in the lab: an RDMA connect with
# a wrong secret under heavy load); killing nvme-cli earlier could leave a controller that the
# kernel finishes making after the cleanup looked
DEFAULT_TIMEOUT = 120.0
DEFAULT_NS_TIMEOUT = 30.0  # seconds for namespaces to show up as block devices

_CTRL_NAME = re.compile(r"nvme\d+")
_PATH_NS = re.compile(r"nvme(\d+)c(\d+)n(\d+)")  # a multipath path: no /dev node
_HEAD_NS = re.compile(r"nvme(\d+)n(\d+)")


# ------------------------------------------------------------------ options
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

    def argv(self, nvme: str = NVME_CLI) -> builtins.list[str]:
        """``nvme connect`` without secrets (they go in a config file)."""
        argv = [nvme, "connect", "--transport", self.transport, "--traddr", self.traddr,
                "--trsvcid", self.trsvcid, "--nqn", self.subnqn, "--hostnqn", self.hostnqn,
                "--hostid", self.hostid]
        for opt, value in self.options:
            argv += [opt] if value == "" else [f"{opt}={value}"]
        # no --verbose: at -vv libnvme logs the whole option string, secrets included
        return argv + ["--output-format=json"]

    def config_json(self) -> builtins.list[dict[str, Any]]:
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


def _uuid_form(hostid_hex: str) -> str:
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
    return nqn, _uuid_form(hid)


def _check_secret(key: str, value: Any, uri: str) -> str:
    """A secret checked by the same C parser the userspace path uses; the message names the
    option, never the value."""
    if not isinstance(value, str):
        raise InvalidArgumentError(22, f"{key} must be a DH-HMAC-CHAP secret in the form "
                                   "`nvme gen-dhchap-key` prints (DHHC-1:0N:<base64>:)",
                                   redact(uri))
    return fabric_uri._secret(key, value, redact(uri))


def redact(uri: str) -> str:
    """The URI with secret values replaced, for messages (fx100io.uri_redact's rule)."""
    return uri_redact.redact(uri)


def _split_query(uri: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """(the URI without secrets and userspace-only keys, the query as given, secrets)."""
    fabric_uri.scheme_of(uri)
    parts = urlsplit(uri)
    given: dict[str, str] = {}
    secrets: dict[str, str] = {}
    kept: builtins.list[tuple[str, str]] = []
    # a secret is base64: its "+" is a plus, never a form-encoded space (nvme gen-dhchap-key's
    # output pasted into a URI as it is)
    literal = dict(parse_qsl(parts.query.replace("+", "%2B"), keep_blank_values=True))
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        given[k] = v
        if k in SECRET_KEYS:
            secrets[k] = _check_secret(k, literal[k], uri)
        elif k not in USERSPACE_ONLY:
            kept.append((k, v))
    return urlunsplit(parts._replace(query=urlencode(kept, safe=":@/"))), given, secrets


def target_of(uri: str, **opts: Any) -> Target:
    """What ``nvme connect`` gets for uri plus keyword overrides (see the module's doc)."""
    if not isinstance(uri, str):
        raise InvalidArgumentError(22, f"expected an nvme+tcp:// or nvme+rdma:// URI, got {uri!r}")
    kernel_only = {k: opts.pop(k) for k in [*opts] if k in KERNEL_ONLY}
    secrets_kw = {k: opts.pop(k) for k in [*opts] if k in SECRET_KEYS}
    if opts:  # URI keys given as keywords: merged into the query, checked as the URI is
        parts = urlsplit(uri)
        q = dict(parse_qsl(parts.query, keep_blank_values=True))
        for k, v in opts.items():
            q[k] = ("1" if v else "0") if isinstance(v, bool) else str(v)
        uri = urlunsplit(parts._replace(query=urlencode([*q.items()], safe=":@/")))
    stripped, given, secrets = _split_query(uri)
    for k, v in secrets_kw.items():
        if v is not None:
            secrets[k] = _check_secret(k, v, redact(uri))
    if "dhchap_ctrl_secret" in secrets and "dhchap_secret" not in secrets:
        raise InvalidArgumentError(22, "dhchap_ctrl_secret (bidirectional authentication) needs "
                                   "dhchap_secret too", redact(uri))
    try:
        p = fabric_uri.parse(stripped)
    except InvalidArgumentError as e:
        e.target = redact(uri)
        raise
    if not p["subnqn"]:
        raise InvalidArgumentError(22, "the URI needs a subsystem NQN as its path "
                                   "(nvme+tcp://HOST:PORT/SUBNQN)", redact(uri))
    transport = fabric_uri.SCHEMES[fabric_uri.scheme_of(uri)]
    dnqn, did = default_host_identity()
    hostnqn = p["hostnqn"] if "hostnqn" in given else dnqn
    hostid = _uuid_form(p["hostid"]) if "hostid" in given else did
    options: builtins.list[tuple[str, str]] = []
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
            options.append((opt, str(v)))
    return Target(transport, p["host"], p["port"], p["subnqn"], hostnqn, hostid,
                  int(p.get("nsid", "1")), tuple(options), secrets, "hostid" in given)


def in_use_hostid(hostnqn: str) -> str | None:
    """The host ID the kernel's controllers of host NQN hostnqn carry, if any: Linux 6.12
    refuses a connect with a known host NQN and another host ID ("found same hostnqn ... but
    different hostid", EINVAL), so a default host ID yields to the one in use."""
    for c in controllers():
        if c.hostnqn == hostnqn and c.hostid:
            return c.hostid
    return None


def _settle_hostid(t: Target) -> Target:
    if t.hostid_given:
        return t
    hid = in_use_hostid(t.hostnqn)
    return dataclasses.replace(t, hostid=hid) if hid and hid != t.hostid else t


# ------------------------------------------------------------------ sysfs
def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def parse_address(address: str) -> dict[str, str]:
    """``traddr=10.88.0.2,trsvcid=4420,src_addr=10.88.0.2`` -> a dict (PCIe's bare BDF is
    ``{"traddr": "0000:00:06.0"}``)."""
    if "=" not in address:
        return {"traddr": address} if address else {}
    out = {}
    for item in address.split(","):
        k, _, v = item.partition("=")
        out[k.strip()] = v.strip()
    return out


@dataclass
class Controller:
    """A controller the kernel holds (``/sys/class/nvme/<name>``).  As a context manager it
    disconnects on exit what :func:`connect` attached."""

    name: str
    subsysnqn: str
    transport: str
    address: str
    state: str = ""
    hostnqn: str = ""
    hostid: str = ""
    cntlid: int = -1
    queue_count: int = 0
    kato: int = 0
    # whether this object's disconnect on exit is wanted (connect() sets it)
    owned: bool = field(default=False, repr=False)
    ns_timeout: float = field(default=DEFAULT_NS_TIMEOUT, repr=False)
    expected_nsids: tuple[int, ...] | None = field(default=None, repr=False)

    @property
    def traddr(self) -> str:
        return parse_address(self.address).get("traddr", "")

    @property
    def trsvcid(self) -> str:
        return parse_address(self.address).get("trsvcid", "")

    @property
    def sysfs_path(self) -> Path:
        return SYSFS / "class" / "nvme" / self.name

    def block_devices(self) -> dict[int, str]:
        """{nsid: /dev/nvmeXnY} of the namespaces that have a block device now."""
        return _namespaces_of(self.name)

    @property
    def namespaces(self) -> builtins.list[str]:
        """Block device paths of the controller's namespaces, in NSID order, once udev/devtmpfs
        shows them (waits up to ns_timeout seconds; FxTimeoutError after)."""
        return [path for _, path in sorted(self.wait_namespaces().items())]

    def wait_namespaces(self, nsids: tuple[int, ...] | None = None,
                        timeout: float | None = None) -> dict[int, str]:
        """{nsid: path} once every namespace in nsids (default: the controller's active
        namespace list, or at least one) has a block device."""
        want = nsids if nsids is not None else self.expected_nsids
        limit = self.ns_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            have = self.block_devices()
            if want is not None and all(n in have for n in want) or want is None and have:
                return have if want is None else {n: have[n] for n in want}
            if not self.sysfs_path.exists():
                raise DeviceNotFoundError(errno.ENODEV, f"controller {self.name} went away while "
                                          "waiting for its namespaces", self.subsysnqn)
            if time.monotonic() >= deadline:
                missing = sorted(set(want or ()) - set(have)) if want else "any"
                raise FxTimeoutError(errno.ETIMEDOUT, f"controller {self.name} is attached, but "
                                     f"namespace(s) {missing} did not show up as block devices "
                                     f"within {limit:g} s (state {_read(self.sysfs_path / 'state')!r};"
                                     " is udev/devtmpfs running?)", self.subsysnqn)
            time.sleep(0.05)

    def namespace(self, nsid: int = 1, timeout: float | None = None) -> str:
        """/dev/nvmeXnY of namespace nsid (waits as :attr:`namespaces` does)."""
        return self.wait_namespaces((nsid,), timeout)[nsid]

    def disconnect(self) -> None:
        disconnect(self)

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.owned:
            self.owned = False
            disconnect(self)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "subsysnqn": self.subsysnqn, "transport": self.transport,
                "address": self.address, "traddr": self.traddr, "trsvcid": self.trsvcid,
                "state": self.state, "hostnqn": self.hostnqn, "hostid": self.hostid,
                "cntlid": self.cntlid, "queue_count": self.queue_count, "kato": self.kato,
                "namespaces": [p for _, p in sorted(self.block_devices().items())]}


def _int(text: str, default: int = -1) -> int:
    try:
        return int(text)
    except ValueError:
        return default


def read_controller(name: str) -> Controller | None:
    """The controller /sys/class/nvme/<name>, or None if it is not there."""
    d = SYSFS / "class" / "nvme" / name
    if not _CTRL_NAME.fullmatch(name) or not d.is_dir():
        return None
    return Controller(name=name, subsysnqn=_read(d / "subsysnqn"), transport=_read(d / "transport"),
                      address=_read(d / "address"), state=_read(d / "state"),
                      hostnqn=_read(d / "hostnqn"), hostid=_read(d / "hostid"),
                      cntlid=_int(_read(d / "cntlid")), queue_count=_int(_read(d / "queue_count"), 0),
                      kato=_int(_read(d / "kato"), 0))


def _namespaces_of(name: str) -> dict[int, str]:
    """{nsid: /dev path} of controller name's namespaces that are ready: a /dev block node and
    a non-zero size.  With native multipath (nvme_core.multipath=Y, the default) the
    controller's directory holds paths nvme<S>c<C>n<N> and the block device is the
    subsystem's head nvme<S>n<N>; without it, nvme<C>n<N> sits there itself."""
    d = SYSFS / "class" / "nvme" / name
    try:
        entries = os.listdir(d)
    except OSError:
        return {}
    out: dict[int, str] = {}
    for e in entries:
        m = _PATH_NS.fullmatch(e)
        if m:
            block = f"nvme{m.group(1)}n{m.group(3)}"
        elif _HEAD_NS.fullmatch(e):
            block = e
        else:
            continue
        nsid = _int(_read(SYSFS / "block" / block / "nsid"), 0) or int(block.rsplit("n", 1)[1])
        dev = DEVDIR / block
        if _read(SYSFS / "block" / block / "size") in ("", "0"):
            continue
        if _is_block_device(dev):
            out[nsid] = str(dev)
    return out


def _is_block_device(path: Path) -> bool:
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False


def controllers(*, all_transports: bool = False) -> builtins.list[Controller]:
    """Every controller in /sys/class/nvme, fabrics ones only unless all_transports (PCIe
    drives are left out: the kernel path never touches them)."""
    d = SYSFS / "class" / "nvme"
    try:
        names = sorted((n for n in os.listdir(d) if _CTRL_NAME.fullmatch(n)),
                       key=lambda n: int(n[4:]))
    except OSError:
        return []
    out = []
    for n in names:
        c = read_controller(n)
        if c is not None and (all_transports or c.transport not in ("pcie", "")):
            out.append(c)
    return out


def subsystems() -> dict[str, str]:
    """{nvme-subsysN: subsysnqn} from /sys/class/nvme-subsystem."""
    d = SYSFS / "class" / "nvme-subsystem"
    try:
        names = os.listdir(d)
    except OSError:
        return {}
    return {n: _read(d / n / "subsysnqn") for n in sorted(names)}


def matches(c: Controller, t: Target, *, host: bool = True) -> bool:
    a = parse_address(c.address)
    return (c.subsysnqn == t.subnqn and c.transport == t.transport
            and a.get("traddr") == t.traddr and a.get("trsvcid") == t.trsvcid
            and (not host or not c.hostnqn or c.hostnqn == t.hostnqn))


# ------------------------------------------------------------------ nvme-cli
def parse_connect_output(text: str) -> str:
    """The controller name of ``nvme connect -o json``'s ``{"device": "nvme1"}``."""
    start = text.rfind("{")
    try:
        name = json.loads(text[start:])["device"] if start >= 0 else None
    except (ValueError, KeyError, TypeError):
        name = None
    if not isinstance(name, str) or not _CTRL_NAME.fullmatch(name):
        raise DeviceIOError(errno.EIO, f"nvme connect printed no controller name: {text.strip()!r}")
    return name


def _subtype(text: str) -> str:
    t = text.lower()
    if "discovery" in t:
        return "discovery"
    if "nvme" in t:
        return "nvme"
    return t


def parse_discover_output(text: str) -> builtins.list[dict[str, Any]]:
    """``nvme discover -o json``'s records, with subtype shortened to the userspace
    discover()'s "nvme" / "discovery" (nvme-cli's words kept in subtype_text)."""
    try:
        doc = json.loads(text[text.index("{"):])
        records = doc["records"]
    except (ValueError, KeyError, TypeError):
        raise DeviceIOError(errno.EIO, f"nvme discover printed no discovery log: {text.strip()[:200]!r}") from None
    out = []
    for r in records:
        e = dict(r)
        e["subtype_text"] = r.get("subtype", "")
        e["subtype"] = _subtype(str(r.get("subtype", "")))
        if "portid" in e:
            e["portid"] = _int(str(e["portid"]), -1)
        out.append(e)
    return out


def parse_list_ns_output(text: str) -> tuple[int, ...]:
    """``nvme list-ns -o json``: ``{"nsid_list": [{"nsid": 1}, ...]}`` -> (1, ...)."""
    doc = json.loads(text[text.index("{"):])
    return tuple(int(e["nsid"]) for e in doc.get("nsid_list", []))


def _nvme_cli() -> str:
    path = shutil.which(NVME_CLI) if os.sep not in NVME_CLI else NVME_CLI
    if not path or not os.access(path, os.X_OK):
        raise NvmeCliNotFoundError(errno.ENOENT, "nvme-cli is not installed (the `nvme` command "
                                   "was not found on PATH): install the Debian/Ubuntu package "
                                   "nvme-cli (apt-get install nvme-cli; nvme-cli 2.x)")
    return path


def _check_kernel(transport: str) -> None:
    """The kernel modules the kernel path needs, named when missing."""
    fabrics = DEVDIR / "nvme-fabrics"
    module = TRANSPORT_MODULES[transport]
    if not fabrics.exists():
        raise KernelSupportError(errno.ENODEV, f"{fabrics} is missing: the kernel module "
                                 f"nvme-fabrics is not loaded (modprobe nvme-fabrics {module})")
    if not os.access(fabrics, os.R_OK | os.W_OK):
        raise DevicePermissionError(errno.EACCES, f"{fabrics} is not writable by this user: "
                                    "attaching through the kernel needs root (CAP_SYS_ADMIN)")


def _module_loaded(transport: str) -> bool:
    return (SYSFS / "module" / TRANSPORT_MODULES[transport].replace("-", "_")).exists()


def _run(argv: builtins.list[str], timeout: float, what: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "LC_ALL": "C"})
    except subprocess.TimeoutExpired:
        raise FxTimeoutError(errno.ETIMEDOUT, f"nvme {argv[1]} did not finish within "
                             f"{timeout:g} s", what) from None
    except FileNotFoundError:
        raise NvmeCliNotFoundError(errno.ENOENT, "nvme-cli is not installed: install the "
                                   "Debian/Ubuntu package nvme-cli") from None


class _KernelLog:
    """The kernel's messages logged from now on (/dev/kmsg), to tell why a connect failed:
    nvme-cli 2.3 on 6.1 says "Input/output error" alike for a host that is not allowed and
    for a subsystem that does not exist; the kernel's log names the reason."""

    def __init__(self) -> None:
        self._fd = -1
        try:
            self._fd = os.open(DEVDIR / "kmsg", os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self._fd, 0, os.SEEK_END)
        except OSError:
            self.close()

    def read(self) -> str:
        lines = []
        while self._fd >= 0:
            try:
                rec = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten records: go on with the next
                    continue
                break
            if not rec:
                break
            # a record is "prio,seq,usec,flags;message\n" and continuation lines that start
            # with a space (key=value pairs)
            for line in rec.decode(errors="replace").splitlines():
                if line and not line.startswith(" "):
                    lines.append(line.split(";", 1)[-1])
        return "\n".join(lines)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1


def classify_connect_failure(t: Target, stderr: str, kmsg: str, module_loaded: bool = True,
                             uri: str = "") -> Fx100ioError:
    """The exception for a failed ``nvme connect``, from nvme-cli's words and the kernel's."""
    where = uri or f"nvme+{t.transport}://{t.traddr}:{t.trsvcid}/{t.subnqn}"
    said = " ".join(stderr.split())
    mine = "\n".join(line for line in kmsg.splitlines()
                     if t.subnqn in line or t.hostnqn in line or "nvme nvme" in line
                     or "no handler found" in line or "auth" in line.lower()
                     or "nvme_fabrics" in line)
    low = mine.lower()
    if "is not allowed" in mine or "not allowed" in low and t.hostnqn in mine:
        e: Fx100ioError = DevicePermissionError(
            errno.EACCES, f"the target does not allow host {t.hostnqn} on this subsystem", where)
    elif "required key not available" in said.lower() or ": no key" in low:
        e = DevicePermissionError(errno.EACCES, f"the target requires DH-HMAC-CHAP "
                                  f"authentication of host {t.hostnqn} and no secret was given "
                                  "(dhchap_secret)", where)
    elif "controller authentication failed" in low:
        e = DevicePermissionError(errno.EACCES, "the controller failed DH-HMAC-CHAP "
                                  "authentication: its reply does not match dhchap_ctrl_secret",
                                  where)
    elif "authentication" in low or "key was rejected" in said.lower():
        e = DevicePermissionError(errno.EACCES, "DH-HMAC-CHAP authentication with the target "
                                  f"failed for host {t.hostnqn} (wrong dhchap_secret?; kernel: "
                                  f"{_last_line(mine, 'auth') or said})", where)
    elif "but different hostid" in mine:
        e = InvalidArgumentError(errno.EINVAL, f"the kernel already knows host {t.hostnqn} with "
                                 f"another host ID than {t.hostid} (kernel: "
                                 f"{_last_line(mine, 'different hostid')}); give that hostid, "
                                 "or leave hostid out to use it", where)
    elif "invalid data parameter" in low and "subsysnqn" in low or "invalid subsystem" in low:
        e = DeviceNotFoundError(errno.ENOENT, f"the target has no subsystem {t.subnqn} (or not "
                                "on this port)", where)
    elif "no handler found for transport" in mine or (not module_loaded and "invalid arg" in said.lower()):
        mod = TRANSPORT_MODULES[t.transport]
        e = KernelSupportError(errno.ENODEV, f"the kernel module {mod} is not loaded "
                               f"(modprobe {mod})", where)
    elif "already connected" in said:
        e = DeviceBusyError(errno.EALREADY, f"host {t.hostnqn} is already connected to this "
                            "subsystem at this address (see fx100io.kernel.list(); disconnect it, "
                            "or pass duplicate_connect=True)", where)
    elif "connection refused" in said.lower() or "failed to connect socket: -111" in mine:
        e = FxConnectionError(errno.ECONNREFUSED, "connection refused: no NVMe-oF port listens "
                              f"at {t.traddr}:{t.trsvcid} ({t.transport})", where)
    elif "failed to open nvme-fabrics" in said.lower() or "failed to open /dev/nvme-fabrics" in said.lower():
        e = KernelSupportError(errno.ENODEV, "cannot open /dev/nvme-fabrics: the kernel module "
                               "nvme-fabrics is not loaded (modprobe nvme-fabrics "
                               f"{TRANSPORT_MODULES[t.transport]})", where)
    elif "invalid arg" in said.lower():
        e = InvalidArgumentError(errno.EINVAL, f"the kernel refused the connect options "
                                 f"(nvme-cli: {said})", where)
    elif "timed out" in said.lower() or "timeout" in low:
        e = FxTimeoutError(errno.ETIMEDOUT, f"the connect timed out (nvme-cli: {said})", where)
    else:
        why = f"; kernel: {_last_line(mine)}" if mine else (
            " (the kernel log was not readable; a host that is not allowed, a missing subsystem "
            "and a failed authentication all read like this: see dmesg)")
        e = DeviceIOError(errno.EIO, f"nvme connect failed (nvme-cli: {said or 'no message'}){why}",
                          where)
    return e


def _last_line(text: str, needle: str = "") -> str:
    lines = [line for line in text.splitlines() if needle.lower() in line.lower()] or text.splitlines()
    return lines[-1].strip() if lines else ""


_SECRET_DIR = re.compile(r"fx100io-nvme-(\d+)-.+")


def _remove_stale_secret_dirs(parent: str) -> None:
    """Remove the secret configuration directories of processes that are gone: a process
    killed while nvme-cli ran (up to DEFAULT_TIMEOUT) never got to its own cleanup, and its
    secret would stay in tmpfs until reboot.  Only this user's, named with a pid that no
    longer runs (a reused pid keeps its directory: left, never wrongly removed)."""
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    for e in entries:
        m = _SECRET_DIR.fullmatch(e)
        if not m:
            continue
        d = os.path.join(parent, e)
        try:
            if os.lstat(d).st_uid != os.geteuid() or not stat.S_ISDIR(os.lstat(d).st_mode):
                continue
            os.kill(int(m.group(1)), 0)
            continue  # its process still runs
        except ProcessLookupError:
            pass
        except (OSError, OverflowError):
            continue
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(d, "config.json"))
        with contextlib.suppress(OSError):
            os.rmdir(d)


@contextlib.contextmanager
def _secret_config(t: Target) -> Iterator[str | None]:
    """A 0600 config file for nvme-cli's --config holding the secrets, gone afterwards (and
    at the next connect of any process, should this one be killed meanwhile)."""
    if not t.secrets:
        yield None
        return
    parent = SECRET_TMPDIR if os.path.isdir(SECRET_TMPDIR) else tempfile.gettempdir()
    _remove_stale_secret_dirs(parent)
    d = tempfile.mkdtemp(prefix=f"fx100io-nvme-{os.getpid()}-", dir=parent)
    path = os.path.join(d, "config.json")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(t.config_json(), f)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(d)


def _check_secrets_applied(c: Controller, t: Target, where: str) -> None:
    """With secrets asked for, the kernel must hold them: a kernel without NVMe in-band
    authentication ignores them (and would authenticate nothing)."""
    if not t.secrets:
        return
    for key in t.secrets:
        attr = c.sysfs_path / key
        if not attr.exists():
            raise KernelSupportError(errno.EOPNOTSUPP, "this kernel has no NVMe in-band "
                                     "authentication (built without CONFIG_NVME_AUTH; its "
                                     f"controllers have no {key} attribute): it would connect "
                                     "without authenticating, so the controller was detached "
                                     "again", where)
        value = _read(attr)
        if value and value != t.secrets[key]:
            raise KernelSupportError(errno.EIO, f"nvme-cli did not hand the {key} to the kernel "
                                     "(its configuration file was not applied); the controller "
                                     "was detached again", where)


def _delete_controller(name: str, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Detach controller name: nvme-cli, then sysfs delete_controller if it is still there."""
    d = SYSFS / "class" / "nvme" / name
    if not d.exists():
        return
    with contextlib.suppress(Fx100ioError):
        _run([_nvme_cli(), "disconnect", "--device", name], timeout, name)
    if d.exists():
        with contextlib.suppress(OSError):
            (d / "delete_controller").write_text("1")
    deadline = time.monotonic() + 5
    while d.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if d.exists():
        raise DeviceBusyError(errno.EBUSY, f"controller {name} could not be detached", name)


# ---- sharing controllers between threads and processes of this host
#
# A controller that attach() uses is held by a shared flock on RUNDIR/ctrl-<name>.lock, one per
# process that uses it; the last process's release() detaches it only when it can take that
# lock exclusively (no other live process holds it) and RUNDIR/ctrl-<name>.json records that
# fx100io attached this very controller (a controller the admin attached is never detached).
# Connects to one target (transport, address, subsystem, host) are serialised by an exclusive
# flock on RUNDIR/connect-<hash>.lock (and a thread lock here), so a failed connect's cleanup
# cannot mistake another process's fresh controller for its own.
_registry_lock = threading.Lock()  # guards the dicts below only; never held across nvme-cli


@dataclass
class _Hold:
    users: int  # attachments in this process
    lock: locks.FileLock  # the shared lock on the controller's lock file


# controller name -> this process's hold on it
_attached: dict[str, _Hold] = {}
_target_locks: dict[str, threading.Lock] = {}


def _lock_file(name: str) -> Path:
    try:
        RUNDIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise DevicePermissionError(e.errno or errno.EACCES, f"cannot make {RUNDIR} (the kernel "
                                    f"path's lock files): {e.strerror}") from None
    return RUNDIR / name


def _target_key(transport: str, traddr: str, trsvcid: str, subnqn: str, hostnqn: str) -> str:
    text = "\0".join((transport, traddr, trsvcid, subnqn, hostnqn))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@contextlib.contextmanager
def _target_lock(t: Target, timeout: float, where: str) -> Iterator[None]:
    """One connect (or attach) of target t at a time on this host."""
    key = _target_key(t.transport, t.traddr, t.trsvcid, t.subnqn, t.hostnqn)
    wait = timeout + 10  # another connect may take its whole timeout
    busy = FxTimeoutError(errno.ETIMEDOUT, f"another connect to {t.subnqn} at {t.traddr}:"
                          f"{t.trsvcid} on this host did not finish within {wait:g} s", where)
    with _registry_lock:
        tl = _target_locks.setdefault(key, threading.Lock())
    if not tl.acquire(timeout=wait):
        raise busy
    try:
        held = locks.lock(_lock_file(f"connect-{key}.lock"), timeout=wait, create=True)
        if held is None:
            raise busy
        with held:
            yield
    finally:
        tl.release()


def _identity(c: Controller) -> dict[str, Any]:
    return {"subsysnqn": c.subsysnqn, "transport": c.transport, "address": c.address,
            "cntlid": c.cntlid, "hostnqn": c.hostnqn}


def _write_record(c: Controller, t: Target) -> None:
    """RUNDIR/ctrl-<name>.json: fx100io attached this controller, with these options (no
    secrets)."""
    path = _lock_file(f"ctrl-{c.name}.json")
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**_identity(c), "options": [[o, v] for o, v in t.options]}))
    os.replace(tmp, path)


def _record_of(c: Controller) -> dict[str, Any] | None:
    """What _write_record wrote for this very controller (not an earlier one of its name)."""
    try:
        rec = json.loads((RUNDIR / f"ctrl-{c.name}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or any(rec.get(k) != v for k, v in _identity(c).items()):
        return None
    return rec


def _claimed(name: str) -> bool:
    """Whether some process holds controller name (its lock file is locked)."""
    try:
        held = locks.lock(_lock_file(f"ctrl-{name}.lock"), create=True)
    except Fx100ioError:
        return True  # cannot tell: leave it
    if held is None:
        return True
    held.release()
    return False


def _hold(name: str, timeout: float, where: str) -> None:
    """One more user of controller name in this process (the first takes the shared lock)."""
    with _registry_lock:
        h = _attached.get(name)
        if h is not None:
            h.users += 1
            return
    held = locks.lock(_lock_file(f"ctrl-{name}.lock"), shared=True, timeout=timeout, create=True)
    if held is None:
        raise DeviceBusyError(errno.EBUSY, f"controller {name} is being detached by another "
                              "process", where)
    with _registry_lock:
        h = _attached.get(name)
        if h is None:
            _attached[name] = _Hold(1, held)
            return
        h.users += 1  # another thread of this process was quicker
    held.release()


def _unhold(name: str) -> bool:
    """One user less; True when it was this process's last (its shared lock is let go)."""
    with _registry_lock:
        h = _attached.get(name)
        if h is None:
            return False
        h.users -= 1
        if h.users > 0:
            return False
        del _attached[name]
        h.lock.release()
    return True


def _detach_if_unused(c: Controller) -> None:
    """Detach c if fx100io attached it and no process holds it any more."""
    try:
        held = locks.lock(_lock_file(f"ctrl-{c.name}.lock"), create=True)
    except Fx100ioError:
        return
    if held is None:
        return  # another process uses it
    with held:
        live = read_controller(c.name)
        if live is None or _identity(live) != _identity(c) or _record_of(live) is None:
            return  # gone, another controller now, or not attached by fx100io
        with contextlib.suppress(DeviceBusyError):
            _delete_controller(c.name)
        if not live.sysfs_path.exists():
            with contextlib.suppress(OSError):
                (RUNDIR / f"ctrl-{c.name}.json").unlink()


def connect(uri: str, *, timeout: float = DEFAULT_TIMEOUT, ns_timeout: float = DEFAULT_NS_TIMEOUT,
            **opts: Any) -> Controller:
    """Attach uri's subsystem through the kernel (``nvme connect``); returns the
    :class:`Controller`, which detaches on ``with`` exit.  Raises DevicePermissionError
    (host not allowed, authentication failed), DeviceNotFoundError (no such subsystem),
    FxConnectionError (nothing listens), DeviceBusyError (this host is already connected
    there), KernelSupportError (a module missing, no authentication in this kernel),
    NvmeCliNotFoundError.  A connect that fails leaves no controller of its own behind."""
    t = target_of(uri, **opts)
    where = redact(uri)
    with _target_lock(t, timeout, where):
        return _connect(t, where, timeout, ns_timeout)


def _connect(t: Target, where: str, timeout: float, ns_timeout: float) -> Controller:
    nvme = _nvme_cli()
    _check_kernel(t.transport)
    t = _settle_hostid(t)
    module_loaded = _module_loaded(t.transport)
    before = {c.name for c in controllers()}
    klog = _KernelLog()
    argv = t.argv(nvme)
    try:
        with _secret_config(t) as cfg:
            if cfg is not None:
                argv.insert(2, f"--config={cfg}")
            try:
                r = _run(argv, timeout, where)
            except FxTimeoutError:
                _cleanup_new(before, t)
                raise
        if r.returncode != 0:
            _cleanup_new(before, t)
            raise classify_connect_failure(t, r.stderr, klog.read(), module_loaded, where)
        try:
            name = parse_connect_output(r.stdout)
        except BaseException:
            _cleanup_new(before, t)
            raise
        try:
            c = read_controller(name)
            if c is None:
                raise DeviceNotFoundError(errno.ENODEV, f"nvme connect said {name}, but "
                                          f"{SYSFS}/class/nvme/{name} is not there", where)
            c.owned = True
            c.ns_timeout = ns_timeout
            _check_secrets_applied(c, t, where)
            c.expected_nsids = _active_nsids(nvme, name)
            return c
        except BaseException:
            _cleanup_new(before, t, name)
            raise
    finally:
        klog.close()


def _active_nsids(nvme: str, name: str) -> tuple[int, ...] | None:
    """The controller's active namespace list (``nvme list-ns -o json``), None if unknown."""
    try:
        r = _run([nvme, "list-ns", str(DEVDIR / name), "--output-format=json"], 30, name)
        return parse_list_ns_output(r.stdout) if r.returncode == 0 else None
    except (Fx100ioError, ValueError, KeyError, TypeError):
        return None


def _cleanup_new(before: set[str], t: Target, name: str | None = None) -> None:
    """Detach what a connect that failed half way left: the controller nvme-cli named (name),
    else controllers of t that appeared since before and that no process holds (connects to
    t are serialised by _target_lock, so one of fx100io's own is held by then)."""
    if name is not None:
        names = [name] if name not in before else []
    else:
        names = [c.name for c in controllers()
                 if c.name not in before and matches(c, t) and not _claimed(c.name)]
    for n in names:
        log.warning("fx100io: detaching %s, left behind by a failed connect to %s", n, t.subnqn)
        with contextlib.suppress(Fx100ioError):
            _delete_controller(n)


def disconnect(target: str | Controller, *, timeout: float = DEFAULT_TIMEOUT) -> builtins.list[str]:
    """Detach a controller (a :class:`Controller`, or a name like ``nvme3``), or every
    controller of a URI's subsystem at its address (and host, when the URI names one).
    Returns the names detached; checks in sysfs that they are gone."""
    if isinstance(target, Controller):
        names = [target.name]
    elif isinstance(target, str) and _CTRL_NAME.fullmatch(target):
        names = [target]
    elif isinstance(target, str) and target.startswith("/dev/") and _CTRL_NAME.fullmatch(
            os.path.basename(target)):
        names = [os.path.basename(target)]
    else:
        t = target_of(target) if isinstance(target, str) else None
        if t is None:
            raise InvalidArgumentError(22, f"disconnect() takes a Controller, a controller name or "
                                       f"a URI, got {target!r}")
        host = "hostnqn" in dict(parse_qsl(urlsplit(target).query))
        names = [c.name for c in controllers() if matches(c, t, host=host)]
    for n in names:
        _delete_controller(n, timeout)
    with _registry_lock:
        holds = [h for h in (_attached.pop(n, None) for n in names) if h is not None]
    for h in holds:
        h.lock.release()
    for n in names:
        with contextlib.suppress(OSError):
            (RUNDIR / f"ctrl-{n}.json").unlink()
    return names


def discover(uri: str, *, timeout: float = DEFAULT_TIMEOUT) -> builtins.list[dict[str, Any]]:
    """The discovery log of nvme+tcp://HOST[:PORT] or nvme+rdma://HOST[:PORT], read by the
    kernel (``nvme discover -o json``): one dict per record with trtype, adrfam, subtype
    ("nvme", "discovery"), subtype_text, treq, portid, trsvcid, subnqn, traddr, ..."""
    scheme = fabric_uri.scheme_of(uri)
    parts = urlsplit(uri)
    q = dict(parse_qsl(parts.query, keep_blank_values=True))
    host, port, _, _ = fabric_uri.discovery_target(urlunsplit(parts._replace(path="")))
    dnqn, did = default_host_identity()
    hostnqn = fabric_uri._text("the host NQN", q["hostnqn"], fabric_uri.NQN_MAX, uri) \
        if "hostnqn" in q else dnqn
    hostid = _uuid_form(fabric_uri._hostid(q["hostid"], uri)) if "hostid" in q else \
        in_use_hostid(hostnqn) or did
    transport = fabric_uri.SCHEMES[scheme]
    nvme = _nvme_cli()
    _check_kernel(transport)
    klog = _KernelLog()
    try:
        r = _run([nvme, "discover", "--transport", transport, "--traddr", host, "--trsvcid", port,
                  "--hostnqn", hostnqn, "--hostid", hostid, "--output-format=json"], timeout, uri)
        if r.returncode != 0:
            t = Target(transport, host, port, DISCOVERY_NQN, hostnqn, hostid)
            raise classify_connect_failure(t, r.stderr, klog.read(), _module_loaded(transport), uri)
        return parse_discover_output(r.stdout)
    finally:
        klog.close()


# ------------------------------------------------------------------ attach (open_device)
@dataclass
class Attachment:
    """A namespace block device that :func:`attach` found or attached; release() detaches the
    controller when fx100io attached it and no attachment of any process on this host uses it
    any more."""

    controller: Controller
    path: str
    attached: bool  # this call made the controller
    _released: bool = field(default=False, repr=False)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        if _unhold(self.controller.name):
            _detach_if_unused(self.controller)


# controller states the kernel passes through on its way to "live" (a reconnect after a loss)
_PENDING_STATES = ("new", "connecting", "resetting")


def _sysfs_options(c: Controller) -> dict[str, str]:
    """The connect options a live controller shows in sysfs, in nvme-cli's terms."""
    out = {"--keep-alive-tmo": str(c.kato)}
    sq = _int(_read(c.sysfs_path / "sqsize"), -1)
    if sq >= 0:
        out["--queue-size"] = str(sq + 1)
    for opt, attr in (("--ctrl-loss-tmo", "ctrl_loss_tmo"), ("--reconnect-delay", "reconnect_delay")):
        v = _read(c.sysfs_path / attr)
        if v:
            out[opt] = "-1" if v == "off" else v
    return out


def _mismatch(c: Controller, t: Target) -> str | None:
    """Why live controller c is not what t asks for (secrets, options), or None.  Secrets are
    compared in constant time and never named by value."""
    for key in ("dhchap_secret", "dhchap_ctrl_secret"):
        want = t.secrets.get(key)
        if want is None:
            continue
        have = _read(c.sysfs_path / key)
        if not hmac.compare_digest(have.encode(), want.encode()):
            return (f"it was not attached with this {key} (it holds another key, or none), so "
                    "reusing it would skip the authentication asked for")
    rec = _record_of(c)
    known: dict[str, str] = ({str(o[0]): str(o[1]) for o in rec["options"]} if rec is not None
                             else _sysfs_options(c))
    for opt, value in t.options:
        if opt == "--duplicate-connect":
            continue
        name = OPTION_NAMES.get(opt, opt)
        if opt not in known:
            if rec is not None:
                return f"it was attached without {name}"
            return (f"whether it has {name} cannot be told (fx100io did not attach it, and sysfs "
                    "does not show it)")
        if known[opt] != value:
            return f"it was attached with another {name} ({opt} {known[opt]}, not {value})"
    return None


def _reusable(t: Target, where: str, timeout: float, duplicate: bool) -> Controller | None:
    """The live controller of t that attach() may use as it is, None to connect one.  Waits
    (up to timeout) for one the kernel is reconnecting; refuses one with other secrets or
    options (DeviceBusyError) unless duplicate (then a second controller is made)."""
    deadline = time.monotonic() + timeout
    while True:
        cands = [c for c in controllers() if matches(c, t)]
        live = [c for c in cands if c.state == "live"]
        refused: tuple[str, str] | None = None
        for c in live:
            why = _mismatch(c, t)
            if why is None:
                return c
            refused = refused or (c.name, why)
        if refused is not None:
            if duplicate:
                return None
            name, why = refused
            raise DeviceBusyError(errno.EBUSY, f"this host already holds controller {name} for "
                                  f"this subsystem and address, but {why}; it is not reused: "
                                  f"detach it (fx100io disconnect {name}), ask for what it has, "
                                  "or pass duplicate_connect=True for a second controller", where)
        pending = [c for c in cands if c.state in _PENDING_STATES]
        if not pending:
            return None
        if time.monotonic() >= deadline:
            c = pending[0]
            raise DeviceBusyError(errno.EBUSY, f"controller {c.name} of this subsystem is in "
                                  f"state {c.state!r} (the kernel is reconnecting it) and did not "
                                  f"become live within {timeout:g} s; wait for it, or detach it "
                                  f"(fx100io disconnect {c.name})", where)
        time.sleep(0.05)


def _check_block_device(path: str, t: Target, where: str) -> None:
    """path (/dev/nvmeXnY) must be t's namespace now: a name the kernel reused for another
    subsystem's namespace is never handed out."""
    blk = os.path.basename(path)
    b = SYSFS / "block" / blk
    nqn = _read(b / "device" / "subsysnqn")
    m = _HEAD_NS.fullmatch(blk)
    if not nqn and m:  # no device link (older sysfs): the head nvme<S>n<N> of nvme-subsys<S>
        nqn = _read(SYSFS / "class" / "nvme-subsystem" / f"nvme-subsys{m.group(1)}" / "subsysnqn")
    nsid = _int(_read(b / "nsid"), 0) or (int(m.group(2)) if m else 0)
    if nqn != t.subnqn or nsid != t.nsid:
        raise DeviceNotFoundError(errno.ENODEV, f"{path} belongs to {nqn or 'no subsystem'} "
                                  f"namespace {nsid} now, not to {t.subnqn} namespace {t.nsid}; "
                                  "it was not opened", where)


def attach(uri: str, *, timeout: float = DEFAULT_TIMEOUT, ns_timeout: float = DEFAULT_NS_TIMEOUT,
           **opts: Any) -> Attachment:
    """The block device of uri's namespace (``ns``, 1), attaching the controller through the
    kernel unless this host already holds a live one for that subsystem and address with the
    same secrets and options (then it is shared; a controller fx100io did not attach is left
    attached).  A live one with other secrets or options is refused (DeviceBusyError naming
    the option) rather than used without them."""
    t = target_of(uri, **opts)
    where = redact(uri)
    duplicate = bool(opts.get("duplicate_connect"))
    with _target_lock(t, timeout, where):
        for _ in range(3):
            c = _reusable(t, where, timeout, duplicate)
            made = c is None
            if c is None:
                c = _connect(t, where, timeout, ns_timeout)
                c.owned = False
                try:
                    _hold(c.name, timeout, where)
                    _write_record(c, t)
                except BaseException:
                    _unhold(c.name)
                    with contextlib.suppress(Fx100ioError):
                        _delete_controller(c.name)
                    raise
                break
            c.ns_timeout = ns_timeout
            _hold(c.name, timeout, where)
            now = read_controller(c.name)
            if now is not None and _identity(now) == _identity(c):
                break
            _unhold(c.name)  # detached by its last user meanwhile: look again
        else:
            raise DeviceBusyError(errno.EBUSY, "the controller kept going away while attaching",
                                  where)
    a = Attachment(c, "", made)
    try:
        a.path = c.namespace(t.nsid)
        _check_block_device(a.path, t, where)
    except BaseException:
        a.release()
        raise
    return a


def options_text(t: Target) -> str:
    """The connect command as a user could type it (no secrets), for messages and --dry-run."""
    return " ".join(quote(a, safe="/:=.,@-_") for a in t.argv())


# Last in the module, so that the builtin ``list`` stays usable above.
def list(*, all_transports: bool = False) -> builtins.list[Controller]:  # noqa: A001 (the API's name)
    """The fabrics controllers the kernel holds now (sysfs; works with any nvme-cli)."""
    return controllers(all_transports=all_transports)

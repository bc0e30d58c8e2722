"""The kernel's view of its NVMe controllers and namespaces, read from sysfs
(``/sys/class/nvme``, ``/sys/class/nvme-subsystem``, ``/sys/block``) and /dev."""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fx100io.errors import (
    DeviceNotFoundError,
    FxTimeoutError,
)

if TYPE_CHECKING:  # (uri_args needs nvme_cli, which needs this module)
    from fx100io.kernel.uri_args import Target

# Where the kernel's view lives; tests point these at captured trees.
SYSFS = Path("/sys")
DEVDIR = Path("/dev")
DEFAULT_NS_TIMEOUT = 30.0  # seconds for namespaces to show up as block devices
CTRL_NAME = re.compile(r"nvme\d+")
_PATH_NS = re.compile(r"nvme(\d+)c(\d+)n(\d+)")  # a multipath path: no /dev node
_HEAD_NS = re.compile(r"nvme(\d+)n(\d+)")


def read_attr(path: Path) -> str:
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
    # the nvme-cli options connect() attached it with (for holds.write_record)
    options: tuple[tuple[str, str], ...] = field(default=(), repr=False)

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
    def namespaces(self) -> list[str]:
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
                                     f"within {limit:g} s (state {read_attr(self.sysfs_path / 'state')!r};"
                                     " is udev/devtmpfs running?)", self.subsysnqn)
            time.sleep(0.05)

    def namespace(self, nsid: int = 1, timeout: float | None = None) -> str:
        """/dev/nvmeXnY of namespace nsid (waits as :attr:`namespaces` does)."""
        return self.wait_namespaces((nsid,), timeout)[nsid]

    @property
    def subsystem(self) -> str:
        """The kernel's nvme-subsys<N> that holds this controller ("" if none shows it)."""
        d = SYSFS / "class" / "nvme-subsystem"
        try:
            names = sorted(os.listdir(d))
        except OSError:
            return ""
        return next((n for n in names if (d / n / self.name).exists()), "")

    def paths(self) -> list[NamespacePath]:
        """This controller's multipath paths (nvme<S>c<C>n<N>), one per namespace it shows,
        in NSID order; empty without native multipath (then it has no paths, only block
        devices of its own)."""
        return namespace_paths(self.name)

    def disconnect(self) -> None:
        from fx100io.kernel.connections import disconnect  # (it needs this module)

        disconnect(self)

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.owned:  # (disconnect lets go of this object's hold first)
            self.disconnect()

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "subsysnqn": self.subsysnqn, "transport": self.transport,
                "address": self.address, "traddr": self.traddr, "trsvcid": self.trsvcid,
                "state": self.state, "hostnqn": self.hostnqn, "hostid": self.hostid,
                "cntlid": self.cntlid, "queue_count": self.queue_count, "kato": self.kato,
                "namespaces": [p for _, p in sorted(self.block_devices().items())],
                "subsystem": self.subsystem,
                "paths": [dataclasses.asdict(p) for p in self.paths()]}


# What identifies a namespace, as sysfs shows it on each path (an attribute a kernel does not
# have, or a namespace does not report, reads as "" and is not compared)
ID_ATTRS = ("nguid", "uuid", "eui", "wwid")


@dataclass(frozen=True)
class NamespacePath:
    """One controller's path to a namespace under native multipath: /sys/block/<name>."""

    name: str  # nvme<S>c<C>n<N>
    nsid: int
    head: str  # the block device all the subsystem's paths serve: nvme<S>n<N>
    ana_state: str  # optimized, non-optimized, inaccessible, persistent-loss, change; "" if none
    ids: dict[str, str] = field(default_factory=dict)  # ID_ATTRS that read non-empty


def namespace_paths(ctrl: str) -> list[NamespacePath]:
    try:
        entries = os.listdir(SYSFS / "class" / "nvme" / ctrl)
    except OSError:
        return []
    out = []
    for e in entries:
        m = _PATH_NS.fullmatch(e)
        if not m:
            continue
        b = SYSFS / "block" / e
        if not b.exists():  # (some kernels show it only under the controller)
            b = SYSFS / "class" / "nvme" / ctrl / e
        ids = {k: v for k in ID_ATTRS if (v := read_attr(b / k))}
        out.append(NamespacePath(e, to_int(read_attr(b / "nsid"), 0) or int(m.group(3)),
                                 f"nvme{m.group(1)}n{m.group(3)}", read_attr(b / "ana_state"),
                                 ids))
    return sorted(out, key=lambda p: (p.nsid, p.name))


def to_int(text: str, default: int = -1) -> int:
    try:
        return int(text)
    except ValueError:
        return default


def read_controller(name: str) -> Controller | None:
    """The controller /sys/class/nvme/<name>, or None if it is not there."""
    d = SYSFS / "class" / "nvme" / name
    if not CTRL_NAME.fullmatch(name) or not d.is_dir():
        return None
    return Controller(name=name, subsysnqn=read_attr(d / "subsysnqn"), transport=read_attr(d / "transport"),
                      address=read_attr(d / "address"), state=read_attr(d / "state"),
                      hostnqn=read_attr(d / "hostnqn"), hostid=read_attr(d / "hostid"),
                      cntlid=to_int(read_attr(d / "cntlid")), queue_count=to_int(read_attr(d / "queue_count"), 0),
                      kato=to_int(read_attr(d / "kato"), 0))


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
        nsid = to_int(read_attr(SYSFS / "block" / block / "nsid"), 0) or int(block.rsplit("n", 1)[1])
        dev = DEVDIR / block
        if read_attr(SYSFS / "block" / block / "size") in ("", "0"):
            continue
        if _is_block_device(dev):
            out[nsid] = str(dev)
    return out


def _is_block_device(path: Path) -> bool:
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False


def controllers(*, all_transports: bool = False) -> list[Controller]:
    """Every controller in /sys/class/nvme, fabrics ones only unless all_transports (PCIe
    drives are left out: the kernel path never touches them)."""
    d = SYSFS / "class" / "nvme"
    try:
        names = sorted((n for n in os.listdir(d) if CTRL_NAME.fullmatch(n)),
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
    return {n: read_attr(d / n / "subsysnqn") for n in sorted(names)}


def same_path(now: Controller, c: Controller) -> bool:
    """Whether now (read from sysfs) is still the path c was: a controller the kernel deleted
    may have left its name to another connect.  (Not the cntlid: a reconnect may get another
    from the target.)"""
    return (now.subsysnqn, now.transport, now.traddr, now.trsvcid, now.hostnqn) == (
        c.subsysnqn, c.transport, c.traddr, c.trsvcid, c.hostnqn)


def matches(c: Controller, t: Target, *, host: bool = True) -> bool:
    a = parse_address(c.address)
    return (c.subsysnqn == t.subnqn and c.transport == t.transport
            and a.get("traddr") == t.traddr and a.get("trsvcid") == t.trsvcid
            and (not host or not c.hostnqn or c.hostnqn == t.hostnqn))


def in_use_hostid(hostnqn: str) -> str | None:
    """The host ID the kernel's controllers of host NQN hostnqn carry, if any: Linux 6.12
    refuses a connect with a known host NQN and another host ID ("found same hostnqn ... but
    different hostid", EINVAL), so a default host ID yields to the one in use."""
    for c in controllers():
        if c.hostnqn == hostnqn and c.hostid:
            return c.hostid
    return None


def settle_hostid(t: Target) -> Target:
    if t.hostid_given:
        return t
    hid = in_use_hostid(t.hostnqn)
    return dataclasses.replace(t, hostid=hid) if hid and hid != t.hostid else t


def sysfs_options(c: Controller) -> dict[str, str]:
    """The connect options a live controller shows in sysfs, in nvme-cli's terms."""
    out = {"--keep-alive-tmo": str(c.kato)}
    sq = to_int(read_attr(c.sysfs_path / "sqsize"), -1)
    if sq >= 0:
        out["--queue-size"] = str(sq + 1)
    for opt, attr in (("--ctrl-loss-tmo", "ctrl_loss_tmo"), ("--reconnect-delay", "reconnect_delay")):
        v = read_attr(c.sysfs_path / attr)
        if v:
            out[opt] = "-1" if v == "off" else v
    return out


def check_block_device(path: str, t: Target, where: str) -> None:
    """path (/dev/nvmeXnY) must be t's namespace now: a name the kernel reused for another
    subsystem's namespace is never handed out."""
    blk = os.path.basename(path)
    b = SYSFS / "block" / blk
    nqn = read_attr(b / "device" / "subsysnqn")
    m = _HEAD_NS.fullmatch(blk)
    if not nqn and m:  # no device link (older sysfs): the head nvme<S>n<N> of nvme-subsys<S>
        nqn = read_attr(SYSFS / "class" / "nvme-subsystem" / f"nvme-subsys{m.group(1)}" / "subsysnqn")
    nsid = to_int(read_attr(b / "nsid"), 0) or (int(m.group(2)) if m else 0)
    if nqn != t.subnqn or nsid != t.nsid:
        raise DeviceNotFoundError(errno.ENODEV, f"{path} belongs to {nqn or 'no subsystem'} "
                                  f"namespace {nsid} now, not to {t.subnqn} namespace {t.nsid}; "
                                  "it was not opened", where)

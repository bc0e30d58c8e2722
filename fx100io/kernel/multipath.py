"""Several paths to one subsystem through the kernel's native NVMe multipath.

``kernel.connect("nvme+tcp://A:4420,B:4421/NQN")`` connects each path with nvme-cli, one
controller per path; the kernel (nvme_core.multipath=Y) groups controllers of one subsystem
NQN and serves each namespace they share as ONE block device, nvme<S>n<N>, choosing a path
per I/O by ANA state and iopolicy and moving I/O off a path that fails.  Each path must show
the same namespace (one head, the same NGUID / UUID / EUI-64): a path that shows another, or
none (the kernel refuses a namespace whose identifiers differ from the head's, and logs it),
is refused with PathMismatchError.  Connects are all or nothing: when one path fails, every
controller this call made is detached before the error is raised.

Without native multipath (nvme_core.multipath=N, a boot or module parameter) the kernel
makes one block device per path, two devices that are the same namespace; writing through
both as if they were one is how data gets lost, so such a connect is refused with
KernelSupportError before any controller is made.
"""

from __future__ import annotations

import contextlib
import errno
import time
from dataclasses import dataclass, field
from typing import Any

from fx100io.errors import (
    DeviceNotFoundError,
    Fx100ioError,
    KernelSupportError,
    PathMismatchError,
)
from fx100io.kernel import holds, sysfs
from fx100io.kernel.diagnose import KernelLog
from fx100io.kernel.nvme_cli import delete_controller
from fx100io.kernel.sysfs import DEFAULT_NS_TIMEOUT, Controller, NamespacePath, read_attr
from fx100io.kernel.uri_args import Target, redact, split_paths, target_of

MULTIPATH_PARAM = ("module", "nvme_core", "parameters", "multipath")
# kernel log words that say it refused a path's namespace or controller for this subsystem
_REFUSALS = ("IDs don't match", "Duplicate unshared namespace", "duplicate subnqn",
             "Found shared namespace", "duplicate IDs")


def native_multipath() -> bool | None:
    """Whether the kernel's native NVMe multipath is on (nvme_core.multipath); None while
    nvme_core is not loaded (nothing to tell yet)."""
    v = read_attr(sysfs.SYSFS.joinpath(*MULTIPATH_PARAM))
    return None if v == "" else v in ("Y", "y", "1")


def _no_multipath(where: str) -> KernelSupportError:
    return KernelSupportError(
        errno.EOPNOTSUPP, "the kernel's native NVMe multipath is off "
        "(/sys/module/nvme_core/parameters/multipath is N): each path would be a block device "
        "of its own for one namespace; boot with nvme_core.multipath=Y (the default of "
        "Debian's and most kernels), or connect one path, or use fx100io's userspace multipath "
        "(open_device with the same URI; docs/nvme-tcp.md)", where)


@dataclass
class Paths:
    """The controllers :func:`connect_paths` made, one per path of the URI, in its order; one
    subsystem, one block device per namespace.  As a context manager it detaches them on
    exit, each unless another process holds it (see kernel.disconnect)."""

    subsysnqn: str
    controllers: list[Controller]
    nsid: int = 1
    owned: bool = field(default=True, repr=False)
    ns_timeout: float = field(default=DEFAULT_NS_TIMEOUT, repr=False)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.controllers]

    @property
    def namespaces(self) -> list[str]:
        """The subsystem's block devices (/dev/nvme<S>n<N>), in NSID order: the same through
        every path, so read from the first path still attached."""
        for c in self.live_controllers():
            return c.namespaces
        raise DeviceNotFoundError(errno.ENODEV, "every path of this subsystem is detached",
                                  self.subsysnqn)

    def namespace(self, nsid: int | None = None, timeout: float | None = None) -> str:
        """/dev/nvme<S>n<N> of namespace nsid (the URI's by default), as a path still attached
        shows it (waits as Controller.namespace does)."""
        for c in self.live_controllers():
            return c.namespace(self.nsid if nsid is None else nsid, timeout)
        raise DeviceNotFoundError(errno.ENODEV, "every path of this subsystem is detached",
                                  self.subsysnqn)

    def states(self) -> list[dict[str, Any]]:
        """Each path as the kernel sees it now: controller, address, controller state, and the
        ANA state of the URI's namespace on it ("" where it shows none)."""
        out = []
        live = {c.name for c in self.live_controllers()}
        for c in self.controllers:
            now = sysfs.read_controller(c.name) if c.name in live else None
            p = _path_of(c.name, self.nsid) if now is not None else None
            out.append({"name": c.name, "address": c.address, "traddr": c.traddr,
                        "trsvcid": c.trsvcid, "state": now.state if now else "gone",
                        "ana_state": p.ana_state if p else ""})
        return out

    def live_controllers(self) -> list[Controller]:
        """This object's controllers that sysfs still shows as the same path: a controller the
        kernel deleted (ctrl_loss_tmo ran out) may have left its name to another connect.
        (Not the cntlid: a reconnect may get another from the target.)"""
        out = []
        for c in self.controllers:
            now = sysfs.read_controller(c.name)
            if now is not None and sysfs.same_path(now, c):
                out.append(c)
        return out

    def disconnect(self) -> list[str]:
        from fx100io.kernel.connections import disconnect  # (it needs this module)

        return disconnect(self)

    def __enter__(self) -> Paths:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.owned:  # (disconnect lets go of this object's holds first)
            self.disconnect()

    def as_dict(self) -> dict[str, Any]:
        return {"subsysnqn": self.subsysnqn, "controllers": self.names,
                "paths": self.states(), "namespaces": self.namespaces}


def _path_of(ctrl: str, nsid: int) -> NamespacePath | None:
    return next((p for p in sysfs.namespace_paths(ctrl) if p.nsid == nsid), None)


def _check_one_namespace(made: list[tuple[Target, Controller]], nsid: int, timeout: float,
                         klog: KernelLog, where: str) -> None:
    """Every controller in made shows namespace nsid as a path of one head with the same
    identifiers as the first path's; PathMismatchError naming the first path that does not
    (within timeout, or at once when the kernel's log says it refused it)."""
    deadline = time.monotonic() + timeout
    logged: list[str] = []
    first: tuple[Target, NamespacePath] | None = None
    for t, c in made:
        while True:
            p = _path_of(c.name, nsid)
            if p is not None:
                break
            if native_multipath() is False:  # (without it no controller shows paths)
                raise _no_multipath(where)
            logged += [line for line in klog.read().splitlines()
                       if any(w in line for w in _REFUSALS)]
            # the kernel's lines name the controller as "nvme nvme4: ..." ("nvme4:" is not
            # a prefix of another controller's name, as "nvme4" is of nvme41's)
            mine = [line for line in logged if f"{c.name}:" in line]
            if mine or time.monotonic() >= deadline:
                why = ("the kernel refused it: " + "; ".join(mine[-2:])) if mine else (
                    f"it shows no path to namespace {nsid} within {timeout:g} s")
                raise PathMismatchError(
                    errno.ESTALE, f"path {t.traddr}:{t.trsvcid} ({c.name}) does not show "
                    f"{t.subnqn} namespace {nsid} as the other paths do: {why}; every path "
                    "this connect made was detached", where)
            time.sleep(0.05)
        if first is None:
            first = (t, p)
            continue
        t0, p0 = first
        differ = [k for k in sysfs.ID_ATTRS if k in p.ids and k in p0.ids and p.ids[k] != p0.ids[k]]
        if p.head != p0.head or differ:
            what = (f"{', '.join(differ)} {', '.join(p.ids[k] for k in differ)} where "
                    f"{t0.traddr}:{t0.trsvcid} shows {', '.join(p0.ids[k] for k in differ)}"
                    if differ else f"block device {p.head}, not {p0.head}")
            raise PathMismatchError(
                errno.ESTALE, f"path {t.traddr}:{t.trsvcid} ({c.name}) shows another namespace "
                f"than path {t0.traddr}:{t0.trsvcid}: {what}; every path this connect made was "
                "detached", where)


def connect_paths(uri: str, *, timeout: float, ns_timeout: float, **opts: Any) -> Paths:
    """Connect every path of uri (see the module's doc).  Raises what a one-path connect
    raises, PathMismatchError for a path that shows another namespace, KernelSupportError
    when native multipath is off; leaves no controller of its own behind when it raises."""
    from fx100io.kernel.connections import _connect, hold_made  # (it imports this module)

    uris = split_paths(uri)
    where = redact(uri)
    targets = [target_of(u, **dict(opts)) for u in uris]
    if native_multipath() is False:
        raise _no_multipath(where)
    made: list[tuple[Target, Controller]] = []
    klog = KernelLog()
    try:
        for t, u in zip(targets, uris):
            with holds.target_lock(t, timeout, redact(u)):
                c = _connect(t, redact(u), timeout, ns_timeout)
                c.owned = False  # (the Paths owns them all)
                hold_made(c, t, timeout, redact(u))
            made.append((t, c))
        if native_multipath() is False:  # nvme_core loaded by the first connect
            raise _no_multipath(where)
        _check_one_namespace(made, targets[0].nsid, ns_timeout, klog, where)
    except BaseException:
        for _t, c in made:
            with contextlib.suppress(Fx100ioError):
                delete_controller(c.name)
        holds.forget([c.name for _t, c in made])
        raise
    finally:
        klog.close()
    return Paths(targets[0].subnqn, [c for _t, c in made], targets[0].nsid,
                 ns_timeout=ns_timeout)

"""connect, disconnect, discover, attach and list: the kernel path's operations."""

from __future__ import annotations

import contextlib
import errno
import hmac
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from fx100io import fabric_uri
from fx100io.errors import (
    DeviceBusyError,
    DeviceNotFoundError,
    Fx100ioError,
    FxTimeoutError,
    InvalidArgumentError,
)
from fx100io.kernel import holds, keyring, sysfs
from fx100io.kernel.diagnose import KernelLog, classify_connect_failure
from fx100io.kernel.holds import (
    claimed,
    detach_if_unused,
    hold,
    identity,
    record_of,
    target_lock,
    unhold,
    write_record,
)
from fx100io.kernel.multipath import Paths, connect_paths
from fx100io.kernel.nvme_cli import (
    DEFAULT_TIMEOUT,
    active_nsids,
    check_kernel,
    delete_controller,
    module_loaded,
    nvme_cli_path,
    parse_connect_output,
    parse_discover_output,
    run,
)
from fx100io.kernel.secrets import check_secrets_applied, secret_config
from fx100io.kernel.sysfs import (
    CTRL_NAME,
    DEFAULT_NS_TIMEOUT,
    Controller,
    check_block_device,
    controllers,
    in_use_hostid,
    matches,
    read_attr,
    read_controller,
    same_path,
    settle_hostid,
    sysfs_options,
)
from fx100io.kernel.uri_args import (
    DISCOVERY_NQN,
    OPTION_NAMES,
    Target,
    default_host_identity,
    query_keys,
    redact,
    refuse_tls,
    split_paths,
    target_of,
    uuid_form,
)

log = logging.getLogger("fx100io")


def connect(uri: str, *, timeout: float = DEFAULT_TIMEOUT, ns_timeout: float = DEFAULT_NS_TIMEOUT,
            **opts: Any) -> Controller | Paths:
    """Attach uri's subsystem through the kernel (``nvme connect``); returns the
    :class:`Controller`, which detaches on ``with`` exit.  Raises DevicePermissionError
    (host not allowed, authentication failed), DeviceNotFoundError (no such subsystem),
    FxConnectionError (nothing listens), DeviceBusyError (this host is already connected
    there), KernelSupportError (a module missing, no authentication in this kernel),
    NvmeCliNotFoundError.  A connect that fails leaves no controller of its own behind.
    A URI with several paths (``nvme+tcp://A:4420,B:4421/NQN``) connects each and returns
    :class:`~fx100io.kernel.multipath.Paths`: one block device through the kernel's native
    multipath (see fx100io.kernel.multipath)."""
    if len(split_paths(uri)) > 1:
        ps = connect_paths(uri, timeout=timeout, ns_timeout=ns_timeout, **opts)
        _own(ps)
        return ps
    t = target_of(uri, **opts)
    where = redact(uri)
    with target_lock(t, timeout, where):
        c = _connect(t, where, timeout, ns_timeout)
        hold_made(c, t, timeout, where)
    _own(c)
    return c


def hold_made(c: Controller, t: Target, timeout: float, where: str) -> None:
    """A controller connect() or connect_paths() made is held (holds.hold) while its
    Controller or Paths owns it, as attach()'s are: another process's disconnect leaves it,
    and when another process's attach() reuses it, the owner's exit leaves it to that one
    (see disconnect).  Taken under the target lock, so that a failed connect's cleanup
    sees it claimed.  On failure the controller is detached."""
    c.options = tuple(t.options)
    try:
        hold(c.name, timeout, where)
    except BaseException:
        with contextlib.suppress(Fx100ioError):
            delete_controller(c.name)
        raise


def _connect(t: Target, where: str, timeout: float, ns_timeout: float) -> Controller:
    nvme = nvme_cli_path()
    check_kernel(t.transport)
    t = settle_hostid(t)
    loaded = module_loaded(t.transport)
    before = {c.name for c in controllers()}
    klog = KernelLog()
    argv = t.argv(nvme)
    try:
        if t.tls_key:
            name, failed = _fabrics_connect(t, where)
            if name is None:
                _cleanup_new(before, t)
                raise classify_connect_failure(t, failed, klog.read(), loaded, where)
        else:
            with secret_config(t) as cfg:
                if cfg is not None:
                    argv.insert(2, f"--config={cfg}")
                try:
                    r = run(argv, timeout, where)
                except FxTimeoutError:
                    _cleanup_new(before, t)
                    raise
            if r.returncode != 0:
                _cleanup_new(before, t)
                raise classify_connect_failure(t, r.stderr, klog.read(), loaded, where)
            try:
                name = parse_connect_output(r.stdout)
            except BaseException:
                _cleanup_new(before, t)
                raise
        try:
            c = read_controller(name)
            if c is None:
                raise DeviceNotFoundError(errno.ENODEV, f"nvme connect said {name}, but "
                                          f"{sysfs.SYSFS}/class/nvme/{name} is not there", where)
            c.owned = True
            c.ns_timeout = ns_timeout
            check_secrets_applied(c, t, where)
            c.expected_nsids = active_nsids(nvme, name)
            return c
        except BaseException:
            _cleanup_new(before, t, name)
            raise
    finally:
        klog.close()


def _fabrics_connect(t: Target, where: str) -> tuple[str | None, str]:
    """A TLS connect, which Debian 12's nvme-cli (2.3, no --tls) cannot ask for: the PSK into
    `.nvme` (kernel/keyring.py), then the options nvme-cli would write, with
    ``tls,tls_key=<serial>``, written to /dev/nvme-fabrics; the kernel hands the handshake to
    tlshd.  (controller name, "") or (None, the failure as nvme-cli would word it).  The
    write returns when the kernel has connected or given up (its own timeouts bound it)."""
    serial, created = keyring.insert_tls_psk(t.tls_key, t.hostnqn, t.subnqn, where)
    name: str | None = None
    try:
        name, failed = _write_fabrics(t, serial)
        return name, failed
    finally:
        if name is None and created:  # (a key this connect added, that nothing uses)
            keyring.invalidate(serial)


def _write_fabrics(t: Target, serial: int) -> tuple[str | None, str]:
    device = sysfs.DEVDIR / "nvme-fabrics"
    try:
        fd = os.open(device, os.O_RDWR)
    except OSError as e:
        return None, f"Failed to open {device}: {e.strerror}"
    try:
        try:
            os.write(fd, t.fabrics_options(serial).encode())
        except OSError as e:  # (the options hold secrets: never in a message)
            return None, f"could not add new controller: {e.strerror}"
        answer = os.read(fd, 4096).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)
    for part in answer.split(","):
        key, _, value = part.partition("=")
        if key == "instance" and value.isdigit():
            return f"nvme{value}", ""
    return None, f"unexpected answer from {device}: {answer!r}"


def _cleanup_new(before: set[str], t: Target, name: str | None = None) -> None:
    """Detach what a connect that failed half way left: the controller nvme-cli named (name),
    else controllers of t that appeared since before and that no process holds (connects to
    t are serialised by target_lock, so one of fx100io's own is held by then)."""
    if name is not None:
        names = [name] if name not in before else []
    else:
        names = [c.name for c in controllers()
                 if c.name not in before and matches(c, t) and not claimed(c.name)]
    for n in names:
        log.warning("fx100io: detaching %s, left behind by a failed connect to %s", n, t.subnqn)
        with contextlib.suppress(Fx100ioError):
            delete_controller(n)


def keep(target: Controller | Paths) -> None:
    """Leave what connect() returned attached as the admin's (`fx100io connect`): this
    process lets go of its holds and writes no record, so no release of fx100io detaches
    it; a disconnect does."""
    with _owned_mu:
        if not target.owned:
            return
        target.owned = False
        _owned.pop(id(target), None)
    for c in _controllers_of(target):
        unhold(c.name)


def disconnect(target: str | Controller | Paths, *, timeout: float = DEFAULT_TIMEOUT,
               force: bool = False) -> list[str]:
    """Detach a controller (a :class:`Controller`, or a name like ``nvme3``), every path of a
    :class:`Paths`, or every controller of a URI's subsystem at its address (at each of its
    addresses, for a URI with several paths; and host, when the URI names one).  A
    controller some process on this host holds (an attach() or store using it, a connect's
    Controller or Paths in its with block) is left attached with a warning, unless force.
    A Controller or Paths that connect() returned first lets go of its own holds; a
    controller of it that another process's attach() reuses is recorded as fx100io's, so
    that the last of those releases detaches it.  Returns the names detached; checks in
    sysfs that they are gone."""
    if isinstance(target, (Controller, Paths)):
        _let_go(target)
    if isinstance(target, Paths):
        names = [c.name for c in target.live_controllers()]
    elif isinstance(target, Controller):
        # (only while sysfs still shows that path: a controller the kernel deleted may have
        # left its name to another connect)
        now = read_controller(target.name)
        names = [target.name] if now is not None and same_path(now, target) else []
    elif isinstance(target, str) and CTRL_NAME.fullmatch(target):
        names = [target]
    elif isinstance(target, str) and target.startswith("/dev/") and CTRL_NAME.fullmatch(
            os.path.basename(target)):
        names = [os.path.basename(target)]
    else:
        if not isinstance(target, str):
            raise InvalidArgumentError(22, f"disconnect() takes a Controller, a controller name or "
                                       f"a URI, got {target!r}")
        ts = [target_of(u) for u in split_paths(target)]
        host = "hostnqn" in query_keys(target)
        names = [c.name for c in controllers() if any(matches(c, t, host=host) for t in ts)]
    with _owned_mu:  # what this process's own connects still own of these goes first
        objs = [o for o in (r() for r in _owned.values()) if o is not None]
    for o in objs:
        if o.owned and set(names) & {c.name for c in _controllers_of(o)}:
            _let_go(o)
    return [n for n in names if holds.detach_unless_held(n, timeout, force)]


# the Controllers and Paths that connect() returned and that still own their controllers
# (id -> weak reference): disconnect(URI or name) in the process that connected lets go of
# their holds as their own exit would, so a process's own connect never blocks its disconnect
_owned: dict[int, weakref.ref[Controller | Paths]] = {}
_owned_mu = threading.Lock()


def _own(target: Controller | Paths) -> None:
    with _owned_mu:
        _owned[id(target)] = weakref.ref(target)


def _controllers_of(target: Controller | Paths) -> list[Controller]:
    return target.controllers if isinstance(target, Paths) else [target]


def _let_go(target: Controller | Paths) -> None:
    """The end of a connect()'s ownership: its controllers are recorded as fx100io's (so
    that another process's attach() that reuses one detaches it at its last release) and
    its holds go; the caller then detaches what nobody holds."""
    with _owned_mu:
        if not target.owned:
            return
        target.owned = False
        _owned.pop(id(target), None)
    for m in _controllers_of(target):  # (the record names the controller as sysfs shows it)
        now = read_controller(m.name)
        if now is not None and same_path(now, m):
            write_record(now, m.options)
    for m in _controllers_of(target):
        unhold(m.name)


def discover(uri: str, *, timeout: float = DEFAULT_TIMEOUT) -> list[dict[str, Any]]:
    """The discovery log of nvme+tcp://HOST[:PORT] or nvme+rdma://HOST[:PORT], read by the
    kernel (``nvme discover -o json``): one dict per record with trtype, adrfam, subtype
    ("nvme", "discovery"), subtype_text, treq, portid, trsvcid, subnqn, traddr, ..."""
    refuse_tls(uri)  # before the URI's values (a tls_key's @FILE) are read
    host, port, nqn, hid, _, _ = fabric_uri.discovery_options(uri)
    given = query_keys(uri)
    dnqn, did = default_host_identity()
    hostnqn = nqn if "hostnqn" in given else dnqn
    hostid = uuid_form(hid) if "hostid" in given else in_use_hostid(hostnqn) or did
    transport = fabric_uri.SCHEMES[fabric_uri.scheme_of(uri)]
    nvme = nvme_cli_path()
    check_kernel(transport)
    klog = KernelLog()
    try:
        r = run([nvme, "discover", "--transport", transport, "--traddr", host, "--trsvcid", port,
                  "--hostnqn", hostnqn, "--hostid", hostid, "--output-format=json"], timeout, uri)
        if r.returncode != 0:
            t = Target(transport, host, port, DISCOVERY_NQN, hostnqn, hostid)
            raise classify_connect_failure(t, r.stderr, klog.read(), module_loaded(transport), uri)
        return parse_discover_output(r.stdout)
    finally:
        klog.close()


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
        if unhold(self.controller.name):
            detach_if_unused(self.controller)


# controller states the kernel passes through on its way to "live" (a reconnect after a loss)
_PENDING_STATES = ("new", "connecting", "resetting")


def _mismatch(c: Controller, t: Target) -> str | None:
    """Why live controller c is not what t asks for (secrets, options), or None.  Secrets are
    compared in constant time and never named by value."""
    for key in ("dhchap_secret", "dhchap_ctrl_secret"):
        want = t.secrets.get(key)
        if want is None:
            continue
        have = read_attr(c.sysfs_path / key)
        if not hmac.compare_digest(have.encode(), want.encode()):
            return (f"it was not attached with this {key} (it holds another key, or none), so "
                    "reusing it would skip the authentication asked for")
    if t.tls_key and not _same_tls_key(c, t):
        return ("it was not attached with this tls_key (its TLS PSK is another, or cannot be "
                "told), so reusing it would skip the authentication asked for")
    rec = record_of(c)
    known: dict[str, str] = ({str(o[0]): str(o[1]) for o in rec["options"]} if rec is not None
                             else sysfs_options(c))
    for opt, value in t.options:
        if opt in ("--duplicate-connect", "--tls"):  # (--tls: its key was checked above)
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


def _same_tls_key(c: Controller, t: Target) -> bool:
    """Whether live controller c did its TLS handshakes with t's PSK: its sysfs tls_key (the
    serial of the `.nvme` key the kernel hands tlshd) is the key that holds the PSK derived
    from t's key.  Anything that cannot be told is a no."""
    try:
        have = int(read_attr(c.sysfs_path / "tls_key") or "0", 16)
        want = keyring.serial_holding(t.tls_key, t.hostnqn, t.subnqn)
    except (ValueError, Fx100ioError):
        return False
    return have != 0 and want is not None and have == want


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
    with target_lock(t, timeout, where):
        for _ in range(3):
            c = _reusable(t, where, timeout, duplicate)
            made = c is None
            if c is None:
                c = _connect(t, where, timeout, ns_timeout)
                c.owned = False
                try:
                    hold(c.name, timeout, where)
                    write_record(c, t.options)
                except BaseException:
                    unhold(c.name)
                    with contextlib.suppress(Fx100ioError):
                        delete_controller(c.name)
                    raise
                break
            c.ns_timeout = ns_timeout
            hold(c.name, timeout, where)
            now = read_controller(c.name)
            if now is not None and identity(now) == identity(c):
                break
            unhold(c.name)  # detached by its last user meanwhile: look again
        else:
            raise DeviceBusyError(errno.EBUSY, "the controller kept going away while attaching",
                                  where)
    a = Attachment(c, "", made)
    try:
        a.path = c.namespace(t.nsid)
        check_block_device(a.path, t, where)
    except BaseException:
        a.release()
        raise
    return a


def list_controllers(*, all_transports: bool = False) -> list[Controller]:
    """The fabrics controllers the kernel holds now (sysfs; works with any nvme-cli)."""
    return controllers(all_transports=all_transports)

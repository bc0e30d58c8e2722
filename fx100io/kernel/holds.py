"""Sharing controllers between the threads and processes of this host: holds on
controllers, records of what fx100io attached, and one connect per target at a time
(all on fx100io.locks)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fx100io import locks
from fx100io.errors import (
    DeviceBusyError,
    DevicePermissionError,
    Fx100ioError,
    FxTimeoutError,
)
from fx100io.kernel.nvme_cli import delete_controller
from fx100io.kernel.sysfs import Controller, read_controller
from fx100io.kernel.uri_args import Target

# lock files and records shared by this host's processes (tmpfs: gone at reboot, as the
# controllers are); a flock is let go when its process dies, so a dead process counts as no user
RUNDIR = Path("/run/fx100io")
log = logging.getLogger("fx100io")


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
def target_lock(t: Target, timeout: float, where: str) -> Iterator[None]:
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


def identity(c: Controller) -> dict[str, Any]:
    return {"subsysnqn": c.subsysnqn, "transport": c.transport, "address": c.address,
            "cntlid": c.cntlid, "hostnqn": c.hostnqn}


def write_record(c: Controller, options: Sequence[tuple[str, str]]) -> None:
    """RUNDIR/ctrl-<name>.json: fx100io attached this controller, with these options (a
    Target's; no secrets)."""
    path = _lock_file(f"ctrl-{c.name}.json")
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**identity(c), "options": [[o, v] for o, v in options]}))
    os.replace(tmp, path)


def record_of(c: Controller) -> dict[str, Any] | None:
    """What write_record wrote for this very controller (not an earlier one of its name)."""
    try:
        rec = json.loads((RUNDIR / f"ctrl-{c.name}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or any(rec.get(k) != v for k, v in identity(c).items()):
        return None
    return rec


def claimed(name: str) -> bool:
    """Whether some process holds controller name (its lock file is locked)."""
    try:
        held = locks.lock(_lock_file(f"ctrl-{name}.lock"), create=True)
    except Fx100ioError:
        return True  # cannot tell: leave it
    if held is None:
        return True
    held.release()
    return False


def hold(name: str, timeout: float, where: str) -> None:
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


def unhold(name: str) -> bool:
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


def detach_if_unused(c: Controller) -> None:
    """Detach c if fx100io attached it and no process holds it any more."""
    try:
        held = locks.lock(_lock_file(f"ctrl-{c.name}.lock"), create=True)
    except Fx100ioError:
        return
    if held is None:
        return  # another process uses it
    with held:
        live = read_controller(c.name)
        if live is None or identity(live) != identity(c) or record_of(live) is None:
            return  # gone, another controller now, or not attached by fx100io
        with contextlib.suppress(DeviceBusyError):
            delete_controller(c.name)
        if not live.sysfs_path.exists():
            with contextlib.suppress(OSError):
                (RUNDIR / f"ctrl-{c.name}.json").unlink()


def detach_unless_held(name: str, timeout: float, force: bool = False) -> bool:
    """disconnect()'s one rule: detach controller name only while no process holds it (this
    one's attachments and connects included), taking its lock file exclusively for the
    delete so that no attach() takes it meanwhile; force detaches it all the same.  Only a
    controller detached loses its record and this process's holds.  True when detached."""
    held = None
    if not force:
        try:
            held = locks.lock(_lock_file(f"ctrl-{name}.lock"), create=True)
        except Fx100ioError:
            held = None  # cannot tell: leave it
        if held is None:
            log.warning("fx100io: controller %s is in use by a process on this host (an attach, "
                        "a store, a connect's with block): left attached (force=True detaches "
                        "it all the same)", name)
            return False
    try:
        delete_controller(name, timeout)
        forget([name])
    finally:
        if held is not None:
            held.release()
    return True


def forget(names: list[str]) -> None:
    """Controllers detached by disconnect(): this process's holds on them and their records
    go."""
    with _registry_lock:
        held = [h for h in (_attached.pop(n, None) for n in names) if h is not None]
    for h in held:
        h.lock.release()
    for n in names:
        with contextlib.suppress(OSError):
            (RUNDIR / f"ctrl-{n}.json").unlink()

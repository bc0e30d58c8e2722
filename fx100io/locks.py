"""Cross-process locks on files: the one mechanism behind a store's claim on its device,
an adapter's claim on its devices and the kernel path's holds on controllers.

Every lock here is an ``flock()`` on an open file description, so:

- the kernel lets go of it when the process dies, however it dies (a crashed worker
  never leaves a device or a controller locked);
- it belongs to the open file description, not to the process: a second lock on the
  same file taken by the same process through another ``open()`` conflicts with the
  first, so one process cannot open two stores on one device by mistake;
- closing another descriptor of the same file leaves it alone.

The adapters used ``lockf()`` (POSIX record locks) before, for one reason: their claim
on a device is taken before the store is opened, and the store's own ``flock()`` on the
same file, in the same process, must not be refused because of it (POSIX locks and
``flock()`` do not see each other on Linux).  POSIX locks have a trap that made the
claim silently fragile: they belong to the process and are dropped as soon as *any*
descriptor of the file is closed, which the store itself does (probing whether a device
is blank, closing a device after a failed open).  A *claim* (:func:`claim`) keeps
``flock()`` and solves the same problem explicitly: it is this process's, and the
process's own lock with ``inside_claim=True`` (the store's) is taken inside it instead of
against it, once at a time.

On NFS, Linux emulates ``flock()`` with a whole-file POSIX lock, whose owner is the
process: there two locks of one process do not conflict.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from dataclasses import dataclass, field

# how often a lock with a timeout tries again (flock has no timed wait)
POLL_S = 0.02


@dataclass
class _Claim:
    """A process claim on one file, and whether a lock is taken inside it now."""

    fd: int
    claims: int = 1  # claim() handles not yet released
    inside: bool = False  # a lock(inside_claim=True) holds it


# (st_dev, st_ino) -> this process's claim on that file
_claims: dict[tuple[int, int], _Claim] = {}
_claims_mu = threading.Lock()


@dataclass
class FileLock:
    """A lock held on path; :meth:`release` (or ``with`` exit) lets go of it.  Releasing
    twice is harmless."""

    path: str
    shared: bool
    _fd: int = field(default=-1, repr=False)
    _claim_key: tuple[int, int] | None = field(default=None, repr=False)
    _claimed: bool = field(default=False, repr=False)  # this handle is a claim()'s

    def release(self) -> None:
        if self._claim_key is not None:
            key, self._claim_key = self._claim_key, None
            _leave_claim(key, self._claimed)
        elif self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)  # closing the descriptor drops the flock

    @property
    def held(self) -> bool:
        return self._fd >= 0 or self._claim_key is not None

    def __enter__(self) -> FileLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _open(path: str | os.PathLike[str], create: bool, writable: bool, mode: int) -> int:
    flags = (os.O_RDWR if writable or create else os.O_RDONLY) | os.O_CLOEXEC
    return os.open(path, flags | (os.O_CREAT if create else 0), mode)


def _flock(fd: int, shared: bool, timeout: float | None) -> bool:
    """Take the flock on fd, trying until timeout seconds have passed (0: once; None:
    without end); False when it stayed busy."""
    how = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, how)
            return True
        except BlockingIOError:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def lock(path: str | os.PathLike[str], *, shared: bool = False, timeout: float | None = 0.0,
         create: bool = False, writable: bool = False, mode: int = 0o600,
         inside_claim: bool = False) -> FileLock | None:
    """An exclusive (or shared) flock on path, or None when another holder kept it for
    timeout seconds (0: one try; None: wait as long as it takes).  create makes a missing
    file (with mode); errors opening path are raised as the OSError open() gives.

    inside_claim: when this process has :func:`claim`-ed the file, the lock is taken inside
    that claim (one such lock at a time: a second gets None, as from another holder)."""
    fd = _open(path, create, writable, mode)
    try:
        if inside_claim:
            key = _identity(fd)
            with _claims_mu:
                c = _claims.get(key)
                if c is not None:
                    if c.inside:
                        return None
                    c.inside = True
                    return FileLock(str(path), shared, c.fd, key)
        if _flock(fd, shared, timeout):
            held, fd = fd, -1
            return FileLock(str(path), shared, held)
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def claim(path: str | os.PathLike[str], *, create: bool = False, mode: int = 0o644
          ) -> FileLock | None:
    """This process's exclusive claim on path (None when another process, or a lock of
    this one taken outside the claim, holds the file).  A lock with inside_claim=True is
    then taken inside it; the file stays locked until both are released.  Claiming a file
    this process has claimed already counts once more."""
    fd = _open(path, create, True, mode)
    try:
        key = _identity(fd)
        with _claims_mu:
            c = _claims.get(key)
            if c is not None:
                c.claims += 1
                return FileLock(str(path), False, c.fd, key, True)
            if not _flock(fd, False, 0.0):
                return None
            _claims[key] = _Claim(fd)
            fd = -1
            return FileLock(str(path), False, _claims[key].fd, key, True)
    finally:
        if fd >= 0:
            os.close(fd)


def _leave_claim(key: tuple[int, int], was_claim: bool) -> None:
    with _claims_mu:
        c = _claims.get(key)
        if c is None:  # a claim of the parent, forgotten at fork (_forget_claims_in_child)
            return
        if was_claim:
            c.claims -= 1
        else:
            c.inside = False
        if c.claims == 0 and not c.inside:
            del _claims[key]
            os.close(c.fd)


def release_all(locks: list[FileLock]) -> None:
    """Release each lock of the list and empty it."""
    for lk in locks:
        lk.release()
    locks.clear()


def _forget_claims_in_child() -> None:
    """A forked child inherits its parent's claims: their descriptors (and with them the
    flocks) and the registry.  Neither is the child's: were they kept, the child's claim
    would count as one more of the parent's and its store would open inside it, so two
    processes would write one device.  The child drops both; its own claim then takes a
    flock of its own, which the parent's refuses, and the device is let go of when the
    parent releases it, whatever the child still runs."""
    global _claims_mu
    _claims_mu = threading.Lock()  # another thread may have held it at fork
    for c in _claims.values():
        try:
            os.close(c.fd)
        except OSError:
            pass
    _claims.clear()


os.register_at_fork(after_in_child=_forget_claims_in_child)

"""The machine-wide lab lock: one lab at a time on a machine, whichever checkout it comes from.

Two labs boot two guests on the same cores, so every start of a lab takes this flock first
(`FX100IO_LAB_MACHINE_LOCK`, default /tmp/fx100io-lab.lock).  The lock lives as long as the
lab, not as long as whoever started it: the starter hands its descriptor to QEMU
(qemu_vm.launch's keep_fds), so the daemonized QEMU holds the lock until it ends, whether the
lab was started by `lab.py start`, by `lab.py run --keep`, by a pytest fixture in an xdist
worker that ends first, or by a process that was killed.  Stopping the lab (QEMU exiting)
releases it.

A `flock PATH lab.py run ...` wrapper still works: the descriptor flock(1) passes down (the
same open file, which already holds the lock) is found and used, so taking it again is no
conflict.

The file is opened read-only without O_CREAT first (flock needs no write access, and a file in
sticky /tmp that another user made cannot be opened with O_CREAT under
fs.protected_regular), and created 0666 when missing, so every user of the machine can lock
it.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable

DEFAULT_PATH = "/tmp/fx100io-lab.lock"
WAIT_LOG_S = 60.0  # how often a start waiting for the lock says so


class MachineLockBusy(RuntimeError):
    """Another lab holds the machine lock and the caller would not wait."""


def path() -> str:
    return os.environ.get("FX100IO_LAB_MACHINE_LOCK", DEFAULT_PATH)


def open_lock(lock_path: str) -> int:
    """A read-only descriptor of the lock file, which is made (0666) when missing."""
    try:
        return os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        pass
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except FileExistsError:  # made just now by another start
        return os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fchmod(fd, 0o666)  # past the umask
    except OSError:
        pass
    return fd


def inherited(lock_path: str) -> int | None:
    """A descriptor of the lock file this process was given (by `flock PATH cmd`), or None."""
    try:
        want = os.stat(lock_path)
    except OSError:
        return None
    for name in os.listdir("/proc/self/fd"):
        try:
            got = os.fstat(int(name))
        except (OSError, ValueError):
            continue  # closed meanwhile (the listing's own descriptor)
        if (got.st_dev, got.st_ino) == (want.st_dev, want.st_ino):
            return int(name)
    return None


class Claim:
    """The machine lock, held through fd until close() (and after it, by whoever fd was handed
    to).  close() never closes a descriptor this process inherited."""

    def __init__(self, fd: int, own: bool, lock_path: str):
        self.fd, self.own, self.path = fd, own, lock_path

    def close(self) -> None:
        if self.own and self.fd >= 0:
            os.close(self.fd)  # the lock stays held by any process given a copy
        self.fd = -1

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def claim(wait: bool, log: Callable[[str], None] = print,
          sleep: Callable[[float], None] = time.sleep) -> Claim:
    """Take the machine lock.  wait=False: MachineLockBusy at once when another lab holds it;
    wait=True: wait for it (saying so now and then).  The wait polls rather than blocks, so
    a signal (Ctrl-C) ends it."""
    lock_path = path()
    fd = inherited(lock_path)
    own = fd is None
    if fd is None:
        fd = open_lock(lock_path)
    said = 0.0
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return Claim(fd, own, lock_path)
            except BlockingIOError:
                if not wait:
                    raise MachineLockBusy(
                        f"another lab holds {lock_path} (one lab at a time on this machine); "
                        "run lab tests through the lab, which waits for it: python3 "
                        "tools/fabric_lab/lab.py run --rdma -- python3 -m pytest ... (or "
                        "deselect them with -m 'not lab and not guest')") from None
            now = time.monotonic()
            if now - said >= WAIT_LOG_S:
                log(f"fabric lab: waiting for {lock_path}: another lab runs on this machine")
                said = now
            sleep(0.5)
    except BaseException:
        if own:
            os.close(fd)
        raise

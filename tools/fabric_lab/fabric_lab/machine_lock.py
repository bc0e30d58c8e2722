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

Who holds the lock is found in /proc: the processes with a descriptor of the file whose
fdinfo shows the flock (holders()), so a wait names them (pid, command, directory) and a lab
QEMU whose starter was killed mid-boot is recognised.  A lock that an ancestor of this
process holds without passing its descriptor down (`flock -o PATH lab.py ...`) can never be
taken here, so claim() refuses it at once rather than waiting forever.

The lock is a flock on a path: deleting the file while a lab holds it would let a second lab
lock a new file beside it, so the file is never deleted (the messages say to stop the lab
instead), and a claim that locked a file which is no longer at the path (deleted or replaced
meanwhile) lets it go and locks the one there.

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
from dataclasses import dataclass

DEFAULT_PATH = "/tmp/fx100io-lab.lock"
WAIT_LOG_S = 60.0  # how often a start waiting for the lock says so


class MachineLockBusy(RuntimeError):
    """Another lab holds the machine lock and the caller would not (or could never) wait."""


class WaitAbandoned(Exception):
    """claim()'s give_up answered True while it waited: the caller no longer needs the lock."""


@dataclass(frozen=True)
class Holder:
    """A process that holds the machine lock."""

    pid: int
    argv: tuple[str, ...]
    cwd: str | None

    def __str__(self) -> str:
        command = " ".join(self.argv)
        if len(command) > 160:
            command = command[:157] + "..."
        # a daemonized QEMU runs in /: its lab directory is where its pid file is
        # (<lab dir>/run/qemu.pid, qemu_vm.command_line)
        where = next((os.path.dirname(os.path.dirname(value))
                      for option, value in zip(self.argv, self.argv[1:])
                      if option == "-pidfile"), None)
        where = f"lab directory {where}" if where else f"in {self.cwd or '?'}"
        return f"pid {self.pid} ({command or '?'}; {where})"


def _describe(pid: int) -> Holder:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = tuple(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
    except OSError:
        argv = ()
    try:
        cwd: str | None = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = None
    return Holder(pid, argv, cwd)


def _holds_flock(pid: str, fd: str) -> bool:
    """Whether descriptor fd of pid carries a flock (fdinfo lists the locks of its open file)."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            return any(line.startswith("lock:") and " FLOCK " in line for line in f)
    except OSError:
        return False


def holders(lock_path: str) -> list[Holder]:
    """The processes holding the lock on the file now at lock_path, among those whose /proc
    entries this user can read (another user's lab is then not named, only waited for)."""
    try:
        want = os.stat(lock_path)
    except OSError:
        return []
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone, or another user's
        for fd in fds:
            try:
                got = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (got.st_dev, got.st_ino) == (want.st_dev, want.st_ino) and _holds_flock(pid, fd):
                found.append(_describe(int(pid)))
                break
    return found


def _ancestors() -> set[int]:
    """The pids of this process's parent, its parent, and so on."""
    out: set[int] = set()
    pid = os.getpid()
    while pid > 1 and pid not in out:
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
        out.add(pid)
    out.discard(os.getpid())
    return out


def _named(found: list[Holder]) -> str:
    return "held by " + "; ".join(map(str, found)) if found else "held by a process not visible here"


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


def _same_file(fd: int, lock_path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(lock_path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def claim(wait: bool, log: Callable[[str], None] = print,
          sleep: Callable[[float], None] = time.sleep,
          give_up: Callable[[], bool] | None = None) -> Claim:
    """Take the machine lock.  wait=False: MachineLockBusy at once when another lab holds it;
    wait=True: wait for it, saying so now and then with its holders, and raise WaitAbandoned
    as soon as give_up() (asked between polls) answers True.  The wait polls rather than
    blocks, so a signal (Ctrl-C) ends it.  A lock held by an ancestor of this process that
    did not pass its descriptor down is refused at once: waiting for it would never end."""
    lock_path = path()
    said = 0.0
    fd = inherited(lock_path)
    own = fd is None
    if fd is None:
        fd = open_lock(lock_path)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _same_file(fd, lock_path):
                    return Claim(fd, own, lock_path)
                # the path was deleted or replaced since it was opened: this lock guards
                # nothing another start would see; let it go and lock the file there now
                if own:
                    os.close(fd)
                fd, own = -1, True
                fd = open_lock(lock_path)
                continue
            except BlockingIOError:
                pass
            now = time.monotonic()
            if not wait or now - said >= WAIT_LOG_S:
                found = holders(lock_path)
                mine = [h for h in found if h.pid in _ancestors()]
                if mine:
                    raise MachineLockBusy(
                        f"{lock_path} is {_named(mine)}, which started this process but did "
                        "not pass its descriptor down (flock -o?), so this can never take it; "
                        "drop the wrapper (lab.py waits for the lock itself) or its -o")
                if not wait:
                    raise MachineLockBusy(
                        f"another lab holds {lock_path} ({_named(found)}; one lab at a time "
                        "on this machine); run lab tests through the lab, which waits for it: "
                        "python3 tools/fabric_lab/lab.py run --rdma -- python3 -m pytest ... "
                        "(or deselect them with -m 'not lab and not guest')")
                log(f"fabric lab: waiting for {lock_path}, {_named(found)} (another lab; "
                    "never delete the file: stop that lab, `lab.py stop --lock-holder` stops "
                    "a lab QEMU holding it from any checkout)")
                said = now
            if give_up is not None and give_up():
                raise WaitAbandoned()
            sleep(0.5)
    except BaseException:
        if own and fd >= 0:
            os.close(fd)
        raise

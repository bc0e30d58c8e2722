"""The fast path's network: a namespace the lab creates, holding a tap device for QEMU.

All traffic to the guest stays inside that namespace: the host side of the link
(10.88.0.1 by default) exists only there, QEMU is started there so it can attach to the tap,
and initiators (a whole pytest run) are run there with `ip netns exec`. Nothing on the host's
own interfaces or routes changes.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from pathlib import Path

from .lab_config import LabConfig

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")


class NetworkError(RuntimeError):
    """The namespace or tap device could not be set up; the message names the failing step."""


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise NetworkError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")
    return result


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def why_netns_unusable() -> str | None:
    """None if this process can build the fast path, else the reason (for skips and errors)."""
    if os.geteuid() != 0:
        return ("network namespaces and tap devices need root (use --net user, "
                "or FX100IO_LAB_NET=user)")
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing (use --net user, or FX100IO_LAB_NET=user)"
    return None


def create(config: LabConfig) -> None:
    """Create the namespace with lo up and a tap device addressed as the guest's peer."""
    reason = why_netns_unusable()
    if reason:
        raise NetworkError(reason)
    name = config.netns
    if netns_exists(name):
        users = pids_in_netns(name)
        if users:
            raise NetworkError(f"network namespace {name} is in use by pids {users} (a lab of "
                               "another directory with the same netns name?); not touching it")
        # Left over from a lab that did not stop cleanly: start from a known state.
        remove(config)
    _ip("netns", "add", name)
    try:
        # lo up so that tests using 127.0.0.1 also work when the whole run is in the namespace.
        _ip("link", "set", "lo", "up", netns=name)
        _ip("tuntap", "add", "dev", config.tap, "mode", "tap", netns=name)
        _ip("addr", "add", f"{config.host_ip}/{config.prefix_len}", "dev", config.tap, netns=name)
        _ip("link", "set", config.tap, "up", netns=name)
    except NetworkError:
        remove(config)
        raise


def pids_in_netns(name: str) -> list[int]:
    """Processes living in the named namespace (empty for a stale one)."""
    result = _ip("netns", "pids", name, check=False)
    return [int(pid) for pid in result.stdout.split() if pid.isdigit()]


def remove(config: LabConfig) -> None:
    """Delete the tap device and the namespace; quiet if they are already gone."""
    if not netns_exists(config.netns):
        return
    _ip("tuntap", "del", "dev", config.tap, "mode", "tap", netns=config.netns, check=False)
    _ip("netns", "delete", config.netns)


def exec_prefix(config: LabConfig) -> list[str]:
    """Command prefix that runs a program inside the lab's network (nothing for user mode)."""
    if config.net == "netns":
        return ["ip", "netns", "exec", config.netns]
    return []


def _namespace_inode(path: str) -> int:
    return os.stat(path).st_ino


def in_netns(name: str) -> bool:
    """True if the calling thread already lives in the named namespace."""
    try:
        return _namespace_inode("/proc/thread-self/ns/net") == _namespace_inode(str(NETNS_DIR / name))
    except FileNotFoundError:
        return False


def enter_netns_thread(name: str) -> None:
    """Move only the calling thread into the named namespace (for short-lived helper threads)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(NETNS_DIR / name, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetworkError(f"setns({name}) failed: {os.strerror(err)}")
    finally:
        os.close(fd)


def enter_netns(name: str) -> None:
    """Move the calling thread (and threads it starts later) into the named namespace.

    Used by the pytest fixture when the test process was not started with `lab.py exec`.
    setns() only moves the calling thread, so this refuses while other Python threads run:
    they would silently stay outside and their connections would fail oddly. Native helper
    threads (numpy's BLAS pool) are tolerated; they open no sockets.
    """
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    if others:
        raise NetworkError(f"cannot move this process into netns {name}: threads {others} "
                           f"would stay outside; run it under `lab.py exec -- ...` instead")
    enter_netns_thread(name)

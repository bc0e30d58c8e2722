"""Makes sure the host has the Debian packages the lab runs with, installing them if missing.

Installation is idempotent: a package is only installed when one of the commands it provides
is missing, so a prepared machine (or CI image) never touches apt.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

# command the lab runs -> the Debian package that provides it
REQUIRED_COMMANDS = {
    "qemu-system-x86_64": "qemu-system-x86",
    "cpio": "cpio",
    "ip": "iproute2",
    "rdma": "iproute2",
    "depmod": "kmod",
    "busybox": "busybox-static",
    "dpkg-deb": "dpkg",
    "apt-get": "apt",
}

# The guest userland is this host's root (guest_userland.py), so what guest runs use must be
# installed here: path that shows it -> Debian package. Not needed for the target itself, so
# a host where they cannot be installed still runs the lab (ensure_host_tools only warns).
USERLAND_FILES = {
    "/usr/sbin/nvme": "nvme-cli",  # nvme connect -t rdma/tcp, nvme list in the guest
    "/usr/bin/fio": "fio",  # the kernel initiator's reference figures
    "/usr/lib/python3/dist-packages/pyverbs/__init__.py": "python3-pyverbs",
    "/etc/libibverbs.d/rxe.driver": "ibverbs-providers",  # soft-RoCE's verbs provider
    "/usr/lib/x86_64-linux-gnu/librdmacm.so.1": "librdmacm1",
    "/usr/bin/ibv_devinfo": "ibverbs-utils",  # ibv_devinfo, ibv_rc_pingpong
    "/usr/bin/rping": "rdmacm-utils",  # rping: an RDMA CM connect check
}

# Commands live in sbin on Debian; a non-login root shell may not have it on PATH.
_EXTRA_PATH = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")


class HostToolsError(RuntimeError):
    """A host command is missing and cannot be installed here."""


def find_command(name: str) -> str | None:
    """Absolute path of a host command, also looking in sbin directories."""
    path = os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(_EXTRA_PATH)
    return shutil.which(name, path=path)


def missing_packages() -> list[str]:
    """Debian packages whose commands are not on this host, in a stable order."""
    packages = {pkg for cmd, pkg in REQUIRED_COMMANDS.items() if find_command(cmd) is None}
    return sorted(packages)


def missing_userland_packages() -> list[str]:
    """Debian packages the guest userland uses that this host lacks."""
    return sorted({pkg for path, pkg in USERLAND_FILES.items() if not os.path.exists(path)})


def ensure_host_tools(log=print) -> None:
    """Install missing host packages with apt-get; raise HostToolsError if the lab's own cannot
    be installed (the guest userland's are installed too if they can be, else a warning)."""
    _ensure_packages(missing_packages, log)
    if missing_userland_packages():
        try:
            _ensure_packages(missing_userland_packages, log)
        except HostToolsError as err:
            log(f"fabric lab: warning: the guest userland will lack some tools: {err}")


def _ensure_packages(missing, log) -> None:
    packages = missing()
    if not packages:
        return
    if find_command("apt-get") is None:
        raise HostToolsError(
            f"missing host packages {packages} and no apt-get on this machine; "
            f"install them by hand")
    if os.geteuid() != 0:
        raise HostToolsError(
            f"missing host packages {packages}; run as root or install them first: "
            f"sudo apt-get install -y {' '.join(packages)}")
    log(f"fabric lab: installing host packages: {' '.join(packages)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    if subprocess.run(install, env=env, stdout=sys.stderr, check=False).returncode != 0:
        # A fresh container often has no package lists yet; refresh once and retry.
        subprocess.run(["apt-get", "update"], env=env, stdout=sys.stderr, check=False)
        if subprocess.run(install, env=env, stdout=sys.stderr, check=False).returncode != 0:
            raise HostToolsError(f"apt-get install {' '.join(packages)} failed (see output above)")
    still_missing = missing()
    if still_missing:
        raise HostToolsError(f"packages {still_missing} installed but their commands are not found")

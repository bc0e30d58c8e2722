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


def ensure_host_tools(log=print) -> None:
    """Install missing host packages with apt-get; raise HostToolsError if that is impossible."""
    packages = missing_packages()
    if not packages:
        return
    if find_command("apt-get") is None:
        raise HostToolsError(
            f"missing host packages {packages} and no apt-get on this machine; "
            "install qemu-system-x86, busybox-static, cpio, iproute2 and kmod by hand")
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
    still_missing = missing_packages()
    if still_missing:
        raise HostToolsError(f"packages {still_missing} installed but their commands are not found")

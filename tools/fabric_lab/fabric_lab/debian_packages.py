"""Fetches Debian packages as .deb files and unpacks them without installing them.

The guest kernel must never be installed into the host's /boot, so everything goes through
`apt-get download` + `dpkg -x` into the lab's cache.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from . import lab_paths

# Debian bookworm's standard (non-cloud, non-rt) 6.1 kernel: linux-image-6.1.0-<abi>-amd64.
_KERNEL_PACKAGE = re.compile(r"^linux-image-6\.1\.0-(\d+)-amd64$")


def _abi(package: str) -> int:
    """The ABI number NN of linux-image-6.1.0-NN-amd64 (for "newest" comparisons)."""
    match = _KERNEL_PACKAGE.match(package)
    return int(match.group(1)) if match else -1


class DebianPackageError(RuntimeError):
    """A package could not be found, downloaded or unpacked."""


def _apt_names(pattern: str) -> list[str]:
    result = subprocess.run(["apt-cache", "search", "--names-only", pattern],
                            capture_output=True, text=True, check=False)
    return [line.split(" - ", 1)[0].strip() for line in result.stdout.splitlines() if line.strip()]


def newest_kernel_package() -> str:
    """Name of the newest linux-image-6.1.0-NN-amd64 apt knows, or $FX100IO_LAB_KERNEL."""
    override = os.environ.get("FX100IO_LAB_KERNEL")
    if override:
        return override
    names = [n for n in _apt_names(r"^linux-image-6\.1\.0-[0-9]+-amd64$") if _KERNEL_PACKAGE.match(n)]
    if not names:
        subprocess.run(["apt-get", "update"], capture_output=True, check=False)
        names = [n for n in _apt_names(r"^linux-image-6\.1\.0-[0-9]+-amd64$")
                 if _KERNEL_PACKAGE.match(n)]
    if not names:
        cached = cached_kernel_packages()
        if cached:
            return cached[-1]
        raise DebianPackageError(
            "no linux-image-6.1.0-*-amd64 package known to apt; this needs Debian bookworm "
            "package lists (apt-get update) or FX100IO_LAB_KERNEL=linux-image-6.1.0-NN-amd64")
    return max(names, key=_abi)


def cached_kernel_packages() -> list[str]:
    """Kernel package names already downloaded, oldest ABI first (for offline rebuilds)."""
    found = set()
    for deb in lab_paths.debs_dir().glob("linux-image-6.1.0-*-amd64_*.deb"):
        name = deb.name.split("_", 1)[0]
        if _KERNEL_PACKAGE.match(name):
            found.add(name)
    return sorted(found, key=_abi)


def candidate_version(package: str) -> str | None:
    """The version apt would download for package, or None if apt does not know it."""
    result = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True,
                            check=False)
    match = re.search(r"Candidate:\s*(\S+)", result.stdout)
    if not match or match.group(1) == "(none)":
        return None
    return match.group(1)


def download(package: str, log=print) -> Path:
    """Path of package's .deb in the cache, downloading it if needed."""
    debs = lab_paths.debs_dir()
    debs.mkdir(parents=True, exist_ok=True)
    version = candidate_version(package)
    if version is not None:
        # apt names files with the epoch's ':' escaped as %3a.
        expected = debs / f"{package}_{version.replace(':', '%3a')}_amd64.deb"
        if expected.exists():
            return expected
        log(f"fabric lab: downloading {package} {version}")
        result = subprocess.run(["apt-get", "download", f"{package}={version}"], cwd=debs,
                                capture_output=True, text=True, check=False)
        if result.returncode != 0 or not expected.exists():
            raise DebianPackageError(f"apt-get download {package} failed:\n{result.stderr.strip()}")
        return expected
    # apt does not know the package (offline, no lists): fall back to whatever is cached.
    cached = sorted(debs.glob(f"{package}_*.deb"))
    if cached:
        return cached[-1]
    raise DebianPackageError(f"Debian package {package} is unknown to apt and not cached in {debs}")


def unpack(deb: Path, destination: Path) -> None:
    """Unpack a .deb's files (not its scripts) into destination."""
    destination.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["dpkg", "-x", str(deb), str(destination)],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise DebianPackageError(f"dpkg -x {deb} failed: {result.stderr.strip()}")

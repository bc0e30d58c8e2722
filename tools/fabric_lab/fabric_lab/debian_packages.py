"""Fetches Debian packages as .deb files and unpacks them without installing them.

The guest kernel must never be installed into the host's /boot, so everything goes through
`apt-get download` + `dpkg -x` into the lab's cache.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from . import lab_paths

# The guest kernel: Debian bookworm-backports' standard (non-cloud, non-rt) 6.12 kernel,
# linux-image-6.12.<n>+deb12-amd64. Bookworm's own 6.1 kernel is built without NVMe in-band
# authentication (CONFIG_NVME_AUTH, CONFIG_NVME_TARGET_AUTH off); the backports kernel has
# both, so the lab's target and in-guest initiator can speak DH-HMAC-CHAP. Backports is read
# through an apt configuration of the lab's own (lab_paths.apt_dir()), so the host's apt
# sources are never changed. FX100IO_LAB_KERNEL names any other kernel package (e.g.
# linux-image-6.1.0-NN-amd64 from the host's own sources).
BACKPORTS_SOURCE = "deb http://deb.debian.org/debian bookworm-backports main\n"
_KERNEL_PACKAGE = re.compile(r"^linux-image-6\.12\.(\d+)\+deb12-amd64$")


def _abi(package: str) -> int:
    """The patch level n of linux-image-6.12.n+deb12-amd64 (for "newest" comparisons)."""
    match = _KERNEL_PACKAGE.match(package)
    return int(match.group(1)) if match else -1


class DebianPackageError(RuntimeError):
    """A package could not be found, downloaded or unpacked."""


def _lab_apt_options() -> list[str]:
    """apt options that read only the lab's backports list (kept under the lab's cache)."""
    root = lab_paths.apt_dir()
    for sub in ("lists/partial", "cache/archives/partial"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    sources = root / "sources.list"
    if not sources.exists() or sources.read_text() != BACKPORTS_SOURCE:
        sources.write_text(BACKPORTS_SOURCE)
    return [f"-oDir::Etc::SourceList={sources}", "-oDir::Etc::SourceParts=/dev/null",
            f"-oDir::State::Lists={root / 'lists'}", f"-oDir::Cache={root / 'cache'}",
            "-oAPT::Sandbox::User=root"]


def _apt(tool: str, args: list[str], lab_sources: bool, **kwargs) -> subprocess.CompletedProcess:
    command = [tool, *(_lab_apt_options() if lab_sources else []), *args]
    return subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)


def _apt_names(pattern: str, lab_sources: bool = False) -> list[str]:
    result = _apt("apt-cache", ["search", "--names-only", pattern], lab_sources)
    return [line.split(" - ", 1)[0].strip() for line in result.stdout.splitlines() if line.strip()]


def _lab_sources_updated_recently(hours: float = 24.0) -> bool:
    lists = lab_paths.apt_dir() / "lists"
    stamps = [p.stat().st_mtime for p in lists.glob("*_Packages*")] if lists.exists() else []
    return bool(stamps) and time.time() - max(stamps) < hours * 3600


def newest_kernel_package() -> str:
    """Name of the newest linux-image-6.12.n+deb12-amd64 in bookworm-backports, or
    $FX100IO_LAB_KERNEL."""
    override = os.environ.get("FX100IO_LAB_KERNEL")
    if override:
        return override
    pattern = r"^linux-image-6\.12\.[0-9]+\+deb12-amd64$"
    if not _lab_sources_updated_recently():
        _apt("apt-get", ["update"], lab_sources=True)
    names = [n for n in _apt_names(pattern, lab_sources=True) if _KERNEL_PACKAGE.match(n)]
    if not names:
        cached = cached_kernel_packages()
        if cached:
            return cached[-1]
        raise DebianPackageError(
            "no linux-image-6.12.*+deb12-amd64 package in bookworm-backports (apt-get update "
            f"with {lab_paths.apt_dir() / 'sources.list'} failed?) and none cached; or set "
            "FX100IO_LAB_KERNEL to a kernel package your apt knows")
    return max(names, key=_abi)


def cached_kernel_packages() -> list[str]:
    """Kernel package names already downloaded, oldest first (for offline rebuilds)."""
    found = set()
    for deb in lab_paths.debs_dir().glob("linux-image-6.12.*+deb12-amd64_*.deb"):
        name = deb.name.split("_", 1)[0]
        if _KERNEL_PACKAGE.match(name):
            found.add(name)
    return sorted(found, key=_abi)


def candidate_version(package: str, lab_sources: bool = False) -> str | None:
    """The version apt would download for package, or None if apt does not know it."""
    result = _apt("apt-cache", ["policy", package], lab_sources)
    match = re.search(r"Candidate:\s*(\S+)", result.stdout)
    if not match or match.group(1) == "(none)":
        return None
    return match.group(1)


def download(package: str, log=print) -> Path:
    """Path of package's .deb in the cache, downloading it if needed."""
    debs = lab_paths.debs_dir()
    debs.mkdir(parents=True, exist_ok=True)
    lab_sources = False
    version = candidate_version(package)
    if version is None and (lab_paths.apt_dir() / "lists").exists():
        lab_sources = True
        version = candidate_version(package, lab_sources=True)
    if version is not None:
        # apt names files with the epoch's ':' escaped as %3a.
        expected = debs / f"{package}_{version.replace(':', '%3a')}_amd64.deb"
        if expected.exists():
            return expected
        log(f"fabric lab: downloading {package} {version}")
        result = _apt("apt-get", ["download", f"{package}={version}"], lab_sources, cwd=debs)
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

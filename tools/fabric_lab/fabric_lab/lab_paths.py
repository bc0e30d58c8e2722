"""Where the lab keeps its cache and its running state.

Everything lives under one directory (git-ignored) so that `rm -rf .lab` is a full reset and
CI can cache it as one folder.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# tools/fabric_lab/fabric_lab/lab_paths.py -> repository root is three levels up.
REPO_ROOT = Path(__file__).resolve().parents[3]
PACKAGE_DIR = Path(__file__).resolve().parent


def lab_dir() -> Path:
    """The lab's root directory: $FX100IO_LAB_DIR, else <repo>/.lab."""
    override = os.environ.get("FX100IO_LAB_DIR")
    return Path(override).resolve() if override else REPO_ROOT / ".lab"


def debs_dir() -> Path:
    """Downloaded .deb files, kept so a rebuild does not download again."""
    return lab_dir() / "debs"


def apt_dir() -> Path:
    """The lab's own apt sources and package lists (bookworm-backports, for the kernel)."""
    return lab_dir() / "apt"


def build_cache_dir() -> Path:
    """Built guest images, one subdirectory per cache key."""
    return lab_dir() / "build"


def run_dir() -> Path:
    """Files of the running lab: sockets, logs, disk images, state.json."""
    return lab_dir() / "run"


def state_file() -> Path:
    """The running lab's description; $FX100IO_LAB_STATE wins so tests can point at any lab."""
    override = os.environ.get("FX100IO_LAB_STATE")
    return Path(override) if override else run_dir() / "state.json"


def default_netns_name(of_lab_dir: Path | None = None) -> str:
    """The lab's network namespace name, unique per lab directory: several checkouts (or
    FX100IO_LAB_DIR labs) on one machine each get their own namespace and never remove
    another's (of_lab_dir: that lab directory's name, default this one's). Addresses can
    repeat, since each namespace is a separate network."""
    digest = hashlib.sha256(str(of_lab_dir or lab_dir()).encode()).hexdigest()[:8]
    return f"fx100io-lab-{digest}"


def lock_file() -> Path:
    """Serialises start/stop between concurrent callers (xdist workers, CI steps)."""
    return lab_dir() / "lab.lock"

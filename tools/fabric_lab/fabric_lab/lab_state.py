"""The running lab's state file and the lock that serialises lab changes.

state.json is the contract between lab.py, the pytest fixture and anything else that wants
the endpoint: it holds the effective config, QEMU's pid and where to connect.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from . import lab_paths

STATE_VERSION = 1


def read(path: Path | None = None) -> dict | None:
    """The state of the last started lab, or None if there is none (or it is unreadable)."""
    path = path or lab_paths.state_file()
    try:
        state = json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return state if state.get("version") == STATE_VERSION else None


def write(state: dict, path: Path | None = None) -> None:
    """Replace the state file atomically, so a concurrent reader never sees half a file."""
    path = Path(path or lab_paths.state_file())
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + f".tmp{os.getpid()}")
    temporary.write_text(json.dumps(dict(state, version=STATE_VERSION), indent=2) + "\n")
    temporary.replace(path)


def remove(path: Path | None = None) -> None:
    Path(path or lab_paths.state_file()).unlink(missing_ok=True)


@contextlib.contextmanager
def locked():
    """Hold the lab's exclusive lock (blocks while another start/stop is in progress)."""
    lock_path = lab_paths.lock_file()
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)

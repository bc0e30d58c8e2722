"""What the tests share besides fixtures (those are tests/conftest.py's): the
checkout's root, whether this is CI, deterministic chunk data, a fresh
interpreter, a loop device.  The other modules of this package are the
helpers of one area each (a target process, a Redis server, a hostile
target, the fabric lab plugin, ...).  tests/ is on sys.path (pyproject's
pythonpath), so a test in any folder imports them as `support.<module>`."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

# CI=true: the test command has installed every dependency, and tests/conftest.py
# fails a skip that names one of them.
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def chunk_bytes(key: str, n: int) -> np.ndarray:
    """Deterministic content for a key, so any reader can tell right bytes
    from wrong ones without being told what was written."""
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def write_then_read_back(dev: Any, pool: Any, ios: Any, tag: str) -> list:
    """Write chunk_bytes(f"{tag}-{off}", n) at each (off, n) of ios, flush, read
    each back into a fresh buffer and assert the bytes; the [(off, buffer)]
    written, for the caller's further checks (another path, all at once)."""
    written = []
    for off, n in ios:
        buf = pool.alloc(n)
        buf[:] = chunk_bytes(f"{tag}-{off}", n)
        assert dev.write_from_blocking(off, buf) == n
        written.append((off, buf))
    dev.flush_blocking()
    for off, buf in written:
        out = pool.alloc(len(buf))
        assert dev.read_into_blocking(off, out) == len(buf)
        assert np.array_equal(out, buf), (off, len(buf))
    return written


def run_python(code: str, *args: str, env: dict | None = None, timeout: int = 120,
               check: bool = True) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (a new process proves persistence)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       env=full_env, timeout=timeout, cwd=str(REPO))
    if check and p.returncode != 0:
        raise AssertionError(f"child failed rc={p.returncode}\nstdout:{p.stdout}\nstderr:{p.stderr}")
    return p


def _make_loop(backing: Path, size: int, block_size: int) -> str:
    with open(backing, "wb") as f:
        f.truncate(size)
    if shutil.which("losetup") is None:
        pytest.skip("losetup is not installed (util-linux)")
    p = subprocess.run(["losetup", "-f", "--show", "-b", str(block_size), "--direct-io=on",
                        str(backing)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot attach a loop device here (needs root and /dev/loop*): {p.stderr.strip()}")
    return p.stdout.strip()


def read_once_reconnected(dev, out: np.ndarray, seconds: float, step: float) -> None:  # noqa: ANN001
    """Read len(out) bytes at 0 into out once the device has reconnected (its target was
    restarted): retried on connection errors and timeouts for up to seconds."""
    from fx100io import errors

    end = time.monotonic() + seconds
    while True:
        out[:] = 0
        try:
            assert dev.read_into_blocking(0, out) == len(out)
            return
        except (errors.FxConnectionError, errors.FxTimeoutError):
            assert time.monotonic() < end, f"no reconnect in {seconds:g} s"
            time.sleep(step)

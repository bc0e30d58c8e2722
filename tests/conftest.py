"""Shared fixtures: real files, loop block devices, deterministic chunk data."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support import IN_CI, _make_loop

# A shared pool's Redis index answers within 0.5 s on a quiet host; the suite runs on
# loaded 2-core machines, where a Redis on the same host can take longer, so stores
# that do not test the timeout itself get 5 s (tests of a hung index set theirs).
os.environ.setdefault("FX100IO_INDEX_TIMEOUT", "5")


@pytest.fixture
def tmp_file(tmp_path: Path) -> Path:
    """A path on the test machine's real disk (ext4 here), not tmpfs."""
    return tmp_path / "dev.img"


@pytest.fixture
def loop_device(tmp_path: Path):
    """A real block device: 256 MiB loop device with 4096-byte logical blocks."""
    dev = _make_loop(tmp_path / "loop.img", 256 << 20, 4096)
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


@pytest.fixture
def loop_device_512(tmp_path: Path):
    dev = _make_loop(tmp_path / "loop512.img", 64 << 20, 512)
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


# In CI (CI=true) the test command has installed every dependency named
# below, so a skip for one of them means the set-up broke: it fails the run
# instead of hiding as a skip.  What a machine truly cannot do (mount
# without privileges, mlock under ASan) and explicit opt-outs
# (FX100IO_LAB=off) stay skips.
INSTALLED_BY_TEST_COMMAND = ("losetup", "cannot attach a loop device", "tshark", "lmcache",
                             "make/gcc", "fabric lab needs", "without --rdma", "user-mode",
                             "fio is not installed", "matplotlib", "hypothesis")


def _skip_reason(rep) -> str:
    lr = rep.longrepr
    return str(lr[2]) if isinstance(lr, tuple) and len(lr) == 3 else str(lr)


def _fail_missing_dependency(rep) -> None:
    if not (IN_CI and rep.skipped) or hasattr(rep, "wasxfail"):
        return
    reason = _skip_reason(rep)
    if "FX100IO_LAB=off" in reason:
        return
    if any(marker in reason for marker in INSTALLED_BY_TEST_COMMAND):
        rep.outcome = "failed"
        rep.longrepr = (f"CI=true: this skip names a dependency the test command installs, "
                        f"so its absence is a failure here: {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_missing_dependency(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_missing_dependency(outcome.get_result())



# The per-test limit (pyproject's faulthandler_timeout) dumps stacks and exits
# from C; the dump does not say which test hung.  A timer a little earlier
# names it, on the stderr the test's output capture does not swallow.  (If the
# hung test holds the GIL the name is missing but the dump still comes.)
_NAME_LEAD_S = 2.0


def _stderr_outside_capture(config) -> int | None:
    fd = getattr(config, "_fx100io_stderr_fd", None)
    if fd is None:
        try:
            fd = os.dup(sys.__stderr__.fileno()) if sys.__stderr__ else None
        except (OSError, ValueError):
            fd = None
        config._fx100io_stderr_fd = fd
    return fd


def pytest_configure(config) -> None:
    _stderr_outside_capture(config)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    limit = float(item.config.getini("faulthandler_timeout") or 0)
    fd = _stderr_outside_capture(item.config)
    timer = None
    if limit > _NAME_LEAD_S and fd is not None:
        msg = (f"\nfx100io: {item.nodeid} has run for {limit - _NAME_LEAD_S:.0f} s; "
               f"every thread's stack follows, then the run exits\n").encode()
        timer = threading.Timer(limit - _NAME_LEAD_S, os.write, (fd, msg))
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()

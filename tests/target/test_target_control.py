"""The control socket's file (`fx100io target --control PATH`, csrc/target/control.c):
a live target's socket is never taken over or removed by a second target given the
same path, a stale one (its target killed) is replaced, a target removes at exit only
the socket it bound, and the socket is mode 0600 whatever the umask.  Real target
processes, real unix sockets."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import REPO
from support.target_host import NQN
from support.target_process import serve_ports

from fx100io.target_ctl import control


@pytest.fixture
def ctl() -> Iterator[str]:
    # (a unix socket path must fit in 108 bytes: pytest's tmp_path may not)
    d = tempfile.mkdtemp(prefix="fx-ctl-", dir="/tmp")
    yield os.path.join(d, "ctl.sock")
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)


@pytest.fixture
def ns(tmp_path: Path) -> str:
    p = tmp_path / "ns.img"
    p.write_bytes(bytes(1 << 20))
    return str(p)


def run_target(ns: str, ctl: str) -> subprocess.CompletedProcess:
    """A target that should refuse to start: its exit and stderr."""
    return subprocess.run([sys.executable, "-m", "fx100io", "target", "--listen", "127.0.0.1:0",
                           "--nqn", NQN, "--namespace", ns, "--control", ctl],
                          capture_output=True, text=True, cwd=str(REPO), timeout=60)


def test_second_target_refuses_a_live_socket(ns: str, ctl: str) -> None:
    with serve_ports([ns], NQN, ["127.0.0.1:0"], control=ctl) as (ports, proc):
        ino = os.lstat(ctl).st_ino
        r = run_target(ns, ctl)
        assert r.returncode == 1, r
        assert "in use" in r.stderr and "its own path" in r.stderr, r.stderr
        # the first target's socket is still there, still its own, and answers
        assert os.lstat(ctl).st_ino == ino
        assert control(ctl, "ports", timeout=5).startswith(f"port 1 127.0.0.1:{ports[0]} ")
        assert proc.poll() is None
    assert not os.path.exists(ctl)  # (the first removed its own at exit)


def test_stale_socket_is_replaced(ns: str, ctl: str) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(ctl)  # bound, never listening, then closed: what a killed target leaves
    s.close()
    with serve_ports([ns], NQN, ["127.0.0.1:0"], control=ctl) as (ports, _):
        assert control(ctl, "ports", timeout=5).startswith(f"port 1 127.0.0.1:{ports[0]} ")


def test_something_else_listening_is_not_removed(ns: str, ctl: str) -> None:
    """A socket someone else serves at the path (not a target) is left alone."""
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(ctl)
        other.listen(1)
        r = run_target(ns, ctl)
        assert r.returncode == 1 and "in use" in r.stderr, r
        assert stat.S_ISSOCK(os.lstat(ctl).st_mode)
        c = socket.socket(socket.AF_UNIX)
        c.connect(ctl)  # still the other's
        c.close()


def test_exit_removes_only_its_own_socket(ns: str, ctl: str) -> None:
    """The target's socket is replaced behind its back (removed, another bound at the
    path): at exit the target leaves the new one alone."""
    newer = socket.socket(socket.AF_UNIX)
    try:
        with serve_ports([ns], NQN, ["127.0.0.1:0"], control=ctl) as (_, proc):
            os.unlink(ctl)
            newer.bind(ctl)
            newer.listen(1)
            ino = os.lstat(ctl).st_ino
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=15) == 0
        assert os.lstat(ctl).st_ino == ino
    finally:
        newer.close()


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277])
def test_socket_mode_is_0600(ns: str, ctl: str, umask: int) -> None:
    old = os.umask(umask)  # (the target inherits it)
    try:
        with serve_ports([ns], NQN, ["127.0.0.1:0"], control=ctl):
            assert stat.S_IMODE(os.lstat(ctl).st_mode) == 0o600
            assert control(ctl, "ports", timeout=5).startswith("port 1 ")
    finally:
        os.umask(old)


def test_not_a_socket_is_an_error(ns: str, ctl: str) -> None:
    Path(ctl).write_text("mine")
    r = run_target(ns, ctl)
    assert r.returncode == 1 and "not a socket" in r.stderr, r
    assert Path(ctl).read_text() == "mine"


def test_an_unreachable_or_silent_control_socket_is_a_clear_fx100io_error(tmp_path: Path) -> None:
    from fx100io.errors import FxConnectionError, FxTimeoutError

    missing = str(tmp_path / "no.sock")
    with pytest.raises(FxConnectionError, match="cannot reach the target's control socket"):
        control(missing, "ports")
    p = subprocess.run([sys.executable, "-m", "fx100io", "target-ctl", missing, "ports"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "cannot reach the target's control socket" in p.stderr and missing in p.stderr
    silent = str(tmp_path / "silent.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(silent)
        srv.listen(1)  # accepts (in the kernel) and never answers
        with pytest.raises(FxTimeoutError, match="no answer within 0.3 s"):
            control(silent, "ports", timeout=0.3)

"""The machine-wide lab lock (tools/fabric_lab/fabric_lab/machine_lock.py) without booting a
lab: it is made 0666 and opened without O_CREAT, refused at once or waited for, found again
under a `flock PATH cmd` wrapper, and held by the process it is handed to (as QEMU gets it
from qemu_vm.launch) after its starter let go, until that process ends."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "fabric_lab"
sys.path.insert(0, str(TOOLS))

from fabric_lab import machine_lock, qemu_vm  # noqa: E402


@pytest.fixture
def lock_path(tmp_path, monkeypatch) -> str:
    p = str(tmp_path / "lab.lock")
    monkeypatch.setenv("FX100IO_LAB_MACHINE_LOCK", p)
    return p


def _free(p: str) -> bool:
    """Whether a third party could take the lock now."""
    fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _holder(p: str) -> subprocess.Popen:
    """Another lab: a process that holds the lock until its stdin closes."""
    code = ("import fcntl, os, sys\n"
            f"fd = os.open({p!r}, os.O_RDONLY | os.O_CREAT, 0o666)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n")
    h = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert h.stdout is not None and h.stdout.readline() == "held\n"
    return h


def test_made_0666_and_opened_without_create(lock_path, monkeypatch):
    old = os.umask(0o022)
    try:
        with machine_lock.claim(wait=False) as c:
            assert c.own and not _free(lock_path)
    finally:
        os.umask(old)
    assert os.stat(lock_path).st_mode & 0o777 == 0o666
    assert _free(lock_path)  # closing the starter's descriptor let it go
    # an existing file (another user's, read-only to us): opened read-only, no O_CREAT
    os.chmod(lock_path, 0o444)
    flags: list[int] = []
    real_open = os.open

    def spy(path, f, *a):  # noqa: ANN001
        if path == lock_path:
            flags.append(f)
        return real_open(path, f, *a)

    monkeypatch.setattr(machine_lock.os, "open", spy)
    with machine_lock.claim(wait=False):
        pass
    assert flags and not flags[0] & os.O_CREAT and flags[0] & os.O_ACCMODE == os.O_RDONLY


def test_refused_at_once_or_waited_for(lock_path):
    h = _holder(lock_path)
    try:
        with pytest.raises(machine_lock.MachineLockBusy, match="another lab holds") as e:
            machine_lock.claim(wait=False)
        assert lock_path in str(e.value)
        said: list[str] = []
        sleeps = []

        def sleep(s: float) -> None:  # the other lab stops while this one waits
            sleeps.append(s)
            if h.poll() is None:
                assert h.stdin is not None
                h.stdin.close()
                h.wait(timeout=10)

        with machine_lock.claim(wait=True, log=said.append, sleep=sleep) as c:
            assert not _free(lock_path)
        assert len(sleeps) == 1 and said and "waiting for" in said[0]
        assert c.fd == -1 and _free(lock_path)
    finally:
        h.kill()
        h.wait()


@pytest.mark.skipif(shutil.which("flock") is None, reason="flock(1) not installed")
def test_a_flock_wrapper_is_the_same_lock(lock_path):
    """`flock PATH cmd`: cmd inherits flock(1)'s descriptor, which holds the lock; a start in
    cmd takes it through that descriptor (a new one would conflict) and leaves it open."""
    code = ("import os, sys\n"
            f"sys.path.insert(0, {str(TOOLS)!r})\n"
            "from fabric_lab import machine_lock\n"
            "c = machine_lock.claim(wait=False)\n"
            "assert not c.own\n"
            "c.close()\n"
            "os.fstat(machine_lock.inherited(c.path))\n"
            "print('ok')\n")
    r = subprocess.run(["flock", lock_path, sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
    assert _free(lock_path)


def test_the_lock_lives_as_long_as_the_process_it_was_handed_to(lock_path, tmp_path):
    """qemu_vm.launch hands the descriptor to the daemonized process: a stand-in for QEMU
    here (a shell that leaves a background sleep and writes its pid, as -daemonize -pidfile
    does).  The starter closes its own; the lock is still held until the stand-in ends."""
    files = qemu_vm.RunFiles(tmp_path / "run")
    files.dir.mkdir()
    fake_qemu = ["sh", "-c", f"sleep 120 </dev/null >/dev/null 2>&1 & echo $! > {files.pid_file}"]
    pid = None
    try:
        with machine_lock.claim(wait=False) as c:
            pid = qemu_vm.launch(fake_qemu, [], files, (c.fd,))
        assert qemu_vm.pid_alive(pid)
        assert not _free(lock_path)  # the starter let go; the "QEMU" holds it
        with pytest.raises(machine_lock.MachineLockBusy):
            machine_lock.claim(wait=False)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not _free(lock_path):
            assert time.monotonic() < deadline, "the lock outlived its holder"
            time.sleep(0.05)
        pid = None
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGKILL)

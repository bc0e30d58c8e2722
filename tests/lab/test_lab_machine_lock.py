"""The machine-wide lab lock (tools/fabric_lab/fabric_lab/machine_lock.py) without booting a
lab: it is made 0666 and opened without O_CREAT, refused at once or waited for, found again
under a `flock PATH cmd` wrapper and refused at once under a `flock -o` one, held by the
process it is handed to (as QEMU gets it from qemu_vm.launch) after its starter let go, until
that process ends, and not kept on a file no longer at its path.  A start waits for it without
this checkout's lab lock; a stand-in QEMU left holding it by a killed start is named, found
and stopped (by the next start here, or by `stop --lock-holder` from elsewhere)."""

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

import threading  # noqa: E402

from fabric_lab import lab_control, lab_paths, machine_lock, qemu_vm  # noqa: E402
from fabric_lab.lab_config import LabConfig  # noqa: E402


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


@pytest.mark.skipif(shutil.which("flock") is None, reason="flock(1) not installed")
def test_a_flock_o_wrapper_is_refused_not_waited_for(lock_path):
    """`flock -o PATH cmd` holds the lock but closes it in cmd: waiting for it would never end."""
    code = (f"import sys; sys.path.insert(0, {str(TOOLS)!r})\n"
            "from fabric_lab import machine_lock\n"
            "machine_lock.claim(wait=True)\n")
    r = subprocess.run(["flock", "-o", lock_path, sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "did not pass its descriptor down" in r.stderr, r.stderr
    assert "flock" in r.stderr  # the holder is named
    assert _free(lock_path)


def test_a_lock_on_a_file_no_longer_at_the_path_is_not_kept(lock_path, monkeypatch):
    """The file is replaced between open and flock: the claim locks the file now there."""
    real_open_lock = machine_lock.open_lock
    calls = []

    def replaced_after_open(p: str) -> int:
        fd = real_open_lock(p)
        if not calls:
            os.unlink(p)
            os.close(os.open(p, os.O_RDONLY | os.O_CREAT, 0o666))
        calls.append(fd)
        return fd

    monkeypatch.setattr(machine_lock, "open_lock", replaced_after_open)
    with machine_lock.claim(wait=False) as c:
        assert len(calls) == 2
        assert os.fstat(c.fd).st_ino == os.stat(lock_path).st_ino
        assert not _free(lock_path)
    assert _free(lock_path)


@pytest.fixture
def lab_dir(tmp_path, monkeypatch, lock_path) -> Path:
    """A lab directory of its own (the \"checkout\"), with a boot that only records its call."""
    d = tmp_path / "lab"
    monkeypatch.setenv("FX100IO_LAB_DIR", str(d))
    monkeypatch.delenv("FX100IO_LAB_STATE", raising=False)
    return d


def _user_config() -> LabConfig:
    config = LabConfig.default()
    config.net = "user"
    return config


def _fake_boot(monkeypatch) -> list[int]:
    booted: list[int] = []

    def boot(config, log, owner, machine_fd):  # noqa: ANN001
        assert not _free(machine_lock.path())  # booted holding the machine lock
        booted.append(machine_fd)
        return {"pid": 0, "owner": owner}

    monkeypatch.setattr(lab_control, "_boot", boot)
    return booted


def _lab_lock_free() -> bool:
    p = lab_paths.lock_file()
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


def test_a_start_waits_for_the_machine_without_the_checkouts_lab_lock(lab_dir, lock_path,
                                                                      monkeypatch):
    """While `lab.py start` waits for another lab, stop, the fixture (which then fails at
    once, naming the holder) and other pytest processes here can take this checkout's lab
    lock; the start boots once the other lab is gone."""
    booted = _fake_boot(monkeypatch)
    h = _holder(lock_path)
    said: list[str] = []
    out: dict = {}

    def run() -> None:
        try:
            out["state"] = lab_control.start(_user_config(), log=said.append)
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 20
        while not said:
            assert time.monotonic() < deadline, "the start did not say it waits"
            time.sleep(0.05)
        assert f"pid {h.pid}" in said[0]  # the other lab is named
        assert t.is_alive() and _lab_lock_free()
        with lab_control.lab_state.locked():  # what the fixture does, then fails at once
            with pytest.raises(machine_lock.MachineLockBusy, match=f"pid {h.pid}"):
                lab_control.start_locked(_user_config(), log=said.append)
        assert not booted
    finally:
        assert h.stdin is not None
        h.stdin.close()
        h.wait(timeout=10)
    t.join(timeout=20)
    assert not t.is_alive() and "error" not in out, out
    assert out["state"]["owner"] == "cli" and len(booted) == 1


_STAND_IN = r"""
import os, socket, sys, time
run = sys.argv[sys.argv.index("-qmp") + 1][len("unix:"):].split(",")[0]
pidfile = sys.argv[sys.argv.index("-pidfile") + 1]
if os.fork():  # as -daemonize: the foreground process exits once the daemon is set up
    deadline = time.monotonic() + 30
    while not os.path.exists(pidfile) and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(0)
os.setsid()
server = socket.socket(socket.AF_UNIX)
server.bind(run)
server.listen(1)
with open(pidfile + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(pidfile + ".tmp", pidfile)
server.settimeout(120)
conn, _ = server.accept()  # QMP, as much of it as qemu_vm.stop speaks
r = conn.makefile("r")
conn.sendall(b'{"QMP": {}}\n')
while "quit" not in r.readline():
    conn.sendall(b'{"return": {}}\n')
conn.sendall(b'{"return": {}}\n')
"""


def _stand_in_qemu(tmp_path: Path, run_dir: Path, lock: bool = True
                   ) -> tuple[int, qemu_vm.RunFiles]:
    """A stand-in for a lab QEMU of run_dir, holding the machine lock (lock) as launch hands
    it to QEMU, its starter gone before it wrote a state (killed mid-boot)."""
    exe = tmp_path / "qemu-stand-in"
    if not exe.exists():
        exe.symlink_to(sys.executable)
    files = qemu_vm.RunFiles(run_dir)
    files.dir.mkdir(parents=True, exist_ok=True)
    cmd = [str(exe), "-c", _STAND_IN, "-qmp", f"unix:{files.qmp_socket},server=on,wait=off",
           "-pidfile", str(files.pid_file)]
    if not lock:
        return qemu_vm.launch(cmd, [], files), files
    with machine_lock.claim(wait=False) as c:
        pid = qemu_vm.launch(cmd, [], files, (c.fd,))
    assert qemu_vm.is_lab_qemu(pid, files) and qemu_vm.run_dir_of(qemu_vm_argv(pid)) == run_dir
    return pid, files


def qemu_vm_argv(pid: int) -> tuple[str, ...]:
    return tuple(a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a)


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 20
    while qemu_vm.pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_start_stops_its_own_orphan_qemu(lab_dir, lock_path, tmp_path, monkeypatch):
    booted = _fake_boot(monkeypatch)
    pid, files = _stand_in_qemu(tmp_path, lab_paths.run_dir())
    try:
        assert not _free(lock_path)
        found = machine_lock.holders(lock_path)
        assert [h.pid for h in found] == [pid] and "qemu-stand-in" in str(found[0])
        assert f"lab directory {lab_dir}" in str(found[0])  # whose lab it is
        assert lab_control._orphan_pid() == pid
        files.pid_file.unlink()  # found through the lock alone too
        assert lab_control._orphan_pid() == pid
        said: list[str] = []
        state = lab_control.start(_user_config(), log=said.append)
        assert _gone(pid) and state["owner"] == "cli" and len(booted) == 1
        assert any(f"QEMU pid {pid}" in m for m in said), said
        pid = 0
    finally:
        if pid and qemu_vm.pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("whose", ["another checkout's", "this checkout's, no pid file"])
def test_stop_lock_holder_stops_the_lab_qemu_holding_the_lock(lab_dir, lock_path, tmp_path,
                                                              whose):
    run_dir = tmp_path / "other" / "run" if whose.startswith("another") else lab_paths.run_dir()
    pid, files = _stand_in_qemu(tmp_path, run_dir)
    if run_dir == lab_paths.run_dir():
        files.pid_file.unlink()
    try:
        with pytest.raises(machine_lock.MachineLockBusy, match=f"pid {pid}"):
            machine_lock.claim(wait=False)
        said: list[str] = []
        assert lab_control.stop_lock_holder(log=said.append) == [pid]
        assert _gone(pid) and _free(lock_path) and not files.pid_file.exists()
        pid = 0
    finally:
        if pid and qemu_vm.pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_waiting_start_uses_a_lab_another_start_here_booted(lab_dir, lock_path, tmp_path,
                                                              monkeypatch):
    """A start waiting for the machine lock sees a lab of this checkout come up (booted by
    another start here): it returns that lab at once and says it did not boot it, so
    `lab.py run` will not stop it afterwards."""
    booted = _fake_boot(monkeypatch)
    h = _holder(lock_path)
    out: dict = {}
    pid = 0

    def run() -> None:
        try:
            out["result"] = lab_control.start_booted(_user_config(), log=lambda m: None)
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        time.sleep(0.3)
        assert t.is_alive()
        pid, files = _stand_in_qemu(tmp_path, lab_paths.run_dir(), lock=False)
        config = _user_config()
        config.validate()  # as start() does before it compares
        host, port = config.endpoint()
        lab_control.lab_state.write({"pid": pid, "host": host, "port": port, "owner": "other",
                                     "run_dir": str(files.dir), "config": config.to_dict()})
        t.join(timeout=20)
        assert not t.is_alive() and "error" not in out, out
        state, did_boot = out["result"]
        assert state["pid"] == pid and state["owner"] == "other" and not did_boot and not booted
    finally:
        assert h.stdin is not None
        h.stdin.close()
        h.wait(timeout=10)
        t.join(timeout=20)
        if pid and qemu_vm.pid_alive(pid):
            os.kill(pid, signal.SIGKILL)

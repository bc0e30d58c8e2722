"""Runs commands in the guest's userland: this host's own root filesystem, chroot'ed.

The host has no RDMA stack, so RDMA initiators (pyverbs, fx100io's NVMe/RDMA transport, the
kernel's `nvme connect -t rdma`, fio) must run inside the guest. Rather than building a second
root filesystem, QEMU shares the host's `/` read-only over 9p; the guest mounts it at /host and
gives it its own /proc, /sys, /dev, configfs and tmpfs at /tmp, /run, /var/tmp and /dev/shm
(guest_init.sh, lab_userland). So the same interpreter, numpy, the checkout with its built
extension and the host's libibverbs/librdmacm/rxe provider work in the guest unchanged, at
the same absolute paths. The checkout is also shared on its own (read-only) at its path, so a
checkout under /tmp stays visible, and the run directory's `guest` folder is shared writable
at its path: guest commands may write there (results, logs) and the host reads them.

A run is three files in that share: <tag>.sh (the command, run by the host's /bin/sh inside
the chroot), <tag>.run (started in the background from the serial console by the guest's
busybox; it records its process group in <tag>.pid and writes the exit status to <tag>.rc last)
and <tag>.out (stdout and stderr, merged). The console carries only the short start line, so
long output, binary output and exit codes come back intact, kernel messages on the console
cannot mix into them, and several runs may go on at once.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from . import guest_console, lab_paths, lab_state

# Set in the environment of every guest run; the fixture uses it to know it is in the guest.
IN_GUEST_VARIABLE = "FX100IO_LAB_IN_GUEST"
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Mount points the guest covers with its own tmpfs: host files below them are not visible.
_GUEST_TMPFS = ("/tmp", "/run", "/var/tmp", "/dev/shm")
_USERLAND_MISSING_STATUS = 90


class GuestRunError(RuntimeError):
    """The guest userland is unavailable, or a run did not finish in time."""


def prepare_share(share: Path) -> None:
    """An empty guest share directory for a lab about to start."""
    for path in (share, lab_paths.REPO_ROOT):
        if "," in str(path):
            # QEMU's -fsdev option syntax would need the comma doubled; refuse clearly.
            raise GuestRunError(f"{path}: the guest share path must not contain ','")
    shutil.rmtree(share, ignore_errors=True)
    share.mkdir(parents=True)


def setup_line(share: Path) -> str:
    """The call in the guest's setup script that mounts the userland (guest_init.sh)."""
    return f"lab_userland {shlex.quote(str(share))} {shlex.quote(str(lab_paths.REPO_ROOT))}\n"


def qemu_arguments(share: Path) -> list[str]:
    """The 9p shares behind the guest userland: /, the checkout (both read-only) and share.
    multidevs=remap keeps inode numbers unique across the host's mounts."""
    shares = (("fxhostroot", Path("/"), True), ("fxcheckout", lab_paths.REPO_ROOT, True),
              ("fxguestout", share, False))
    arguments = []
    for tag, path, readonly in shares:
        arguments += ["-fsdev", (f"local,id={tag},path={path},security_model=none,"
                                 f"multidevs=remap{',readonly=on' if readonly else ''}"),
                      "-device", f"virtio-9p-pci,fsdev={tag},mount_tag={tag}"]
    return arguments


def guest_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a guest run: this interpreter first on PATH (so `python3` is the
    host's), the checkout on PYTHONPATH (so `import fx100io` is this checkout's, whatever an
    editable install elsewhere says), no bytecode writes (the checkout is read-only there),
    lab tests marked as running in the guest; env's entries are added last and win."""
    result = {
        "PATH": f"{os.path.dirname(sys.executable)}:{_SYSTEM_PATH}",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        # numba (LMCache's kernels) caches compiled code next to the package, which is
        # read-only here: give it the guest's tmpfs
        "NUMBA_CACHE_DIR": "/tmp/numba-cache",
        "PYTHONPATH": str(lab_paths.REPO_ROOT),
        IN_GUEST_VARIABLE: "1",
        "FX100IO_LAB_STATE": str(lab_paths.state_file()),
    }
    result.update(env or {})
    return result


def in_guest() -> bool:
    """True inside a guest run (the fixture and guest_run then act locally)."""
    return os.environ.get(IN_GUEST_VARIABLE) == "1"


def _script(command: str | Sequence[str], cwd: str, env: Mapping[str, str]) -> str:
    q = shlex.quote
    lines = ["# a fabric lab guest run (tools/fabric_lab/fabric_lab/guest_userland.py)"]
    lines += [f"export {name}={q(value)}" for name, value in env.items()]
    lines.append(f"cd -- {q(cwd)} || exit 127")
    if isinstance(command, str):
        lines.append(command)
    else:
        lines.append("exec " + shlex.join(list(command)))
    return "\n".join(lines) + "\n"


def _runner(share: Path, tag: str) -> str:
    # Busybox sh in the guest's initramfs, outside the chroot, where the share is /host<share>.
    outside = shlex.quote(f"/host{share}/{tag}")
    return (f"d={outside}\n"
            "echo $$ >\"$d.pid\"\n"
            f"chroot /host /usr/bin/env -i /bin/sh {shlex.quote(f'{share}/{tag}.sh')} "
            "</dev/null >\"$d.out\" 2>&1\n"
            "echo $? >\"$d.rc.part\"\n"
            "mv \"$d.rc.part\" \"$d.rc\"\n")


def _console(state: dict, command: str, timeout: float = 60.0) -> tuple[int, str]:
    with lab_state.locked():
        return guest_console.run(Path(state["run_dir"]) / "console.sock", command, timeout)


def _local_run(command: str | Sequence[str], cwd: str, env: Mapping[str, str],
               timeout: float) -> tuple[int, str]:
    """A guest run from inside the guest (a test run by guest_python): a subprocess, with the
    same results as from the host: a shell's exit status, the process group killed on timeout."""
    shell = isinstance(command, str)
    with subprocess.Popen(command, shell=shell, cwd=cwd, env={**os.environ, **env},
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, start_new_session=True) as process:
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            output, _ = process.communicate()
            raise GuestRunError(f"guest run timed out after {timeout:.0f} s: {command}\n"
                                f"output so far:\n{output.decode(errors='replace')[-4000:]}"
                                ) from None
    status = process.returncode
    return (128 - status if status < 0 else status), output.decode(errors="replace")


def run(state: dict, command: str | Sequence[str], *, cwd: str | None = None,
        env: Mapping[str, str] | None = None, timeout: float = 600.0,
        on_output: Callable[[str], None] | None = None) -> tuple[int, str]:
    """Run command in the guest userland; return (exit status, stdout and stderr merged).

    command: a shell command line (run by /bin/sh) or an argv list (exec'd as is).
    cwd: default the checkout's root. env: added to guest_env()'s defaults.
    on_output: called with each new piece of output while the command runs.
    Raises GuestRunError if the userland is unavailable or the run outlives timeout (then its
    whole process group is killed in the guest).
    """
    cwd = cwd or str(lab_paths.REPO_ROOT)
    if in_guest():
        return _local_run(command, cwd, dict(env or {}), timeout)
    if not state.get("guest_share"):
        raise GuestRunError("this lab was started without a guest userland; restart it with "
                            "this checkout's lab.py")
    share = Path(state["guest_share"])
    visible = (lab_paths.REPO_ROOT, share)
    for mounted in _GUEST_TMPFS:
        if (_below(Path(cwd), Path(mounted)) and not any(_below(Path(cwd), v) for v in visible)):
            raise GuestRunError(f"cwd {cwd} is not visible in the guest: the guest has its own "
                                f"tmpfs at {mounted}")
    tag = uuid.uuid4().hex[:16]
    base = share / tag
    Path(f"{base}.sh").write_text(_script(command, cwd, guest_env(env)))
    Path(f"{base}.run").write_text(_runner(share, tag))
    status, output = _console(state, (
        f"if [ -e /run/userland-error ]; then cat /run/userland-error; "
        f"exit {_USERLAND_MISSING_STATUS}; fi; "
        f"setsid sh /host{shlex.quote(str(base))}.run </dev/null >/dev/null 2>&1 &"))
    if status != 0:
        _remove(base)
        raise GuestRunError(f"the guest userland is unavailable: {output.strip()}")
    deadline = time.monotonic() + timeout
    out_path, rc_path = Path(f"{base}.out"), Path(f"{base}.rc")
    received = bytearray()
    streamed = 0
    try:
        while True:
            finished = rc_path.exists()  # written after the last output, so check it first
            received += _read_from(out_path, len(received))
            if on_output is not None:
                # Hand over whole UTF-8 sequences only (the rest follows when complete).
                cut = len(received) if finished else _utf8_boundary(received)
                if cut > streamed:
                    on_output(received[streamed:cut].decode(errors="replace"))
                    streamed = cut
            if finished:
                break
            if time.monotonic() > deadline:
                _kill(state, share, tag)
                raise GuestRunError(f"guest run timed out after {timeout:.0f} s: {command}\n"
                                    f"output so far:\n{received.decode(errors='replace')[-4000:]}")
            time.sleep(0.1)
        text = rc_path.read_text().strip()
        if not text.isdigit():
            raise GuestRunError(f"guest run left an unreadable exit status {text!r}")
        return int(text), received.decode(errors="replace")
    finally:
        _remove(base)


def _below(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as stream:
            stream.seek(offset)
            return stream.read()
    except FileNotFoundError:
        return b""


def _utf8_boundary(data: bytearray) -> int:
    """Length of data's longest prefix that does not end inside a UTF-8 sequence."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return len(data)
        if byte >= 0xC0:  # a lead byte: is its sequence complete?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)


def _kill(state: dict, share: Path, tag: str) -> None:
    pid_file = f"/host{share}/{tag}.pid"
    try:
        _console(state, f"kill -9 -- -$(cat {shlex.quote(pid_file)}) 2>/dev/null", timeout=30)
    except guest_console.GuestCommandError:
        pass


def _remove(base: Path) -> None:
    for suffix in (".sh", ".run", ".out", ".rc", ".rc.part", ".pid"):
        Path(f"{base}{suffix}").unlink(missing_ok=True)

"""Launches the guest in QEMU (TCG), waits until its target listens, and shuts it down.

QEMU runs daemonized (-daemonize -pidfile) so it is never a child of lab.py or of pytest:
no zombies when the caller lives on, and no dependence on the caller's lifetime. The guest's
serial console is a unix socket whose output QEMU also copies to console.log; boot progress
and readiness are read from that log.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from . import guest_userland
from .initramfs import GuestImage
from .lab_config import LabConfig, Namespace

MARK = "FX100IO-LAB:"
GUEST_MAC = "52:54:00:88:00:02"
KERNEL_ARGS = "console=ttyS0,115200 panic=-1 loglevel=4 mitigations=off"


class BootError(RuntimeError):
    """The guest did not reach READY; the message carries the end of its console log."""


class RunFiles:
    """Names of the files a running lab keeps in its run directory."""

    def __init__(self, run_dir: Path):
        self.dir = run_dir
        self.console_socket = run_dir / "console.sock"
        self.console_log = run_dir / "console.log"
        self.qmp_socket = run_dir / "qmp.sock"
        self.pid_file = run_dir / "qemu.pid"
        self.qemu_log = run_dir / "qemu.log"
        self.boot_initramfs = run_dir / "boot-initramfs.cpio.gz"
        # Writable from the guest (9p) at this same absolute path: guest runs' scripts,
        # output and exit status, and scratch space for guest commands.
        self.guest_share = run_dir / "guest"

    def drive_image(self, serial: str) -> Path:
        return self.dir / f"{serial}.img"


def create_drive_images(config: LabConfig, files: RunFiles) -> list[tuple[str, Namespace, Path]]:
    """Fresh sparse backing files for the QEMU NVMe drives (contents do not survive a restart,
    like the RAM disks, so every run starts from zeros)."""
    drives = []
    for serial, ns in config.nvme_drives():
        path = files.drive_image(serial)
        with open(path, "wb") as image:
            image.truncate(ns.size_mib * 2**20)
        drives.append((serial, ns, path))
    return drives


def _socket_path_ok(path: Path) -> None:
    # sockaddr_un holds 108 bytes; QEMU would fail with a less obvious message.
    if len(str(path).encode()) >= 108:
        raise BootError(f"socket path {path} is too long for a unix socket; set FX100IO_LAB_DIR "
                        "to a shorter directory")


def command_line(config: LabConfig, image: GuestImage, files: RunFiles,
                 drives: list[tuple[str, Namespace, Path]]) -> list[str]:
    for path in (files.console_socket, files.qmp_socket):
        _socket_path_ok(path)
    if config.net == "netns":
        # The tap lives in the lab's namespace; QEMU is started inside it (see networking).
        netdev = f"tap,id=net0,ifname={config.tap},script=no,downscript=no"
    else:
        # restrict=on: the guest reaches nothing outside, only the forwarded port comes in.
        netdev = (f"user,id=net0,restrict=on,net={config.host_ip}/{config.prefix_len},"
                  f"host={config.host_ip},"
                  f"hostfwd=tcp:127.0.0.1:{config.host_forward_port}-"
                  f"{config.guest_ip}:{config.tcp_port}")
    cmd = [
        "qemu-system-x86_64", "-name", "fx100io-fabric-lab",
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        # TCG: the test machines' KVM is unusable (tools/fabric_lab/README.md).
        "-accel", "tcg,thread=multi", "-cpu", "max",
        "-smp", str(config.guest_cpus), "-m", str(config.memory_mib()),
        "-kernel", str(image.kernel), "-initrd", str(files.boot_initramfs),
        "-append", KERNEL_ARGS,
        "-chardev", (f"socket,id=console,path={files.console_socket},server=on,wait=off,"
                     f"logfile={files.console_log},logappend=off"),
        "-serial", "chardev:console",
        "-qmp", f"unix:{files.qmp_socket},server=on,wait=off",
        "-netdev", netdev,
        "-device", f"virtio-net-pci,netdev=net0,mac={GUEST_MAC}",
        "-pidfile", str(files.pid_file), "-daemonize",
    ]
    # The guest userland: the host's root and the checkout read-only, the guest share writable.
    cmd += guest_userland.qemu_arguments(files.guest_share)
    for serial, ns, path in drives:
        cmd += ["-drive", f"file={path},if=none,id={serial},format=raw,cache=unsafe",
                "-device", (f"nvme,serial={serial},drive={serial},"
                            f"logical_block_size={ns.block_size},"
                            f"physical_block_size={ns.block_size}")]
    return cmd


def launch(cmd: list[str], prefix: list[str], files: RunFiles, keep_fds: tuple[int, ...] = ()
           ) -> int:
    """Start QEMU (daemonized) and return its pid; raise BootError if it refuses to start.
    keep_fds: descriptors QEMU inherits and holds for its life (the machine lock)."""
    for stale in (files.console_log, files.pid_file, files.console_socket, files.qmp_socket):
        stale.unlink(missing_ok=True)
    with open(files.qemu_log, "w") as log:
        log.write(" ".join(prefix + cmd) + "\n")
        log.flush()
        # With -daemonize the foreground process exits once the VM is set up, so this returns
        # quickly and any configuration error arrives here on stderr.
        result = subprocess.run(prefix + cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, check=False, timeout=120,
                                pass_fds=keep_fds)
    if result.returncode != 0 or not files.pid_file.exists():
        raise BootError(f"QEMU did not start (exit {result.returncode}):\n"
                        f"{files.qemu_log.read_text()[-3000:]}")
    return int(files.pid_file.read_text().strip())


def pid_alive(pid: int) -> bool:
    """True if pid is a live (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def is_lab_qemu(pid: int, files: RunFiles) -> bool:
    """True if pid is the QEMU of this run directory (guards against reused pids)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return pid_alive(pid) and str(files.qmp_socket).encode() in b" ".join(cmdline)


def run_dir_of(argv: tuple[str, ...] | list[str]) -> Path | None:
    """The run directory of the lab QEMU with this command line (its -qmp socket lives
    there, see command_line), or None if argv is not a lab QEMU's."""
    if not argv or "qemu" not in Path(argv[0]).name:
        return None
    for option, value in zip(argv, argv[1:]):
        if option == "-qmp" and value.startswith("unix:"):
            socket_path = Path(value[len("unix:"):].split(",", 1)[0])
            if socket_path.name == "qmp.sock":
                return socket_path.parent
    return None


def console_tail(files: RunFiles, lines: int = 40) -> str:
    try:
        text = files.console_log.read_text(errors="replace")
    except FileNotFoundError:
        return "(no console output)"
    return "\n".join(text.replace("\r", "").splitlines()[-lines:])


def wait_ready(pid: int, files: RunFiles, timeout: float, log=print) -> float:
    """Follow the console until the guest prints READY; return seconds since this call."""
    started = time.monotonic()
    seen = 0
    while True:
        try:
            text = files.console_log.read_text(errors="replace")
        except FileNotFoundError:
            text = ""
        # Only whole lines count; a partial last line is read again next time.
        complete = text[:text.rfind("\n") + 1].replace("\r", "")
        for line in complete.splitlines()[seen:]:
            seen += 1
            if not line.startswith(MARK):
                continue
            message = line[len(MARK):].strip()
            if message.startswith("READY"):
                return time.monotonic() - started
            if message.startswith("FAILED"):
                raise BootError(f"guest setup failed: {message}\n--- console ---\n"
                                f"{console_tail(files)}")
            log(f"fabric lab: [{time.monotonic() - started:5.1f} s] {message.removeprefix('step: ')}")
        if not pid_alive(pid):
            raise BootError(f"QEMU exited during boot\n--- console ---\n{console_tail(files)}")
        if time.monotonic() - started > timeout:
            raise BootError(f"guest not ready after {timeout:.0f} s (raise FX100IO_LAB_BOOT_TIMEOUT"
                            f" on slow machines)\n--- console ---\n{console_tail(files)}")
        time.sleep(0.2)


def _qmp_quit(qmp_socket: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as qmp:
        qmp.settimeout(5)
        qmp.connect(str(qmp_socket))
        reader = qmp.makefile("r")
        reader.readline()  # greeting
        qmp.sendall(json.dumps({"execute": "qmp_capabilities"}).encode() + b"\n")
        reader.readline()
        qmp.sendall(json.dumps({"execute": "quit"}).encode() + b"\n")
        try:
            reader.readline()
        except OSError:
            pass  # QEMU may close the socket before answering


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return not pid_alive(pid)


def stop(pid: int, files: RunFiles, log=print) -> None:
    """Quit QEMU through QMP; fall back to SIGTERM, then SIGKILL, so nothing is left running."""
    if not is_lab_qemu(pid, files):
        return
    try:
        _qmp_quit(files.qmp_socket)
    except OSError as err:
        log(f"fabric lab: QMP quit failed ({err}); sending SIGTERM")
    if _wait_gone(pid, 15):
        return
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        if _wait_gone(pid, grace):
            return
    raise BootError(f"QEMU pid {pid} survived SIGKILL")

"""Start, stop and inspect the lab: the operations behind lab.py and the pytest fixture.

Every change happens under the lab lock and ends with the state file describing reality:
after start() the target answers an ICReq at the recorded endpoint; after stop() no QEMU of
this lab runs and its namespace is gone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

from . import (
    guest_console,
    guest_userland,
    initramfs,
    lab_paths,
    lab_state,
    machine_lock,
    networking,
    qemu_vm,
    target_probe,
    tlshd,
)
from .lab_config import DISCOVERY_NQN, LabConfig

DEFAULT_BOOT_TIMEOUT = 600.0  # TCG on a busy 2-core CI runner; a quiet machine needs ~10 s


class LabError(RuntimeError):
    """The lab could not be started, reached or stopped; the message says why."""


def boot_timeout() -> float:
    return float(os.environ.get("FX100IO_LAB_BOOT_TIMEOUT", DEFAULT_BOOT_TIMEOUT))


def _files(state: dict | None = None) -> qemu_vm.RunFiles:
    """The run files of state's lab (which may live elsewhere, via FX100IO_LAB_STATE), else
    of this lab directory."""
    return qemu_vm.RunFiles(Path(state["run_dir"]) if state else lab_paths.run_dir())


def config_of(state: dict) -> LabConfig:
    return LabConfig.from_dict(state["config"], validate=False)


def is_running(state: dict | None) -> bool:
    if not state or not qemu_vm.is_lab_qemu(state["pid"], _files(state)):
        return False
    config = config_of(state)
    return config.net != "netns" or networking.netns_exists(config.netns)


def probe(state: dict, timeout: float = 10.0) -> dict:
    """ICReq/ICResp with the running target from where initiators run."""
    config = config_of(state)
    netns = config.netns if config.net == "netns" and not networking.in_netns(config.netns) else None
    return target_probe.icreq_handshake(state["host"], state["port"], netns, timeout)


def _new_state(config: LabConfig, pid: int, image: initramfs.GuestImage, boot_seconds: float) -> dict:
    host, port = config.endpoint()
    return {
        "pid": pid,
        "host": host,
        "port": port,
        "net": config.net,
        "netns": config.netns if config.net == "netns" else None,
        "guest_ip": config.guest_ip,
        "discovery_nqn": DISCOVERY_NQN,
        "allowed_host_nqn": config.allowed_host_nqn(),
        "rdma": {"traddr": config.guest_ip, "trsvcid": config.rdma_port} if config.rdma else None,
        "kernel_package": image.kernel_package,
        "kernel_release": image.kernel_release,
        "boot_seconds": round(boot_seconds, 1),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "run_dir": str(lab_paths.run_dir()),
        "console_socket": str(_files().console_socket),
        "guest_share": str(_files().guest_share),
        "config": config.to_dict(),
    }


def _cleanup(config: LabConfig | None, pid: int | None, log) -> None:
    """Stop a lab's QEMU and remove its namespace, whatever state they are in."""
    files = _files()
    if pid is None and files.pid_file.exists():
        try:
            pid = int(files.pid_file.read_text().strip())
        except ValueError:
            pid = None
    if pid is not None:
        qemu_vm.stop(pid, files, log)
    if config is not None and config.net == "netns":
        networking.remove(config)
    for leftover in (files.pid_file, files.console_socket, files.qmp_socket,
                     files.boot_initramfs):
        leftover.unlink(missing_ok=True)
    for image in files.dir.glob("*.img"):
        image.unlink()
    lab_state.remove()


def start(config: LabConfig, log=print, owner: str = "cli", wait_for_machine: bool = True) -> dict:
    """Start the lab with config, or return the running one if it has the same config
    (start_booted says which it was)."""
    return start_booted(config, log, owner, wait_for_machine)[0]


def start_booted(config: LabConfig, log=print, owner: str = "cli",
                 wait_for_machine: bool = True) -> tuple[dict, bool]:
    """start(), and whether this call booted the lab (False: it was running, or another
    start of this checkout booted it while this one waited).

    owner is recorded in the state: the pytest fixture stops only labs it started itself.
    A lab that is started takes the machine lock (machine_lock; waits for it, or with
    wait_for_machine=False raises MachineLockBusy) and hands it to its QEMU.

    Lock order: the machine lock first, then this checkout's lab lock, never the other way
    round.  The wait for the machine lock (as long as another checkout's lab runs) happens
    without this checkout's lab lock, so `lab.py stop`, the fixture and the other pytest
    processes here go on meanwhile; the wait ends early when a lab of this checkout comes up
    (started by another start here), which is then used.
    """
    config.validate()
    while True:
        with lab_state.locked():
            state = _running_or_cleaned(config, log)
            if state is not None:
                return state, False
            if not wait_for_machine:
                return _claim_and_boot(config, log, owner, wait=False), True
        try:
            machine = machine_lock.claim(wait=True, log=log, give_up=_lab_here_changed)
        except machine_lock.WaitAbandoned:
            continue  # look again under the lab lock: use it, or clean up after it
        with machine, lab_state.locked():
            state = _running_or_cleaned(config, log)
            if state is not None:
                return state, False
            return _boot(config, log, owner, machine.fd), True


def start_locked(config: LabConfig, log=print, owner: str = "cli") -> dict:
    """start() without waiting, for callers that already hold the lab lock (the fixture)."""
    state = _running_or_cleaned(config, log)
    if state is not None:
        return state
    return _claim_and_boot(config, log, owner, wait=False)


def _claim_and_boot(config: LabConfig, log, owner: str, wait: bool) -> dict:
    with machine_lock.claim(wait=wait, log=log) as machine:
        return _boot(config, log, owner, machine.fd)


def _lab_here_changed() -> bool:
    """Whether a lab of this checkout runs now, or its QEMU does without a state: read
    without the lab lock (the state file is replaced atomically) by a start waiting for the
    machine lock, which then looks again under the lab lock."""
    return is_running(lab_state.read()) or _orphan_pid(scan_lock=False) is not None


def _orphan_pid(scan_lock: bool = True) -> int | None:
    """A live QEMU of this checkout's run directory that no running state describes: its
    starter was killed while it booted (the state is written once the guest answers).  Under
    the lab lock nothing boots here, so such a QEMU is an orphan; it holds the machine lock."""
    files = _files()
    try:
        pid = int(files.pid_file.read_text().strip())
    except (OSError, ValueError):
        pid = None
    if pid is not None and qemu_vm.is_lab_qemu(pid, files):
        return pid
    if not scan_lock:
        return None  # (a scan of /proc: not on every poll of a wait)
    for holder in machine_lock.holders(machine_lock.path()):
        if qemu_vm.run_dir_of(holder.argv) == files.dir and qemu_vm.is_lab_qemu(holder.pid, files):
            return holder.pid  # its pid file is gone
    return None


def _running_or_cleaned(config: LabConfig, log) -> dict | None:
    """Under the lab lock: this checkout's running lab (LabError if its config differs), or
    None once whatever a lab that did not stop cleanly left here is gone (its QEMU first: it
    holds the machine lock that a start then takes)."""
    state = lab_state.read()
    if state is not None and is_running(state):
        if not config_of(state).same_target_as(config):
            raise LabError("the fabric lab is already running with another config; "
                           "run `lab.py stop` first")
        return state
    if config.net == "netns":
        reason = networking.why_netns_unusable()
        if reason:
            raise LabError(f"cannot use the netns network: {reason}")
    if state is not None:
        log("fabric lab: cleaning up a lab that did not stop cleanly")
        _cleanup(config_of(state), state.get("pid"), log)
    orphan = _orphan_pid()
    if orphan is not None:
        log(f"fabric lab: stopping QEMU pid {orphan}, left booting by a start that was killed")
        _cleanup(config, orphan, log)
    return None


def _fetch_tlshd(log) -> None:
    """tlshd cached before the guest boots (it sees the host's root through a cached 9p
    mount), for the kernel's NVMe/TCP TLS tests; without it they skip, saying why."""
    try:
        tlshd.ensure(log=log)
    except tlshd.TlshdUnavailable as err:
        log(f"fabric lab: no tlshd for the guest (its kernel TLS tests will skip): {err}")


def _boot(config: LabConfig, log, owner: str, machine_fd: int) -> dict:
    """Boot the lab, its QEMU holding machine_fd (the machine lock) for its life."""
    image = initramfs.build(log=log)
    _fetch_tlshd(log)
    files = _files()
    files.dir.mkdir(parents=True, exist_ok=True)
    guest_userland.prepare_share(files.guest_share)
    setup = config.guest_setup_script() + guest_userland.setup_line(files.guest_share)
    initramfs.boot_initramfs(image, setup, files.boot_initramfs)
    drives = qemu_vm.create_drive_images(config, files)
    cmd = qemu_vm.command_line(config, image, files, drives)
    pid = None
    try:
        if config.net == "netns":
            networking.create(config)
        started = time.monotonic()
        pid = qemu_vm.launch(cmd, networking.exec_prefix(config), files, (machine_fd,))
        log(f"fabric lab: QEMU pid {pid} booting {image.kernel_release} (TCG)")
        qemu_vm.wait_ready(pid, files, boot_timeout(), log)
        state = _new_state(config, pid, image, time.monotonic() - started)
        state["owner"] = owner
        _wait_reachable(state)
        state["boot_seconds"] = round(time.monotonic() - started, 1)
    except BaseException:
        _cleanup(config, pid, log)
        raise
    lab_state.write(state)
    return state


def _wait_reachable(state: dict, seconds: float = 60.0) -> None:
    """The guest printed READY; wait until its listener answers (ARP and the link settle)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            probe(state, timeout=5.0)
            return
        except (OSError, ValueError) as err:
            if time.monotonic() > deadline:
                raise LabError(f"guest is up but {state['host']}:{state['port']} does not answer "
                               f"an NVMe/TCP ICReq: {err}") from None
            time.sleep(0.5)


def stop(log=print) -> bool:
    """Stop the lab; return False if nothing was running. Never leaves QEMU or the netns."""
    with lab_state.locked():
        return stop_locked(log)


def stop_locked(log=print) -> bool:
    """stop() for callers that already hold the lab lock."""
    state = lab_state.read()
    config = config_of(state) if state else LabConfig.default()
    was_running = is_running(state)
    _cleanup(config, state["pid"] if state else None, log)
    return was_running


def stop_lock_holder(log=print) -> list[int]:
    """Stop the lab QEMU holding the machine lock, whichever checkout (lab directory) it
    belongs to, and remove what it leaves there: its state (when it names that QEMU), pid file
    and netns.  A holder that is not a lab QEMU (a flock wrapper, say) is named and left
    alone.  Returns the pids stopped."""
    stopped = []
    for holder in machine_lock.holders(machine_lock.path()):
        run_dir = qemu_vm.run_dir_of(holder.argv)
        if run_dir is None:
            log(f"fabric lab: the machine lock is held by {holder}, not a lab QEMU: left alone")
            continue
        files = qemu_vm.RunFiles(run_dir)
        if run_dir == _files().dir:
            with lab_state.locked():  # this checkout's own lab, by the holder's pid (its
                state = lab_state.read()  # pid file may be gone), its QMP socket still there
                _cleanup(config_of(state) if state else LabConfig.default(), holder.pid, log)
        else:
            log(f"fabric lab: stopping the lab QEMU of {run_dir.parent}: {holder}")
            qemu_vm.stop(holder.pid, files, log)
            state = lab_state.read(run_dir / "state.json")
            config = config_of(state) if state else LabConfig.default()
            if not state:
                config.netns = lab_paths.default_netns_name(run_dir.parent)
            if config.net == "netns" and networking.netns_exists(config.netns):
                try:
                    networking.remove(config)
                except (OSError, RuntimeError) as err:
                    log(f"fabric lab: could not remove netns {config.netns}: {err}")
            if state is None or state.get("pid") == holder.pid:
                (run_dir / "state.json").unlink(missing_ok=True)
            files.pid_file.unlink(missing_ok=True)
        stopped.append(holder.pid)
    return stopped


def status() -> dict | None:
    """The running lab's state plus a live probe result, or None if it is not running."""
    state = lab_state.read()
    if state is None or not is_running(state):
        return None
    try:
        state["probe"] = probe(state)
    except (OSError, ValueError) as err:
        state["probe"] = {"error": str(err)}
    return state


def exec_in_lab(command: list[str], state: dict) -> int:
    """Run command where initiators belong (inside the netns), telling it where the lab is."""
    config = config_of(state)
    env = dict(os.environ, FX100IO_LAB_STATE=str(lab_paths.state_file()),
               FX100IO_LAB_DIR=str(lab_paths.lab_dir()))
    prefix = networking.exec_prefix(config)
    if prefix and networking.in_netns(config.netns):
        prefix = []
    if not command:
        command = [os.environ.get("SHELL", "/bin/sh")]
    if shutil.which(command[0]) is None and not os.path.exists(command[0]):
        raise LabError(f"command not found: {command[0]}")
    return subprocess.run(prefix + command, env=env, check=False).returncode


def guest_command(state: dict, command: str, timeout: float = 120.0) -> tuple[int, str]:
    """Run a shell command inside the guest (for in-guest initiators and debugging)."""
    with lab_state.locked():
        return guest_console.run(_files(state).console_socket, command, timeout)


def guest_run(state: dict, command: str | list[str], *, cwd: str | None = None,
              env: dict[str, str] | None = None, timeout: float = 600.0,
              on_output=None) -> tuple[int, str]:
    """Run command in the guest's userland (the host's root, chroot'ed; see guest_userland)."""
    return guest_userland.run(state, command, cwd=cwd, env=env, timeout=timeout,
                              on_output=on_output)

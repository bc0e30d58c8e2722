"""pytest plugin: the `fabric_lab` fixture, a real Linux NVMe-oF target in a QEMU guest.

Load it with `pytest_plugins = ["support.lab_fixture"]` in a test module or in the top-level
tests/conftest.py (tests/ is on sys.path: pyproject's pythonpath).

The fixture uses the lab the test command started (`lab.py run -- python3 -m pytest ...`),
or starts one itself and stops it when the last pytest process using it is done (so
pytest-xdist workers share one lab). When the lab runs in its network namespace and this
process is not inside it yet, the fixture moves the process there (lo is up in it, so
loopback tests keep working). A lab it starts itself first takes the machine-wide lab lock
(/tmp/fx100io-lab.lock, FX100IO_LAB_MACHINE_LOCK) without waiting, and fails (naming the holder)
if another lab holds it; the lab's QEMU then holds it until the lab stops
(fabric_lab/machine_lock.py). It skips only where the lab cannot run at all (not Linux, no
QEMU and no way to install it, FX100IO_LAB=off); a lab that should start but fails is an error.

Environment: FX100IO_LAB=off (skip lab tests), FX100IO_LAB_NET=netns|user,
FX100IO_LAB_KEEP=1 (leave a self-started lab running), FX100IO_LAB_DIR, FX100IO_LAB_STATE,
FX100IO_LAB_BOOT_TIMEOUT (seconds).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

_LAB_TOOLS = Path(__file__).resolve().parents[2] / "tools" / "fabric_lab"
if str(_LAB_TOOLS) not in sys.path:
    sys.path.insert(0, str(_LAB_TOOLS))

from fabric_lab import guest_userland, host_tools, lab_control, lab_paths, lab_state, networking
from fabric_lab.lab_config import LabConfig, LabConfigError


@dataclass(frozen=True)
class LabNamespace:
    nsid: int
    block_size: int
    size_bytes: int
    backend: str  # brd | null_blk | nvme (QEMU-emulated drive)


@dataclass(frozen=True)
class LabSubsystem:
    nqn: str
    namespaces: tuple[LabNamespace, ...]
    allow_any_host: bool
    allowed_hosts: tuple[str, ...]
    # host NQN -> DH-HMAC-CHAP settings (.key .ctrl_key .hash .dhgroup); empty: no auth
    host_keys: dict = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class FabricLab:
    """Where the lab's target listens and what it exports."""

    host: str
    port: int
    # the subsystems a host reaches without authentication (allowed_host_nqn is admitted by
    # all of them); those that authenticate their hosts are in auth_subsystems
    subsystems: tuple[LabSubsystem, ...]
    allowed_host_nqn: str  # admitted by every subsystem in subsystems, allow-listed ones included
    discovery_nqn: str
    guest_ip: str
    net: str  # "netns" or "user" (on the host), "guest" (in a guest run)
    netns: str | None
    rdma_port: int | None  # NVMe/RDMA port on guest_ip (reachable only inside the guest)
    kernel_release: str
    state: dict
    auth_subsystems: tuple[LabSubsystem, ...] = ()

    @property
    def endpoint(self) -> tuple[str, int]:
        return self.host, self.port

    def subsystem(self, name: str) -> LabSubsystem:
        """The subsystem whose NQN is name or ends with it (e.g. "lab-ram")."""
        for sub in self.subsystems + self.auth_subsystems:
            if sub.nqn == name or sub.nqn.endswith(name):
                return sub
        raise KeyError(f"no lab subsystem {name!r}; have {[s.nqn for s in self.subsystems]}")

    def guest(self, command: str, timeout: float = 120.0) -> tuple[int, str]:
        """Run a shell command in the guest's busybox initramfs (serial console); returns
        (exit status, output). For Python, RDMA and host tools use guest_run."""
        if guest_userland.in_guest():
            return guest_userland.run(self.state, command, timeout=timeout)
        return lab_control.guest_command(self.state, command, timeout)

    def guest_run(self, command: str | Sequence[str], timeout: float = 600.0,
                  env: Mapping[str, str] | None = None,
                  cwd: str | None = None) -> tuple[int, str]:
        """Run command in the guest's userland: this host's root filesystem (read-only),
        chroot'ed in the guest, with the guest's /dev (RDMA: /dev/infiniband), /sys, configfs
        and a fresh tmpfs /tmp. command: a shell command line, or an argv list run without a
        shell. cwd: default the checkout's root. env: added to the defaults (PATH with this
        interpreter first, PYTHONPATH=<checkout>, PYTHONDONTWRITEBYTECODE=1,
        FX100IO_LAB_IN_GUEST=1, FX100IO_LAB_STATE). Returns (exit status, stdout and stderr
        merged). Writable: /tmp, /run, /dev/shm (the guest's) and guest_scratch."""
        return guest_userland.run(self.state, command, cwd=cwd, env=env, timeout=timeout)

    def guest_python(self, code_or_args: str | Sequence[str], timeout: float = 600.0,
                     env: Mapping[str, str] | None = None,
                     cwd: str | None = None) -> tuple[int, str]:
        """Run this test process's interpreter in the guest userland: a string is code for
        `-c`, a list its arguments (a script and its options, `-m pytest ...`)."""
        args = ["-c", code_or_args] if isinstance(code_or_args, str) else list(code_or_args)
        return self.guest_run([sys.executable, *args], timeout=timeout, env=env, cwd=cwd)

    @property
    def guest_scratch(self) -> Path:
        """A directory writable by guest runs, at the same path on the host (emptied when
        the lab starts)."""
        return Path(self.state["guest_share"])

    @property
    def guest_has_rdma(self) -> bool:
        """True if the guest's soft-RoCE device rxe0 is there with an ACTIVE port 1 (the lab
        was started with --rdma)."""
        if not self.state.get("rdma"):
            return False
        status, output = self.guest("cat /sys/class/infiniband/rxe0/ports/1/state", timeout=60)
        return status == 0 and "ACTIVE" in output


def _lab_from_state(state: dict) -> FabricLab:
    config = lab_control.config_of(state)
    subsystems = tuple(
        LabSubsystem(
            nqn=sub.nqn,
            namespaces=tuple(LabNamespace(ns.nsid, ns.block_size, ns.size_mib * 2**20, ns.backend)
                             for ns in sub.namespaces),
            allow_any_host=sub.allow_any_host,
            allowed_hosts=tuple(sub.allowed_hosts),
            host_keys=dict(sub.host_keys))
        for sub in config.subsystems)
    return FabricLab(
        host=state["host"], port=state["port"],
        subsystems=tuple(s for s in subsystems if not s.host_keys),
        auth_subsystems=tuple(s for s in subsystems if s.host_keys),
        allowed_host_nqn=state["allowed_host_nqn"], discovery_nqn=state["discovery_nqn"],
        guest_ip=state["guest_ip"], net=state["net"], netns=state["netns"],
        rdma_port=state["rdma"]["trsvcid"] if state.get("rdma") else None,
        kernel_release=state["kernel_release"], state=state)


def _why_lab_cannot_run() -> str | None:
    """A reason to skip, only for machines where the lab truly cannot run."""
    if os.environ.get("FX100IO_LAB", "").lower() in ("0", "off", "no", "false"):
        return "fabric lab disabled by FX100IO_LAB=off"
    if not sys.platform.startswith("linux"):
        return "the fabric lab needs Linux"
    missing = host_tools.missing_packages()
    if missing and (os.geteuid() != 0 or host_tools.find_command("apt-get") is None):
        return (f"fabric lab needs Debian packages {missing}, and this user cannot install "
                f"them (sudo apt-get install -y {' '.join(missing)})")
    return None


def _default_config() -> LabConfig:
    config = LabConfig.default()
    wanted = os.environ.get("FX100IO_LAB_NET")
    if wanted:
        config.net = wanted
    elif networking.why_netns_unusable():
        # Without root or /dev/net/tun the slower user-mode path still gives a real target.
        config.net = "user"
    config.validate()
    return config


# One lab per process, even if the fixture function ends up registered more than once (a
# module importing it directly gets its own fixture definition, which would start it twice).
_session: dict = {}


def _users_dir() -> Path:
    return lab_paths.run_dir() / "pytest-users"


def _live_users() -> list[Path]:
    users = []
    for marker in _users_dir().glob("*"):
        if marker.name.isdigit() and Path(f"/proc/{marker.name}").exists():
            users.append(marker)
        else:
            marker.unlink(missing_ok=True)  # a pytest process that died without cleanup
    return users


def _lab_in_guest() -> FabricLab:
    """The lab as seen from a guest run (tests run with fabric_lab.guest_python): its state
    file comes through the shared root; the target is the guest itself."""
    state = lab_state.read()
    if state is None:
        pytest.fail(f"in the guest but no lab state at {lab_paths.state_file()}", pytrace=False)
    config = lab_control.config_of(state)
    return dataclasses.replace(_lab_from_state(state), host=config.guest_ip,
                               port=config.tcp_port, net="guest", netns=None)


def _acquire() -> FabricLab:
    if guest_userland.in_guest():
        return _lab_in_guest()
    reason = _why_lab_cannot_run()
    if reason and not lab_control.is_running(lab_state.read()):
        pytest.skip(reason)
    try:
        config = _default_config()
    except LabConfigError as err:
        pytest.fail(f"fabric lab config: {err}", pytrace=False)
    problem = None
    state: dict | None = None
    try:
        with lab_state.locked():
            # Registered under the same lock as start/stop, so a finishing pytest process
            # cannot stop the lab between our start and our registration.
            _users_dir().mkdir(parents=True, exist_ok=True)
            (_users_dir() / str(os.getpid())).touch()
            state = lab_state.read()
            if state is None or not lab_control.is_running(state):
                # one lab at a time on the machine (fabric_lab/machine_lock.py): without
                # waiting, so this never hangs under another lab or a flock wrapper; the lab
                # lock above is never held while anyone waits for the machine lock, so it
                # is waited for only while a lab of this checkout boots or stops
                state = lab_control.start_locked(config, log=_log, owner="pytest")
    except (RuntimeError, OSError) as err:
        problem = f"fabric lab did not start: {err}"
    if problem is None and state is not None:
        lab = _lab_from_state(state)
        if lab.netns is not None and not networking.in_netns(lab.netns):
            try:
                networking.enter_netns(lab.netns)
            except (networking.NetworkError, OSError) as err:
                problem = f"cannot join the lab's network namespace: {err}"
    if problem is not None:
        # Outside the except blocks, so the report is the message, not a chained traceback.
        _release()
        pytest.fail(problem, pytrace=False)
    return lab


def _release() -> None:
    if guest_userland.in_guest():
        return  # the lab belongs to the host
    with lab_state.locked():
        (_users_dir() / str(os.getpid())).unlink(missing_ok=True)
        state = lab_state.read()
        if (state and state.get("owner") == "pytest" and not _live_users()
                and os.environ.get("FX100IO_LAB_KEEP") != "1"):
            lab_control.stop_locked(log=_log)


def _log(message: str) -> None:
    # Boot progress is useful in CI logs; pytest shows stderr of failing setups.
    print(message, file=sys.stderr, flush=True)


# ---- @pytest.mark.guest: tests that run inside the guest userland ---------------------------

# Results of the guest pytest runs, one per test module: module path -> batch.
_guest_batches: dict[str, dict] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "guest: runs inside the fabric lab's guest userland (tests/support/lab_fixture.py); "
                   "the test takes the fabric_lab fixture")


# Plugins the guest's pytest does without: under TCG, importing hypothesis alone takes longer
# than the rest of pytest's start (27 s -> 10 s to collect tests/lab/test_lab_guest.py).
_GUEST_PYTEST_ARGS = "-p no:hypothesispytest -p no:benchmark -p no:anyio"


def _guest_timeout() -> float:
    return float(os.environ.get("FX100IO_LAB_GUEST_TIMEOUT", "1800"))


def _run_guest_batch(item: pytest.Function, lab: FabricLab) -> dict:
    """Run every guest-marked test of item's module in one pytest process in the guest."""
    from fabric_lab import guest_pytest_report

    items = [i for i in item.session.items
             if i.path == item.path and i.get_closest_marker("guest") is not None]
    report = lab.guest_scratch / f"pytest-{os.getpid()}-{len(_guest_batches)}.json"
    env = {guest_pytest_report.REPORT_VARIABLE: str(report),
           "PYTHONPATH": f"{lab_paths.REPO_ROOT}:{_LAB_TOOLS}"}
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
            "fabric_lab.guest_pytest_report",
            *shlex.split(os.environ.get("FX100IO_LAB_GUEST_PYTEST_ARGS", _GUEST_PYTEST_ARGS)),
            *(i.nodeid for i in items)]
    try:
        status, output = lab.guest_python(args, timeout=_guest_timeout(), env=env,
                                          cwd=str(item.config.rootpath))
    except guest_userland.GuestRunError as err:
        status, output = -1, str(err)
    try:
        results = json.loads(report.read_text())
    except (OSError, ValueError):
        results = {}
    report.unlink(missing_ok=True)
    return {"results": results, "status": status, "output": output}


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """On the host, a @pytest.mark.guest test is not called here: its module's guest tests
    run in one pytest process in the guest (at the first of them), and each reports the
    outcome it had there: passed, failed (with the guest's report), skipped or xfailed."""
    if pyfuncitem.get_closest_marker("guest") is None or guest_userland.in_guest():
        return None
    lab = pyfuncitem.funcargs.get("fabric_lab")
    if not isinstance(lab, FabricLab):
        pytest.fail("a @pytest.mark.guest test must take the fabric_lab fixture", pytrace=False)
    key = str(pyfuncitem.path)
    if key not in _guest_batches:
        _guest_batches[key] = _run_guest_batch(pyfuncitem, lab)
    batch = _guest_batches[key]
    result = batch["results"].get(pyfuncitem.nodeid)
    if result is None:
        pytest.fail(f"the guest pytest run (exit status {batch['status']}) reported nothing "
                    f"for {pyfuncitem.nodeid}; its output ends:\n{batch['output'][-6000:]}",
                    pytrace=False)
    if result["outcome"] == "failed":
        pytest.fail(f"failed in the guest:\n{result['message']}", pytrace=False)
    if result["outcome"] == "skipped":
        pytest.skip(f"in the guest: {result['message']}")
    if result["outcome"] == "xfailed":
        pytest.xfail(f"in the guest: {result['message']}")
    return True


@pytest.fixture(scope="session")
def fabric_lab() -> Iterator[FabricLab]:
    """The running fabric lab (started on demand); see the module docstring."""
    if "lab" not in _session:
        _session["lab"] = _acquire()
        _session["users"] = 0
    _session["users"] += 1
    try:
        yield _session["lab"]
    finally:
        _session["users"] -= 1
        if _session["users"] == 0:
            del _session["lab"]
            _release()

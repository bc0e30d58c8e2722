"""The Linux kernel's NVMe/TCP initiator in the fabric lab's guest against our target
(`python3 -m fx100io target` on the host side of the lab network): starting the target,
running nvme-cli in the guest, connecting and finding the device, reading regions back.
What the tests of the kernel path against our target (tests/kernel) drive it with; the
`lab` fixture needs the fabric_lab fixture (support.lab_fixture)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import select
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import fx100io
from support import REPO

NAMESPACE_SIZE = 64 << 20
# TCG is slow and a busy 2-core CI runner slower still; a hang still ends in a clear failure.
GUEST_TIMEOUT = 300.0
TARGET_START_TIMEOUT = 60.0
# If a test dies between connect and disconnect and cleanup fails too, the guest's kernel
# stops retrying a vanished target after this many seconds instead of the default 600.
CTRL_LOSS_TMO = 30


def _host_nqn() -> str:
    # A fresh, real UUID host NQN per use: the guest's `nvme gen-hostnqn` would give an
    # all-zero UUID (QEMU's DMI product UUID), and distinct NQNs keep controllers apart.
    return f"nqn.2014-08.org.nvmexpress:uuid:{uuid.uuid4()}"


def _random_bytes(seed: str, n: int) -> np.ndarray:
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "little"))
    return rng.integers(0, 256, n, dtype=np.uint8)


def _md5(data) -> str:
    return hashlib.md5(memoryview(data).tobytes()).hexdigest()


# ---- our target as a subprocess ---------------------------------------------------------------

@dataclass
class OurTarget:
    host: str
    port: int
    nqn: str
    backing: Path
    log: Path
    process: subprocess.Popen

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _read_ready_line(process: subprocess.Popen, timeout: float) -> str:
    """The target's first stdout line, without blocking past timeout if it never comes."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").split("\n", 1)[0]


@contextlib.contextmanager
def our_target(tmp_path: Path, host_ip: str, block_size: int, *extra: str, port: int = 0,
               nqn: str | None = None, log_name: str = "target.log") -> Iterator[OurTarget]:
    """Run `fx100io target` on host_ip (never 0.0.0.0: only the lab network may reach it)
    serving tmp_path/ns1.img (made as a 64 MiB sparse file unless it exists, so a restarted
    target serves the same data); yield once it prints its endpoint."""
    # A unique NQN per test, so a controller left over from a failed test can never be
    # mistaken for this test's device in the guest.
    nqn = nqn or f"nqn.2026-11.io.fx100:kinit-{uuid.uuid4().hex[:12]}"
    backing = tmp_path / "ns1.img"
    if not backing.exists():
        with open(backing, "wb") as f:
            f.truncate(NAMESPACE_SIZE)
    log = tmp_path / log_name
    cmd = [sys.executable, "-m", "fx100io", "target", "--listen", f"{host_ip}:{port}", "--nqn", nqn,
           "--namespace", str(backing), "--block-size", str(block_size), *extra]
    # The target logs to stderr (into a file: a full pipe would stall it); stdout carries
    # only the "listening on" line.
    with open(log, "wb") as log_file:
        process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log_file, cwd=str(REPO))
    try:
        line = _read_ready_line(process, TARGET_START_TIMEOUT)
        match = re.search(r"listening on nvme\+tcp://([^/]+):(\d+)/(\S+)", line)
        if not match:
            raise AssertionError(f"our target did not start: {line!r}\n{log.read_text()[-3000:]}")
        assert match.group(1) == host_ip and match.group(3) == nqn, line
        assert port == 0 or int(match.group(2)) == port, line
        yield OurTarget(host_ip, int(match.group(2)), nqn, backing, log, process)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()


def _open_ours(target: OurTarget, hostnqn: str, digests: bool):
    flag = int(digests)
    return fx100io.open_device(
        f"nvme+tcp://{target.host}:{target.port}/{target.nqn}"
        f"?hostnqn={hostnqn}&hdgst={flag}&ddgst={flag}&io_timeout_ms=60000")


# ---- the guest's kernel initiator -------------------------------------------------------------

def _guest(lab, command: str, timeout: float = GUEST_TIMEOUT) -> tuple[int, str]:
    return lab.guest(command, timeout=timeout)


def _guest_ok(lab, command: str, timeout: float = GUEST_TIMEOUT) -> str:
    rc, out = _guest(lab, command, timeout)
    if rc != 0:
        _, dmesg = _guest(lab, "dmesg | tail -n 25", 60)
        raise AssertionError(f"guest command failed (rc {rc}): {command}\n{out}\n"
                             f"guest dmesg:\n{dmesg}")
    return out


@pytest.fixture
def lab(fabric_lab):
    if fabric_lab.net != "netns":
        pytest.skip("the guest reaches the host side only over the netns tap; user-mode "
                    "networking (restrict=on) lets it reach nothing")
    rc, out = fabric_lab.guest("command -v nvme && nvme version", timeout=60)
    if rc != 0:
        pytest.fail("the lab guest has no nvme-cli: it runs an image built before nvme-cli "
                    "was added; restart the lab (lab.py stop; lab.py start) to rebuild it\n" + out,
                    pytrace=False)
    return fabric_lab


def _host_ip(lab) -> str:
    # The tap's address in the lab's namespace: what the guest routes to for the host side.
    return lab.state["config"]["host_ip"]


def _connect_command(target: OurTarget, hostnqn: str, digests: bool, extra: str = "") -> str:
    cmd = (f"nvme connect -t tcp -a {target.host} -s {target.port} -n {shlex.quote(target.nqn)} "
           f"-q {shlex.quote(hostnqn)} -l {CTRL_LOSS_TMO}")
    return cmd + (" -g -G" if digests else "") + (f" {extra}" if extra else "")


def _find_device_script(nqn: str, seconds: int = 120) -> str:
    """Guest shell: print "NAME LOGICAL_BLOCK_SIZE SECTORS" of the namespace block device of
    subsystem nqn once it has a /dev node. nvmeXcYnZ entries are multipath controller paths
    without device nodes; the lab's own QEMU drive (nvme0n1) has another subsystem NQN."""
    return f"""
for i in $(seq {seconds * 10}); do
  for b in /sys/block/nvme*n*; do
    n=${{b##*/}}
    case $n in *c*) continue;; esac
    [ "$(cat $b/device/subsysnqn 2>/dev/null)" = {shlex.quote(nqn)} ] || continue
    [ -b /dev/$n ] && [ "$(cat $b/size)" != 0 ] || continue
    echo "$n $(cat $b/queue/logical_block_size) $(cat $b/size)"
    exit 0
  done
  usleep 100000
done
exit 1"""


@contextlib.contextmanager
def guest_connection(lab, target: OurTarget, hostnqn: str, digests: bool,
                     extra: str = "") -> Iterator[str]:
    """`nvme connect` from the guest; yields /dev/nvmeXnY. Disconnects on the way out
    whatever happened, so a failing test leaves no controller retrying in the guest."""
    try:
        _guest_ok(lab, _connect_command(target, hostnqn, digests, extra))
        out = _guest_ok(lab, _find_device_script(target.nqn)).split()
        assert re.fullmatch(r"nvme\d+n1", out[0]), out
        yield f"/dev/{out[0]}"
    finally:
        _guest(lab, f"nvme disconnect -n {shlex.quote(target.nqn)}")


@dataclass(frozen=True)
class Region:
    offset: int
    length: int
    # dd's bs, so the request size the kernel sends: 4096; 512 for regions that are only
    # 512-aligned; 1 MiB for writes past the target's in-capsule size (R2T + H2CData) and
    # reads of many C2HData PDUs.
    dd_block: int

    def dd_args(self) -> str:
        return f"bs={self.dd_block} count={self.length // self.dd_block}"


def _regions(block_size: int, which: str) -> list[Region]:
    """Non-overlapping regions: ones our initiator writes ("ours") and ones the guest
    writes ("guest"), including the namespace's last blocks and, on a 512-byte namespace,
    ones that are not 4 KiB aligned."""
    ours = [Region(0, 256 << 10, 4096),
            Region((5 << 20) + 3 * 4096, 1 << 20, 4096),
            Region(8 << 20, 2 << 20, 1 << 20),
            Region(NAMESPACE_SIZE - (512 << 10), 512 << 10, 4096)]
    guest = [Region(20 << 20, 1 << 20, 4096),
             Region(24 << 20, 2 << 20, 1 << 20)]
    if block_size == 512:
        ours.append(Region((32 << 20) + 7 * 512, (64 << 10) + 3 * 512, 512))
        guest.append(Region((40 << 20) + 5 * 512, (32 << 10) + 512, 512))
    return ours if which == "ours" else guest


def _guest_read_md5(lab, device: str, region: Region) -> str:
    out = _guest_ok(lab, f"dd if={device} {region.dd_args()} skip={region.offset // region.dd_block}"
                         f" iflag=direct 2>/dev/null | md5sum")
    return out.split()[0]


def _backing_bytes(target: OurTarget, region: Region) -> bytes:
    with open(target.backing, "rb") as f:
        f.seek(region.offset)
        return f.read(region.length)


def _discovery_entries(output: str) -> list[dict[str, str]]:
    entries = []
    for chunk in re.split(r"=====Discovery Log Entry \d+======", output)[1:]:
        fields = {}
        for line in chunk.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        entries.append(fields)
    return entries

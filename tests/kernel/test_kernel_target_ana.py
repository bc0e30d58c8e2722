"""The Linux kernel's NVMe/TCP multipath against our target's two ports and ANA.

Our target listens twice on the host side of the lab network (port ids 1 and 2) with a
control socket; the lab guest's kernel (Debian 6.12, native NVMe multipath) connects through
both ports, so one block device has two paths. The kernel reads our ANA log and follows our
ANA change events: a state changed through the control socket shows in the path's sysfs
`ana_state` (a `change` too, and the state it leaves for by itself), I/O goes on through
the other path, and so it does when a port is closed.
Data are checked through MD5 digests of exactly the bytes written.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import tempfile

import pytest
from support.kernel_lab import (
    _guest,
    _guest_ok,
    _host_ip,
    _host_nqn,
    lab,
    our_target,
)

from fx100io.target_ctl import control

pytest_plugins = ["support.lab_fixture"]
pytestmark = pytest.mark.lab
__all__ = ["lab"]  # (the fixture, imported for this module's tests)


def _paths_script(nqn: str) -> str:
    """Guest shell: "PATHDEV ANA_STATE TRADDR_TRSVCID" for each path of subsystem nqn."""
    return f"""
for b in /sys/block/nvme*c*n1; do
  [ -e "$b" ] || continue
  [ "$(cat $b/device/subsysnqn 2>/dev/null)" = {shlex.quote(nqn)} ] || continue
  echo "${{b##*/}} $(cat $b/ana_state) $(cat $b/device/address | tr -d ' ')"
done"""


def _wait_states(lab, nqn: str, want: dict[str, str], seconds: int = 60) -> str:
    """Poll until each path whose address has trsvcid=PORT shows want[PORT]."""
    checks = " && ".join(
        f"grep -E 'trsvcid={p}(,|$)' /tmp/paths | grep -q ' {s} '"
        for p, s in want.items())
    script = f"""
for i in $(seq {seconds * 10}); do
  ( {_paths_script(nqn)} ) > /tmp/paths
  if {checks}; then cat /tmp/paths; exit 0; fi
  usleep 100000
done
cat /tmp/paths; exit 1"""
    return _guest_ok(lab, script)


def _find_head(nqn: str) -> str:
    return f"""
for i in $(seq 600); do
  for b in /sys/block/nvme*n1; do
    n=${{b##*/}}
    case $n in *c*) continue;; esac
    [ "$(cat $b/device/subsysnqn 2>/dev/null)" = {shlex.quote(nqn)} ] || continue
    [ -b /dev/$n ] && echo $n && exit 0
  done
  usleep 100000
done
exit 1"""


def test_kernel_multipath_follows_our_ana(lab, tmp_path):
    host_ip = _host_ip(lab)
    # (a unix socket path must fit in 108 bytes: tmp_path may not)
    ctl = os.path.join(tempfile.mkdtemp(prefix="fx-ana-", dir="/tmp"), "ctl.sock")
    hostnqn = _host_nqn()
    with our_target(tmp_path, host_ip, 512, "--listen", f"{host_ip}:0",
                    "--control", ctl) as target:
        lines = control(ctl, "ports").splitlines()
        port2 = int(lines[1].split()[2].rpartition(":")[2])
        ports = (target.port, port2)
        nqn = target.nqn
        try:
            for p in ports:
                _guest_ok(lab, f"nvme connect -t tcp -a {host_ip} -s {p} -n {shlex.quote(nqn)} "
                               f"-q {shlex.quote(hostnqn)} -l 5")
            head = _guest_ok(lab, _find_head(nqn)).split()[0]
            out = _wait_states(lab, nqn, {str(ports[0]): "optimized", str(ports[1]): "optimized"})
            assert len(out.strip().splitlines()) == 2, out

            def write_read(tag: str) -> None:
                _guest_ok(lab, f"dd if=/dev/urandom of=/tmp/{tag} bs=4096 count=64 2>/dev/null && "
                               f"dd if=/tmp/{tag} of=/dev/{head} bs=4096 oflag=direct "
                               f"seek=16 2>/dev/null && "
                               f"dd if=/dev/{head} of=/tmp/{tag}.back bs=4096 count=64 skip=16 "
                               f"iflag=direct 2>/dev/null && cmp /tmp/{tag} /tmp/{tag}.back")
                guest_md5 = _guest_ok(lab, f"md5sum < /tmp/{tag}").split()[0]
                with open(target.backing, "rb") as f:
                    f.seek(16 * 4096)
                    assert hashlib.md5(f.read(64 * 4096)).hexdigest() == guest_md5

            write_read("a")
            # port 2 inaccessible: the kernel gets our AER, reads the log, and says so
            control(ctl, "ana-state 2 1 inaccessible")
            _wait_states(lab, nqn, {str(ports[0]): "optimized", str(ports[1]): "inaccessible"})
            write_read("b")
            control(ctl, "ana-state 2 1 non-optimized")
            _wait_states(lab, nqn, {str(ports[1]): "non-optimized"})
            # change, left by itself: the kernel sees change, then optimized after our
            # second notice (its ANATT timer stops: no controller reset)
            control(ctl, "ana-state 2 1 change optimized 4000")
            _wait_states(lab, nqn, {str(ports[1]): "change"})
            _wait_states(lab, nqn, {str(ports[0]): "optimized", str(ports[1]): "optimized"})
            write_read("d")
            assert "ANA group 1 left change: now optimized" in target.log_text()
            # port 1 closed: its path dies, I/O goes through port 2
            control(ctl, "close-port 1")
            write_read("c")
            assert "port 1 (" in target.log_text() and "closed" in target.log_text()
        finally:
            _guest(lab, f"nvme disconnect -n {shlex.quote(nqn)}")

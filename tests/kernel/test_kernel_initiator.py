"""The Linux kernel's NVMe/TCP initiator against our target.

Our target (`python3 -m fx100io target`) listens on the host side of the lab network: the
tap's address inside the lab's network namespace, where this test process runs. The lab
guest's own kernel (Debian 6.12, nvme-tcp, driven by nvme-cli) discovers and connects to it
over the tap, so a real, independent NVMe/TCP host exercises the target. Data crosses in both
directions and is compared byte for byte (through MD5 digests of exactly the bytes written,
since the guest is reachable only over its serial console):

- our initiator writes random data and flushes; the guest reads it with `dd iflag=direct`;
- the guest writes random data with `dd oflag=direct`; our initiator reads it back, and the
  target's backing file holds the same bytes.

Everything runs at TCG speed inside the guest, so the data is kept to a few MiB and the
guest commands get generous timeouts.
"""

from __future__ import annotations

import contextlib
import re
import shlex

import numpy as np
import pytest
from support.kernel_lab import (
    NAMESPACE_SIZE,
    Region,
    _backing_bytes,
    _connect_command,
    _discovery_entries,
    _find_device_script,
    _guest,
    _guest_ok,
    _guest_read_md5,
    _host_ip,
    _host_nqn,
    _md5,
    _open_ours,
    _random_bytes,
    _regions,
    guest_connection,
    lab,
    our_target,
)

pytest_plugins = ["support.lab_fixture"]
pytestmark = pytest.mark.lab
__all__ = ["lab"]  # (the fixture, imported for this module's tests)


# ---- tests ------------------------------------------------------------------------------------

@pytest.mark.parametrize("digests", [False, True], ids=["plain", "digests"])
@pytest.mark.parametrize("block_size", [512, 4096])
def test_kernel_initiator_and_ours_see_each_others_writes(lab, tmp_path, block_size, digests):
    guest_nqn, our_nqn = _host_nqn(), _host_nqn()
    tag = f"{block_size}-{int(digests)}"
    with our_target(tmp_path, _host_ip(lab), block_size) as target:
        # 1. Our initiator writes random data at several offsets and flushes.
        ours = _regions(block_size, "ours")
        written = {r: _random_bytes(f"ours-{tag}-{r.offset}", r.length) for r in ours}
        with _open_ours(target, our_nqn, digests) as dev:
            assert dev.block_size == block_size and dev.size == NAMESPACE_SIZE
            for region, data in written.items():
                dev.write_from_blocking(region.offset, data)
            dev.flush_blocking()

        # 2. The guest's discovery controller query lists our subsystem at our address.
        out = _guest_ok(lab, f"nvme discover -t tcp -a {target.host} -s {target.port} "
                             f"-q {shlex.quote(guest_nqn)}")
        entries = _discovery_entries(out)
        assert any(e.get("subnqn") == target.nqn and e.get("trtype") == "tcp"
                   and e.get("traddr") == target.host and e.get("trsvcid") == str(target.port)
                   and e.get("subtype") == "nvme subsystem" for e in entries), out

        with guest_connection(lab, target, guest_nqn, digests) as device:
            # The kernel sees the namespace as we serve it.
            name = device.rsplit("/", 1)[1]
            geometry = _guest_ok(lab, f"cat /sys/block/{name}/queue/logical_block_size "
                                      f"/sys/block/{name}/size").split()
            assert int(geometry[0]) == block_size
            assert int(geometry[1]) * 512 == NAMESPACE_SIZE
            # The digests the guest asked for (-g -G) were negotiated on its admin queue.
            connected = [line for line in target.log_text().splitlines()
                         if f"host {guest_nqn} connected to {target.nqn}" in line]
            assert connected, target.log_text()[-3000:]
            assert ("header digest, data digest" in connected[0]) == digests, connected[0]
            assert ("no header digest" in connected[0]) == (not digests), connected[0]

            # 3. The guest reads what our initiator wrote (O_DIRECT: from the target, not
            #    from a page cache).
            for region, data in written.items():
                assert _guest_read_md5(lab, device, region) == _md5(data), region

            # 4. The guest writes random data from a file it made itself; conv=fsync ends
            #    with a Flush to our target.
            guest_md5 = {}
            for region in _regions(block_size, "guest"):
                path = f"/tmp/kinit-{tag}-{region.offset}.bin"
                out = _guest_ok(
                    lab,
                    f"dd if=/dev/urandom of={path} {region.dd_args()} iflag=fullblock "
                    f"2>/dev/null && "
                    f"md5sum {path} && "
                    f"dd if={path} of={device} {region.dd_args()} "
                    f"seek={region.offset // region.dd_block} oflag=direct conv=fsync 2>&1; "
                    f"rc=$?; rm -f {path}; exit $rc")
                guest_md5[region] = out.split()[0]
                records = region.length // region.dd_block
                assert f"{records}+0 records out" in out, out

            # 5. Our initiator reads the guest's data back; the target's file holds it too.
            with _open_ours(target, our_nqn, digests) as dev:
                for region, digest in guest_md5.items():
                    back = np.zeros(region.length, np.uint8)
                    assert dev.read_into_blocking(region.offset, back) == region.length
                    assert _md5(back) == digest, region
                    assert _backing_bytes(target, region) == back.tobytes(), region
                # The guest's writes left ours alone.
                for region, data in written.items():
                    back = np.zeros(region.length, np.uint8)
                    dev.read_into_blocking(region.offset, back)
                    assert np.array_equal(back, data), region

            # 6. A clean disconnect removes the device.
            out = _guest_ok(lab, f"nvme disconnect -n {shlex.quote(target.nqn)}")
            assert "disconnected 1 controller" in out, out
            _guest_ok(lab, f"for i in $(seq 100); do [ -e /sys/block/{name} ] || exit 0; "
                           f"usleep 100000; done; exit 1")


def test_allow_list_refuses_other_kernel_hosts(lab, tmp_path):
    allowed, other = _host_nqn(), _host_nqn()
    with our_target(tmp_path, _host_ip(lab), 4096, "--allow-host", allowed) as target:
        data = _random_bytes("allow-list", 64 << 10)
        with _open_ours(target, allowed, digests=False) as dev:
            dev.write_from_blocking(0, data)
            dev.flush_blocking()
        region = Region(0, data.nbytes, 4096)

        # Like Linux nvmet, the discovery log shows a host only the subsystems it may use.
        def listed(hostnqn: str) -> bool:
            out = _guest_ok(lab, f"nvme discover -t tcp -a {target.host} -s {target.port} "
                                 f"-q {shlex.quote(hostnqn)}")
            return any(e.get("subnqn") == target.nqn for e in _discovery_entries(out))
        assert listed(allowed)
        assert not listed(other)

        # A host that is not on the list: nvme connect fails and no device appears.
        try:
            rc, out = _guest(lab, _connect_command(target, other, digests=False))
            assert rc != 0, f"nvme connect as a host off the allow-list succeeded:\n{out}"
            rc, listing = _guest(lab, _find_device_script(target.nqn, seconds=2))
            assert rc != 0, f"a device appeared for a refused host: {listing}"
        finally:
            _guest(lab, f"nvme disconnect -n {shlex.quote(target.nqn)}")
        assert f"host {other} is not allowed to connect to {target.nqn}" in target.log_text()
        _, dmesg = _guest(lab, "dmesg | tail -n 20")
        assert re.search(rf"not allowed.*{re.escape(other)}|{re.escape(other)}.*not allowed",
                         dmesg), dmesg

        # The listed host gets in and reads what was written: the refusal was the allow-list.
        with guest_connection(lab, target, allowed, digests=False) as device:
            assert _guest_read_md5(lab, device, region) == _md5(data)


def test_kernel_initiator_rides_out_a_target_restart(lab, tmp_path):
    """Our target dies and comes back on the same address with the same file: the guest's
    kernel reconnects by itself (as it would to a Linux target) and I/O goes on, with the
    data from before the restart intact."""
    guest_nqn = _host_nqn()
    before = Region(0, 1 << 20, 4096)
    after = Region(4 << 20, 1 << 20, 4096)
    with contextlib.ExitStack() as stack:
        target = stack.enter_context(our_target(tmp_path, _host_ip(lab), 4096))
        # Reconnect every second, give up after CTRL_LOSS_TMO: the restart below takes
        # about a second; the default 10 s delay would only slow the test.
        device = stack.enter_context(guest_connection(lab, target, guest_nqn, digests=False,
                                                      extra="-c 1"))
        path = "/tmp/kinit-restart.bin"
        out = _guest_ok(lab, f"dd if=/dev/urandom of={path} bs=4096 count=256 2>/dev/null && "
                             f"md5sum {path} && dd if={path} of={device} bs=4096 count=256 "
                             f"oflag=direct conv=fsync 2>/dev/null; rc=$?; rm -f {path}; exit $rc")
        written_md5 = out.split()[0]
        dmesg_lines = int(_guest_ok(lab, "dmesg | wc -l").split()[0])

        target.process.kill()  # no goodbye to the host: like a crash
        target.process.wait()
        # The same port, NQN and file. On failure the ExitStack stops this target before the
        # guest disconnects; a disconnect from a reconnecting controller works all the same.
        target = stack.enter_context(our_target(tmp_path, target.host, 4096, port=target.port,
                                                nqn=target.nqn, log_name="target2.log"))
        # Reading blocks while the kernel reconnects (the namespace queues I/O meanwhile).
        assert _guest_read_md5(lab, device, before) == written_md5
        controller = _guest_ok(lab, f"for c in /sys/class/nvme/nvme*; do "
                                    f"[ \"$(cat $c/subsysnqn)\" = {shlex.quote(target.nqn)} ] && "
                                    f"echo ${{c##*/}} $(cat $c/state); done; true").split()
        assert len(controller) == 2 and controller[1] == "live", controller
        # Only kernel messages since the restart: an earlier controller may have had this name.
        dmesg = _guest_ok(lab, f"dmesg | tail -n +{dmesg_lines + 1}")
        assert f"{controller[0]}: Successfully reconnected" in dmesg, dmesg
        data = _random_bytes("after-restart", after.length)
        with _open_ours(target, _host_nqn(), digests=False) as dev:
            dev.write_from_blocking(after.offset, data)
            dev.flush_blocking()
        assert _guest_read_md5(lab, device, after) == _md5(data)
        assert f"host {guest_nqn} connected to {target.nqn}" in target.log_text()
        out = _guest_ok(lab, f"nvme disconnect -n {shlex.quote(target.nqn)}")
        assert "disconnected 1 controller" in out, out

"""The kernel path over several paths (fx100io.kernel.multipath): the guest kernel's native NVMe
multipath serves ONE block device over two NVMe/TCP ports of its own target (nvmet), and a
byte-checked load through that device sees no failed I/O while one port is taken away and
while the other port's ANA group is inaccessible.

The bodies run inside the lab guest (@pytest.mark.guest): the guest's nvmet exports lab-ram on
the lab's TCP port; the test adds a second port (4428, port id 28) through configfs and takes
it away again at the end, restoring every ANA state it changed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support import chunk_bytes
from support.nvmet_port import NVMET, extra_port

import fx100io
from fx100io import kernel

pytest_plugins = ["support.lab_fixture", "guest_rdma"]
pytestmark = [pytest.mark.lab, pytest.mark.guest]

PORT_ID, PORT = 28, 4428
BS = 64 << 10
SLOTS = 32
BASE = 16 << 20  # the load's region on lab-ram


def wait_for(cond, what: str, seconds: float = 30.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:g} s waiting for {what}")
        time.sleep(0.05)


def ana(port_id: str | int, state: str) -> None:
    (NVMET / "ports" / str(port_id) / "ana_groups" / "1" / "ana_state").write_text(state)


def mine(nqn: str) -> list[str]:
    return [c.name for c in kernel.list() if c.subsysnqn == nqn]


@pytest.fixture
def two_ports(fabric_lab):
    from fabric_lab import guest_userland  # (on sys.path once the lab plugin is loaded)

    if not guest_userland.in_guest():  # on the host the test only hands over to the guest
        yield None
        return
    nqn = fabric_lab.subsystem("lab-ram").nqn
    main = next(d.name for d in (NVMET / "ports").iterdir()
                if (d / "addr_trsvcid").read_text().strip() == str(fabric_lab.port)
                and (d / "addr_trtype").read_text().strip() == "tcp")
    attrs = {"addr_trtype": "tcp", "addr_adrfam": "ipv4", "addr_traddr": fabric_lab.host,
             "addr_trsvcid": str(PORT)}
    with extra_port(PORT_ID, nqn, attrs) as d:
        link = d / "subsystems" / nqn
        assert mine(nqn) == [], "a controller of lab-ram was left attached before this test"
        try:
            yield main, nqn, link
        finally:
            for c in kernel.list():
                if c.subsysnqn == nqn:
                    kernel.disconnect(c)
            with contextlib.suppress(OSError):
                ana(main, "optimized")
            with contextlib.suppress(OSError):
                ana(PORT_ID, "optimized")


def test_the_lab_guest_has_native_multipath_on(fabric_lab):
    """Debian's 6.12 kernel builds nvme_core with native multipath on by default."""
    assert kernel.native_multipath() is True
    assert Path("/sys/module/nvme_core/parameters/multipath").read_text().strip() == "Y"


class Load:
    """Writes then reads back 64 KiB slots through the block device, checking every byte,
    from one thread; counts what it did and keeps the first failure."""

    def __init__(self, dev: fx100io.Device, pool: fx100io.BufferPool):
        self.dev, self.stop, self.done = dev, threading.Event(), 0
        self.error: BaseException | None = None
        self.written: dict[int, str] = {}
        self.out, self.buf = pool.alloc(BS), pool.alloc(BS)
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        n = 0
        try:
            while not self.stop.is_set():
                slot = n % SLOTS
                tag = f"kmp-{slot}-{n}"
                self.buf[:] = chunk_bytes(tag, BS)
                off = BASE + slot * BS
                assert self.dev.write_from_blocking(off, self.buf) == BS
                self.written[slot] = tag
                assert self.dev.read_into_blocking(off, self.out) == BS
                assert np.array_equal(self.out, self.buf), f"wrong bytes read back at {tag}"
                n += 1
                self.done = n
        except BaseException as e:  # noqa: BLE001 (reported by the test thread)
            self.error = e

    def progress_during(self, seconds: float) -> int:
        before = self.done
        time.sleep(seconds)
        assert self.error is None, self.error
        return self.done - before


def test_two_paths_one_block_device_no_failed_io_when_a_port_goes_or_ana_says_inaccessible(
        fabric_lab, two_ports):
    main, nqn, link = two_ports
    host = fabric_lab.host
    uri = (f"nvme+tcp://{host}:{fabric_lab.port},{host}:{PORT}/{nqn}"
           f"?hostnqn={fabric_lab.allowed_host_nqn}")
    with kernel.connect(uri, ctrl_loss_tmo=120, reconnect_delay=1) as ps:
        assert len(ps.controllers) == 2
        (path,) = ps.namespaces  # ONE block device for both paths
        print(f"\npaths: {ps.states()} -> {path}")
        assert [s["trsvcid"] for s in ps.states()] == [str(fabric_lab.port), str(PORT)]
        wait_for(lambda: [(s["state"], s["ana_state"]) for s in ps.states()]
                 == [("live", "optimized")] * 2, "both paths live and optimized")
        listed = {c.name: c for c in kernel.list() if c.subsysnqn == nqn}
        assert sorted(listed) == sorted(ps.names)
        subsystem = listed[ps.names[0]].subsystem
        assert subsystem.startswith("nvme-subsys")
        assert {c.subsystem for c in listed.values()} == {subsystem}
        assert all([p.head for p in c.paths()] == [Path(path).name] for c in listed.values())

        pool = fx100io.BufferPool(4 << 20)
        with fx100io.open_device(path) as dev:
            load = Load(dev, pool)
            load.thread.start()
            try:
                assert load.progress_during(1.0) > 0
                # port 28 loses the subsystem: nvmet drops its controllers; the kernel
                # reconnects that path in the background, I/O goes through the other one
                link.unlink()
                wait_for(lambda: ps.states()[1]["state"] != "live", "path 2 to leave live")
                print(f"port 28 gone: {ps.states()}")
                assert load.progress_during(2.0) > 0
                link.symlink_to(NVMET / "subsystems" / nqn)
                wait_for(lambda: ps.states()[1]["state"] == "live", "path 2 back", 60)
                # the first port's ANA group inaccessible: the kernel reads it (ANA change
                # event), list shows it, and I/O goes through port 28
                ana(main, "inaccessible")
                wait_for(lambda: ps.states()[0]["ana_state"] == "inaccessible",
                         "path 1 inaccessible")
                c0 = next(c for c in kernel.list() if c.name == ps.names[0])
                assert [p.ana_state for p in c0.paths()] == ["inaccessible"]
                print(f"port {main} inaccessible: {ps.states()}")
                assert load.progress_during(2.0) > 0
                ana(main, "optimized")
                wait_for(lambda: ps.states()[0]["ana_state"] == "optimized", "path 1 back")
                assert load.progress_during(1.0) > 0
            finally:
                load.stop.set()
                load.thread.join(timeout=60)
            assert not load.thread.is_alive(), "the load did not stop"
            assert load.error is None, load.error
            print(f"{load.done} write+read rounds, none failed")
            # every slot holds the last bytes written to it
            out = pool.alloc(BS)
            for slot, tag in load.written.items():
                assert dev.read_into_blocking(BASE + slot * BS, out) == BS
                assert np.array_equal(out, chunk_bytes(tag, BS)), tag
    assert mine(nqn) == []


def test_disconnect_by_the_uri_takes_every_path(fabric_lab, two_ports):
    _main, nqn, _link = two_ports
    host = fabric_lab.host
    uri = (f"nvme+tcp://{host}:{fabric_lab.port},{host}:{PORT}/{nqn}"
           f"?hostnqn={fabric_lab.allowed_host_nqn}")
    ps = kernel.connect(uri)
    assert sorted(mine(nqn)) == sorted(ps.names) and len(ps.names) == 2
    assert sorted(kernel.disconnect(uri)) == sorted(ps.names)
    assert mine(nqn) == []


_HOLDER = """
import hashlib, sys
from fx100io import kernel
a = kernel.attach(sys.argv[1])
print(a.controller.name, a.path, flush=True)
sys.stdin.readline()
with open(a.path, "rb") as f:
    f.seek(int(sys.argv[2]))
    print(hashlib.sha256(f.read(4096)).hexdigest(), flush=True)
a.release()
"""


def test_a_paths_exit_leaves_the_controller_another_process_attached_to(fabric_lab, two_ports):
    """Another process's attach() reuses the first path's controller that a Paths made: the
    Paths' exit detaches only the second path, the other process still reads the bytes the
    test wrote through its block device, and its release (the last user) detaches the rest."""
    import hashlib
    import os
    import select
    import subprocess
    import sys

    _main, nqn, _link = two_ports
    host = fabric_lab.host
    q = f"?hostnqn={fabric_lab.allowed_host_nqn}"
    uri = f"nvme+tcp://{host}:{fabric_lab.port},{host}:{PORT}/{nqn}{q}"
    one = f"nvme+tcp://{host}:{fabric_lab.port}/{nqn}{q}"
    pattern = chunk_bytes("k3-holder", 4096).tobytes()
    env = {**os.environ, "PYTHONPATH": str(Path(fx100io.__file__).parents[1])}
    with kernel.connect(uri) as ps:
        (dev,) = ps.namespaces
        fd = os.open(dev, os.O_RDWR)
        try:
            assert os.pwrite(fd, pattern, BASE) == 4096
            os.fsync(fd)
        finally:
            os.close(fd)
        holder = subprocess.Popen([sys.executable, "-c", _HOLDER, one, str(BASE)], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert select.select([holder.stdout], [], [], 60)[0], "the holder did not attach"
            name, path = holder.stdout.readline().split()
            assert name == ps.names[0] and path == dev  # it reused the Paths' controller
        except BaseException:
            holder.kill()
            holder.wait(timeout=30)
            raise
    try:
        assert mine(nqn) == [name], "the Paths' exit detached the other process's controller"
        out, _ = holder.communicate("go\n", timeout=60)
        assert out.strip() == hashlib.sha256(pattern).hexdigest()
        assert holder.returncode == 0
        wait_for(lambda: mine(nqn) == [], "the last user's release to detach it")
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)


def test_a_path_to_another_namespace_is_refused_and_leaves_nothing(fabric_lab, tmp_path):
    """Two of our targets with one subsystem NQN, each serving a file of its own: the same
    NSID with other NGUID/UUID behind the second path.  The kernel refuses that namespace on
    the second controller; connect raises PathMismatchError naming the path and detaches both."""
    from support.target_process import serve

    from fx100io import errors

    nqn = "nqn.2026-12.io.fx100:kmp-mismatch"
    files = [tmp_path / "a.img", tmp_path / "b.img"]
    for f in files:
        with open(f, "wb") as fh:
            fh.truncate(16 << 20)
    with serve([str(files[0])], nqn) as (_h, pa, _pa), serve([str(files[1])], nqn) as (_h2, pb, _pb):
        # (each target numbers its controllers from 1, and the kernel refuses two controllers
        # of one subsystem with one cntlid: a discovery controller of b takes its 1)
        kernel.discover(f"nvme+tcp://127.0.0.1:{pb}")
        uri = f"nvme+tcp://127.0.0.1:{pa},127.0.0.1:{pb}/{nqn}?hostnqn={fabric_lab.allowed_host_nqn}"
        with pytest.raises(errors.PathMismatchError, match=f"path 127.0.0.1:{pb} ") as e:
            kernel.connect(uri, ns_timeout=20)
        print(f"\nrefused: {e.value}")
        assert "detached" in str(e.value)
        assert mine(nqn) == []


def test_every_path_down_queues_io_until_ctrl_loss_tmo_then_fails_it(fabric_lab, two_ports):
    """Both ports lose the subsystem: the kernel holds I/O while a path may come back (a read
    waits, then completes with the right bytes once the ports are back); past ctrl_loss_tmo
    it deletes the controllers and the I/O fails with an error (DeviceIOError), not a hang."""
    from fx100io import errors

    main, nqn, link = two_ports
    main_link = NVMET / "ports" / main / "subsystems" / nqn
    host = fabric_lab.host
    uri = (f"nvme+tcp://{host}:{fabric_lab.port},{host}:{PORT}/{nqn}"
           f"?hostnqn={fabric_lab.allowed_host_nqn}")
    pool = fx100io.BufferPool(1 << 20)
    data, out = pool.alloc(BS), pool.alloc(BS)
    data[:] = chunk_bytes("kmp-all-down", BS)
    result: dict[str, object] = {}

    def read(dev: fx100io.Device) -> None:
        try:
            result["n"] = dev.read_into_blocking(BASE, out)
        except BaseException as e:  # noqa: BLE001 (checked by the test thread)
            result["error"] = e

    def relink() -> None:
        for lk in (main_link, link):
            if not lk.is_symlink():
                lk.symlink_to(NVMET / "subsystems" / nqn)
    try:
        # (ctrl_loss_tmo 8 s: with 4 s, a path relinked 2 s after its loss was seen deleted
        # all the same in one run under TCG)
        with kernel.connect(uri, ctrl_loss_tmo=8, reconnect_delay=1) as ps:
            (path,) = ps.namespaces
            wait_for(lambda: [s["state"] for s in ps.states()] == ["live", "live"], "both live")
            with fx100io.open_device(path) as dev:
                assert dev.write_from_blocking(BASE, data) == BS
                dev.flush_blocking()
                # 1. every path down for less than ctrl_loss_tmo: the read waits, then succeeds
                main_link.unlink()
                link.unlink()
                wait_for(lambda: all(s["state"] != "live" for s in ps.states()), "both down")
                t = threading.Thread(target=read, args=(dev,), daemon=True)
                t.start()
                t.join(1.5)
                assert t.is_alive() and not result, result  # held by the kernel, not failed
                relink()
                t.join(30)
                assert not t.is_alive() and result.get("n") == BS, result
                assert np.array_equal(out, data)
                # 2. every path down past ctrl_loss_tmo: the kernel gives up, the read fails
                # (a path whose reconnects all failed within ctrl_loss_tmo is gone by now)
                wait_for(lambda: any(s["state"] == "live" for s in ps.states()),
                         "a path live again", 60)
                print(f"\nafter every path came back: {ps.states()}")
                result.clear()
                main_link.unlink()
                link.unlink()
                t0 = time.monotonic()
                t = threading.Thread(target=read, args=(dev,), daemon=True)
                t.start()
                t.join(60)
                assert not t.is_alive(), "the read still waits 60 s after every path went"
                failed_after = time.monotonic() - t0
                assert isinstance(result.get("error"), errors.Fx100ioError), (result, ps.states())
                assert failed_after >= 6, failed_after  # not much before ctrl_loss_tmo (8 s)
                print(f"\nevery path down: the read failed after {failed_after:.1f} s: "
                      f"{result['error']!r}")
                wait_for(lambda: ps.live_controllers() == [], "the kernel to delete both")
    finally:
        relink()
    assert mine(nqn) == []

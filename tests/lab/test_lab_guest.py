"""The fabric lab's guest userland: this checkout, its interpreter and the host's RDMA and NVMe
tools running inside the QEMU guest (where soft-RoCE exists), through fabric_lab.guest_run
and guest_python. See tools/fabric_lab/README.md, "Guest userland".
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

import fx100io

pytest_plugins = ["support.lab_fixture"]
pytestmark = pytest.mark.lab

CHECKOUT = Path(__file__).resolve().parents[2]
DEBIAN_DIST_PACKAGES = "/usr/lib/python3/dist-packages"  # Debian's python3-pyverbs


def _pattern(seed: str, size: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


def _needs(*packages: str) -> None:
    """Skip if the host lacks a Debian package the guest userland takes from it (the lab
    installs them when it can; see host_tools.USERLAND_FILES)."""
    from fabric_lab import host_tools

    missing = sorted(set(packages) & set(host_tools.missing_userland_packages()))
    if missing:
        pytest.skip(f"host packages {missing} are missing (apt-get install {' '.join(missing)})")


def _ok(result: tuple[int, str]) -> str:
    status, output = result
    assert status == 0, output
    return output


def test_guest_imports_this_checkout_and_its_extension(fabric_lab):
    out = _ok(fabric_lab.guest_python(
        "import json, sys, numpy, fx100io, fx100io._core as core\n"
        "print(json.dumps([fx100io.__file__, core.__file__, sys.executable, numpy.__version__]))"))
    package, extension, executable, numpy_version = json.loads(out.strip().splitlines()[-1])
    import numpy

    import fx100io._core as core
    # The same files as on the host: this checkout (not another editable install), its built
    # extension, this interpreter and its numpy.
    assert package == fx100io.__file__ == str(CHECKOUT / "fx100io" / "__init__.py")
    assert extension == core.__file__
    assert executable == sys.executable
    assert numpy_version == numpy.__version__


def test_guest_round_trip_on_a_file_device_in_guest_tmp(fabric_lab):
    size = (1 << 20) + 4096 * 3
    expected = hashlib.sha256(_pattern("guest-file", size)).hexdigest()
    code = f"""
import hashlib, os, fx100io
size = {size}
out = bytearray()
counter = 0
while len(out) < size:
    out += hashlib.sha256(f"guest-file:{{counter}}".encode()).digest()
    counter += 1
data = bytes(out[:size])
path = "/tmp/fx100io-guest-round-trip.img"
with fx100io.open_device(path, create=True, size=8 << 20) as dev:
    assert dev.write_from_blocking(4096 * 5, bytearray(data)) == size
    dev.flush_blocking()
    back = bytearray(size)
    assert dev.read_into_blocking(4096 * 5, back) == size
    engine = dev.engine
with open(path, "rb") as f:
    f.seek(4096 * 5)
    on_disk = f.read(size)
print(engine, hashlib.sha256(back).hexdigest(), hashlib.sha256(on_disk).hexdigest())
os.unlink(path)
"""
    engine, read_back, on_disk = _ok(fabric_lab.guest_python(code)).split()[-3:]
    assert read_back == on_disk == expected, engine


def test_guest_output_and_exit_status_come_back_intact(fabric_lab):
    # Long output (more than a pytest run prints), stderr merged, a last line without newline,
    # non-ASCII text, and the exit status.
    status, output = fabric_lab.guest_run(
        "seq 1 5000; echo 'to stderr' >&2; printf 'caf\\303\\251 end'; exit 7")
    assert status == 7
    lines = output.split("\n")
    assert lines[:5000] == [str(i) for i in range(1, 5001)]
    assert lines[5000:] == ["to stderr", "café end"]
    # An argv list runs without a shell: its arguments arrive as they are.
    status, output = fabric_lab.guest_run(["printf", "%s|", "a b", "$HOME", "*"])
    assert (status, output) == (0, "a b|$HOME|*|")
    assert fabric_lab.guest_run("kill -9 $$")[0] == 137


def test_guest_runs_in_the_checkout_with_a_writable_scratch_and_tmp(fabric_lab):
    scratch = fabric_lab.guest_scratch
    payload = _pattern("scratch", 100_000)
    (scratch / "from-host.bin").write_bytes(payload)
    out = _ok(fabric_lab.guest_run(
        f"pwd; cp {scratch}/from-host.bin {scratch}/from-guest.bin && "
        "echo tmp > /tmp/x && cat /tmp/x; touch ./should-not-exist 2>/dev/null || echo read-only"))
    assert out.split() == [str(CHECKOUT), "tmp", "read-only"]
    assert (scratch / "from-guest.bin").read_bytes() == payload
    assert not (CHECKOUT / "should-not-exist").exists()
    assert _ok(fabric_lab.guest_run("pwd", cwd="/usr")).strip() == "/usr"
    (scratch / "from-host.bin").unlink()
    (scratch / "from-guest.bin").unlink()


def test_guest_run_that_outlives_its_timeout_is_killed(fabric_lab):
    from fabric_lab.guest_userland import GuestRunError

    with pytest.raises(GuestRunError, match="timed out"):
        fabric_lab.guest_run("echo started; exec sleep 300", timeout=3)
    status, output = fabric_lab.guest("ps | grep -v grep | grep -c 'sleep 300'")
    assert output.strip() == "0", output


def test_pyverbs_in_the_guest_lists_rxe_with_an_active_port(fabric_lab):
    if not fabric_lab.guest_has_rdma:
        pytest.skip("the lab runs without --rdma (no rxe0 in the guest)")
    _needs("python3-pyverbs", "ibverbs-providers")
    # Debian's python3-pyverbs is built for Python 3.11; this interpreter imports it from
    # Debian's dist-packages when that directory is appended to sys.path.
    out = _ok(fabric_lab.guest_python(
        f"import sys; sys.path.append({DEBIAN_DIST_PACKAGES!r})\n"
        "import pyverbs.device as d, pyverbs.enums as e\n"
        "for dev in d.get_device_list():\n"
        "    ctx = d.Context(name=dev.name.decode())\n"
        "    port = ctx.query_port(1)\n"
        "    print(dev.name.decode(), ctx.query_device().phys_port_cnt,\n"
        "          port.state == e.ibv_port_state.IBV_PORT_ACTIVE)\n"))
    assert "rxe0 1 True" in out.splitlines(), out


def test_nvme_cli_and_fio_work_in_the_guest(fabric_lab):
    _needs("nvme-cli", "fio")
    listing = json.loads(_ok(fabric_lab.guest_run("nvme list -o json")))
    serials = {dev.get("SerialNumber", "").strip() for dev in listing.get("Devices", [])}
    drives = [ns for sub in fabric_lab.subsystems for ns in sub.namespaces if ns.backend == "nvme"]
    if drives:
        assert "fxlab0" in serials, listing  # the lab's QEMU NVMe drive (lab_config serials)
    out = _ok(fabric_lab.guest_run(
        "fio --name=guest --filename=/tmp/fio.img --size=4m --bs=64k --rw=write "
        "--ioengine=psync --verify=crc32c --do_verify=1 --output-format=json && rm /tmp/fio.img"))
    job = json.loads(out[out.index("{"):])["jobs"][0]
    assert job["error"] == 0 and job["write"]["io_bytes"] == 4 << 20


def test_kernel_rdma_initiator_round_trip_from_the_guest_userland(fabric_lab):
    """The guest kernel's nvme-rdma initiator, driven by the host's nvme-cli in the chroot,
    writes a pattern through rxe to the lab's RAM namespace; it reads back equal, and the
    target's RAM disk holds the same bytes."""
    if not fabric_lab.guest_has_rdma:
        pytest.skip("the lab runs without --rdma (no rxe0 in the guest)")
    _needs("nvme-cli")
    sub = fabric_lab.subsystem("lab-ram")
    block = sub.namespaces[0].block_size
    offset_blocks = (250 << 20) // block  # far from where the other lab tests write
    payload = _pattern("kernel-rdma", 1 << 20)
    scratch = fabric_lab.guest_scratch
    (scratch / "rdma-pattern.bin").write_bytes(payload)
    script = f"""
set -e
nqn={sub.nqn}
nvme connect -t rdma -a {fabric_lab.guest_ip} -s {fabric_lab.rdma_port} -n $nqn \\
    -q {fabric_lab.allowed_host_nqn}
trap 'nvme disconnect -n $nqn >/dev/null' EXIT
dev=
for try in $(seq 50); do
    for ctrl in /sys/class/nvme/nvme*; do
        [ "$(cat $ctrl/subsysnqn)" = "$nqn" ] && [ "$(cat $ctrl/transport)" = rdma ] &&
            [ -b /dev/${{ctrl##*/}}n1 ] && dev=/dev/${{ctrl##*/}}n1 && break
    done
    [ -n "$dev" ] && break
    sleep 0.2
done
[ -n "$dev" ] || {{ echo "no rdma namespace appeared"; exit 1; }}
dd if={scratch}/rdma-pattern.bin of=$dev bs={block} seek={offset_blocks} oflag=direct \\
    conv=fsync status=none
dd if=$dev of={scratch}/rdma-back.bin bs={block} skip={offset_blocks} count={len(payload) // block} \\
    iflag=direct status=none
backing=$(cat /sys/kernel/config/nvmet/subsystems/$nqn/namespaces/{sub.namespaces[0].nsid}/device_path)
dd if=$backing of={scratch}/ram-back.bin bs={block} skip={offset_blocks} \\
    count={len(payload) // block} status=none
echo done $dev
"""
    try:
        out = _ok(fabric_lab.guest_run(script, timeout=300))
        assert "done /dev/nvme" in out
        assert (scratch / "rdma-back.bin").read_bytes() == payload
        assert (scratch / "ram-back.bin").read_bytes() == payload
        # Disconnected again: no rdma controller of that subsystem remains.
        status, left = fabric_lab.guest(
            f"for c in /sys/class/nvme/nvme*; do grep -qx {sub.nqn} $c/subsysnqn && "
            "grep -qx rdma $c/transport && echo $c; done; true")
        assert status == 0 and left.strip() == "", left
    finally:
        for name in ("rdma-pattern.bin", "rdma-back.bin", "ram-back.bin"):
            (scratch / name).unlink(missing_ok=True)


@pytest.mark.guest
def test_a_guest_marked_test_runs_in_the_guest(fabric_lab):
    # The body runs in the guest (lab_fixture's pytest_pyfunc_call); the host reports its result.
    assert os.environ.get("FX100IO_LAB_IN_GUEST") == "1"
    assert os.uname().release == fabric_lab.kernel_release  # Debian's backports 6.12, not the host's
    assert (fabric_lab.net, fabric_lab.host) == ("guest", fabric_lab.guest_ip)
    assert fx100io.__file__ == str(CHECKOUT / "fx100io" / "__init__.py")


@pytest.mark.guest
def test_a_guest_marked_test_sees_the_rdma_device_nodes(fabric_lab):
    if not fabric_lab.state.get("rdma"):
        pytest.skip("the lab runs without --rdma (no rxe0 in the guest)")
    assert os.path.exists("/dev/infiniband/uverbs0") and os.path.exists("/dev/infiniband/rdma_cm")
    state = Path("/sys/class/infiniband/rxe0/ports/1/state").read_text()
    assert "ACTIVE" in state


def _kernel_auth_connect(fabric_lab, host: str, secret: str, ctrl_secret: str = "") -> tuple[int, str]:
    """nvme connect from the guest kernel to the lab-auth subsystem over TCP; on success print
    the controller's authentication state and disconnect again."""
    sub = fabric_lab.subsystem("lab-auth")
    ctrl_arg = f"--dhchap-ctrl-secret={ctrl_secret}" if ctrl_secret else ""
    script = f"""
nqn={sub.nqn}
nvme connect -t tcp -a {fabric_lab.guest_ip} -s {fabric_lab.port} -n $nqn -q {host} \\
    --dhchap-secret={secret} {ctrl_arg} || exit 7
trap 'nvme disconnect -n $nqn >/dev/null' EXIT
for c in /sys/class/nvme/nvme*; do
    grep -qx $nqn $c/subsysnqn && echo "connected $(cat $c/state)"
done
"""
    return fabric_lab.guest_run(script, timeout=120)


def test_lab_auth_subsystem_authenticates_the_guest_kernel_initiator(fabric_lab):
    """The lab's host keys work: the guest kernel's initiator authenticates (one-way and
    bidirectional) to the lab-auth subsystem with the configured secrets, is refused with a
    wrong one, and leaves no controller behind either way."""
    _needs("nvme-cli")
    sub = fabric_lab.subsystem("lab-auth")
    assert sub in fabric_lab.auth_subsystems and sub not in fabric_lab.subsystems
    one_way, one_key = next((h, k) for h, k in sub.host_keys.items() if not k.ctrl_key)
    bidir, bidir_key = next((h, k) for h, k in sub.host_keys.items() if k.ctrl_key)
    status, out = _kernel_auth_connect(fabric_lab, one_way, one_key.key)
    assert status == 0 and "connected live" in out, out
    status, out = _kernel_auth_connect(fabric_lab, bidir, bidir_key.key, bidir_key.ctrl_key)
    assert status == 0 and "connected live" in out, out
    # The bidirectional host's secret is the same key bytes but transformed (DHHC-1:01):
    # a wrong secret for the one-way host.
    status, out = _kernel_auth_connect(fabric_lab, one_way, bidir_key.key)
    assert status == 7, out
    status, left = fabric_lab.guest(
        f"for c in /sys/class/nvme/nvme*; do grep -qx {sub.nqn} $c/subsysnqn && echo $c; done; true")
    assert status == 0 and left.strip() == "", left

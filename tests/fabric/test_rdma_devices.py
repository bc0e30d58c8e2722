"""fx100io.rdma_devices and `fx100io rdma-devices`: how pyverbs is found, what is listed,
and what a host without pyverbs or without RDMA devices is told.

Most tests run against a stand-in pyverbs package and a stand-in sysfs tree written
in tmp_path, so they say the same on any host; test_this_host_* check this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fx100io import rdma_devices as rd

REPO = Path(__file__).resolve().parents[2]

FAKE_INIT = """
import os, sys
DIST = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# where our folder stood on sys.path while we were imported
POSITION = sys.path.index(DIST) if DIST in sys.path else None
PATH_LEN = len(sys.path)
"""

FAKE_DEVICE = """
class PyverbsRDMAError(Exception):
    pass

class Device:
    def __init__(self, name, guid, node_type, transport_type):
        self.name, self.guid = name, guid
        self.node_type, self.transport_type = node_type, transport_type

class DeviceAttr:
    phys_port_cnt = 2
    max_qp_rd_atom = 128
    fw_version = b"0.0.1"

class PortAttr:
    def __init__(self, state, link_layer, active_mtu, max_mtu):
        self.state, self.link_layer = state, link_layer
        self.active_mtu, self.max_mtu = active_mtu, max_mtu

DEVICES = None          # None: ibv_get_device_list() fails (no uverbs)
CLOSED = []

def get_device_list():
    if DEVICES is None:
        raise PyverbsRDMAError("Failed to get devices list")
    return [Device(*d) for d in DEVICES]

class Context:
    def __init__(self, name):
        self.name = name
    def query_device(self):
        return DeviceAttr()
    def query_port(self, port):
        return PortAttr(4, 2, 3, 5) if port == 1 else PortAttr(1, 2, 1, 5)
    def query_gid(self, port, index):
        return "fe80:0000:0000:0000:0000:0000:0000:00%02x" % port
    def close(self):
        CLOSED.append(self.name)
"""


@pytest.fixture
def fresh(monkeypatch):
    """rdma_devices with no pyverbs imported yet; sys.modules and sys.path restored after."""
    saved = {k: v for k, v in sys.modules.items() if k == "pyverbs" or k.startswith("pyverbs.")}
    path = list(sys.path)
    for k in saved:
        del sys.modules[k]
    monkeypatch.setattr(rd, "_pyverbs", None)
    monkeypatch.setattr(rd, "_pyverbs_error", None)
    yield rd
    for k in [k for k in sys.modules if k == "pyverbs" or k.startswith("pyverbs.")]:
        del sys.modules[k]
    sys.modules.update(saved)
    sys.path[:] = path


def _fake_dist(tmp_path: Path, device_src: str = FAKE_DEVICE, init_src: str = FAKE_INIT) -> Path:
    dist = tmp_path / "dist-packages"
    (dist / "pyverbs").mkdir(parents=True)
    (dist / "pyverbs" / "__init__.py").write_text(init_src)
    (dist / "pyverbs" / "device.py").write_text(device_src)
    # a module that only Debian's folder has: it must not become importable for us
    (dist / "fx100io_debian_only_probe.py").write_text("X = 1\n")
    return dist


def _no_normal_import(monkeypatch):
    """The normal `import pyverbs` fails, as on an interpreter that sees no pyverbs."""
    real = rd.importlib.import_module
    state = {"first": True}

    def fake(name, *a, **kw):
        if name.startswith("pyverbs") and state["first"]:
            state["first"] = False
            raise ModuleNotFoundError("No module named 'pyverbs'", name="pyverbs")
        return real(name, *a, **kw)
    monkeypatch.setattr(rd.importlib, "import_module", fake)


def _sysfs(tmp_path: Path) -> Path:
    """rxe0's port 1 as a RoCE device bound to eth0 shows it in sysfs."""
    root = tmp_path / "infiniband"
    port = root / "rxe0" / "ports" / "1"
    gids = {0: ("fe80:0000:0000:0000:5054:00ff:fe12:3456", "IB/RoCE v1"),
            1: ("fe80:0000:0000:0000:5054:00ff:fe12:3456", "RoCE v2"),
            2: ("0000:0000:0000:0000:0000:ffff:0a58:0002", "IB/RoCE v1"),
            3: ("0000:0000:0000:0000:0000:ffff:0a58:0002", "RoCE v2"),
            4: ("0000:0000:0000:0000:0000:0000:0000:0000", None)}
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True)
    for i, (gid, typ) in gids.items():
        (port / "gids" / str(i)).write_text(gid + "\n")
        if typ:
            (port / "gid_attrs" / "types" / str(i)).write_text(typ + "\n")
            (port / "gid_attrs" / "ndevs" / str(i)).write_text("eth0\n")
    (root / "rxe0" / "ports" / "2").mkdir(parents=True)
    return root


RXE0 = ("rxe0", 0x505400FFFE123456, 1, 0)


def test_missing_pyverbs_names_the_debian_package(fresh, monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "pyverbs", None)          # `import pyverbs` fails
    monkeypatch.setattr(rd, "DEBIAN_DIST_PACKAGES", str(tmp_path / "nothing-here"))
    with pytest.raises(rd.PyverbsUnavailableError, match="python3-pyverbs") as ei:
        rd.list_devices()
    assert "apt-get install python3-pyverbs" in str(ei.value)
    ok, why = rd.pyverbs_available()
    assert ok is False and "python3-pyverbs" in why
    assert "python3-pyverbs" in (rd.skip_reason() or "")
    assert rd.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fx100io rdma-devices: pyverbs is not available")
    assert "python3-pyverbs" in err


def test_debian_pyverbs_that_does_not_load_says_so(fresh, monkeypatch, tmp_path):
    dist = _fake_dist(tmp_path, device_src="raise ImportError('undefined symbol: _PyFoo')\n")
    monkeypatch.setattr(rd, "DEBIAN_DIST_PACKAGES", str(dist))
    _no_normal_import(monkeypatch)
    with pytest.raises(rd.PyverbsUnavailableError) as ei:
        rd.import_pyverbs()
    msg = str(ei.value)
    assert "does not load in this Python" in msg and "undefined symbol: _PyFoo" in msg
    assert "python3-pyverbs" in msg
    assert str(dist) not in sys.path


def test_debian_pyverbs_is_appended_last_and_only_for_the_import(fresh, monkeypatch, tmp_path):
    dist = _fake_dist(tmp_path)
    monkeypatch.setattr(rd, "DEBIAN_DIST_PACKAGES", str(dist))
    _no_normal_import(monkeypatch)
    pv = rd.import_pyverbs()
    assert pv.__file__ == str(dist / "pyverbs" / "__init__.py")
    assert pv.POSITION == pv.PATH_LEN - 1          # at the END of sys.path while importing
    assert str(dist) not in sys.path               # and gone afterwards
    with pytest.raises(ImportError):
        __import__("fx100io_debian_only_probe")    # Debian's other modules do not leak
    import pyverbs.device  # submodules still import by name
    assert pyverbs.device.__file__ == str(dist / "pyverbs" / "device.py")
    assert rd.pyverbs_available() == (True, f"pyverbs from {dist / 'pyverbs'}")


def test_no_rdma_stack_is_an_empty_list_and_the_cli_says_how_to_add_one(fresh, monkeypatch,
                                                                         tmp_path, capsys):
    dist = _fake_dist(tmp_path)                    # get_device_list() fails: no uverbs
    monkeypatch.setattr(rd, "DEBIAN_DIST_PACKAGES", str(dist))
    monkeypatch.setattr(rd, "SYSFS_INFINIBAND", str(tmp_path / "no-infiniband"))
    _no_normal_import(monkeypatch)
    assert rd.list_devices() == []
    assert rd.main([]) == 0
    assert capsys.readouterr().out == rd.NO_DEVICES + "\n"
    assert rd.NO_DEVICES == ("no RDMA devices (the kernel has no RDMA stack, or no device: for "
                             "soft-RoCE `rdma link add rxe0 type rxe netdev IFACE`)")
    assert rd.main(["-o", "json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out) == [] and cap.err == rd.NO_DEVICES + "\n"
    assert rd.skip_reason() == rd.NO_DEVICES


def test_uverbs_missing_while_sysfs_has_devices_is_an_error(fresh, monkeypatch, tmp_path):
    dist = _fake_dist(tmp_path)
    monkeypatch.setattr(rd, "DEBIAN_DIST_PACKAGES", str(dist))
    _no_normal_import(monkeypatch)
    with pytest.raises(rd.RdmaDeviceError, match="ib_uverbs"):
        rd.list_devices(str(_sysfs(tmp_path)))


def test_devices_ports_gids_and_netdev(fresh, monkeypatch, tmp_path, capsys):
    dist = _fake_dist(tmp_path)
    monkeypatch.setattr(rd, "DEBIAN_DIST_PACKAGES", str(dist))
    _no_normal_import(monkeypatch)
    rd.import_pyverbs()
    import pyverbs.device as fake
    monkeypatch.setattr(fake, "DEVICES", [RXE0])
    root = _sysfs(tmp_path)
    devs = rd.list_devices(str(root))
    assert fake.CLOSED == ["rxe0"]
    assert len(devs) == 1
    d = devs[0]
    assert {k: d[k] for k in ("name", "node_guid", "node_type", "transport", "fw_ver",
                              "max_qp_rd_atom")} == {
        "name": "rxe0", "node_guid": "5054:00ff:fe12:3456", "node_type": "CA",
        "transport": "InfiniBand", "fw_ver": "0.0.1", "max_qp_rd_atom": 128}
    p1, p2 = d["ports"]
    assert {k: v for k, v in p1.items() if k != "gids"} == {
        "port": 1, "state": "ACTIVE", "link_layer": "Ethernet", "active_mtu": 1024,
        "max_mtu": 4096, "gid0": "fe80::5054:ff:fe12:3456", "roce_v2_gid_index": 3,
        "netdev": "eth0"}
    assert [g["index"] for g in p1["gids"]] == [0, 1, 2, 3]      # the all-zero entry left out
    assert p1["gids"][3] == {"index": 3, "gid": "::ffff:10.88.0.2", "type": "RoCE v2",
                             "netdev": "eth0"}
    # port 2 has no sysfs GID table: GID 0 comes from pyverbs, no RoCE v2 index, no netdev
    assert {k: v for k, v in p2.items() if k != "gids"} == {
        "port": 2, "state": "DOWN", "link_layer": "Ethernet", "active_mtu": 256,
        "max_mtu": 4096, "gid0": "fe80::2", "roce_v2_gid_index": None, "netdev": None}
    assert rd.format_normal(devs) == textwrap.dedent("""\
        rxe0: node GUID 5054:00ff:fe12:3456, transport InfiniBand, node type CA, firmware 0.0.1
          port 1: ACTIVE, link layer Ethernet, active MTU 1024, netdev eth0, GID 0 fe80::5054:ff:fe12:3456, RoCE v2 GID index 3
          port 2: DOWN, link layer Ethernet, active MTU 256, netdev -, GID 0 fe80::2""")  # noqa: E501
    monkeypatch.setattr(rd, "SYSFS_INFINIBAND", str(root))
    assert rd.skip_reason() is None
    assert rd.main(["-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == devs


def test_skip_reason_without_an_active_port(fresh, monkeypatch, tmp_path):
    monkeypatch.setattr(rd, "list_devices", lambda: [
        {"name": "rxe0", "ports": [{"port": 1, "state": "DOWN"}]}])
    assert rd.skip_reason() == "no RDMA device has an ACTIVE port (rxe0/1 DOWN)"


def test_roce_v2_gid_index_prefers_the_ipv4_mapped_entry():
    gids = [{"index": 1, "gid": "fe80::1", "type": "RoCE v2"},
            {"index": 5, "gid": "::ffff:10.0.0.1", "type": "RoCE v2"},
            {"index": 4, "gid": "::ffff:10.0.0.1", "type": "IB/RoCE v1"}]
    assert rd.roce_v2_gid_index(gids) == 5
    assert rd.roce_v2_gid_index(gids[:1]) == 1
    assert rd.roce_v2_gid_index(gids[2:]) is None


def _host_has_no_rdma() -> bool:
    return not rd.sysfs_device_names()


@pytest.mark.skipif(not _host_has_no_rdma(), reason="this host has RDMA devices")
def test_this_host_cli_without_rdma_devices():
    ok, why = rd.pyverbs_available()
    p = subprocess.run([sys.executable, "-m", "fx100io", "rdma-devices"], capture_output=True,
                       text=True, cwd=str(REPO), timeout=60,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    if not ok:
        assert p.returncode == 2 and "python3-pyverbs" in p.stderr
        return
    assert rd.list_devices() == []
    assert (p.returncode, p.stdout, p.stderr) == (0, rd.NO_DEVICES + "\n", "")


def test_device_without_userspace_provider_is_listed_with_the_reason(fresh, monkeypatch, tmp_path,
                                                                      capsys):
    dist = _fake_dist(tmp_path)
    monkeypatch.setattr(rd, "DEBIAN_DIST_PACKAGES", str(dist))
    _no_normal_import(monkeypatch)
    rd.import_pyverbs()
    import pyverbs.device as fake
    monkeypatch.setattr(fake, "DEVICES", [])          # libibverbs lists nothing
    root = _sysfs(tmp_path)                           # but the kernel has rxe0
    monkeypatch.setattr(rd, "SYSFS_INFINIBAND", str(root))
    assert rd.list_devices() == [{"name": "rxe0", "ports": [], "error": rd.NO_PROVIDER}]
    assert "ibverbs-providers" in rd.NO_PROVIDER
    assert rd.skip_reason() == f"rxe0: {rd.NO_PROVIDER}"
    assert rd.main([]) == 0
    assert capsys.readouterr().out == f"rxe0: {rd.NO_PROVIDER}\n"


def test_cli_registers_rdma_devices(monkeypatch, capsys):
    from fx100io import cli
    assert cli.main(["--help"]) == 0
    assert "rdma-devices" in capsys.readouterr().out

    def missing():
        raise rd.PyverbsUnavailableError(rd._missing("no module named 'pyverbs'"))
    monkeypatch.setattr(rd, "list_devices", missing)
    assert cli.main(["rdma-devices"]) == 2
    assert "install Debian's python3-pyverbs" in capsys.readouterr().err
    monkeypatch.setattr(rd, "list_devices", lambda: [])
    assert cli.main(["rdma-devices", "-o", "normal"]) == 0
    assert capsys.readouterr().out == rd.NO_DEVICES + "\n"
    with pytest.raises(SystemExit) as ei:
        cli.main(["rdma-devices", "-o", "yaml"])
    assert ei.value.code == 2

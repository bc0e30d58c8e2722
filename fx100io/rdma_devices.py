"""RDMA devices and ports, through pyverbs (`fx100io rdma-devices`).

pyverbs is the Python binding of rdma-core's libibverbs and librdmacm.  fx100io
uses it only where Python needs verbs and not on the data path: to list the
host's RDMA devices and ports, to tell tests why they skip, and for an
independent NVMe/RDMA connect check (tests/support/rdma_cm_check.py).

How pyverbs is found: a normal ``import pyverbs`` first (a virtual environment
or an interpreter that already sees it).  Failing that, Debian's
``python3-pyverbs`` package installs it in /usr/lib/python3/dist-packages,
which an interpreter other than Debian's own python3 does not search; if
pyverbs is there, that folder is appended at the END of ``sys.path`` for that
one import and removed again, so it can never shadow this interpreter's own
packages nor leak Debian's other packages into later imports.  Debian's build
is for CPython 3.11: another Python version gets a clear error saying so.

The port facts pyverbs does not give (the GID table's types and the network
interface each GID belongs to) come from sysfs,
/sys/class/infiniband/<dev>/ports/<n>/{gids,gid_attrs/types,gid_attrs/ndevs}.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import ipaddress
import json
import os
import sys
from typing import Any

from fx100io.errors import Fx100ioError

DEBIAN_DIST_PACKAGES = "/usr/lib/python3/dist-packages"
SYSFS_INFINIBAND = "/sys/class/infiniband"
PACKAGE = "python3-pyverbs"

NO_DEVICES = ("no RDMA devices (the kernel has no RDMA stack, or no device: for soft-RoCE "
              "`rdma link add rxe0 type rxe netdev IFACE`)")

# enum ibv_port_state, ibv_mtu, link layer, ibv_transport_type, ibv_node_type (verbs.h)
PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
MTUS = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
LINK_LAYERS = {0: "unspecified", 1: "InfiniBand", 2: "Ethernet"}
TRANSPORTS = {-1: "unknown", 0: "InfiniBand", 1: "iWARP", 2: "usNIC", 3: "usNIC UDP",
              4: "unspecified"}
NODE_TYPES = {-1: "unknown", 1: "CA", 2: "switch", 3: "router", 4: "RNIC", 5: "usNIC",
              6: "usNIC UDP", 7: "unspecified"}


NO_PROVIDER = ("the kernel has this device but libibverbs does not list it: its userspace "
               "provider is missing (Debian: ibverbs-providers)")


class PyverbsUnavailableError(Fx100ioError):
    """pyverbs cannot be imported: the message names the package to install."""

    def __init__(self, message: str):
        super().__init__(errno.ENOPKG, message)


class RdmaDeviceError(Fx100ioError):
    """The RDMA devices could not be listed or queried."""


_pyverbs: Any = None          # the imported pyverbs package, once found
_pyverbs_error: str | None = None


def _missing(detail: str) -> str:
    return (f"pyverbs is not available ({detail}): install Debian's {PACKAGE} "
            f"(apt-get install {PACKAGE}; fx100io then finds it in {DEBIAN_DIST_PACKAGES})")


def _import_from_debian() -> Any:
    """Import pyverbs from Debian's dist-packages, that folder on sys.path only meanwhile."""
    added = DEBIAN_DIST_PACKAGES not in sys.path
    if added:
        sys.path.append(DEBIAN_DIST_PACKAGES)   # last: never shadows our own packages
    try:
        for name in [m for m in sys.modules if m == "pyverbs" or m.startswith("pyverbs.")]:
            del sys.modules[name]               # a half-imported package from the first try
        importlib.invalidate_caches()
        return importlib.import_module("pyverbs.device")
    finally:
        if added:
            try:
                sys.path.remove(DEBIAN_DIST_PACKAGES)
            except ValueError:
                pass


def import_pyverbs() -> Any:
    """The pyverbs package (its submodules import by name afterwards), or raise
    PyverbsUnavailableError naming the package to install."""
    global _pyverbs, _pyverbs_error
    if _pyverbs is not None:
        return _pyverbs
    if _pyverbs_error is not None:
        raise PyverbsUnavailableError(_pyverbs_error)
    try:
        importlib.import_module("pyverbs.device")
    except ImportError as first:
        debian = os.path.join(DEBIAN_DIST_PACKAGES, "pyverbs", "__init__.py")
        if not os.path.isfile(debian):
            _pyverbs_error = _missing(f"no module named 'pyverbs' ({first})")
            raise PyverbsUnavailableError(_pyverbs_error)
        try:
            _import_from_debian()
        except ImportError as e:
            ver = f"{sys.version_info[0]}.{sys.version_info[1]}"
            _pyverbs_error = _missing(
                f"Debian's pyverbs in {DEBIAN_DIST_PACKAGES} does not load in this Python {ver}, "
                f"Debian builds it for its own python3: {e}")
            raise PyverbsUnavailableError(_pyverbs_error)
    _pyverbs = sys.modules["pyverbs"]
    return _pyverbs


def pyverbs_available() -> tuple[bool, str]:
    """(True, where pyverbs was imported from) or (False, why not)."""
    try:
        pv = import_pyverbs()
    except PyverbsUnavailableError as e:
        return False, str(e)
    return True, f"pyverbs from {os.path.dirname(getattr(pv, '__file__', '') or '?')}"


# ---- sysfs: GID table, GID types and network interfaces -----------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:   # absent, or EINVAL for an unused GID entry's attributes
        return None


def format_gid(raw: str) -> str:
    """sysfs's 'fe80:0000:...:3456' (or any IPv6 text) in its short form."""
    try:
        a = ipaddress.IPv6Address(raw)
    except ValueError:
        return raw
    if a.ipv4_mapped is not None:
        return f"::ffff:{a.ipv4_mapped}"
    return a.compressed


def sysfs_gids(dev: str, port: int, root: str | None = None) -> list[dict[str, Any]]:
    """The port's GID entries that are in use: index, gid, type ('RoCE v2', 'IB/RoCE v1'),
    netdev (None where sysfs does not tell)."""
    base = os.path.join(root or SYSFS_INFINIBAND, dev, "ports", str(port))
    try:
        names = os.listdir(os.path.join(base, "gids"))
    except OSError:
        return []
    out = []
    for idx in sorted(int(n) for n in names if n.isdigit()):
        raw = _read(os.path.join(base, "gids", str(idx)))
        if raw is None:
            continue
        try:
            if int(ipaddress.IPv6Address(raw)) == 0:
                continue                       # an empty table entry
        except ValueError:
            pass
        out.append({"index": idx, "gid": format_gid(raw),
                    "type": _read(os.path.join(base, "gid_attrs", "types", str(idx))),
                    "netdev": _read(os.path.join(base, "gid_attrs", "ndevs", str(idx))) or None})
    return out


def roce_v2_gid_index(gids: list[dict[str, Any]]) -> int | None:
    """The GID index RDMA CM uses for IPv4 over RoCE v2: a 'RoCE v2' entry holding an
    IPv4-mapped address, else the first 'RoCE v2' entry; None without one."""
    v2 = [g for g in gids if (g.get("type") or "").lower() == "roce v2"]
    for g in v2:
        if str(g["gid"]).startswith("::ffff:") and "." in str(g["gid"]):
            return int(g["index"])
    return int(v2[0]["index"]) if v2 else None


def sysfs_device_names(root: str | None = None) -> list[str]:
    try:
        return sorted(os.listdir(root or SYSFS_INFINIBAND))
    except OSError:
        return []


# ---- listing ------------------------------------------------------------------------------


def _guid(value: int) -> str:
    h = f"{value & 0xFFFFFFFFFFFFFFFF:016x}"
    return ":".join(h[i:i + 4] for i in range(0, 16, 4))


def _port(ctx: Any, name: str, port: int, root: str | None) -> dict[str, Any]:
    pa = ctx.query_port(port)
    gids = sysfs_gids(name, port, root)
    gid0: str | None = next((g["gid"] for g in gids if g["index"] == 0), None)
    if gid0 is None:
        try:
            gid0 = format_gid(str(ctx.query_gid(port, 0)))
        except Exception:  # pyverbs raises its own exception classes
            gid0 = None
    netdev = next((g["netdev"] for g in gids if g["netdev"]), None)
    return {
        "port": port,
        "state": PORT_STATES.get(int(pa.state), f"state {pa.state}"),
        "link_layer": LINK_LAYERS.get(int(pa.link_layer), f"link layer {pa.link_layer}"),
        "active_mtu": MTUS.get(int(pa.active_mtu)),
        "max_mtu": MTUS.get(int(pa.max_mtu)),
        "gid0": gid0,
        "roce_v2_gid_index": roce_v2_gid_index(gids),
        "netdev": netdev,
        "gids": gids,
    }


def list_devices(root: str | None = None) -> list[dict[str, Any]]:
    """Every RDMA device with its ports (an empty list on a host without any).
    Raises PyverbsUnavailableError without pyverbs, RdmaDeviceError when a device
    exists but cannot be queried."""
    import_pyverbs()
    device = importlib.import_module("pyverbs.device")
    try:
        devs = device.get_device_list()
    except Exception as e:  # PyverbsRDMAError: ibv_get_device_list() returned NULL
        if not sysfs_device_names(root):
            return []       # no RDMA stack at all (no uverbs): nothing to list
        raise RdmaDeviceError(errno.EIO, f"cannot list RDMA devices ({e}); are the ib_uverbs "
                              "and rdma_ucm modules loaded?") from None
    out = []
    for d in devs:
        name = d.name.decode() if isinstance(d.name, bytes) else str(d.name)
        info: dict[str, Any] = {
            "name": name,
            "node_guid": _guid(int(d.guid)),
            "node_type": NODE_TYPES.get(int(d.node_type), str(d.node_type)),
            "transport": TRANSPORTS.get(int(d.transport_type), str(d.transport_type)),
            "ports": [],
        }
        try:
            ctx = device.Context(name=name)
        except Exception as e:
            raise RdmaDeviceError(errno.EIO, f"cannot open RDMA device {name}: {e}") from None
        try:
            attr = ctx.query_device()
            info["fw_ver"] = (attr.fw_version.decode() if isinstance(attr.fw_version, bytes)
                              else str(attr.fw_version)) or None
            info["max_qp_rd_atom"] = int(attr.max_qp_rd_atom)
            for port in range(1, int(attr.phys_port_cnt) + 1):
                info["ports"].append(_port(ctx, name, port, root))
        except Fx100ioError:
            raise
        except Exception as e:
            raise RdmaDeviceError(errno.EIO, f"cannot query RDMA device {name}: {e}") from None
        finally:
            ctx.close()
        out.append(info)
    listed = {d["name"] for d in out}
    for name in sysfs_device_names(root):
        if name not in listed:   # libibverbs leaves out a device whose provider it lacks
            out.append({"name": name, "ports": [], "error": NO_PROVIDER})
    return out


def skip_reason() -> str | None:
    """None when an RDMA device has an ACTIVE port, else a sentence saying why not
    (for pytest.skip)."""
    try:
        devs = list_devices()
    except Fx100ioError as e:
        return str(e)
    if not devs:
        return NO_DEVICES
    if any(p["state"] == "ACTIVE" for d in devs for p in d["ports"]):
        return None
    broken = [f"{d['name']}: {d['error']}" for d in devs if d.get("error")]
    if broken:
        return "; ".join(broken)
    states = ", ".join(f"{d['name']}/{p['port']} {p['state']}" for d in devs for p in d["ports"])
    return f"no RDMA device has an ACTIVE port ({states or 'no ports'})"


# ---- `fx100io rdma-devices` ---------------------------------------------------------------


def format_normal(devs: list[dict[str, Any]]) -> str:
    if not devs:
        return NO_DEVICES
    lines = []
    for d in devs:
        if d.get("error"):
            lines.append(f"{d['name']}: {d['error']}")
            continue
        lines.append(f"{d['name']}: node GUID {d['node_guid']}, transport {d['transport']}, "
                     f"node type {d['node_type']}"
                     + (f", firmware {d['fw_ver']}" if d.get("fw_ver") else ""))
        for p in d["ports"]:
            mtu = f"{p['active_mtu']}" if p["active_mtu"] else "?"
            v2 = p["roce_v2_gid_index"]
            lines.append(
                f"  port {p['port']}: {p['state']}, link layer {p['link_layer']}, active MTU {mtu}"
                f", netdev {p['netdev'] or '-'}, GID 0 {p['gid0'] or '-'}"
                + (f", RoCE v2 GID index {v2}" if v2 is not None else ""))
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"fx100io rdma-devices: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fx100io rdma-devices",
                description="List the RDMA devices and their ports (state, MTU, GIDs, the "
                "network interface they are bound to), through pyverbs.")
    p.add_argument("-o", "--output", choices=("normal", "json"), default="normal",
                   help="output format (default normal)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        devs = list_devices()
    except PyverbsUnavailableError as e:
        print(f"fx100io rdma-devices: {e}", file=sys.stderr)
        return 2
    if args.output == "json":
        print(json.dumps(devs, indent=2))
        if not devs:
            print(NO_DEVICES, file=sys.stderr)
    else:
        print(format_normal(devs))
    return 0

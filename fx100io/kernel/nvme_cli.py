"""Running nvme-cli (2.x, ``-o json``) and reading what it prints."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import time
from typing import Any

from fx100io.errors import (
    DeviceBusyError,
    DeviceIOError,
    DevicePermissionError,
    Fx100ioError,
    FxTimeoutError,
    KernelSupportError,
    NvmeCliNotFoundError,
)
from fx100io.kernel import sysfs
from fx100io.kernel.sysfs import CTRL_NAME, to_int

NVME_CLI = "nvme"
TRANSPORT_MODULES = {"tcp": "nvme-tcp", "rdma": "nvme-rdma"}


# seconds for one nvme-cli call: past the kernel's own admin command timeout (nvme_core's
# admin_timeout, 60 s), which a connect can sit out (seen once in the lab: an RDMA connect with
# a wrong secret under heavy load); killing nvme-cli earlier could leave a controller that the
# kernel finishes making after the cleanup looked
DEFAULT_TIMEOUT = 120.0


def parse_connect_output(text: str) -> str:
    """The controller name of ``nvme connect -o json``'s ``{"device": "nvme1"}``."""
    start = text.rfind("{")
    try:
        name = json.loads(text[start:])["device"] if start >= 0 else None
    except (ValueError, KeyError, TypeError):
        name = None
    if not isinstance(name, str) or not CTRL_NAME.fullmatch(name):
        raise DeviceIOError(errno.EIO, f"nvme connect printed no controller name: {text.strip()!r}")
    return name


def _subtype(text: str) -> str:
    t = text.lower()
    if "discovery" in t:
        return "discovery"
    if "nvme" in t:
        return "nvme"
    return t


def parse_discover_output(text: str) -> list[dict[str, Any]]:
    """``nvme discover -o json``'s records, with subtype shortened to the userspace
    discover()'s "nvme" / "discovery" (nvme-cli's words kept in subtype_text)."""
    try:
        doc = json.loads(text[text.index("{"):])
        records = doc["records"]
    except (ValueError, KeyError, TypeError):
        raise DeviceIOError(errno.EIO, f"nvme discover printed no discovery log: {text.strip()[:200]!r}") from None
    out = []
    for r in records:
        e = dict(r)
        e["subtype_text"] = r.get("subtype", "")
        e["subtype"] = _subtype(str(r.get("subtype", "")))
        if "portid" in e:
            e["portid"] = to_int(str(e["portid"]), -1)
        out.append(e)
    return out


def parse_list_ns_output(text: str) -> tuple[int, ...]:
    """``nvme list-ns -o json``: ``{"nsid_list": [{"nsid": 1}, ...]}`` -> (1, ...)."""
    doc = json.loads(text[text.index("{"):])
    return tuple(int(e["nsid"]) for e in doc.get("nsid_list", []))


def nvme_cli_path() -> str:
    path = shutil.which(NVME_CLI) if os.sep not in NVME_CLI else NVME_CLI
    if not path or not os.access(path, os.X_OK):
        raise NvmeCliNotFoundError(errno.ENOENT, "nvme-cli is not installed (the `nvme` command "
                                   "was not found on PATH): install the Debian/Ubuntu package "
                                   "nvme-cli (apt-get install nvme-cli; nvme-cli 2.x)")
    return path


def check_kernel(transport: str) -> None:
    """The kernel modules the kernel path needs, named when missing."""
    fabrics = sysfs.DEVDIR / "nvme-fabrics"
    module = TRANSPORT_MODULES[transport]
    if not fabrics.exists():
        raise KernelSupportError(errno.ENODEV, f"{fabrics} is missing: the kernel module "
                                 f"nvme-fabrics is not loaded (modprobe nvme-fabrics {module})")
    if not os.access(fabrics, os.R_OK | os.W_OK):
        raise DevicePermissionError(errno.EACCES, f"{fabrics} is not writable by this user: "
                                    "attaching through the kernel needs root (CAP_SYS_ADMIN)")


def module_loaded(transport: str) -> bool:
    return (sysfs.SYSFS / "module" / TRANSPORT_MODULES[transport].replace("-", "_")).exists()


def run(argv: list[str], timeout: float, what: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "LC_ALL": "C"})
    except subprocess.TimeoutExpired:
        raise FxTimeoutError(errno.ETIMEDOUT, f"nvme {argv[1]} did not finish within "
                             f"{timeout:g} s", what) from None
    except FileNotFoundError:
        raise NvmeCliNotFoundError(errno.ENOENT, "nvme-cli is not installed: install the "
                                   "Debian/Ubuntu package nvme-cli") from None


def delete_controller(name: str, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Detach controller name: nvme-cli, then sysfs delete_controller if it is still there."""
    d = sysfs.SYSFS / "class" / "nvme" / name
    if not d.exists():
        return
    with contextlib.suppress(Fx100ioError):
        run([nvme_cli_path(), "disconnect", "--device", name], timeout, name)
    if d.exists():
        with contextlib.suppress(OSError):
            (d / "delete_controller").write_text("1")
    deadline = time.monotonic() + 5
    while d.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if d.exists():
        raise DeviceBusyError(errno.EBUSY, f"controller {name} could not be detached", name)


def active_nsids(nvme: str, name: str) -> tuple[int, ...] | None:
    """The controller's active namespace list (``nvme list-ns -o json``), None if unknown."""
    try:
        r = run([nvme, "list-ns", str(sysfs.DEVDIR / name), "--output-format=json"], 30, name)
        return parse_list_ns_output(r.stdout) if r.returncode == 0 else None
    except (Fx100ioError, ValueError, KeyError, TypeError):
        return None

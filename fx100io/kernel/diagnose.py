"""Why a connect failed: nvme-cli's words and the kernel's log (/dev/kmsg) made one
clear exception."""

from __future__ import annotations

import errno
import os

from fx100io.errors import (
    DeviceBusyError,
    DeviceIOError,
    DeviceNotFoundError,
    DevicePermissionError,
    Fx100ioError,
    FxConnectionError,
    FxTimeoutError,
    InvalidArgumentError,
    KernelSupportError,
)
from fx100io.kernel import sysfs
from fx100io.kernel.nvme_cli import TRANSPORT_MODULES
from fx100io.kernel.uri_args import Target


class KernelLog:
    """The kernel's messages logged from now on (/dev/kmsg), to tell why a connect failed:
    nvme-cli 2.3 on 6.1 says "Input/output error" alike for a host that is not allowed and
    for a subsystem that does not exist; the kernel's log names the reason."""

    def __init__(self) -> None:
        self._fd = -1
        try:
            self._fd = os.open(sysfs.DEVDIR / "kmsg", os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self._fd, 0, os.SEEK_END)
        except OSError:
            self.close()

    def read(self) -> str:
        lines = []
        while self._fd >= 0:
            try:
                rec = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten records: go on with the next
                    continue
                break
            if not rec:
                break
            # a record is "prio,seq,usec,flags;message\n" and continuation lines that start
            # with a space (key=value pairs)
            for line in rec.decode(errors="replace").splitlines():
                if line and not line.startswith(" "):
                    lines.append(line.split(";", 1)[-1])
        return "\n".join(lines)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1


def classify_connect_failure(t: Target, stderr: str, kmsg: str, module_loaded: bool = True,
                             uri: str = "") -> Fx100ioError:
    """The exception for a failed ``nvme connect``, from nvme-cli's words and the kernel's."""
    where = uri or f"nvme+{t.transport}://{t.traddr}:{t.trsvcid}/{t.subnqn}"
    said = " ".join(stderr.split())
    mine = "\n".join(line for line in kmsg.splitlines()
                     if t.subnqn in line or t.hostnqn in line or "nvme nvme" in line
                     or "no handler found" in line or "auth" in line.lower()
                     or "nvme_fabrics" in line)
    low = mine.lower()
    if "is not allowed" in mine or "not allowed" in low and t.hostnqn in mine:
        e: Fx100ioError = DevicePermissionError(
            errno.EACCES, f"the target does not allow host {t.hostnqn} on this subsystem", where)
    elif "required key not available" in said.lower() or ": no key" in low:
        e = DevicePermissionError(errno.EACCES, f"the target requires DH-HMAC-CHAP "
                                  f"authentication of host {t.hostnqn} and no secret was given "
                                  "(dhchap_secret)", where)
    elif "controller authentication failed" in low:
        e = DevicePermissionError(errno.EACCES, "the controller failed DH-HMAC-CHAP "
                                  "authentication: its reply does not match dhchap_ctrl_secret",
                                  where)
    elif "authentication" in low or "key was rejected" in said.lower():
        e = DevicePermissionError(errno.EACCES, "DH-HMAC-CHAP authentication with the target "
                                  f"failed for host {t.hostnqn} (wrong dhchap_secret?; kernel: "
                                  f"{_last_line(mine, 'auth') or said})", where)
    elif "but different hostid" in mine:
        e = InvalidArgumentError(errno.EINVAL, f"the kernel already knows host {t.hostnqn} with "
                                 f"another host ID than {t.hostid} (kernel: "
                                 f"{_last_line(mine, 'different hostid')}); give that hostid, "
                                 "or leave hostid out to use it", where)
    elif "invalid data parameter" in low and "subsysnqn" in low or "invalid subsystem" in low:
        e = DeviceNotFoundError(errno.ENOENT, f"the target has no subsystem {t.subnqn} (or not "
                                "on this port)", where)
    elif "no handler found for transport" in mine or (not module_loaded and "invalid arg" in said.lower()):
        mod = TRANSPORT_MODULES[t.transport]
        e = KernelSupportError(errno.ENODEV, f"the kernel module {mod} is not loaded "
                               f"(modprobe {mod})", where)
    elif "already connected" in said:
        e = DeviceBusyError(errno.EALREADY, f"host {t.hostnqn} is already connected to this "
                            "subsystem at this address (see fx100io.kernel.list(); disconnect it, "
                            "or pass duplicate_connect=True)", where)
    elif "connection refused" in said.lower() or "failed to connect socket: -111" in mine:
        e = FxConnectionError(errno.ECONNREFUSED, "connection refused: no NVMe-oF port listens "
                              f"at {t.traddr}:{t.trsvcid} ({t.transport})", where)
    elif "failed to open nvme-fabrics" in said.lower() or "failed to open /dev/nvme-fabrics" in said.lower():
        e = KernelSupportError(errno.ENODEV, "cannot open /dev/nvme-fabrics: the kernel module "
                               "nvme-fabrics is not loaded (modprobe nvme-fabrics "
                               f"{TRANSPORT_MODULES[t.transport]})", where)
    elif "invalid arg" in said.lower():
        e = InvalidArgumentError(errno.EINVAL, f"the kernel refused the connect options "
                                 f"(nvme-cli: {said})", where)
    elif ("--tls", "") in t.options and "tls handshake complete, error" in low:
        # (the kernel's word for a handshake tlshd finished and failed; its timeout and the
        # rest fall through to the branches below)
        e = DevicePermissionError(errno.EACCES, "the TLS handshake with the target failed (does "
                                  f"it hold this tls_key for host {t.hostnqn}?; kernel: "
                                  f"{_last_line(mine, 'tls')})", where)
    elif "timed out" in said.lower() or "timeout" in low:
        e = FxTimeoutError(errno.ETIMEDOUT, f"the connect timed out (nvme-cli: {said})", where)
    else:
        why = f"; kernel: {_last_line(mine)}" if mine else (
            " (the kernel log was not readable; a host that is not allowed, a missing subsystem "
            "and a failed authentication all read like this: see dmesg)")
        e = DeviceIOError(errno.EIO, f"nvme connect failed (nvme-cli: {said or 'no message'}){why}",
                          where)
    return e


def _last_line(text: str, needle: str = "") -> str:
    lines = [line for line in text.splitlines() if needle.lower() in line.lower()] or text.splitlines()
    return lines[-1].strip() if lines else ""

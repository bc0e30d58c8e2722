"""The kernel's side of NVMe/TCP TLS for the kernel path: the PSK in the `.nvme` keyring and
the tlshd daemon that does the handshakes (docs/kernel-path.md, "TLS").

Linux's nvme-tcp derives nothing: given `tls_key=<serial>` it hands that key to tlshd, which
offers the key's description as the PSK identity and its payload as the TLS PSK.  So the key
put in `.nvme` is what libnvme (`nvme gen-tls-key --insert`) puts there: a `psk` key named
`NVMe0R0<h> <hostnqn> <subnqn>` holding the TLS PSK derived from the configured key
(fx100io._core.tls_psk, the derivation our own initiator uses).  It is added with add_key(2)
directly (no keyctl, no command line: the key never reaches argv) and stays in `.nvme`, as
nvme-cli's does: the kernel needs it again for every reconnect.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from pathlib import Path

from fx100io.errors import KernelSupportError

# add_key(2) by number: libkeyutils is not a dependency of fx100io
_SYS_ADD_KEY = {"x86_64": 248, "aarch64": 217}
PROC_KEYS = Path("/proc/keys")
PROC = Path("/proc")


def tlshd_running() -> bool:
    """Whether a process named tlshd runs on this host (the kernel's handshake daemon)."""
    for d in PROC.iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == "tlshd":
                    return True
            except OSError:
                continue
    return False


def nvme_keyring(where: str = "") -> int:
    """Serial of the `.nvme` keyring (nvme-keyring.ko's), read from /proc/keys."""
    try:
        lines = PROC_KEYS.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        f = line.split()
        if len(f) >= 9 and f[7] == "keyring" and f[8].rstrip(":") == ".nvme":
            return int(f[0], 16)
    raise KernelSupportError(errno.ENOKEY, "the kernel has no .nvme keyring (the nvme-keyring "
                             "module, CONFIG_NVME_KEYRING): it cannot do NVMe/TCP TLS", where)


def insert_tls_psk(key_text: str, hostnqn: str, subnqn: str, where: str = "") -> int:
    """Put the TLS PSK for (hostnqn, subnqn) from the configured key into `.nvme` (replacing
    one of the same identity, as add_key does) and return its serial."""
    from fx100io import _core  # (the C extension: only the TLS path needs it here)

    identity, psk = _core.tls_psk(key_text, hostnqn, subnqn)
    keyring = nvme_keyring(where)
    nr = _SYS_ADD_KEY.get(platform.machine())
    if nr is None:
        raise KernelSupportError(errno.ENOSYS, f"add_key(2) on {platform.machine()} is not "
                                 "known to fx100io", where)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    buf = ctypes.create_string_buffer(psk, len(psk))
    try:
        serial = libc.syscall(ctypes.c_long(nr), ctypes.c_char_p(b"psk"),
                              ctypes.c_char_p(identity.encode()), buf,
                              ctypes.c_size_t(len(psk)), ctypes.c_int32(keyring))
        err = ctypes.get_errno()
    finally:
        ctypes.memset(buf, 0, len(psk))
    if serial < 0:
        raise KernelSupportError(err, f"cannot add the TLS PSK to the .nvme keyring: "
                                 f"{os.strerror(err)}", where)
    return int(serial)

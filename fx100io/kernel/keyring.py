"""The kernel's side of NVMe/TCP TLS for the kernel path: the PSK in the `.nvme` keyring and
the tlshd daemon that does the handshakes (docs/kernel-path.md, "TLS").

Linux's nvme-tcp derives nothing: given `tls_key=<serial>` it hands that key to tlshd, which
offers the key's description as the PSK identity and its payload as the TLS PSK.  So the key
put in `.nvme` is what libnvme (`nvme gen-tls-key --insert`) puts there: a `psk` key named
`NVMe0R0<h> <hostnqn> <subnqn>` holding the TLS PSK derived from the configured key
(fx100io._core.tls_psk, the derivation our own initiator uses).  It is added with add_key(2)
directly (no keyctl, no command line: the key never reaches argv) and stays in `.nvme`, as
nvme-cli's does: the kernel needs it again for every reconnect.  So a key already there for
the identity is never replaced: reused when it holds the same PSK, refused otherwise.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hmac
import os
import platform
from pathlib import Path
from typing import Any

from fx100io.errors import DeviceBusyError, InvalidArgumentError, KernelSupportError

# add_key(2) and keyctl(2) by number: libkeyutils is not a dependency of fx100io
_SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}
# keyctl operations (linux/keyctl.h)
_KEYCTL_LINK, _KEYCTL_SEARCH, _KEYCTL_READ, _KEYCTL_INVALIDATE = 8, 10, 11, 21
_KEY_SPEC_PROCESS_KEYRING = -2
_PAYLOAD_MAX = 64  # a TLS PSK: 32 (SHA-256) or 48 (SHA-384) bytes
PROC_KEYS = Path("/proc/keys")
PROC = Path("/proc")


def tlshd_running() -> bool:
    """Whether a process named tlshd runs in this network namespace (the kernel hands a
    socket's handshake to the tlshd of the socket's namespace: one elsewhere does not help).
    Whether its config names `.nvme` (keyrings=) cannot be told from here."""
    try:
        here = os.readlink(PROC / "self" / "ns" / "net")
    except OSError:
        here = None
    for d in PROC.iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() != "tlshd":
                    continue
                if here is None or os.readlink(d / "ns" / "net") == here:
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


def _syscalls(where: str) -> tuple[ctypes.CDLL, int, int]:
    """(libc, add_key's number, keyctl's number) on this machine."""
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise KernelSupportError(errno.ENOSYS, f"add_key(2) on {platform.machine()} is not "
                                 "known to fx100io", where)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc, numbers[0], numbers[1]


def _keyctl(libc: ctypes.CDLL, nr: int, op: int, *args: Any) -> tuple[int, int]:
    """keyctl(op, args...): (its result, errno)."""
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(nr), ctypes.c_int(op), *args)
    return int(rc), ctypes.get_errno()


def _installed_key(libc: ctypes.CDLL, nr: int, keyring: int, identity: str) -> int | None:
    """Serial of the psk key `.nvme` holds for identity (KEYCTL_SEARCH), or None."""
    rc, err = _keyctl(libc, nr, _KEYCTL_SEARCH, ctypes.c_int32(keyring), ctypes.c_char_p(b"psk"),
                      ctypes.c_char_p(identity.encode()), ctypes.c_int32(0))
    if rc >= 0:
        return rc
    if err in (errno.ENOKEY, errno.EKEYREVOKED, errno.EKEYEXPIRED):
        return None
    raise KernelSupportError(err, f"cannot search the .nvme keyring: {os.strerror(err)}", "")


def _same_payload(libc: ctypes.CDLL, nr: int, serial: int, psk: bytes) -> bool | None:
    """Whether key serial holds psk (compared in constant time; the buffer wiped), None when
    its payload cannot be read here."""
    buf = ctypes.create_string_buffer(_PAYLOAD_MAX)
    try:
        n, _ = _keyctl(libc, nr, _KEYCTL_READ, ctypes.c_int32(serial), buf,
                       ctypes.c_size_t(_PAYLOAD_MAX))
        if n < 0 or n > _PAYLOAD_MAX:
            return None
        return hmac.compare_digest(ctypes.string_at(buf, n), psk)
    finally:
        ctypes.memset(buf, 0, _PAYLOAD_MAX)


def _derive(key_text: str, hostnqn: str, subnqn: str, where: str) -> tuple[str, bytes]:
    """(identity, TLS PSK) for (hostnqn, subnqn) from the configured key."""
    from fx100io import _core  # (the C extension: only the TLS path needs it here)

    try:
        return _core.tls_psk(key_text, hostnqn, subnqn)
    except ValueError as e:  # (names the NQNs' fault or the key's form, never the key)
        raise InvalidArgumentError(errno.EINVAL, f"cannot derive a TLS PSK: {e}", where) from None


def _lookup(libc: ctypes.CDLL, keyctl: int, keyring: int, identity: str, where: str) -> int | None:
    """Serial of the key `.nvme` holds for identity, or None; `.nvme` is linked into this
    process's own keyring first, since a key in it is readable only by a process that
    possesses it (as tlshd links it into its session keyring); no other process sees the
    link, and it goes with the process."""
    _keyctl(libc, keyctl, _KEYCTL_LINK, ctypes.c_int32(keyring),
            ctypes.c_int32(_KEY_SPEC_PROCESS_KEYRING))
    try:
        return _installed_key(libc, keyctl, keyring, identity)
    except KernelSupportError as e:
        e.target = where
        raise


def serial_holding(key_text: str, hostnqn: str, subnqn: str, where: str = "") -> int | None:
    """Serial of the `.nvme` key of (hostnqn, subnqn) when it holds the PSK derived from the
    configured key; None when there is none, it holds another, or it cannot be read.  (A
    psk key's payload never changes: the key type has no update.)"""
    identity, psk = _derive(key_text, hostnqn, subnqn, where)
    libc, _, keyctl = _syscalls(where)
    found = _lookup(libc, keyctl, nvme_keyring(where), identity, where)
    if found is None or not _same_payload(libc, keyctl, found, psk):
        return None
    return found


def insert_tls_psk(key_text: str, hostnqn: str, subnqn: str, where: str = "") -> tuple[int, bool]:
    """(serial, created) of the `.nvme` key holding the TLS PSK for (hostnqn, subnqn) derived
    from the configured key.  The key is looked up first, as libnvme does: one that holds
    this PSK is reused (another connect of the same identity: a second path, another
    process); one that holds another PSK is refused (DeviceBusyError), since add_key would
    replace it and the kernel could no longer hand its controllers' reconnects their key.
    When its payload cannot be read, that is refused too.  Otherwise the key is added with
    add_key(2) (created True: the caller invalidates it if its connect fails)."""
    identity, psk = _derive(key_text, hostnqn, subnqn, where)
    libc, add_key, keyctl = _syscalls(where)
    keyring = nvme_keyring(where)
    found = _lookup(libc, keyctl, keyring, identity, where)
    if found is not None:
        same = _same_payload(libc, keyctl, found, psk)
        if same:
            return found, False
        why = ("holds another PSK" if same is False
               else "cannot be read here to tell whether it holds this PSK")
        raise DeviceBusyError(errno.EBUSY, f"the .nvme keyring already has a key for the TLS "
                              f"identity {identity!r} (serial {found}), which {why}; it is not "
                              "replaced, since controllers connected with it need it for their "
                              "reconnects: detach them and remove that key first "
                              f"(keyctl invalidate {found})", where)
    buf = ctypes.create_string_buffer(psk, len(psk))
    try:
        ctypes.set_errno(0)
        serial = libc.syscall(ctypes.c_long(add_key), ctypes.c_char_p(b"psk"),
                              ctypes.c_char_p(identity.encode()), buf,
                              ctypes.c_size_t(len(psk)), ctypes.c_int32(keyring))
        err = ctypes.get_errno()
    finally:
        ctypes.memset(buf, 0, len(psk))
    if serial < 0:
        raise KernelSupportError(err, f"cannot add the TLS PSK to the .nvme keyring: "
                                 f"{os.strerror(err)}", where)
    return int(serial), True


def invalidate(serial: int) -> None:
    """Remove a key this process added (a connect that failed with it): gone from every
    keyring at once.  Best effort: a key left behind only holds a PSK nothing uses."""
    with contextlib.suppress(KernelSupportError):
        libc, _, keyctl = _syscalls("")
        _keyctl(libc, keyctl, _KEYCTL_INVALIDATE, ctypes.c_int32(serial))

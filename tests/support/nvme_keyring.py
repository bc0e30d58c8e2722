"""TLS PSKs in the Linux kernel's `.nvme` keyring, put there the way libnvme (nvme-cli's
`gen-tls-key --insert`, nvmetcli) does, for the kernel's NVMe/TCP TLS tests in the lab guest.

The kernel's two sides never derive anything: nvme-tcp (host) looks a PSK up in `.nvme` by
its description, `NVMe0R<hh> <hostnqn> <subnqn>` (6.12's nvme_tls_psk_default: retained
PSKs, hh 02 then 01), and hands its serial to tlshd, which uses the description as the TLS
PSK identity and the payload as the PSK; on the target side tlshd searches its session
keyring (`.nvme` linked in) for the identity the host sent.  So the payload is the TLS PSK
itself, derived from the configured key as the NVMe/TCP transport specification says (the
same derivation as csrc/nvme_tcp/tls_psk.c, written again here in Python so that what the
kernel gets does not come from the code under test):

    retained = HKDF-Expand-Label(HKDF-Extract(0, configured), "HostNQN", hostnqn, len)
    TLS PSK  = HKDF-Expand-Label(HKDF-Extract(0, retained), "nvme-tls-psk", identity, hashlen)

Keys are added with add_key(2) through libkeyutils (tlshd's own dependency), never through
a command line.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import hmac
import struct
import zlib
from pathlib import Path

_HASHES = {1: hashlib.sha256, 2: hashlib.sha384}


def _keyutils() -> ctypes.CDLL:
    lib = ctypes.CDLL("libkeyutils.so.1", use_errno=True)
    lib.add_key.restype = ctypes.c_int32
    lib.add_key.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t,
                            ctypes.c_int32]
    lib.keyctl_invalidate.restype = ctypes.c_long
    lib.keyctl_invalidate.argtypes = [ctypes.c_int32]
    return lib


def parse_configured(text: str) -> tuple[int, bytes]:
    """(hash id, key bytes) of `NVMeTLSkey-1:HH:<base64(key || le32 crc32(key))>:`."""
    prefix, hh, b64, tail = text.split(":")
    assert prefix == "NVMeTLSkey-1" and tail == "", "not a TLS key in the interchange format"
    raw = base64.b64decode(b64)
    key, crc = raw[:-4], struct.unpack("<I", raw[-4:])[0]
    assert zlib.crc32(key) == crc, "TLS key CRC mismatch"
    return int(hh), key


def _expand_label(hash_fn, secret: bytes, label: str, context: bytes, length: int) -> bytes:
    full = b"tls13 " + label.encode()
    info = struct.pack(">H", length) + bytes([len(full)]) + full + bytes([len(context)]) + context
    prk = hmac.new(b"", secret, hash_fn).digest()  # HKDF-Extract(0, secret)
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([i]), hash_fn).digest()
        out += block
        i += 1
    return out[:length]


def tls_psk(configured: str, hostnqn: str, subnqn: str) -> tuple[str, bytes]:
    """(identity, TLS PSK) for a version-0 identity, from a configured key with HH 01/02."""
    hh, key = parse_configured(configured)
    hash_fn = _HASHES[hh]
    identity = f"NVMe0R{hh:02d} {hostnqn} {subnqn}"
    retained = _expand_label(hash_fn, key, "HostNQN", hostnqn.encode(), len(key))
    return identity, _expand_label(hash_fn, retained, "nvme-tls-psk", identity.encode(),
                                   hash_fn().digest_size)


def nvme_keyring() -> int:
    """Serial of the `.nvme` keyring (nvme-keyring.ko's), from /proc/keys."""
    for line in Path("/proc/keys").read_text().splitlines():
        f = line.split()
        if len(f) >= 9 and f[7] == "keyring" and f[8].rstrip(":") == ".nvme":
            return int(f[0], 16)
    raise AssertionError("no .nvme keyring in /proc/keys (is nvme-keyring loaded?)")


def insert_psk(configured: str, hostnqn: str, subnqn: str) -> int:
    """Add the TLS PSK for (hostnqn, subnqn) to `.nvme` as a `psk` key; its serial."""
    identity, psk = tls_psk(configured, hostnqn, subnqn)
    buf = ctypes.create_string_buffer(psk, len(psk))
    serial = _keyutils().add_key(b"psk", identity.encode(), buf, len(psk), nvme_keyring())
    if serial < 0:
        raise OSError(ctypes.get_errno(), f"add_key psk {identity!r}")
    return serial


def remove(serial: int) -> None:
    """Invalidate a key added by insert_psk (it is gone from every keyring at once)."""
    _keyutils().keyctl_invalidate(serial)

"""DH-HMAC-CHAP (NVMe in-band authentication) in plain Python: the
independent reference the C implementation (csrc/auth/auth_crypto.c, on
OpenSSL) is checked against.  Only hashlib, hmac, zlib, base64 and pow();
the RFC 7919 primes are rebuilt from their defining formula, so they do not
come from the library under test.

    secret     "DHHC-1:HH:" + base64(key + le32(crc32(key))) + ":"
    transform  Kt = HMAC_HH(key, nqn + b"NVMe-over-Fabrics")  (HH != 0)
    augmented  Ca = HMAC_H(H(g^xy mod p, padded to p's size), C)
    R1 = HMAC_H(Kt_host, Ca + le32(S1) + le16(T_ID) + SC_C + b"HostHost"
                + hostnqn + b"\\0" + subnqn)
    R2 = HMAC_H(Kt_ctrl, Ca + le32(S2) + le16(T_ID) + SC_C + b"Controller"
                + subnqn + b"\\0" + hostnqn)
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import struct
import zlib

HASHES = {1: "sha256", 2: "sha384", 3: "sha512"}
HASH_LEN = {1: 32, 2: 48, 3: 64}
GROUP_BITS = {1: 2048, 2: 3072, 3: 4096, 4: 6144, 5: 8192}
GROUP_NAMES = {0: "null", 1: "ffdhe2048", 2: "ffdhe3072", 3: "ffdhe4096", 4: "ffdhe6144",
               5: "ffdhe8192"}
# RFC 7919: the X of p = 2^b - 2^(b-64) + (floor(2^(b-130) e) + X) * 2^64 - 1,
# the smallest that makes p a safe prime.
_RFC7919_X = {2048: 560316, 3072: 2625351, 4096: 5736041, 6144: 15705020, 8192: 10965728}


def _e_fixed(bits: int) -> int:
    """floor(e * 2**bits), from the series sum 1/k! in integers."""
    guard = 64
    term = 1 << (bits + guard)
    total = 0
    k = 0
    while term:
        total += term
        k += 1
        term //= k
    return total >> guard


@functools.cache
def ffdhe_prime(dhgid: int) -> int:
    b = GROUP_BITS[dhgid]
    return 2**b - 2**(b - 64) + (_e_fixed(b - 130) + _RFC7919_X[b]) * 2**64 - 1


def dh_len(dhgid: int) -> int:
    return GROUP_BITS[dhgid] // 8 if dhgid else 0


def crc32(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def format_secret(key: bytes, hh: int = 0) -> str:
    blob = key + struct.pack("<I", crc32(key))
    return f"DHHC-1:{hh:02d}:{base64.b64encode(blob).decode()}:"


def parse_secret(text: str) -> tuple[int, bytes]:
    """(HH, key); ValueError on any format error."""
    if not text.startswith("DHHC-1:"):
        raise ValueError("prefix")
    rest = text[len("DHHC-1:"):]
    hh_s, sep, b64 = rest.partition(":")
    if not sep or hh_s not in ("00", "01", "02", "03"):
        raise ValueError("hash field")
    if b64.endswith(":"):
        b64 = b64[:-1]
    if ":" in b64:
        raise ValueError("trailing text")
    blob = base64.b64decode(b64, validate=True)
    if len(blob) not in (36, 52, 68):
        raise ValueError("length")
    key, crc = blob[:-4], struct.unpack("<I", blob[-4:])[0]
    if crc32(key) != crc:
        raise ValueError("crc")
    return int(hh_s), key


def H(hid: int, data: bytes) -> bytes:
    return hashlib.new(HASHES[hid], data).digest()


def HMAC(hid: int, key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, HASHES[hid]).digest()


def transform(key: bytes, hh: int, nqn: str) -> bytes:
    if hh == 0:
        return key
    return HMAC(hh, key, nqn.encode() + b"NVMe-over-Fabrics")


def augmented(hid: int, sess: bytes, chal: bytes) -> bytes:
    return HMAC(hid, H(hid, sess), chal)


def response_mac(role: str, hid: int, tkey: bytes, chal: bytes, seq: int, tid: int, sc_c: int,
                 hostnqn: str, subnqn: str) -> bytes:
    head = struct.pack("<IHB", seq, tid, sc_c)
    if role == "host":
        tail = b"HostHost" + hostnqn.encode() + b"\0" + subnqn.encode()
    else:
        tail = b"Controller" + subnqn.encode() + b"\0" + hostnqn.encode()
    return HMAC(hid, tkey, chal + head + tail)


def response(role: str, hid: int, key: bytes, hh: int, chal: bytes, sess: bytes | None,
             seq: int, tid: int, sc_c: int, hostnqn: str, subnqn: str) -> bytes:
    tkey = transform(key, hh, hostnqn if role == "host" else subnqn)
    c = augmented(hid, sess, chal) if sess else chal
    return response_mac(role, hid, tkey, c, seq, tid, sc_c, hostnqn, subnqn)


def dh_pub(dhgid: int, x: int) -> bytes:
    p = ffdhe_prime(dhgid)
    return pow(2, x, p).to_bytes(dh_len(dhgid), "big")


def dh_shared(dhgid: int, x: int, peer: bytes) -> bytes:
    """g^xy mod p, padded; ValueError when the peer's value is out of range."""
    p = ffdhe_prime(dhgid)
    y = int.from_bytes(peer, "big")
    if not 1 < y < p - 1:
        raise ValueError("DH value out of range")
    return pow(y, x, p).to_bytes(dh_len(dhgid), "big")

"""The host side of DH-HMAC-CHAP in NVMe/TCP, written from the spec with sockets and struct on
the host of tests/support/target_host.py, and the Python reference
(tests/support/dhchap_reference.py) for the math: what the tests of our target's
authentication (tests/target) drive it with."""

from __future__ import annotations

import os
import secrets
import struct

from support import dhchap_reference as ref
from support.target_host import HOST_A, NQN, Host

KEY_A = bytes(range(32))
KEY_B = bytes(range(100, 148))
CTRL_KEY = bytes(range(200, 232)) + bytes(range(32))  # 64 bytes
SECRET_A = ref.format_secret(KEY_A, 1)      # transformed with SHA-256
SECRET_B = ref.format_secret(KEY_B, 0)      # used as is
SECRET_CTRL = ref.format_secret(CTRL_KEY, 3)
WRONG_A = ref.format_secret(bytes(31) + b"\x01", 1)

AUTH_SEND, AUTH_RECV = 0x05, 0x06
SC_AUTH_REQUIRED = 0x91  # SCT 1
DNR = 0x4000
# Failure reason code explanations
RC_FAILED, RC_NOT_USABLE, RC_CONCAT, RC_HASH, RC_DHGROUP, RC_PAYLOAD, RC_MESSAGE = range(1, 8)


# ------------------------------------------------------------ the host side

def auth_cmd(fctype: int, length: int, secp: int = 0xE9, spsp0: int = 1,
             spsp1: int = 1) -> bytearray:
    c = bytearray(64)
    c[0], c[1], c[4] = 0x7F, 0x40, fctype
    c[41], c[42], c[43] = spsp0, spsp1, secp
    struct.pack_into("<I", c, 44, length)
    return c


def send(h: Host, msg: bytes, tl: int | None = None, **kw):
    return h.cmd(auth_cmd(AUTH_SEND, len(msg) if tl is None else tl, **kw), msg)[0]


def receive(h: Host, al: int = 4096, sgl: int | None = None, **kw):
    return h.cmd(auth_cmd(AUTH_RECV, al, **kw), data_in=al if sgl is None else sgl)


def negotiate(tid: int, hashes=(1, 2, 3), groups=(0, 1, 2, 3, 4, 5), sc_c: int = 0,
              napd: int = 1, authid: int = 1) -> bytes:
    d = bytearray(64)
    d[0], d[2], d[3] = authid, len(hashes), len(groups)
    d[4:4 + len(hashes)] = bytes(hashes)
    d[34:34 + len(groups)] = bytes(groups)
    return struct.pack("<BBHHBB", 0, 0, 0, tid, sc_c, napd) + bytes(d)


def parse_challenge(m: bytes) -> dict:
    typ, mid, tid, hl, hashid, dhgid, dhvlen, s1 = struct.unpack_from("<BBxxHBxBBHI", m, 0)
    assert (typ, mid) == (1, 1), m[:16].hex()
    return dict(tid=tid, hl=hl, hash=hashid, group=dhgid, s1=s1, c1=m[16:16 + hl],
                dhv=m[16 + hl:16 + hl + dhvlen])


def failure(m: bytes) -> tuple[int, int] | None:
    """(rescode, rescode_exp) of a Failure1, None for another message."""
    if m[0] == 0 and m[1] == 0xF1:
        return m[6], m[7]
    return None


def reply(tid: int, r1: bytes, s2: int = 0, c2: bytes | None = None, dhv: bytes = b"",
          hl: int | None = None) -> bytes:
    hl = len(r1) if hl is None else hl
    cvalid = 1 if c2 is not None else 0
    c2 = c2 if c2 is not None else bytes(len(r1))
    return struct.pack("<BBHHBBBBHI", 1, 2, 0, tid, hl, 0, cvalid, 0, len(dhv), s2) + r1 + c2 + dhv


def success2(tid: int) -> bytes:
    return struct.pack("<BBHH", 1, 4, 0, tid) + bytes(10)


def authenticate(h: Host, secret: str, hostnqn: str = HOST_A, hashes=(1, 2, 3),
                 groups=(0, 1, 2, 3, 4, 5), ctrl_secret: str | None = None,
                 tid: int = 7) -> dict:
    """The whole transaction from the host's side; returns the challenge
    (hash, group) and, on a Failure1, its reason under 'failure'."""
    assert send(h, negotiate(tid, hashes, groups)).ok
    cqe, m = receive(h)
    assert cqe.ok, cqe
    if failure(m):
        return dict(failure=failure(m))
    ch = parse_challenge(m)
    assert ch["tid"] == tid and ch["hl"] == ref.HASH_LEN[ch["hash"]]
    assert len(ch["c1"]) == ch["hl"] and ch["s1"] != 0
    hh, key = ref.parse_secret(secret)
    sess, dhv = None, b""
    if ch["group"]:
        assert len(ch["dhv"]) == ref.dh_len(ch["group"])
        x = secrets.randbits(256) | 1
        dhv = ref.dh_pub(ch["group"], x)
        sess = ref.dh_shared(ch["group"], x, ch["dhv"])
    else:
        assert ch["dhv"] == b""
    r1 = ref.response("host", ch["hash"], key, hh, ch["c1"], sess, ch["s1"], tid, 0, hostnqn,
                      NQN)
    c2, s2 = None, 0
    if ctrl_secret:
        c2, s2 = os.urandom(ch["hl"]), secrets.randbits(31) + 1
    assert send(h, reply(tid, r1, s2, c2, dhv)).ok
    cqe, m = receive(h)
    assert cqe.ok, cqe
    if failure(m):
        return dict(ch, failure=failure(m))
    typ, mid, rtid, hl, rvalid = struct.unpack_from("<BBxxHBxB", m, 0)
    assert (typ, mid, rtid, hl) == (1, 3, tid, ch["hl"])
    if ctrl_secret:
        assert rvalid == 1
        chh, ckey = ref.parse_secret(ctrl_secret)
        want = ref.response("ctrl", ch["hash"], ckey, chh, c2, sess, s2, tid, 0, hostnqn, NQN)
        assert m[16:16 + hl] == want, "R2 does not match the controller secret"
        assert send(h, success2(tid)).ok
    else:
        assert rvalid == 0
    return ch


def connect(port: int, qid: int = 0, hostnqn: str = HOST_A, cntlid: int = 0xFFFF):
    h = Host(port)
    h.icreq()
    cqe = h.connect(qid, hostnqn=hostnqn, cntlid=cntlid)
    return h, cqe


def refused(cqe) -> bool:
    return (cqe.sct, cqe.sc) == (1, SC_AUTH_REQUIRED) and bool(cqe.status & DNR)


def keyed(start_target, *extra: str):
    return start_target("--dhchap-key", f"{HOST_A}={SECRET_A}", *extra)


def log_of(t) -> str:
    t.log.flush()
    t.log.seek(0)
    return t.log.read().decode(errors="replace")

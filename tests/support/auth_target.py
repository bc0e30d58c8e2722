"""An NVMe/TCP controller that requires DH-HMAC-CHAP, for tests of the
initiator's side (csrc/host/auth_host.c) without the fabric lab.

The controller's side is computed with the pure-Python reference
(tests/support/dhchap_reference.py), independently of fx100io's C code, on top of
tests/support/evil_target.py's control and data path: every queue's Connect answers
ATR, and until the queue authenticated every other command fails with
"Authentication Required".  Scenarios make the controller misbehave in the
ways a broken or hostile one could (HOSTILE), or fail the host the way a
correct one does (a wrong host secret gets AUTH_Failure1).  The Linux
target's side of the same exchange is tests/fabric/test_dhchap_lab.py's.
"""

from __future__ import annotations

import os
import socket
import struct
import threading

from support import dhchap_reference as R
from support.evil_target import F_LAST, F_SUCCESS, EvilTarget, _c2h, _r2t, _rsp

SUBNQN = "nqn.2026-11.io.evil"
ATR, ASCR = 1 << 17, 1 << 18

# challenge and success1 mutations, and the error the host must give
HOSTILE = {
    "challenge-wrong-tid": "transaction id",
    "challenge-unknown-msg": "message type 0x01 id 0x09",
    "challenge-bad-hl": "HL is not the hash function's length",
    "challenge-unknown-hash": "unknown hash function id",
    "challenge-unknown-group": "unknown DH group id",
    "challenge-dhvlen-too-long": "DH value length does not fit the DH group",
    "challenge-null-group-with-value": "DH value length does not fit the DH group",
    "challenge-dh-zero": "public value is out of range",
    "challenge-dh-one": "public value is out of range",
    "challenge-dh-p-minus-1": "public value is out of range",
    "challenge-dh-p": "public value is out of range",
    "challenge-dh-not-in-subgroup": "public value is out of range",
    "success1-wrong-tid": "transaction id",
    "success1-bad-hl": "HL is no hash function's length",
    "success1-other-hl": "differs from the challenge's",
    "negotiate-nvme-error": "AUTH_Send (negotiate) failed with NVMe status 0x4002",
    # the data ends early (allowed, as SPDK's target does) but inside the message
    "challenge-truncated": "truncated message from the target: challenge: C1 and DH value run "
                           "past the message (only 68 bytes arrived)",
    "challenge-no-data": "truncated message from the target: 0 bytes where the "
                         "DH-HMAC-CHAP_Challenge was expected",
}

# How an Authentication Receive's data is delivered: "pad" (all of the allocation
# length, as Linux's target and ours do), "short" (only the message, then a
# CapsuleResp: SPDK's target), "short-success" (only the message, C2HData SUCCESS).
DELIVERY = ("pad", "short", "short-success")


class AuthTarget(EvilTarget):
    """host_secret / ctrl_secret: DHHC-1 texts the controller holds for the
    host (None: a controller without a key for it still asks).  hash_id and
    dhgid: what the controller picks (it must be among the host's offers)."""

    def __init__(self, host_secret: str | None, ctrl_secret: str | None = None, *,
                 hash_id: int = 1, dhgid: int = 0, scenario: str = "good", ascr: bool = False,
                 delivery: str = "pad", **kw: object) -> None:
        assert delivery in DELIVERY, delivery
        self.delivery = delivery
        assert scenario in ("good", "bad-r2", "no-r2", "close-instead-of-failure1",
                            "success1-truncated") or \
            scenario in HOSTILE, scenario
        self.host_key = R.parse_secret(host_secret) if host_secret else None
        self.ctrl_key = R.parse_secret(ctrl_secret) if ctrl_secret else None
        self.hash_id = hash_id
        self.dhgid = dhgid
        self.auth_scenario = scenario
        self.ascr = ascr
        self.events: list[tuple[int, str]] = []  # (qid, what happened)
        self.offers: list[tuple[list[int], list[int]]] = []
        self.conns: list[tuple[int, socket.socket]] = []
        self._ev_lock = threading.Lock()
        # in-capsule data as Linux's nvmet-tcp takes it (16 KiB) unless a test says otherwise
        kw.setdefault("ioccsz", (64 + 16384) // 16)
        super().__init__("good", **kw)  # type: ignore[arg-type]

    def _event(self, qid: int, what: str) -> None:
        with self._ev_lock:
            self.events.append((qid, what))

    def authenticated(self, qid: int | None = None) -> int:
        """How many transactions succeeded (on qid, or on any queue)."""
        return sum(1 for q, e in self.events if e == "authenticated" and qid in (None, q))

    def drop_io(self) -> None:
        """Cut every I/O queue's connection (the host reconnects)."""
        with self._ev_lock:
            conns, self.conns = self.conns, [c for c in self.conns if c[0] == 0]
        for qid, c in conns:
            if qid:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    # ------------------------------------------------------------- hooks

    def _connect_dw0(self, qid: int, data: bytes) -> int:
        st = self._tls.__dict__
        st["auth"] = {"qid": qid, "ok": False, "step": "negotiate",
                      "hostnqn": data[512:768].split(b"\0", 1)[0].decode()}
        return 1 | ATR | (ASCR if self.ascr else 0)

    def _may_serve(self, qid: int | None) -> bool:
        a = self._tls.__dict__.get("auth")
        return qid is None or bool(a and a["ok"])

    def _auth_command(self, c: socket.socket, cid: int, fctype: int, sqe: bytes,
                      incap: bytes) -> bool:
        a = self._tls.auth
        if not any(s is c for _q, s in self.conns):
            with self._ev_lock:
                self.conns.append((a["qid"], c))
        if sqe[43] != 0xE9 or sqe[41] != 1 or sqe[42] != 1:
            c.sendall(_rsp(cid, status=0x4002))
            return True
        length = struct.unpack_from("<I", sqe, 44)[0]
        if fctype == 0x05:
            if incap:
                data = incap[:length]
            elif length <= self.ioccsz * 16 - 64:
                # Linux's nvmet-tcp sends no R2T for a write that fits in the capsule (it
                # waits for the data to come in-capsule): a host that asks hangs there
                self._event(a["qid"], "AUTH_Send without in-capsule data")
                c.sendall(_rsp(cid, status=0x4002))
                return True
            else:
                self.r2t_writes += 1
                c.sendall(_r2t(cid, 1, 0, length))
                data = self._recv_h2c(c, cid, length)
            if self.auth_scenario == "negotiate-nvme-error" and a["step"] == "negotiate":
                c.sendall(_rsp(cid, status=0x4002))
                return True
            self._on_send(a, data)
            c.sendall(_rsp(cid))
        else:
            if a["step"] == "failure1" and self.auth_scenario == "close-instead-of-failure1":
                # what the Linux target's NVMe/RDMA queue can look like to a host: the
                # controller's fatal error tears the queue down before Failure1 goes out
                self._event(a["qid"], "closed instead of failure1")
                return False
            msg = self._on_receive(a)
            # success1-truncated: test_dhchap_host.py asks for it with bidirectional
            # authentication (without R2 all of Success1 is its fixed header)
            cut = self.auth_scenario.endswith(("-truncated", "-no-data")) and \
                msg[1] == (0x01 if self.auth_scenario.startswith("challenge-") else 0x03)
            if cut:  # the message's own header promises more than comes
                msg = msg[:len(msg) - 12] if self.auth_scenario.endswith("-truncated") else b""
            if msg and not cut and self.delivery == "pad":
                msg = msg.ljust(length, b"\0")
            msg = msg[:length]
            if self.delivery == "short-success" and not cut:
                c.sendall(_c2h(cid, msg, flags=F_LAST | F_SUCCESS))
            elif msg:
                c.sendall(_c2h(cid, msg, flags=F_LAST) + _rsp(cid))
            else:
                c.sendall(_rsp(cid))
        return True

    # ------------------------------------------------------- controller

    def _fail(self, a: dict, reason: int) -> None:
        a["step"] = "failure1"
        a["reason"] = reason

    def _on_send(self, a: dict, d: bytes) -> None:
        qid = a["qid"]
        typ, mid = d[0], d[1]
        tid = struct.unpack_from("<H", d, 4)[0]
        if typ == 0 and mid == 0xF0:
            self._event(qid, f"failure2 reason {d[7]:#04x}")
            a["ok"] = False
            a["step"] = "done"
            return
        if typ == 0 and mid == 0x00:
            sc_c, napd = d[6], d[7]
            authid, _r, halen, dhlen = d[8:12]
            ids = d[12:72]
            hashes, groups = list(ids[:halen]), list(ids[30:30 + dhlen])
            self.offers.append((hashes, groups))
            a["tid"] = tid
            if sc_c or napd != 1 or authid != 1:
                return self._fail(a, 0x06)
            if self.hash_id not in hashes:
                return self._fail(a, 0x04)
            if self.dhgid not in groups:
                return self._fail(a, 0x05)
            a["step"] = "challenge"
            return
        if a["step"] == "reply" and typ == 1 and mid == 0x02 and tid == a["tid"]:
            hl, cvalid = d[6], d[8]
            dhvlen, seq = struct.unpack_from("<HI", d, 10)
            r1, c2, dhv = d[16:16 + hl], d[16 + hl:16 + 2 * hl], d[16 + 2 * hl:16 + 2 * hl + dhvlen]
            sess = None
            if self.dhgid:
                try:
                    sess = R.dh_shared(self.dhgid, a["x"], dhv)
                except ValueError:
                    return self._fail(a, 0x06)
            ok = False
            if self.host_key is not None:
                hh, key = self.host_key
                want = R.response("host", self.hash_id, key, hh, a["c1"], sess, a["s1"], tid, 0,
                                  a["hostnqn"], SUBNQN)
                ok = want == r1
            if not ok:
                self._event(qid, "bad r1")
                return self._fail(a, 0x01)
            a["r2"] = None
            if cvalid:
                if self.ctrl_key is None:
                    return self._fail(a, 0x01)
                hh, key = self.ctrl_key
                a["r2"] = R.response("ctrl", self.hash_id, key, hh, c2, sess, seq, tid, 0,
                                     a["hostnqn"], SUBNQN)
            a["step"] = "success1"
            return
        if a["step"] == "success2" and typ == 1 and mid == 0x04 and tid == a["tid"]:
            a["ok"] = True
            a["step"] = "done"
            self._event(qid, "success2")
            self._event(qid, "authenticated")
            return
        self._event(qid, f"unexpected message {typ:#x}/{mid:#x} in step {a['step']}")
        self._fail(a, 0x07)

    def _on_receive(self, a: dict) -> bytes:
        qid, s = a["qid"], self.auth_scenario
        if a["step"] == "challenge":
            hl = R.HASH_LEN[self.hash_id]
            a["s1"] = int.from_bytes(os.urandom(4), "little") or 1
            a["c1"] = os.urandom(hl)
            dhv = b""
            if self.dhgid:
                a["x"] = int.from_bytes(os.urandom(32), "big") | 2
                dhv = R.dh_pub(self.dhgid, a["x"])
            a["step"] = "reply"
            tid, typ, mid, hid, gid = a["tid"], 1, 1, self.hash_id, self.dhgid
            if s == "challenge-wrong-tid":
                tid ^= 0x5A5A
            elif s == "challenge-unknown-msg":
                mid = 0x09
            elif s == "challenge-bad-hl":
                hl = 33
            elif s == "challenge-unknown-hash":
                hid = 7
            elif s == "challenge-unknown-group":
                gid = 9
            elif s == "challenge-null-group-with-value":
                gid, dhv = 0, bytes(range(256))
            elif s.startswith("challenge-dh-") and self.dhgid:
                p, n = R.ffdhe_prime(self.dhgid), R.dh_len(self.dhgid)
                bad = {"zero": 0, "one": 1, "p-minus-1": p - 1, "p": p}.get(s[13:])
                if s == "challenge-dh-not-in-subgroup":
                    bad = next(v for v in range(3, 1000) if pow(v, (p - 1) // 2, p) != 1)
                assert bad is not None
                dhv = bad.to_bytes(n, "big")
            msg = struct.pack("<BBxxHBxBBHI", typ, mid, tid, hl, hid, gid, len(dhv), a["s1"])
            if s == "challenge-dhvlen-too-long":
                msg = msg[:10] + struct.pack("<H", 2 * len(dhv) or 600) + msg[12:]
            return msg + a["c1"][:hl].ljust(hl, b"\0") + dhv
        if a["step"] == "success1":
            hl = R.HASH_LEN[self.hash_id]
            r2 = a["r2"]
            tid = a["tid"] ^ (0x5A5A if s == "success1-wrong-tid" else 0)
            if s == "success1-bad-hl":
                hl = 40
            elif s == "success1-other-hl":
                hl = 64 if hl != 64 else 32
            if r2 is not None and s == "bad-r2":
                r2 = bytes([r2[0] ^ 1]) + r2[1:]
            rvalid = 1 if r2 is not None and s != "no-r2" else 0
            if r2 is None:
                a["ok"] = True
                a["step"] = "done"
                self._event(qid, "authenticated")
            else:
                a["step"] = "success2"
            return struct.pack("<BBxxHBxB7x", 1, 3, tid, hl, rvalid) + \
                (r2 if rvalid else b"")
        reason = a.get("reason", 0x01)
        a["step"] = "done"
        self._event(qid, f"failure1 reason {reason:#04x}")
        return struct.pack("<BBxxHBB", 0, 0xF1, a.get("tid", 0), 1, reason)

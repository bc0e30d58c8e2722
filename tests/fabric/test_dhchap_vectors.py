"""DH-HMAC-CHAP crypto in C (csrc/auth/auth_crypto.c, on OpenSSL) against
the pure-Python reference (tests/support/dhchap_reference.py) on random inputs:
secret parsing (incl. secrets made by the real nvme-cli when it is
installed), key transform, hashes, HMAC, augmented challenge, both response
MACs, and finite-field DH in every RFC 7919 group.  The C side runs as
tests/c/build/auth_vectors, one command per line."""

from __future__ import annotations

import base64
import random
import shutil
import struct
import subprocess

import pytest
from support import REPO
from support import dhchap_reference as R

HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100"
SUBNQN = "nqn.2026-01.io.fx100io:vectors"


@pytest.fixture(scope="module")
def cvec():
    if shutil.which("make") is None or shutil.which("gcc") is None:
        pytest.skip("make/gcc not installed")
    p = subprocess.run(["make", "-s", "-C", str(REPO / "tests" / "c"), "build/auth_vectors"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    proc = subprocess.Popen([str(REPO / "tests" / "c" / "build" / "auth_vectors")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(line: str) -> str:
        assert proc.stdin and proc.stdout
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        return proc.stdout.readline().rstrip("\n")

    yield ask
    assert proc.stdin
    proc.stdin.close()
    proc.wait(timeout=30)


def test_primes_are_rfc7919():
    # the formula's X gives a safe prime with top and bottom 64 bits set
    for gid in range(1, 6):
        p = R.ffdhe_prime(gid)
        b = R.GROUP_BITS[gid]
        assert p.bit_length() == b
        assert p >> (b - 64) == 2**64 - 1 and p & (2**64 - 1) == 2**64 - 1
        assert pow(3, p - 1, p) == 1
        assert pow(2, (p - 1) // 2, p) == 1  # 2 generates the order-q subgroup
    # ffdhe2048 as printed in RFC 7919 appendix A.1, first and last words
    p = R.ffdhe_prime(1)
    assert p.to_bytes(256, "big")[:16].hex() == "ffffffffffffffffadf85458a2bb4a9a"
    assert p.to_bytes(256, "big")[-16:].hex() == "886b423861285c97ffffffffffffffff"


def test_parse_random_secrets(cvec):
    rng = random.Random(11)
    for n in (32, 48, 64):
        for hh in range(4):
            for _ in range(20):
                key = rng.randbytes(n)
                text = R.format_secret(key, hh)
                assert cvec(f"parse {text}") == f"ok {hh:02d} {key.hex()}"
                assert cvec(f"parse {text[:-1]}") == f"ok {hh:02d} {key.hex()}"


def test_parse_rejects(cvec):
    rng = random.Random(12)
    key = rng.randbytes(48)
    good = R.format_secret(key, 2)
    # a bad CRC, in any position
    for i in range(10, len(good) - 3):
        c = good[i]
        t = good[:i] + ("A" if c != "A" else "B") + good[i + 1:]
        try:
            R.parse_secret(t)
            ok_py = True
        except ValueError:
            ok_py = False
        ans = cvec(f"parse {t}")
        assert ans.startswith("ok") == ok_py, (t, ans)
        assert key.hex() not in ans and t[10:-1] not in ans
    for n in (0, 16, 31, 33, 47, 49, 63, 65, 96):
        blob = rng.randbytes(n)
        t = "DHHC-1:00:" + base64.b64encode(blob + struct.pack("<I", R.crc32(blob))).decode() + ":"
        assert cvec(f"parse {t}").startswith("err "), n
    for t in ("DHHC-1:04:" + good[10:], "DHHC-1:" + good[10:], "DHHC-2:" + good[7:],
              good[:-1] + "::", good + "x", good.replace("+", "-").replace("/", "_") + "!"):
        assert cvec(f"parse {t}").startswith("err "), t


@pytest.mark.skipif(shutil.which("nvme") is None, reason="nvme-cli not installed")
def test_parse_nvme_cli_secrets(cvec):
    for hh, n in ((0, 32), (0, 48), (0, 64), (1, 32), (2, 48), (3, 64)):
        p = subprocess.run(["nvme", "gen-dhchap-key", "-m", str(hh), "-l", str(n), "-n", HOSTNQN],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        text = p.stdout.strip()
        ref_hh, key = R.parse_secret(text)
        assert (ref_hh, len(key)) == (hh, n)
        assert cvec(f"parse {text}") == f"ok {hh:02d} {key.hex()}"


def test_transform_hash_hmac(cvec):
    rng = random.Random(13)
    for hh in range(4):
        for n in (32, 48, 64):
            key = rng.randbytes(n)
            nqn = f"nqn.2014-08.org.example:{rng.randrange(10**9)}"
            assert cvec(f"transform {hh} {key.hex()} {nqn}") == R.transform(key, hh, nqn).hex()
    for hid in (1, 2, 3):
        for n in (1, 55, 64, 200):
            data = rng.randbytes(n)
            assert cvec(f"hash {hid} {data.hex()}") == R.H(hid, data).hex()
            key = rng.randbytes(rng.choice((1, 32, 100, 200)))
            assert cvec(f"hmac {hid} {key.hex()} {data.hex()}") == R.HMAC(hid, key, data).hex()


def test_augmented_challenge(cvec):
    rng = random.Random(14)
    for hid in (1, 2, 3):
        for glen in (256, 384, 512, 768, 1024):
            sess = rng.randbytes(glen)
            chal = rng.randbytes(R.HASH_LEN[hid])
            assert cvec(f"aug {hid} {sess.hex()} {chal.hex()}") == R.augmented(hid, sess, chal).hex()


@pytest.mark.parametrize("role", ["host", "ctrl"])
def test_responses(cvec, role):
    rng = random.Random(15 if role == "host" else 16)
    for hid in (1, 2, 3):
        for hh in range(4):
            for dh in (False, True):
                key = rng.randbytes(rng.choice((32, 48, 64)))
                chal = rng.randbytes(R.HASH_LEN[hid])
                sess = rng.randbytes(256) if dh else None
                seq = rng.randrange(2**32)
                tid = rng.randrange(2**16)
                want = R.response(role, hid, key, hh, chal, sess, seq, tid, 0, HOSTNQN, SUBNQN)
                got = cvec(f"response {role} {hid} {hh} {key.hex()} {chal.hex()} "
                           f"{sess.hex() if sess else '-'} {seq} {tid} 0 {HOSTNQN} {SUBNQN}")
                assert got == want.hex()


@pytest.mark.parametrize("gid", [1, 2, 3, 4, 5])
def test_dh(cvec, gid):
    rng = random.Random(100 + gid)
    p = R.ffdhe_prime(gid)
    n = R.dh_len(gid)
    for _ in range(2):
        x = rng.randrange(2, 2**256)
        y = rng.randrange(2, 2**256)
        peer = R.dh_pub(gid, y)
        pub, shared = cvec(f"dh {gid} {x.to_bytes(32, 'big').hex()} {peer.hex()}").split()
        assert pub == R.dh_pub(gid, x).hex()
        assert shared == R.dh_shared(gid, x, peer).hex()
        assert len(bytes.fromhex(shared)) == n
    # a shared secret with leading zero bytes stays padded to p's size
    x = 3
    for k in range(2, 10**6):
        peer_int = pow(2, k, p)
        if pow(peer_int, x, p) < 2 ** (8 * n - 8):
            break
    peer = peer_int.to_bytes(n, "big")
    pub, shared = cvec(f"dh {gid} 03 {peer.hex()}").split()
    assert shared == R.dh_shared(gid, x, peer).hex() and shared.startswith("00")
    # hostile peer values: 0, 1, p-1, p, 2^b-1, and one byte too long
    for bad in (0, 1, p - 1, p, 2 ** (8 * n) - 1):
        assert cvec(f"dh {gid} 05 {bad.to_bytes(n, 'big').hex()}") == "err -71"
    assert cvec(f"dh {gid} 05 00{peer.hex()}") == "err -71"
    # a value outside the prime-order subgroup (a quadratic non-residue)
    for cand in range(3, 200):
        if pow(cand, (p - 1) // 2, p) != 1:
            assert cvec(f"dh {gid} 05 {cand.to_bytes(n, 'big').hex()}") == "err -71"
            break

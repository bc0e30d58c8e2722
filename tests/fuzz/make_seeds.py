"""Write the seed inputs of the fuzzers into tests/fuzz/corpus/<name>/, made
by the real producers: index segments by fx100io's own encoder, target
strings by fx100io.fabric_uri, discovery logs as a controller sends them.

Run from the repository root with fx100io built in place:
    python3 tests/fuzz/make_seeds.py
Seeds are named seed-*; regression inputs from crashes (crash-*) are left
alone.  Input layouts are described at the top of each fuzz_<name>.c.
"""

from __future__ import annotations

import pathlib
import struct
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from fx100io import _core, fabric_uri  # noqa: E402

GEN = 0x0123456789ABCDEF
PUT, DEL = _core.REC_PUT, _core.REC_DEL


def auth_host_seeds() -> dict[str, bytes]:
    """fuzz_auth_host: a controller's challenge and success1 as the Python
    reference (tests/support/dhchap_reference.py) makes them."""
    sys.path.insert(0, str(HERE.parent / "support"))
    import dhchap_reference as R

    def challenge(hid: int, gid: int, x: int = 0x1234567) -> bytes:
        hl = R.HASH_LEN[hid]
        dhv = R.dh_pub(gid, x) if gid else b""
        return struct.pack("<BBxxHBxBBHI", 1, 1, 0, hl, hid, gid, len(dhv), 77) + \
            bytes(range(hl)) + dhv

    def success1(hl: int, r2: bytes = b"") -> bytes:
        return struct.pack("<BBxxHBxB7x", 1, 3, 0, hl, 1 if r2 else 0) + r2

    def inp(flags: int, *msgs: bytes) -> bytes:
        return bytes([flags]) + b"".join(struct.pack("<H", len(m)) + m for m in msgs)

    failure1 = struct.pack("<BBxxHBB", 0, 0xF1, 0, 1, 1)
    return {
        "sha256-null": inp(8, challenge(1, 0), success1(32)),
        "sha384-ffdhe2048": inp(8, challenge(2, 1), success1(48)),
        "sha512-ffdhe3072-bidir": inp(8 | 4, challenge(3, 2), success1(64, bytes(64))),
        "failure1-at-challenge": inp(8, failure1),
        "failure1-at-success1": inp(8, challenge(1, 0), failure1),
        "wrong-tid": inp(0, challenge(1, 0), success1(32)),
        "ascr": inp(1),
        "no-atr": inp(2),
        "send-fails": inp(8 | 16 | (2 << 5), challenge(1, 0), success1(32)),
        # bit 5: the data ends at the message (SPDK's form); then a challenge cut short
        "short-data": inp(8 | 32, challenge(1, 0), success1(32)),
        "short-data-cut-challenge": inp(8 | 32, challenge(1, 0)[:20]),
    }


def write(name: str, seeds: dict[str, bytes]) -> None:
    d = HERE / "corpus" / name
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob("seed-*"):
        old.unlink()
    for label, data in seeds.items():
        (d / f"seed-{label}").write_bytes(data)
    print(f"corpus/{name}: {len(seeds)} seeds")


def pad(b: bytes, bs: int) -> bytes:
    return b + bytes(-len(b) % bs)


def index_seeds() -> dict[str, bytes]:
    # ctl: bit 0 fix CRCs, bits 1-2 block size (8, 64, 512, 4096)
    def rec(i: int, key_len: int, typ: int = PUT) -> tuple:
        key = (b"chunk-%d-" % i).ljust(key_len, b"k")[:key_len]
        return (typ, key, i % 3, 4096 * i, 65536 + i, 0xDEADBEEF ^ i)

    def seg(seq: int, recs: list, gen: int = GEN) -> bytes:
        return _core.encode_segment(gen, seq, recs)

    def log(ctl: int, segs: list[bytes], gen: int = GEN) -> bytes:
        bs = (8, 64, 512, 4096)[(ctl >> 1) & 3]
        return bytes([ctl]) + struct.pack("<Q", gen) + b"".join(pad(s, bs) for s in segs)

    three = [seg(1, [rec(1, 7)]), seg(2, [rec(2, 16), rec(3, 1, DEL)]), seg(3, [rec(4, 33)])]
    torn = bytearray(seg(5, [rec(5, 9)]))
    torn[-1] ^= 1  # a torn write: CRC mismatch
    bad_keylen = bytearray(seg(1, [rec(1, 8)]))
    bad_keylen[64 + 2] = 0  # key_len 0, fixed up by ctl bit 0
    return {
        "chain-bs8": log(0, three),
        "chain-bs64": log(2, three),
        "chain-bs512-fixcrc": log(5, three),
        "empty-segment": log(0, [seg(7, [])]),
        "key-max": log(2, [seg(1, [rec(1, 1024), rec(2, 1023, DEL)])]),
        "many-records": log(0, [seg(1, [rec(i, 1 + i % 40) for i in range(300)])]),
        "torn-tail": log(0, three + [bytes(torn)]),
        "stale-after-tail": log(0, three[:2] + [seg(9, [rec(9, 5)])]),
        "other-generation": log(0, [seg(1, [rec(1, 4)], GEN + 1)]),
        "bad-keylen-fixcrc": log(1, [bytes(bad_keylen)]),
        "bs4096": log(6, three[:1]),
    }


def disc_entry(i: int, *, trsvcid: bytes = b"4420", traddr: bytes = b"192.0.2.1",
               subnqn: bytes | None = None, subtype: int = 2) -> bytes:
    subnqn = subnqn if subnqn is not None else b"nqn.2014-08.io.fx100:sub%d" % i
    e = struct.pack("<BBBBHHHH", 3, 1, subtype, 0, i, 0xFFFF, 32, 0) + bytes(20)
    e += trsvcid.ljust(32, b"\0")[:32] + bytes(192)
    e += subnqn.ljust(256, b"\0")[:256] + traddr.ljust(256, b"\0")[:256] + bytes(256)
    assert len(e) == 1024
    return e


def disc_log(genctr: int, entries: list[bytes], numrec: int | None = None,
             recfmt: int = 0) -> bytes:
    n = len(entries) if numrec is None else numrec
    return struct.pack("<QQH", genctr, n, recfmt).ljust(1024, b"\0") + b"".join(entries)


def discovery_seeds() -> dict[str, bytes]:
    serve = bytes(8)
    two = [disc_entry(0), disc_entry(1, subtype=3, subnqn=b"nqn.2014-08.org.nvmexpress.discovery")]
    full = [disc_entry(0, trsvcid=b"4" * 32, traddr=b"a" * 256, subnqn=b"n" * 256)]
    return {
        "empty": serve + disc_log(1, []),
        "two": serve + disc_log(7, two),
        "unterminated-strings": serve + disc_log(1, full),
        "numrec-past-data": serve + disc_log(1, two, numrec=40),
        "numrec-too-many": serve + disc_log(1, two, numrec=5000),
        "recfmt-1": serve + disc_log(1, two, recfmt=1),
        "genctr-moves-once": bytes([0, 2, 0, 0, 0, 0, 0, 0]) + disc_log(3, two),
        "never-settles": bytes([2] * 8) + disc_log(3, two),
        "numrec-changes": bytes([0, 3 | (5 << 2), 0, 0, 0, 0, 0, 0]) + disc_log(3, two),
        "read-fails": bytes([0, 1, 0, 0, 0, 0, 0, 0]) + disc_log(3, two),
    }


def uri_seeds() -> dict[str, bytes]:
    hostid = "00112233445566778899aabbccddeeff"
    uris = {
        "plain": "nvme+tcp://192.0.2.1:4420/nqn.2014-08.io.fx100:sub0",
        "ipv6": "nvme+tcp://[fe80::1]/nqn.2014-08.io.fx100:sub0?ns=2&queues=4",
        "all-options": ("nvme+tcp://target.example:4421/nqn.2014-08.io.fx100:sub0?ns=3&queues=64"
                        "&hdgst=1&ddgst=true&kato_ms=0&connect_timeout_ms=3000"
                        "&io_timeout_ms=1000&max_xfer=131072"),
    }
    # the same host identity on every machine
    me = f"hostnqn=nqn.2014-08.io.fx100:h&hostid={hostid}"
    seeds = {k: fabric_uri.to_transport_target(v + ("&" if "?" in v else "?") + me).encode()
             for k, v in uris.items()}
    seeds["no-subnqn"] = b"host=h\nport=4420\nhostnqn=nqn.x"
    seeds["junk-lines"] = b"host=h\n\nport=1\nnoequals\nsubnqn=s\nhostnqn=n\nqueues=65"
    seeds["hostid-not-hex"] = b"host=h\nport=1\nsubnqn=s\nhostnqn=n\nhostid=" + b"zz" * 16
    return seeds


if __name__ == "__main__":
    write("index", index_seeds())
    write("discovery", discovery_seeds())
    write("uri", uri_seeds())
    write("auth_host", auth_host_seeds())

"""One host of a shared pool, as its own process, driven by JSON lines on
stdin (tests/shared/test_shared_store*.py start several).  Every value embeds its
key and a tag and is otherwise derived from them, so the host checks each
chunk it reads itself: right bytes, or a miss, never anything else.

Commands: {"op": "put", "keys": [...], "tag": t, "size": n},
{"op": "get", "keys": [...]} -> {"found": [tag | null]} (a wrong value is
reported as {"wrong": ...}), {"op": "exists"|"delete"|"stats"|"quit"}, {"op": "open", "uris": [...],
"index": url, "opts": {...}} (another pool; a host started with "" has none),
{"op": "put_loop", ...}: put batches forever, printing each before and after.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import signal
import sys
import time
import traceback

import numpy as np

MAX = 1 << 21


def make_value(key: str, tag: str, size: int) -> np.ndarray:
    ident = f"{key}#{tag}#{size}#".encode()
    n = max(size, len(ident))
    seed = int.from_bytes(hashlib.blake2b(ident, digest_size=8).digest(), "little")
    out = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    out[:len(ident)] = np.frombuffer(ident, np.uint8)
    return out


def check_value(key: str, buf: np.ndarray) -> str:
    """The tag of a value read back into buf; raises if the bytes are not a
    value that a put of key wrote."""
    head = buf[:2048].tobytes()
    parts = head.split(b"#", 3)
    try:
        k, tag, size = parts[0].decode(), parts[1].decode(), int(parts[2])
    except (IndexError, ValueError, UnicodeDecodeError):
        raise AssertionError(f"wrong bytes under {key!r}: {head[:40]!r}") from None
    want = make_value(k, tag, size)
    if k != key or not np.array_equal(want, buf[:len(want)]):
        raise AssertionError(f"wrong bytes under {key!r} (tag {tag!r}, {size} bytes)")
    return tag


def main() -> None:
    faulthandler.register(signal.SIGUSR1)  # a test that waits too long asks where we are
    sys.path.insert(0, ".")
    import fx100io
    from fx100io.store.shared import SharedChunkStore
    uris, index, opts = sys.argv[1].split(","), sys.argv[2], json.loads(sys.argv[3])
    st = SharedChunkStore(uris, index, **opts) if uris != [""] else None
    buf = np.zeros(MAX, np.uint8)

    def reply(**kw: object) -> None:
        sys.stdout.write(json.dumps(kw) + "\n")
        sys.stdout.flush()

    reply(ready=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "quit":
                break
            if op == "open":  # another pool, for the next example of a model test
                if st is not None:
                    st.close()
                st = SharedChunkStore(cmd["uris"], cmd["index"], **cmd["opts"])
                reply(ok=True)
            elif op == "put":
                st.batch_put_blocking(cmd["keys"], [make_value(k, cmd["tag"], cmd["size"])
                                                    for k in cmd["keys"]])
                reply(ok=True)
            elif op == "get":
                found = []
                for k in cmd["keys"]:
                    buf[:] = 0
                    (hit,) = st.batch_get_blocking([k], [buf])
                    found.append(check_value(k, buf) if hit else None)
                reply(found=found)
            elif op == "exists":
                reply(n=st.batch_exists_blocking(cmd["keys"]))
            elif op == "delete":
                reply(ok=st.delete_blocking(cmd["key"]))
            elif op == "stats":
                reply(stats={k: v for k, v in st.stats().items() if k != "devices"})
            elif op == "put_loop":
                put_loop(st, cmd, reply)
            elif op == "get_loop":
                get_loop(st, cmd, buf, reply)
        except AssertionError as e:
            reply(wrong=str(e))
        except fx100io.errors.Fx100ioError as e:
            reply(err=type(e).__name__, msg=str(e))
        except Exception as e:  # noqa: BLE001
            reply(err=type(e).__name__, msg=traceback.format_exc())
    if st is not None:
        st.close()


def put_loop(st: object, cmd: dict, reply: object) -> None:
    keys, size, tag = cmd["keys"], cmd["size"], cmd["tag"]
    i = 0
    # seconds: stop once that long has passed (whatever count says)
    deadline = time.monotonic() + cmd.get("seconds", float("inf"))
    while (cmd.get("count") is None or i < cmd["count"]) and time.monotonic() < deadline:
        batch = [keys[(i * 3 + j) % len(keys)] for j in range(cmd.get("batch", 2))]
        batch = list(dict.fromkeys(batch))
        t = f"{tag}-{i}"
        reply(trying=i, keys=batch, tag=t)  # type: ignore[operator]
        try:
            st.batch_put_blocking(batch, [make_value(k, t, size) for k in batch])  # type: ignore[attr-defined]
            reply(acked=i, keys=batch, tag=t)  # type: ignore[operator]
        except OSError as e:
            reply(failed=i, err=type(e).__name__)  # type: ignore[operator]
            time.sleep(0.05)
        i += 1
    reply(done=True)  # type: ignore[operator]


def get_loop(st: object, cmd: dict, buf: np.ndarray, reply: object) -> None:
    keys = cmd["keys"]
    hits = misses = 0
    deadline = time.time() + cmd["seconds"]
    while time.time() < deadline:
        for k in keys:
            buf[:cmd["size"] + 64] = 0
            if st.batch_get_blocking([k], [buf])[0]:  # type: ignore[attr-defined]
                check_value(k, buf)
                hits += 1
            else:
                misses += 1
    reply(hits=hits, misses=misses)  # type: ignore[operator]


if __name__ == "__main__":
    main()

"""A chunk whose DEL commit fails stays the store's, also across a crash,
and only where nothing newer of its key happened meanwhile;
even when another commit compacted the index while that DEL was pending:
the compaction must not drop a chunk that is only on its way out.

The race is forced: the DEL's commit first runs a compaction (standing for
another batch's commit that folded into one), then fails.  The store then
"crashes" (the child exits without closing) and a new process opens it."""

from __future__ import annotations

import pytest
from support import run_python

SETUP = r"""
import asyncio, os, sys
import fx100io
from fx100io.store.local.index_log import REC_DEL
from tests.support import chunk_bytes

path, how = sys.argv[1], sys.argv[2]
st = fx100io.ChunkStore(path, create=True, size=8 << 20)
keys = ["keep-a", "keep-b", "victim"]
st.batch_put_blocking(keys, [chunk_bytes(k, 1 << 20) for k in keys])
m = st._members[0]
real_commit = m.log._commit_locked

def commit_then_fail(recs, live, apply=None):
    if any(r[0] == REC_DEL for r in recs):
        m.log._compact(live, ())     # another commit's compaction, in between
        raise OSError(5, "injected: the DEL commit fails")
    return real_commit(recs, live, apply)

m.log._commit_locked = commit_then_fail
try:
    if how == "delete":
        st.delete_blocking("victim")
    elif how == "batch_delete":
        asyncio.run(st.batch_delete(["victim"]))
    else:  # evict: a put that needs the victim's space (the LRU's oldest is keep-a)
        st.touch(["keep-a", "keep-b"])
        st.batch_put_blocking(["big"], [chunk_bytes("big", 5 << 20)])
except OSError as e:  # (DeviceFullError would be one too: checked below)
    assert "injected" in str(e), e
    print("failed as injected:", e)
else:
    raise SystemExit("the injected DEL failure did not surface")
assert st.contains("victim"), "a chunk whose DEL failed must still be there"
os._exit(0)                          # a crash: nothing closed, nothing flushed late
"""

CHECK = r"""
import sys
import numpy as np
import fx100io
from tests.support import chunk_bytes

with fx100io.ChunkStore(sys.argv[1]) as st:
    for k in ["keep-a", "keep-b", "victim"]:
        buf = np.zeros(1 << 20, np.uint8)
        assert st.batch_get_blocking([k], [buf]) == [True], f"{k} lost after the crash"
        assert np.array_equal(buf, chunk_bytes(k, 1 << 20)), f"{k}: wrong bytes"
print("all three back, byte-exact")
"""


@pytest.mark.parametrize("how", ["delete", "batch_delete", "evict"])
def test_a_failed_del_survives_a_compaction_and_a_crash(tmp_path, how) -> None:
    path = str(tmp_path / "st.img")
    p = run_python(SETUP, path, how)
    assert "failed as injected" in p.stdout, p.stdout + p.stderr
    p = run_python(CHECK, path)
    assert "byte-exact" in p.stdout


def test_a_failed_del_never_brings_back_an_older_value(tmp_path) -> None:
    """A DEL of K's first value fails while a put of K's second value is
    committed behind it, and that second value is then deleted: K must be
    gone (in memory and after a reopen), never back at its first value.
    The event loop is held busy while the log thread works through both
    commits, so the failed DEL is handled after the put was applied."""
    import asyncio
    import time

    import numpy as np

    import fx100io

    path = str(tmp_path / "st.img")
    v1, v2 = np.full(8192, 0x11, np.uint8), np.full(8192, 0x22, np.uint8)
    for trial in range(5):
        st = fx100io.ChunkStore([path], create=True, size=32 << 20)
        st.batch_put_blocking(["K"], [v1])
        log = st._members[0].log
        real_write = log.write_at
        fail, failing = [True], [False]

        def write_at(half, pos, data, real_write=real_write, fail=fail, failing=failing):
            if fail[0]:
                fail[0] = False
                time.sleep(0.2)  # the put's commit queues up behind this one
                failing[0] = True
                raise OSError(5, "injected: the DEL record's write fails")
            return real_write(half, pos, data)
        log.write_at = write_at

        async def race(st=st, failing=failing):
            e1 = st._entries[b"K"]

            def v2_applied() -> bool:
                return st._entries.get(b"K") not in (None, e1)
            first_delete = asyncio.ensure_future(st.delete("K"))
            await asyncio.sleep(0)
            put_v2 = asyncio.ensure_future(st.batch_put(["K"], [v2]))
            while not put_v2.done() and not v2_applied():
                await asyncio.sleep(0)
                if failing[0]:
                    # the DEL's write has failed: hold the loop until the
                    # log thread has applied the put queued behind it
                    deadline = time.monotonic() + 5
                    while not v2_applied() and time.monotonic() < deadline:
                        time.sleep(0.001)
            assert v2_applied()
            assert await st.delete("K") is True  # the second value, durably
            await asyncio.gather(first_delete, put_v2, return_exceptions=True)
            buf = np.zeros(8192, np.uint8)
            return await st.batch_get(["K"], [buf]), int(buf[0])

        got, byte = asyncio.run(race())
        assert got == [False], f"trial {trial}: K came back at 0x{byte:02x} after both deletes"
        st.close()
        with fx100io.ChunkStore([path]) as again:
            assert again.batch_get_blocking(["K"], [np.zeros(8192, np.uint8)]) == [False]

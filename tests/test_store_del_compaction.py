"""A chunk whose DEL commit fails stays the store's, also across a crash,
even when another commit compacted the index while that DEL was pending:
the compaction must not drop a chunk that is only on its way out.

The race is forced: the DEL's commit first runs a compaction (standing for
another batch's commit that folded into one), then fails.  The store then
"crashes" (the child exits without closing) and a new process opens it."""

from __future__ import annotations

import pytest

from tests.conftest import run_python

SETUP = r"""
import asyncio, os, sys
import fx100io
from fx100io.store.index_log import REC_DEL
from tests.conftest import chunk_bytes

path, how = sys.argv[1], sys.argv[2]
st = fx100io.ChunkStore(path, create=True, size=8 << 20)
keys = ["keep-a", "keep-b", "victim"]
st.batch_put_blocking(keys, [chunk_bytes(k, 1 << 20) for k in keys])
m = st._members[0]
real_commit = m.log.commit

def commit_then_fail(recs, live, apply=None):
    if any(r[0] == REC_DEL for r in recs):
        m.log.compact(live)          # another commit's compaction, in between
        raise OSError(5, "injected: the DEL commit fails")
    return real_commit(recs, live, apply)

m.log.commit = commit_then_fail
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
from tests.conftest import chunk_bytes

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

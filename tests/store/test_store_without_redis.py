"""The local ChunkStore needs no redis package: only the shared pool does
(a serving engine's venv, the vLLM one here, may not have it)."""

from __future__ import annotations

from support import run_python

CODE = r"""
import sys
sys.modules["redis"] = None          # as if it were not installed
import numpy as np
import fx100io
with fx100io.ChunkStore(sys.argv[1], create=True, size=16 << 20) as st:
    st.batch_put_blocking(["k"], [np.full(5000, 7, np.uint8)])
    buf = np.zeros(5000, np.uint8)
    assert st.batch_get_blocking(["k"], [buf]) == [True] and (buf == 7).all()
try:
    from fx100io.store.shared import SharedChunkStore  # noqa: F401
except ImportError as e:
    assert "pip install redis" in str(e), e
    print("shared pool refused clearly")
"""


def test_a_chunkstore_works_without_the_redis_package(tmp_path) -> None:
    p = run_python(CODE, str(tmp_path / "st.img"))
    assert "shared pool refused clearly" in p.stdout

"""A blocking twin interrupted (Ctrl-C: KeyboardInterrupt in the calling
thread) returns only once the reads it started have landed: no byte of the
caller's buffer changes after the exception reached the caller.  Each run
is a child process, so the interrupt can never land in pytest itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import run_python
from support.shared_redis import serve

CHILD = r"""
import signal, sys, threading, time, _thread
# A shell that starts the suite in the background ignores SIGINT, and a
# Python started so has no KeyboardInterrupt handler: interrupt_main()
# would then do nothing.  Ctrl-C as a user's program has it:
signal.signal(signal.SIGINT, signal.default_int_handler)
import numpy as np
import fx100io
from fx100io.pool import aligned_array
from tests.support import chunk_bytes

kind, path, url = sys.argv[1:4]
CH = 64 << 20
opts = dict(create=True, size=3 * CH, max_io=128 << 10, queue_depth=4)
if kind == "ChunkStore":
    st = fx100io.ChunkStore([path], **opts)
else:
    from fx100io.store.shared import SharedChunkStore
    st = SharedChunkStore([path], url, **opts)
data = chunk_bytes("interrupt", CH)
st.batch_put_blocking(["k"], [data])
buf = aligned_array(CH)
caught = changed = 0
# the watcher must get the GIL while the read runs (a loaded machine reads a
# cached chunk in a few ms): switch often, and try until a few interrupts
# fell while a read was in flight
sys.setswitchinterval(1e-5)
for trial in range(60):
    if caught >= 3:
        break
    buf[:] = 0
    running = [True]

    def interrupt_once_bytes_land():
        while running[0] and not buf[:4096].any():
            time.sleep(0.0002)
        if running[0]:
            _thread.interrupt_main()
    t = threading.Thread(target=interrupt_once_bytes_land)
    try:
        t.start()
        st.batch_get_blocking(["k"], [buf])
        running[0] = False
        t.join()
    except KeyboardInterrupt:
        running[0] = False
        caught += 1
        buf[:] = 0xA5
        time.sleep(0.5)
        changed += int(np.count_nonzero(buf != 0xA5))
        t.join()
# after the loop, a late interrupt of a trial that finished first has
# nowhere to land but here
try:
    time.sleep(0.2)
except KeyboardInterrupt:
    pass
st.close()
print(f"caught={caught} changed={changed}")
"""


@pytest.fixture
def redis_server(tmp_path: Path):
    yield from serve(tmp_path)


@pytest.mark.parametrize("kind", ["ChunkStore", "SharedChunkStore"])
def test_an_interrupted_blocking_get_leaves_the_buffer_alone(tmp_path, redis_server, kind) -> None:
    p = run_python(CHILD, kind, str(tmp_path / "st.img"), redis_server.url, timeout=240)
    line = p.stdout.strip().splitlines()[-1]
    caught = int(line.split()[0].split("=")[1])
    changed = int(line.split()[1].split("=")[1])
    assert caught >= 1, f"no interrupt fell while the read was in flight: {line}"
    assert changed == 0, f"bytes landed after the interrupted call returned: {line}"
    # an interrupted call left pending (not run to its end) shows up when
    # its coroutine is collected
    for left_pending in ("ignored GeneratorExit", "Task was destroyed but it is pending",
                         "was never awaited"):
        assert left_pending not in p.stderr, p.stderr

"""Device calls carry a priority class (fx100io.Priority) to the queue:
every call takes priority=, the queue counts pieces per class, a queued
load read goes before queued writes on a real file, and bad values are
refused before any I/O.  The scheduler's rules themselves are checked in C
(tests/c/test_reqs_prio.c) and through the stores
(tests/store/test_store_priority.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import fx100io
from fx100io import errors
from fx100io.pool import aligned_array

KiB, MiB = 1 << 10, 1 << 20


def test_each_call_counts_in_its_class(tmp_path):
    with fx100io.open_device(str(tmp_path / "d.img"), create=True, size=16 * MiB,
                             max_io=64 * KiB) as dev:
        buf = aligned_array(256 * KiB)
        buf[:] = 7
        dev.write_from_blocking(0, buf)  # a store: 4 pieces
        dev.write_from_blocking(MiB, buf, priority="background")
        dev.read_into_blocking(0, buf)  # a load
        dev.read_into_blocking(0, buf, priority=fx100io.Priority.STORE)
        dev.submit_blocking([(fx100io.OP_READ, 0, buf)], priority="background")
        dev.flush_blocking(priority="background")
        s = dev.queue_stats()
        assert (s["pieces_load"], s["pieces_store"], s["pieces_background"]) == (4, 8, 9)
        assert np.all(buf == 7)


async def test_a_load_goes_before_queued_writes(tmp_path):
    """Depth 1: 32 write pieces are queued when a read of one piece comes;
    the read finishes while most writes are still queued (counted by the
    queue's bytes, not by time)."""
    dev = fx100io.open_device(str(tmp_path / "d.img"), create=True, size=16 * MiB,
                              max_io=64 * KiB, queue_depth=1)
    try:
        src = aligned_array(2 * MiB)
        src[:] = 3
        dev.write_from_blocking(8 * MiB, src[:64 * KiB])
        drv = dev._driver(True)
        before = drv.queue.stats()["bytes"]
        writes = dev.start([(fx100io.OP_WRITE, 0, src)])
        await asyncio.sleep(0)  # the writes reach C, one piece in flight
        dst = aligned_array(64 * KiB)
        assert await asyncio.wait_for(dev.read_into(8 * MiB, dst), 30) == 64 * KiB
        moved = drv.queue.stats()["bytes"] - before
        # the read, the write piece it found in flight, and maybe one more
        assert moved <= 64 * KiB + 3 * 64 * KiB, moved
        assert (await asyncio.wait_for(writes[0], 30))[0] == 2 * MiB
        assert np.all(dst == 3)
    finally:
        dev.close()


def test_bad_priorities_and_options_are_refused(tmp_path):
    with fx100io.open_device(str(tmp_path / "d.img"), create=True, size=MiB) as dev:
        buf = aligned_array(4 * KiB)
        for bad in ("now", 3, -1, True, 0.5):
            with pytest.raises(errors.InvalidArgumentError):
                dev.read_into_blocking(0, buf, priority=bad)
        with pytest.raises(errors.InvalidArgumentError):
            dev.submit_blocking([(fx100io.OP_READ | 1 << 16, 0, buf)])  # no class in op
        for bad in ("s", -1, 1 << 32, 1.0):
            with pytest.raises(errors.InvalidArgumentError):
                dev.submit_blocking([(fx100io.OP_READ, 0, buf)], stream=bad)
        assert dev.queue_stats()["ios"] == 0
    for bad in (0, -2, "4"):
        with pytest.raises(errors.InvalidArgumentError):
            fx100io.open_device(str(tmp_path / "e.img"), create=True, size=MiB, write_depth=bad)


def scheduler_orders_by_class(path: str) -> bool | None:
    """Whether the block device under path has mq-deadline or bfq active (None:
    no block device under it)."""
    import os

    st = os.stat(path)
    for up in ("", "../"):
        p = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/{up}queue/scheduler"
        if os.path.exists(p):
            with open(p) as f:
                text = f.read()
            return "[mq-deadline]" in text or "[bfq]" in text
    return None


@pytest.mark.parametrize("where", ["tmp", "var_tmp"])
def test_load_reads_carry_the_io_priority_where_the_scheduler_honours_it(tmp_path, where):
    """The probe agrees with the block device's own scheduler (sysfs), and loads
    read the right bytes with the realtime class set (or without it)."""
    import os
    import tempfile

    base = str(tmp_path) if where == "tmp" else tempfile.mkdtemp(dir="/var/tmp")
    path = os.path.join(base, "prio.img")
    try:
        with fx100io.open_device(path, create=True, size=4 * MiB, max_io=64 * KiB) as dev:
            want = scheduler_orders_by_class(path)
            assert dev.io_priority == bool(want)
            src = aligned_array(MiB)
            src[:] = np.arange(MiB, dtype=np.uint64).view(np.uint8)[:MiB]
            dev.write_from_blocking(0, src)
            dst = aligned_array(MiB)
            assert dev.read_into_blocking(0, dst) == MiB  # a load
            assert np.array_equal(dst, src)
    finally:
        if where != "tmp":
            os.unlink(path)
            os.rmdir(base)


def test_a_refused_io_priority_falls_back_out_loud(tmp_path):
    """Without CAP_SYS_NICE and CAP_SYS_ADMIN the kernel refuses the realtime class:
    the load is issued again without it, gets its bytes, and a line says so."""
    import os
    import shutil
    import subprocess
    import sys

    from support import REPO

    path = tmp_path / "refused.img"
    if shutil.which("setpriv") is None or os.geteuid() != 0:
        pytest.skip("needs setpriv and root (to drop the capabilities)")
    with fx100io.open_device(str(path), create=True, size=MiB) as dev:
        if not dev.io_priority:
            pytest.skip("the scheduler under tmp_path does not order by class")
    code = ("import fx100io, numpy as np\n"
            "from fx100io.pool import aligned_array\n"
            f"d = fx100io.open_device({str(path)!r})\n"
            "b = aligned_array(1 << 20); b[:] = 7; d.write_from_blocking(0, b)\n"
            "c = aligned_array(1 << 20)\n"
            "assert d.read_into_blocking(0, c) == 1 << 20 and (c == 7).all()\n"
            "print('ok')\n")
    p = subprocess.run(["setpriv", "--inh-caps=-sys_admin,-sys_nice",
                        "--bounding-set=-sys_admin,-sys_nice", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout + p.stderr
    assert "refused the I/O priority for loads" in p.stderr, p.stderr


def test_psync_does_not_claim_the_io_priority(tmp_path):
    """Only the io_uring engine sets the class on a load's SQE; psync's reads
    carry none, so it must not report io_priority (where io_uring does)."""
    path = str(tmp_path / "psync.img")
    with fx100io.open_device(path, create=True, size=MiB) as dev:
        uring = dev.io_priority
    with fx100io.open_device(path, engine="psync") as dev:
        assert dev.io_priority is False
        b = aligned_array(64 * KiB)
        assert dev.read_into_blocking(0, b) == 64 * KiB
    if not uring:
        pytest.skip("the scheduler under tmp_path does not order by class: "
                    "io_uring does not claim it either")


def test_io_priority_off_sets_none(tmp_path):
    """io_priority=False: no load read carries the realtime class, on a disk whose
    scheduler would honour it (counted by the queue: ioprio_ios), and the bytes are
    right; with the default the same loads carry it.  Skipped where the disk under
    /var/tmp does not order by class (then nothing carries it either way)."""
    import os
    import tempfile

    base = tempfile.mkdtemp(dir="/var/tmp")
    path = os.path.join(base, "off.img")
    try:
        if not scheduler_orders_by_class(base):
            pytest.skip("the disk under /var/tmp does not order by class: nothing to turn off")
        src = aligned_array(MiB)
        src[:] = np.arange(MiB, dtype=np.uint32).view(np.uint8)[:MiB]
        dst = aligned_array(MiB)
        for setting, want in ((False, False), (True, True)):
            with fx100io.open_device(path, create=True, size=4 * MiB, max_io=64 * KiB,
                                     io_priority=setting) as dev:
                assert dev.io_priority is want
                dev.write_from_blocking(0, src)
                dst[:] = 0
                assert dev.read_into_blocking(0, dst) == MiB  # a load: 16 pieces
                assert np.array_equal(dst, src)
                s = dev.queue_stats()
                assert s["pieces_load"] == 16
                # on: every piece ran with the class, unless the kernel refused it
                # (no CAP_SYS_NICE): then none did, and the device says so
                ran = 16 if dev.io_priority else 0
                assert s["ioprio_ios"] == ran, s
                if not setting:
                    assert s["ioprio_ios"] == 0
        # through the store, as the adapters open it
        with fx100io.ChunkStore(path + ".st", create=True, size=16 * MiB,
                                io_priority=False) as st:
            st.batch_put_blocking(["k"], [src])
            assert st.batch_get_blocking(["k"], [dst]) == [True]
            assert np.array_equal(dst, src)
            assert all(m.dev.io_priority is False for m in st._members)
            assert all(m.dev.queue_stats()["ioprio_ios"] == 0 for m in st._members)
        with pytest.raises(errors.InvalidArgumentError):
            fx100io.open_device(path, io_priority="off")
    finally:
        for f in (path, path + ".st"):
            if os.path.exists(f):
                os.unlink(f)
        os.rmdir(base)


_REFUSED_CHILD = r"""
import sys, numpy as np, fx100io
from fx100io.pool import aligned_array
MiB = 1 << 20
src = aligned_array(MiB); src[:] = np.arange(MiB, dtype=np.uint32).view(np.uint8)[:MiB]
dst = aligned_array(MiB)
with fx100io.open_device(sys.argv[1], create=True, size=4 * MiB, max_io=64 * 1024) as dev:
    before = dev.io_priority
    dev.write_from_blocking(0, src)
    assert dev.read_into_blocking(0, dst) == MiB
    assert np.array_equal(dst, src)
    s = dev.queue_stats()
    print(before, dev.io_priority, s["pieces_load"], s["ioprio_ios"])
"""


def test_io_priority_refused_counts_none(tmp_path):
    """Without CAP_SYS_NICE and CAP_SYS_ADMIN the kernel refuses the realtime class:
    the loads are retried without it and return the right bytes, none of them counts
    in ioprio_ios, and Device.io_priority turns False.  Needs root (to drop the
    capabilities with setpriv) and a disk under /var/tmp that orders by class."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run a child without CAP_SYS_NICE")
    base = tempfile.mkdtemp(dir="/var/tmp")
    path = os.path.join(base, "refused.img")
    try:
        if not scheduler_orders_by_class(base):
            pytest.skip("the disk under /var/tmp does not order by class")
        out = subprocess.run(
            ["setpriv", "--inh-caps=-all", "--bounding-set=-sys_nice,-sys_admin", "--",
             sys.executable, "-c", _REFUSED_CHILD, path],
            capture_output=True, text=True, timeout=120, env=dict(os.environ))
        assert out.returncode == 0, out.stderr
        before, after, pieces, ran = out.stdout.split()
        assert before == "True"  # the probe cannot tell: only a read shows it
        assert (after, pieces, ran) == ("False", "16", "0"), out.stdout
        assert "refused the I/O priority" in out.stderr
    finally:
        if os.path.exists(path):
            os.unlink(path)
        os.rmdir(base)

"""Closing a device while the kernel still moves a read into its buffer
(docs/architecture.md, "Closing a queue with I/O in flight").

A read that stays in flight needs a slow disk: tmpfs and a plain loop device
finish a read inside the submit.  The fixture stacks two loop devices: B (the
device under test, O_DIRECT) over a file of an ext4 filesystem on A, whose
reads the blkio controller throttles for the child process's cgroup.  B's
requests then wait in B's queue for A's throttled reads, for about a second
per MiB, out of reach of io_uring.  Each scenario runs in a child process put
in that cgroup, so pytest itself is never throttled."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import fx100io
from fx100io import _core

REPO = Path(__file__).resolve().parents[2]
PATTERN = 0x5A
BPS = 1 << 20  # A's read limit: a 2 MiB read takes about 2 s


def _run(cmd: list[str]) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return p.stdout.strip()


def _throttle_dir(name: str, mounts: list[Path]) -> tuple[Path, str]:
    """A fresh cgroup with a read limit file: (its directory, the limit
    file's name).  cgroup v1's blkio controller, else v2's io controller.
    Under `ip netns exec` (the suite runs in the fabric lab's namespace)
    /sys is a fresh sysfs without the cgroup mounts: the blkio hierarchy is
    then mounted here for the test (appended to mounts, unmounted after)."""
    v1 = Path("/sys/fs/cgroup/blkio")
    if (v1 / "blkio.throttle.read_bps_device").exists():
        d = v1 / name
        d.mkdir(exist_ok=True)
        return d, "blkio.throttle.read_bps_device"
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        ctl = root / "cgroup.subtree_control"
        if ctl.exists() and "io" in ctl.read_text().split():
            d = root / name
            d.mkdir(exist_ok=True)
            return d, "io.max"
    if "blkio" in Path("/proc/cgroups").read_text():
        mnt = Path(tempfile.mkdtemp(prefix="fx100io-blkio-"))
        if subprocess.run(["mount", "-t", "cgroup", "-o", "blkio", "fx100io-blkio", str(mnt)],
                          capture_output=True, timeout=60).returncode == 0:
            mounts.append(mnt)
            d = mnt / name
            d.mkdir(exist_ok=True)
            return d, "blkio.throttle.read_bps_device"
        mnt.rmdir()
    pytest.skip("no blkio/io cgroup controller to throttle a disk with")


@pytest.fixture
def slow_disk(tmp_path: Path):
    """(path of B, cgroup.procs of the throttled cgroup)."""
    if os.geteuid() != 0:
        pytest.skip("a throttled disk needs root (loop devices, mount, cgroups)")
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not available")
    undo: list[list[str]] = []
    mounts: list[Path] = []
    cg: Path | None = None
    try:
        base = tmp_path / "a.img"
        with open(base, "wb") as f:
            f.truncate(64 << 20)
        if not Path("/dev/loop-control").exists():
            pytest.skip("no loop devices here (/dev/loop-control is missing): a throttled disk "
                        "stacks two")
        a = _run(["losetup", "-f", "--show", "-b", "4096", str(base)])
        undo.append(["losetup", "-d", a])
        _run(["mkfs.ext4", "-q", "-F", "-b", "4096", a])
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        _run(["mount", a, str(mnt)])
        undo.append(["umount", str(mnt)])
        back = mnt / "b.img"
        with open(back, "wb") as f:
            f.write(bytes([PATTERN]) * (8 << 20))
            os.fsync(f.fileno())
            # what B reads must come from A, not from the page cache (B is
            # --direct-io=on as well; this file's pages only, not the
            # machine's)
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        b = _run(["losetup", "-f", "--show", "-b", "4096", "--direct-io=on", str(back)])
        undo.append(["losetup", "-d", b])
        cg, limit = _throttle_dir(f"fx100io-test-{os.getpid()}", mounts)
        majmin = Path(f"/sys/block/{Path(a).name}/dev").read_text().strip()
        line = f"{majmin} {BPS}" if limit.startswith("blkio") else f"{majmin} rbps={BPS}"
        try:
            (cg / limit).write_text(line + "\n")
        except OSError as e:
            pytest.skip(f"cannot throttle {a}: {e}")
        yield b, str(cg / "cgroup.procs")
    finally:
        for cmd in reversed(undo):
            # B's detach can lag its last close a moment: umount retries,
            # then detaches lazily rather than leave the mount behind
            for _ in range(20):
                if subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0:
                    break
                time.sleep(0.1)
            else:
                if cmd[0] == "umount":
                    subprocess.run(["umount", "-l", cmd[1]], capture_output=True, timeout=60)
        if cg is not None:
            try:
                cg.rmdir()
            except OSError:
                pass
        for m in mounts:
            subprocess.run(["umount", str(m)], capture_output=True, timeout=60)
            try:
                m.rmdir()
            except OSError:
                pass


CHILD = r'''
import json, mmap, os, sys, threading, time
dev_path, procs, scenario = sys.argv[1:4]
with open(procs, "w") as f:
    f.write(str(os.getpid()))
import fx100io
from fx100io import _core, aio
from fx100io.errors import DeviceClosedError

PATTERN = 0x5A
N = int(os.environ.get("READ_MIB", "2")) << 20
out = {}
dev = fx100io.open_device(dev_path, direct=True)
buf = mmap.mmap(-1, N)  # page aligned: the read goes O_DIRECT, in 1 MiB pieces

def landed(b=None):
    return (buf if b is None else b)[:].count(bytes([PATTERN]))

def kept_is(b):
    return any(getattr(m, "obj", None) is b for m in _core._kept_for_kernel)

if scenario == "blocked_reader":
    res = {}
    def reader():
        res["features"] = dev._driver().queue.features
        try:
            res["n"] = dev.read_into_blocking(0, memoryview(buf))
        except Exception as e:
            res["error"] = type(e).__name__
            res["landed_at_error"] = landed()
        res["t"] = time.monotonic()
    t = threading.Thread(target=reader)
    t0 = time.monotonic()
    t.start()
    time.sleep(0.3)
    out["landed_before_close"] = landed()
    dev.close()
    t1 = time.monotonic()
    out["close_s"] = t1 - t0
    out["landed_at_close"] = landed()
    t.join(20)
    out["reader"] = res
    out["reader_s"] = res["t"] - t0
    time.sleep(2.5)  # the whole read would have landed by now
    out["landed_later"] = landed()
    out["kept"] = aio.left_with_kernel()
elif scenario == "async_reader":
    # an event loop's queue (no DEFER_TASKRUN: the closing thread can wait
    # on it), its read in flight, closed from another thread
    import asyncio
    res = {}
    started = threading.Event()
    async def read():
        t = asyncio.ensure_future(dev.read_into(0, memoryview(buf)))
        await asyncio.sleep(0)
        started.set()
        try:
            res["n"] = await asyncio.wait_for(t, 20)
        except Exception as e:
            res["error"] = type(e).__name__
            res["landed_at_error"] = landed()
    t = threading.Thread(target=lambda: asyncio.run(read()))
    t0 = time.monotonic()
    t.start()
    started.wait(10)
    time.sleep(0.3)
    out["landed_before_close"] = landed()
    dev.close()
    out["close_s"] = time.monotonic() - t0
    out["landed_at_close"] = landed()
    t.join(20)
    out["reader"] = res
    out["kept_is_ours"] = kept_is(buf)
    out["kept"] = aio.left_with_kernel()
    time.sleep(2.5)
    out["landed_later"] = landed()
elif scenario == "three_readers":
    # three threads, each blocked in its own read on its own ring, closed
    # together: one deadline for the close, not one per queue in turn
    n = 2 << 20
    bufs = [mmap.mmap(-1, n) for _ in range(3)]
    res = {}
    def reader(k):
        try:
            dev.read_into_blocking(k * n, memoryview(bufs[k]))
            res[k] = ["ok", landed(bufs[k])]
        except Exception as e:
            res[k] = [type(e).__name__, landed(bufs[k])]
    ts = [threading.Thread(target=reader, args=(k,)) for k in range(3)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    time.sleep(0.5)
    out["landed_before_close"] = sum(landed(b) for b in bufs)
    dev.close()
    out["close_s"] = time.monotonic() - t0
    for t in ts:
        t.join(30)
    out["reader"] = res
    time.sleep(1.0)
    out["landed_later"] = [landed(b) for b in bufs]
elif scenario == "loop_closes_under_a_worker":
    # an event loop closes the device (async with) while another thread is
    # blocked in a read on its own ring, and a read of the loop's own is in
    # flight: the loop goes on meanwhile (the close runs in a thread), and
    # both readers get their buffers back whole
    import asyncio
    res = {}
    buf2 = mmap.mmap(-1, N)
    def reader():
        try:
            dev.read_into_blocking(0, memoryview(buf))
            res["n"] = "ok"
        except Exception as e:
            res["error"] = type(e).__name__
            res["landed_at_error"] = landed()
    t = threading.Thread(target=reader)
    async def main():
        lag = []
        async def ticker():
            while True:
                a = time.monotonic()
                await asyncio.sleep(0.01)
                lag.append(time.monotonic() - a)
        tk = asyncio.ensure_future(ticker())
        t.start()
        rd = asyncio.ensure_future(dev.read_into(N, memoryview(buf2)))
        await asyncio.sleep(0.3)
        out["landed_before_close"] = landed() + landed(buf2)
        c0 = time.monotonic()
        async with dev:
            pass
        out["close_on_loop_s"] = time.monotonic() - c0
        await asyncio.sleep(0.2)
        out["max_lag_s"] = max(lag)
        try:
            await asyncio.wait_for(rd, 10)
            out["loop_read"] = "ok"
        except Exception as e:
            out["loop_read"] = type(e).__name__
        out["loop_landed"] = landed(buf2)
        tk.cancel()
    asyncio.run(main())
    t.join(20)
    out["reader"] = res
    time.sleep(1.0)
    out["landed_later"] = landed()
elif scenario == "close_races_settle":
    # Device.close's two steps (close the queue, then fail its waiters) with
    # the ring's thread finishing the handed-off close in between
    from fx100io.errors import DeviceClosedError
    ready, go, settling = threading.Event(), threading.Event(), threading.Event()
    box = {}
    def ring_thread():
        d = box["d"] = dev._driver(False)
        r = dev._request(_core.OP_READ, 0, memoryview(buf))
        d._queue([r], list)
        d._drain_backlog()
        d.queue.wait(1, 100)
        ready.set()
        go.wait(20)
        settling.set()
        try:
            d.queue.wait(1, -1)  # its next call: finishes the close first
        except Exception as e:
            out["error"] = type(e).__name__
            out["landed_at_error"] = landed()
        out["left_with_kernel"] = d.queue.left_with_kernel
    t = threading.Thread(target=ring_thread)
    t.start()
    ready.wait(10)
    d = box["d"]
    q = d.queue
    q.begin_close()
    q.close()
    out["handoff"] = q.handoff
    # the queue holds the buffer from the first moment of the handoff
    out["parked_is_ours"] = any(getattr(m, "obj", None) is buf for m in q.parked.values())
    go.set()
    settling.wait(10)
    time.sleep(0.3)  # the ring's thread is in its wait, the GIL let go
    d.abandon(lambda: DeviceClosedError(9, "closed"))
    t.join(20)
    out["landed_at_join"] = landed()
    time.sleep(1.0)
    out["landed_later"] = landed()
    out["kept"] = aio.left_with_kernel()
elif scenario in ("ring_thread_returns", "ring_thread_never_returns"):
    # A request handed to C by a thread that then does something else: the
    # closing thread cannot wait on that thread's DEFER_TASKRUN ring, so it
    # hands the close over.  Either that thread calls again (it finishes the
    # close, waiting for the kernel, before its caller hears of it), or the
    # queue's last reference goes on another thread (it is left to the
    # kernel: logged, counted, the buffer kept for good).
    ready, closed, done = threading.Event(), threading.Event(), threading.Event()
    holders = []
    def submitter():
        d = dev._driver(False)
        out["features"] = d.queue.features
        r = dev._request(_core.OP_READ, 0, memoryview(buf))
        holders.extend(d._queue([r], list))
        d._drain_backlog()
        # one short wait: a read the device could not take without blocking
        # goes on in the kernel's worker, truly in flight (until a wait runs
        # the ring's deferred work, it waits parked in the ring)
        out["first_wait"] = d.queue.wait(1, 100)
        if scenario == "ring_thread_never_returns":
            keep.append(d)  # the last reference is the main thread's
            d = None
            ready.set()
            done.wait(20)  # alive (its exit would wait for its I/O)
            return
        ready.set()
        closed.wait(20)
        try:
            d._finish(holders)  # run_blocking's wait, come back after the close
        except Exception as e:
            out["error"] = type(e).__name__
            out["landed_at_error"] = landed()
        out["left_with_kernel"] = d.queue.left_with_kernel
        out["destroyed"] = d.queue.destroyed
        out["parked"] = d.queue.parked
        done.wait(20)
    keep = []
    t = threading.Thread(target=submitter)
    before = _core.leaked_ios()
    t.start()
    ready.wait(10)
    time.sleep(0.3)
    out["landed_before_close"] = landed()
    c0 = time.monotonic()
    dev.close()
    out["close_s"] = time.monotonic() - c0
    out["landed_at_close"] = landed()
    out["holder"] = [type(h).__name__ for h in holders[0]]
    if scenario == "ring_thread_returns":
        closed.set()
        time.sleep(3.0)
    else:
        q = keep[0].queue
        out["handoff"] = q.handoff
        out["parked_is_ours"] = any(getattr(m, "obj", None) is buf
                                    for m in (q.parked or {}).values())
        keep.clear()
        del q  # the queue goes on this thread: nobody can wait for its I/O
        kept = aio.left_with_kernel()
        out["kept_buffers"] = kept["buffers"]
        out["kept_bytes"] = kept["bytes"]
        out["kept_is_ours"] = kept_is(buf)
        out["leaked_ios"] = _core.leaked_ios() - before
        out["landed_at_drop"] = landed()
        time.sleep(3.0)
    out["landed_later"] = landed()
    done.set()
    t.join(10)
print(json.dumps(out), flush=True)
'''


def _child(slow_disk: tuple[str, str], scenario: str, **env_more: str) -> tuple[dict, str]:
    dev, procs = slow_disk
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **env_more)
    p = subprocess.run([sys.executable, "-c", CHILD, dev, procs, scenario], capture_output=True,
                       text=True, timeout=90, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


# best: SINGLE_ISSUER + DEFER_TASKRUN, only the reader's thread can wait;
# plain: a ring without them (FX100IO_RING_SETUP=plain), which any thread can
# wait on.  (This kernel has IORING_FEAT_EXT_ARG whatever the setup: the
# timeout-SQE wait of kernels before 5.11 is not run here.)
@pytest.mark.parametrize("setup", ["best", "plain"])
def test_close_from_another_thread_waits_for_the_read_the_kernel_holds(slow_disk, setup) -> None:
    out, _ = _child(slow_disk, "blocked_reader", FX100IO_RING_SETUP=setup)
    n = 2 << 20
    assert ("defer_taskrun" in out["reader"]["features"]) == (setup == "best")
    # the read was in flight when close began (the scenario is real)
    assert out["landed_before_close"] < n
    # the blocked caller got DeviceClosedError, and only once every byte the
    # kernel was moving into its buffer had landed: nothing is written after
    # its buffer was handed back, nor after close returned
    assert out["reader"]["error"] == "DeviceClosedError"
    assert out["reader"]["landed_at_error"] == n
    assert out["landed_at_close"] == n
    assert out["landed_later"] == n
    # promptly: as soon as the read was back (about 2 s at 1 MiB/s), far
    # from FX_QUEUE_DRAIN_MS
    assert out["reader_s"] < 4.5
    assert out["close_s"] < 4.5


@pytest.mark.parametrize("setup", ["best", "plain"])
def test_a_blocked_reader_waits_for_its_own_read_past_the_close_bound(slow_disk, setup) -> None:
    # an 8 MiB read at 1 MiB/s: longer than FX_QUEUE_DRAIN_MS (5 s)
    out, _ = _child(slow_disk, "blocked_reader", FX100IO_RING_SETUP=setup, READ_MIB="8")
    n = 8 << 20
    assert out["landed_before_close"] < n
    # the closer is bounded: it left the close to the reader's thread ...
    assert out["close_s"] < 6.5
    assert out["landed_at_close"] < n
    # ... which heard of it only once the kernel was done with its buffer,
    # however long that took: a plain DeviceClosedError, its buffer free
    assert out["reader"]["error"] == "DeviceClosedError"
    assert out["reader"]["landed_at_error"] == n
    assert out["reader_s"] > 6.0
    assert out["landed_later"] == n
    assert out["kept"]["ios"] == 0 and out["kept"]["buffers"] == 0


def test_close_from_another_thread_waits_for_an_event_loops_read(slow_disk) -> None:
    out, _ = _child(slow_disk, "async_reader")
    n = 2 << 20
    assert out["landed_before_close"] < n
    # the closing thread waited for the read itself; the awaiting task got
    # DeviceClosedError after that, and nothing landed after close returned
    # (a guard: the code before the close bound passed this too)
    assert out["landed_at_close"] == n
    assert out["reader"]["error"] == "DeviceClosedError"
    assert out["reader"]["landed_at_error"] == n
    assert out["landed_later"] == n
    assert out["close_s"] < 4.5
    assert not out["kept_is_ours"]


def test_an_event_loops_read_past_the_close_bound_says_its_buffer_is_kept(slow_disk) -> None:
    out, err = _child(slow_disk, "async_reader", READ_MIB="8")
    n = 8 << 20
    assert out["landed_before_close"] < n
    # nobody's call owns this buffer (the loop awaits a future): the close
    # waits its bound, then leaves the read to the kernel ...
    assert 4.5 < out["close_s"] < 6.5
    assert out["landed_at_close"] < n
    assert "with the kernel" in err
    # ... and the task hears that its buffer is not free, and it is kept
    assert out["reader"]["error"] == "BufferStillInUseError"
    assert out["kept_is_ours"]
    assert out["kept"]["ios"] >= 1 and out["kept"]["bytes"] >= n
    # which was needed: the kernel went on writing it
    assert out["landed_later"] > out["reader"]["landed_at_error"]


def test_closing_several_blocked_queues_has_one_deadline(slow_disk) -> None:
    out, _ = _child(slow_disk, "three_readers")
    n = 2 << 20
    assert out["landed_before_close"] < 3 * n
    # 6 MiB at 1 MiB/s: past the 5 s bound, reached once and not per queue
    assert out["close_s"] < 6.5
    # every reader got its buffer back whole, with the error
    for k in ("0", "1", "2"):
        assert out["reader"][k] in (["DeviceClosedError", n], ["ok", n])
    assert out["landed_later"] == [n, n, n]


def test_a_close_on_an_event_loop_does_not_stall_it(slow_disk) -> None:
    out, _ = _child(slow_disk, "loop_closes_under_a_worker")
    n = 2 << 20
    assert out["landed_before_close"] < 2 * n
    # the loop went on while the close waited (its own read, the worker's)
    assert out["max_lag_s"] < 0.5
    assert out["close_on_loop_s"] < 6.5
    assert out["loop_read"] == "DeviceClosedError" and out["loop_landed"] == n
    assert out["reader"]["error"] == "DeviceClosedError"
    assert out["reader"]["landed_at_error"] == n
    assert out["landed_later"] == n


def test_a_close_racing_the_ring_threads_settle_keeps_the_buffer(slow_disk) -> None:
    out, _ = _child(slow_disk, "close_races_settle")
    n = 2 << 20
    assert out["handoff"] and out["parked_is_ours"]
    assert out["error"] == "DeviceClosedError"
    assert out["landed_at_error"] == n
    assert out["landed_later"] == n
    assert out["left_with_kernel"] == 0
    assert out["kept"]["buffers"] == 0


@pytest.mark.parametrize("setup", ["best", "plain"])
def test_close_handed_to_the_ring_thread_waits_for_its_read(slow_disk, setup) -> None:
    out, _ = _child(slow_disk, "ring_thread_returns", FX100IO_RING_SETUP=setup)
    n = 2 << 20
    assert ("defer_taskrun" in out["features"]) == (setup == "best")
    assert out["landed_before_close"] < n
    # close did not wait (on a DEFER_TASKRUN ring it could not; on any
    # blocking caller's queue it is that caller's to wait for its buffers):
    # it handed the close to the ring's thread, which heard of it only once
    # the kernel was done with its buffer
    assert out["close_s"] < 1.0
    assert out["holder"] == ["DeviceClosedError"]
    assert out["error"] == "DeviceClosedError"
    assert out["landed_at_error"] == n
    assert out["landed_later"] == n
    assert out["destroyed"] and out["left_with_kernel"] == 0 and out["parked"] is None


def test_close_nobody_can_wait_for_keeps_the_buffer_and_says_so(slow_disk) -> None:
    out, err = _child(slow_disk, "ring_thread_never_returns")
    n = 2 << 20
    assert out["landed_before_close"] < n
    assert out["close_s"] < 1.0
    assert out["handoff"] and out["parked_is_ours"]
    assert out["holder"] == ["DeviceClosedError"]
    # the queue went where nobody could wait for the read: said, counted,
    # and its buffer kept for good
    assert out["leaked_ios"] >= 1
    assert "with the kernel" in err
    assert out["kept_is_ours"]
    assert out["kept_buffers"] >= 1 and out["kept_bytes"] >= n
    # and that was needed: the kernel went on writing into it after
    assert out["landed_later"] > out["landed_at_drop"]


def test_submit_from_another_thread_fails_at_once(tmp_path: Path) -> None:
    """A ring tied to one thread (SINGLE_ISSUER) refuses another's submit:
    the batch fails with a clear error, nothing is left queued, and an async
    caller is not left waiting."""
    path = tmp_path / "f.img"
    path.write_bytes(bytes(range(256)) * 64)
    dev = fx100io.open_device(str(path), direct=False)
    try:
        q = dev.raw_queue()
        if "single_issuer" not in q.features:
            pytest.skip("this kernel's rings are not tied to a thread")
        buf = bytearray(4096)
        addr, n = _core.buffer_address(buf, True)
        errs: list[BaseException] = []

        def other() -> None:
            try:
                q.submit([(_core.OP_READ, addr, n, 0, 7)])
            except OSError as e:
                errs.append(e)
        t = threading.Thread(target=other)
        t.start()
        t.join(10)
        assert len(errs) == 1 and errs[0].errno == 17
        assert "another thread" in str(errs[0])
        assert q.pending == 0
        # the owning thread still uses it
        assert q.submit([(_core.OP_READ, addr, n, 0, 8)]) == 1
        assert q.wait(1, 5000)
        assert [c[:2] for c in q.reap()] == [(8, 4096)]
        assert bytes(buf) == bytes(range(256)) * 16
    finally:
        dev.close()


def test_async_submit_on_another_threads_queue_fails_instead_of_hanging(tmp_path: Path) -> None:
    import asyncio

    path = tmp_path / "f.img"
    path.write_bytes(b"\x11" * 8192)
    dev = fx100io.open_device(str(path), direct=False)
    try:
        drv = dev._driver(True)  # this thread's event-loop queue
        if "single_issuer" not in drv.queue.features:
            pytest.skip("this kernel's rings are not tied to a thread")
        got: list[BaseException] = []

        async def use_it() -> None:
            r = dev._request(_core.OP_READ, 0, bytearray(4096))
            (f,) = drv.submit([r])
            try:
                await asyncio.wait_for(f, 10)
            except BaseException as e:
                got.append(e)

        t = threading.Thread(target=lambda: asyncio.run(use_it()))
        t.start()
        t.join(20)
        assert not t.is_alive()
        assert len(got) == 1 and isinstance(got[0], OSError) and got[0].errno == 17
        drv.detach()
    finally:
        dev.close()


def test_close_with_nothing_in_flight_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "f.img"
    path.write_bytes(b"\x22" * 8192)
    before = _core.leaked_ios()
    dev = fx100io.open_device(str(path), direct=False)
    q = dev.raw_queue()
    buf = bytearray(8192)
    assert dev.read_into_blocking(0, buf) == 8192
    dev.close()
    assert q.left_with_kernel == 0
    assert _core.leaked_ios() == before
    assert bytes(buf) == b"\x22" * 8192


def test_a_closed_queue_says_closed(tmp_path: Path) -> None:
    from fx100io.errors import DeviceClosedError

    path = tmp_path / "f.img"
    path.write_bytes(b"\x33" * 4096)
    dev = fx100io.open_device(str(path), direct=False)
    q = dev.raw_queue()
    assert q.fd >= 0 and isinstance(q.features, list)
    dev.close()
    with pytest.raises(DeviceClosedError):
        _ = q.features
    with pytest.raises(DeviceClosedError):
        _ = q.fd
    assert q.pending == 0 and q.stats() == {}


def test_a_cancelled_aclose_still_closes(tmp_path: Path) -> None:
    import asyncio

    from fx100io.errors import DeviceClosedError

    path = tmp_path / "f.img"
    path.write_bytes(b"\x44" * 8192)
    dev = fx100io.open_device(str(path), direct=False)

    async def main() -> None:
        assert await dev.read_into(0, bytearray(4096)) == 4096  # the loop's own queue
        task = asyncio.ensure_future(dev.aclose())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # closed to new requests at once, and the close ends in its thread
        assert dev.closed
        with pytest.raises(DeviceClosedError):
            await dev.read_into(0, bytearray(4096))
        for _ in range(500):
            if all(d.queue.destroyed for d in list(dev._drivers)):
                break
            await asyncio.sleep(0.01)
        assert all(d.queue.destroyed for d in list(dev._drivers))

    asyncio.run(main())

"""Bad input and hostile environments give specific exceptions and lose nothing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from support import chunk_bytes, run_python

import fx100io
from fx100io import errors


def test_missing_device(tmp_path):
    with pytest.raises(errors.DeviceNotFoundError) as ei:
        fx100io.open_device(str(tmp_path / "nope.img"))
    assert isinstance(ei.value, FileNotFoundError)
    assert "nope.img" in str(ei.value)


def test_bad_uris_and_options(tmp_file):
    with pytest.raises(errors.UnsupportedTransportError):
        fx100io.open_device("s3://bucket/x")
    with pytest.raises(errors.InvalidArgumentError):
        fx100io.open_device("")
    with pytest.raises(errors.InvalidArgumentError):
        fx100io.open_device(str(tmp_file), create=True, size=1 << 20, engine="spdk")
    with pytest.raises(errors.InvalidArgumentError):
        fx100io.open_device(str(tmp_file), create=True, size=1 << 20, queue_depth=0)
    with pytest.raises(errors.InvalidArgumentError):
        fx100io.open_device(str(tmp_path_dir(tmp_file)))  # a directory


def tmp_path_dir(p: Path) -> Path:
    return p.parent


def test_read_only_and_bad_buffers(tmp_file):
    with fx100io.open_device(str(tmp_file), create=True, size=1 << 20) as dev:
        dev.write_from_blocking(0, b"x" * 4096)
        with pytest.raises(errors.ReadOnlyBufferError):
            dev.read_into_blocking(0, b"\0" * 4096)
        with pytest.raises(errors.InvalidArgumentError):
            dev.read_into_blocking(-1, bytearray(10))
        with pytest.raises(errors.InvalidArgumentError):
            dev.read_into_blocking(0, 12345)
        with pytest.raises(errors.InvalidArgumentError):
            dev.read_into_blocking(0, np.zeros((64, 64), dtype=np.uint8)[:, ::2])
        back = bytearray(4096)
        dev.read_into_blocking(0, back)
        assert back == b"x" * 4096  # nothing lost


def test_closed_device(tmp_file):
    dev = fx100io.open_device(str(tmp_file), create=True, size=1 << 20)
    dev.close()
    with pytest.raises(errors.DeviceClosedError):
        dev.read_into_blocking(0, bytearray(10))


def test_read_only_device(tmp_file):
    with fx100io.open_device(str(tmp_file), create=True, size=1 << 20) as dev:
        dev.write_from_blocking(0, b"y" * 4096)
    os.chmod(tmp_file, 0o444)
    with fx100io.open_device(str(tmp_file), readonly=True) as dev:
        with pytest.raises(errors.Fx100ioError):
            dev.write_from_blocking(0, b"z" * 4096)
        out = bytearray(4096)
        dev.read_into_blocking(0, out)
        assert out == b"y" * 4096


def test_full_device(tmp_path):
    """A filesystem that runs out of space: the write fails with
    DeviceFullError and what was written before stays intact."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip()}")
    try:
        with pytest.raises(errors.DeviceFullError):
            fx100io.open_device(str(mnt / "big.img"), create=True, size=64 << 20)
        with fx100io.open_device(str(mnt / "d.img"), create=True, size=0) as dev:
            first = chunk_bytes("first", 1 << 20)
            dev.write_from_blocking(0, first)
            with pytest.raises(errors.DeviceFullError):
                dev.write_from_blocking(1 << 20, chunk_bytes("second", 4 << 20))
            back = np.empty(1 << 20, dtype=np.uint8)
            dev.read_into_blocking(0, back)
            assert np.array_equal(back, first)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_filesystem_without_o_direct(tmp_path):
    """ramfs has no O_DIRECT: direct=True says so, 'auto' falls back."""
    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "ramfs", "ramfs", str(mnt)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount ramfs here: {r.stderr.strip()}")
    try:
        path = str(mnt / "x.img")
        with pytest.raises(errors.DirectIONotSupportedError) as ei:
            fx100io.open_device(path, create=True, size=1 << 20, direct=True)
        assert "O_DIRECT" in str(ei.value)
        with fx100io.open_device(path, create=True, size=1 << 20) as dev:
            assert not dev.direct
            dev.write_from_blocking(0, b"abc" * 1000)
            out = bytearray(3000)
            dev.read_into_blocking(0, out)
            assert out == b"abc" * 1000
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


IO_URING_SYSCTL = "/proc/sys/kernel/io_uring_disabled"


def refused_then_psync(path, why: str) -> str:
    """Child code: opening with io_uring fails with IoUringUnavailableError
    whose message says `why` and the way out; psync and 'auto' (devices and
    a store) stay correct."""
    return f"""
import fx100io, numpy as np
from fx100io import errors
try:
    fx100io.open_device({str(path)!r}, create=True, size=1 << 20)
except errors.IoUringUnavailableError as e:
    assert {why!r} in str(e) and "psync" in str(e), str(e)
    assert isinstance(e, PermissionError)
else:
    raise SystemExit("io_uring opened although refused")
for engine in ("psync", "auto"):
    dev = fx100io.open_device({str(path)!r}, create=True, size=1 << 20, engine=engine)
    assert dev.engine == "psync"
    data = np.random.default_rng(1).integers(0, 256, 300000, dtype=np.uint8)
    dev.write_from_blocking(4096, data)
    dev.flush_blocking()
    out = np.empty_like(data)
    dev.read_into_blocking(4096, out)
    assert np.array_equal(out, data)
    dev.close()
with fx100io.ChunkStore({str(path) + ".store"!r}, create=True, size=64 << 20,
                        engine="auto") as st:
    st.batch_put_blocking(["k"], [b"x" * 5000])
    out = bytearray(5000)
    assert st.batch_get_blocking(["k"], [out]) == [True] and out == b"x" * 5000
print("ok")
"""


def test_io_uring_disabled_is_named_and_psync_works(tmp_file):
    """With kernel.io_uring_disabled=2 the error names the sysctl, and the
    psync engine ('auto' too) stays correct.  The child sees the setting in a
    mount namespace of its own (a file holding "2" bound over the sysctl) and
    gets io_uring_setup's EPERM from a seccomp filter, exactly what the kernel
    answers at that setting, so the machine-wide sysctl is never touched:
    setting it broke io_uring for every other process on the machine while
    the test ran."""
    fake = tmp_file.parent / "io_uring_disabled"
    fake.write_text("2\n")
    code = MOUNT_NS_SYSCTL.format(fake=str(fake), sysctl=IO_URING_SYSCTL) + \
        SECCOMP_DENY_IO_URING + refused_then_psync(tmp_file, "io_uring_disabled")
    out = run_python(code, check=False)
    if out.returncode == 77:
        pytest.skip(f"no private mount namespace here ({out.stdout.strip()}): needs root")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


# The child's own mount namespace with `fake` bound over the sysctl `sysctl`
# (unshare(CLONE_NEWNS), mounts made private so nothing propagates back).
MOUNT_NS_SYSCTL = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, MS_BIND, MS_REC, MS_PRIVATE = 0x00020000, 4096, 16384, 1 << 18
if libc.unshare(CLONE_NEWNS) != 0:
    print("unshare: errno", ctypes.get_errno()); sys.exit(77)
assert libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0, ctypes.get_errno()
assert libc.mount({fake!r}.encode(), {sysctl!r}.encode(), None, MS_BIND, None) == 0, ctypes.get_errno()
assert open({sysctl!r}).read().strip() == "2"
"""


# A seccomp filter that fails io_uring_setup with EPERM, as Docker's default
# profile does, installed by the child itself (no_new_privs + a classic BPF
# program through prctl), so this runs on every kernel with seccomp.
SECCOMP_DENY_IO_URING = """
import ctypes, os, platform, struct
NR_IO_URING_SETUP = 425                      # same number on x86_64 and aarch64
ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}[platform.machine()]
LD, JEQ, RET = 0x20, 0x15, 0x06              # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
ALLOW, ERRNO, KILL = 0x7FFF0000, 0x00050000, 0x80000000
EPERM = 1
prog = [(LD, 0, 0, 4), (JEQ, 1, 0, ARCH), (RET, 0, 0, KILL),
        (LD, 0, 0, 0), (JEQ, 0, 1, NR_IO_URING_SETUP), (RET, 0, 0, ERRNO | EPERM),
        (RET, 0, 0, ALLOW)]
raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
buf = ctypes.create_string_buffer(raw)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Fprog(len(prog), ctypes.addressof(buf))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0, ctypes.get_errno()   # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0, ctypes.get_errno()  # SECCOMP_MODE_FILTER
"""


def test_io_uring_refused_by_seccomp_is_named_and_psync_works(tmp_file):
    """Under a seccomp filter that denies io_uring_setup (a container's
    default), opening with io_uring says why and what to do; psync and
    'auto' stay correct.  Runs on every kernel: the filter is our own."""
    code = SECCOMP_DENY_IO_URING + refused_then_psync(tmp_file, "seccomp")
    assert run_python(code).stdout.strip() == "ok"


DROP_IPC_LOCK = """
import ctypes, os, resource, sys
libc = ctypes.CDLL(None, use_errno=True)
PR_CAPBSET_DROP, CAP_IPC_LOCK = 24, 14
if libc.prctl(PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0) != 0:
    raise SystemExit("prctl failed")
resource.setrlimit(resource.RLIMIT_MEMLOCK, (1 << 20, 1 << 20))
# exec so the kernel recomputes capabilities without CAP_IPC_LOCK
os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]] + sys.argv[2:])
"""


def test_memory_that_cannot_be_pinned(tmp_file):
    """Without CAP_IPC_LOCK and with a 1 MiB RLIMIT_MEMLOCK: require_pinned
    raises PinnedMemoryError; otherwise the pool works unpinned and I/O
    through it stays correct."""
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("ASan replaces mlock() with a no-op that succeeds, so pinning limits "
                    "cannot be observed in the sanitizer run (the normal run covers this)")
    inner = f"""
import logging, fx100io, numpy as np
from fx100io import errors
logging.basicConfig()
try:
    fx100io.BufferPool(16 << 20, require_pinned=True)
except errors.PinnedMemoryError as e:
    assert isinstance(e, MemoryError) and "RLIMIT_MEMLOCK" in str(e), str(e)
else:
    raise SystemExit("pinned although the limit forbids it")
pool = fx100io.BufferPool(16 << 20)
assert not pool.pinned
buf = pool.alloc(8 << 20)
buf[:] = np.random.default_rng(2).integers(0, 256, 8 << 20, dtype=np.uint8)
dev = fx100io.open_device({str(tmp_file)!r}, create=True, size=16 << 20)
dev.write_from_blocking(0, buf)
out = pool.alloc(8 << 20)
dev.read_into_blocking(0, out)
assert np.array_equal(out, buf)
print("ok")
"""
    p = run_python(DROP_IPC_LOCK, inner)
    assert p.stdout.strip() == "ok"
    assert "RLIMIT_MEMLOCK" in p.stderr  # logged once


def test_close_from_another_thread_releases_the_file(tmp_path):
    """Device.close() from one thread while a worker thread that used the
    device is still alive: the file is released at once (its filesystem can
    be unmounted) and the worker's next call fails cleanly."""
    import threading
    import time
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        dev = fx100io.open_device(str(mnt / "d.img"), create=True, size=4 << 20)
        used, release, after = threading.Event(), threading.Event(), []

        def worker():
            dev.write_from_blocking(0, b"w" * 4096)
            used.set()
            release.wait(10)
            try:
                dev.read_into_blocking(0, bytearray(4096))
            except Exception as e:
                after.append(e)

        t = threading.Thread(target=worker)
        t.start()
        assert used.wait(10)
        dev.close()
        # the kernel tears a closed ring down asynchronously: allow it a moment
        for _ in range(30):
            um = subprocess.run(["umount", str(mnt)], capture_output=True, text=True)
            if um.returncode == 0:
                break
            time.sleep(0.1)
        release.set()
        t.join(10)
        assert um.returncode == 0, um.stderr  # no ring kept the file open
        assert len(after) == 1 and isinstance(after[0], errors.DeviceClosedError)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)

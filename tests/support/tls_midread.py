"""One contract for a TLS record that is not data arriving in the middle of a
read's C2HData, checked the same way on both of our initiator's record layers:
ours (userspace, where the kernel has no `tls` ULP: this host) and the kernel's
(kTLS: the lab guest).  Our target's --fault-tls-record sends the record,
sealed with the connection's keys (by the kernel where the target is on kTLS),
between two records of one C2HData.

The test modules (tests/fabric/test_tls_records_mid_read.py here,
tests/guest/test_ktls.py in the guest) call these with the layers they expect:
ktls, the initiator's; target_ktls, the target's (read from its control socket's
`tls` command)."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

import fx100io
from fx100io import errors
from fx100io.target_ctl import control
from support import chunk_bytes
from support.target_process import serve, tls_args
from support.tls_keys import KEY

NQN = "nqn.2026-12.io.fx100:tlsmid"
HOST = "nqn.2014-08.org.nvmexpress:uuid:f0100000-0000-4000-8000-00000000f1d1"
SIZE = 16 << 20
# The record goes after the connection's 20th 16 KiB record of read data: inside the
# first read of 1 MiB or more.
AFTER = 20
# what each kind does to the read: (exception, errno, our layer's reason)
ENDS = {
    "close_notify": (errors.FxConnectionError, errno.ECONNRESET,
                     "the TLS peer closed the connection (close_notify)"),
    "fatal": (errors.FxProtocolError, errno.EPROTO,
              "the TLS peer sent an alert and ended the connection"),
    "warning": (errors.FxProtocolError, errno.EPROTO,
                "the TLS peer sent an alert and ended the connection"),
}


def _uri(port: int, ktls: bool, **q: object) -> str:
    """ktls=False pins our own record layer (ktls=off), so a host whose kernel has the
    tls ULP still tests it; True leaves the default (auto), which takes the kernel's."""
    q = {"hostnqn": HOST, "tls_key": KEY, **q}
    if not ktls:
        q["ktls"] = "off"
    return f"nvme+tcp://127.0.0.1:{port}/{NQN}?" + "&".join(f"{k}={v}" for k, v in q.items())


def _image(tmp_path: Path, tag: str) -> tuple[str, np.ndarray]:
    """The namespace's bytes, written buffered: in the target's page cache, the
    path whose records --fault-tls-record counts (a read from the disk goes out
    from a buffer in one send and is not counted)."""
    data = chunk_bytes("tls-mid-" + tag, SIZE)
    img = tmp_path / "ns.img"
    img.write_bytes(data.tobytes())
    return str(img), data


def _layer(dev: fx100io.Device, ktls: bool) -> None:
    st = dev.queue_stats()
    if ktls:
        assert st["ktls_conns"] >= 1 and st["tls_user_conns"] == 0, st
    else:
        assert st["tls_user_conns"] >= 1 and st["ktls_conns"] == 0, st


def target_tls(ctl: Path) -> dict[str, int]:
    """The target's control socket's `tls` counts: ktls_conns, tls_user_conns (since the
    start), tls_open (not yet ended)."""
    words = control(str(ctl), "tls").split()
    return dict(zip(words[::2], map(int, words[1::2])))


def wait_tls_open(ctl: Path, want: int, seconds: float = 20.0) -> None:
    """Wait until the target has `want` TLS connections open (its control socket's
    tls_open): connections a host left have ended there, quietly or not."""
    deadline = time.monotonic() + seconds
    while (st := target_tls(ctl))["tls_open"] != want:
        assert time.monotonic() < deadline, (want, st)
        time.sleep(0.05)


def target_layer(ctl: Path, target_ktls: bool) -> None:
    """The target's control socket says every TLS connection so far used the layer
    expected (ktls_conns: the kernel's; tls_user_conns: ours)."""
    st = target_tls(ctl)
    if target_ktls:
        assert st["ktls_conns"] >= 1 and st["tls_user_conns"] == 0, st
    else:
        assert st["tls_user_conns"] >= 1 and st["ktls_conns"] == 0, st


def _target_args(tmp_path: Path, target_ktls: bool) -> tuple[Path, list[str]]:
    ctl = tmp_path / "ctl.sock"
    return ctl, ["--control", str(ctl), "--ktls", "auto" if target_ktls else "off"]


def ticket_mid_read(tmp_path: Path, n: int, ktls: bool, target_ktls: bool = False) -> None:
    """A NewSessionTicket between two records of an n-byte read's C2HData: the
    read is byte-exact, no reconnect, later reads go on on the same layer."""
    img, data = _image(tmp_path, f"ticket-{n}")
    log = tmp_path / "target.log"
    ctl, targs = _target_args(tmp_path, target_ktls)
    with serve([img], NQN, *tls_args(HOST, KEY), "--fault-tls-record", f"ticket:{AFTER}",
               *targs, log=log) as (_h, port, _p):
        with fx100io.open_device(_uri(port, ktls, io_timeout_ms=20000), queue_depth=8) as dev:
            out = np.full(n, 0x77, np.uint8)
            assert dev.read_into_blocking(1 << 20, out) == n
            assert "fault injection: a TLS record of type 22" in log.read_text()
            assert np.array_equal(out, data[1 << 20:(1 << 20) + n])
            for off in (0, 5 << 20, SIZE - n):
                out[:] = 0
                assert dev.read_into_blocking(off, out) == n
                assert np.array_equal(out, data[off:off + n]), off
            st = dev.queue_stats()
            assert st["reconnects"] == 0, st
            _layer(dev, ktls)
            target_layer(ctl, target_ktls)


def end_mid_read(tmp_path: Path, kind: str, ktls: bool, capfd: pytest.CaptureFixture,
                 target_ktls: bool = False) -> None:
    """close_notify or an alert between two records of a 4 MiB read's C2HData:
    the read fails with our layer's error and reason, its buffer holds data or
    zeros or what it held (no byte of the record), and the queue reconnects and
    serves byte-exact reads on the same layer."""
    exc, code, why = ENDS[kind]
    img, data = _image(tmp_path, kind)
    n = 4 << 20
    log = tmp_path / "target.log"
    ctl, targs = _target_args(tmp_path, target_ktls)
    with serve([img], NQN, *tls_args(HOST, KEY), "--fault-tls-record", f"{kind}:{AFTER}",
               *targs, log=log) as (_h, port, _p):
        dev = fx100io.open_device(_uri(port, ktls, io_timeout_ms=20000, reconnect_ms=50),
                                  queue_depth=8)
        try:
            capfd.readouterr()
            out = np.full(n, 0x77, np.uint8)
            with pytest.raises(exc) as e:
                dev.read_into_blocking(0, out)
            assert e.value.errno == code
            assert "fault injection: a TLS record of type 21" in log.read_text()
            ref = data[:n]
            assert np.all((out == ref) | (out == 0) | (out == 0x77))
            if not ktls:
                # our layer hands over each record's data as it comes: what
                # came before the record is there (it came after 20 records;
                # on kTLS the failed receive's part may be zeroed instead)
                assert np.count_nonzero(out == ref) >= 16 * 16384
            err = capfd.readouterr().err
            assert f"{'kTLS' if ktls else 'TLS'}: {why}" in err, err[-2000:]
            out[:] = 0
            assert dev.read_into_blocking(0, out) == n
            assert np.array_equal(out, ref)
            st = dev.queue_stats()
            assert st["reconnects"] >= 1, st
            _layer(dev, ktls)
            target_layer(ctl, target_ktls)
        finally:
            dev.close()


# Every read path of the target carries the fault (it once fired only on a read
# from the page cache without a data digest or --fault-drop-after, after its 15th
# record): (URI options, target options, read size).
PATHS = {
    "ddgst": ({"hdgst": 1, "ddgst": 1}, [], 1 << 20),
    "drop-after": ({}, ["--fault-drop-after", "1000000"], 1 << 20),
    "disk": ({}, [], 1 << 20),
    "small": ({}, [], 128 << 10),
}


def _resident_pages(path: str, length: int) -> int:
    """How many pages of the file's first `length` bytes are in the page cache, as the
    target's mincore() on its mapping sees them."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    page = os.sysconf("SC_PAGE_SIZE")
    pages = (length + page - 1) // page
    vec = ctypes.create_string_buffer(pages)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap of the namespace image failed")
        try:
            if libc.mincore(addr, length, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore of the namespace image failed")
        finally:
            libc.munmap(addr, length)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec.raw[:pages])


def ticket_on_path(tmp_path: Path, path: str, ktls: bool, target_ktls: bool = False,
                   img_dir: Path | None = None) -> None:
    """The ticket on one of PATHS: "disk" reads a namespace evicted from the page
    cache (where its filesystem lets fadvise evict: the target then reads it from
    the disk into a buffer), "small" reads of 8 records (the third holds record
    20).  Every read is byte-exact, the fault fired once, no reconnect."""
    q, extra, n = PATHS[path]
    img, data = _image(img_dir or tmp_path, f"path-{path}")
    reads = max(2, (AFTER + 2) * 16384 // n + 1)
    if path == "disk":
        fd = os.open(img, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        # the target sends a read from the page cache where mincore() finds all of it
        # resident (csrc/target/io.c): the disk path runs only if the pages are gone
        left = _resident_pages(img, reads * n)
        if left:
            pytest.skip(f"{left} pages of {img} stay in the page cache after "
                        "fadvise(DONTNEED) (its filesystem keeps them): the disk path "
                        "would not run")
    log = tmp_path / "target.log"
    ctl, targs = _target_args(tmp_path, target_ktls)
    with serve([img], NQN, *tls_args(HOST, KEY), "--fault-tls-record", f"ticket:{AFTER}",
               *extra, *targs, log=log) as (_h, port, _p):
        with fx100io.open_device(_uri(port, ktls, io_timeout_ms=20000, **q),
                                 queue_depth=8) as dev:
            out = np.empty(n, np.uint8)
            for i in range(reads):
                off = i * n
                out[:] = 0x77
                assert dev.read_into_blocking(off, out) == n
                assert np.array_equal(out, data[off:off + n]), (path, off)
            text = log.read_text()
            assert text.count("fault injection: a TLS record of type 22") == 1, text[-2000:]
            # (where: after record AFTER of the data, or the stream's next record boundary
            # where the C2HData header shifts the records: our layer's packed reads)
            after = int(re.search(r"type 22 \(04 00\) after (\d+) records", text)[1])
            assert AFTER <= after <= AFTER + 1, text[-2000:]
            st = dev.queue_stats()
            assert st["reconnects"] == 0, st
            _layer(dev, ktls)
            target_layer(ctl, target_ktls)

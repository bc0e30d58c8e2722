"""One contract for a TLS record that is not data arriving in the middle of a
read's C2HData, checked the same way on both of our initiator's record layers:
ours (userspace, where the kernel has no `tls` ULP: this host) and the kernel's
(kTLS: the lab guest).  Our target's --fault-tls-record sends the record,
sealed with the connection's keys, between two records of one C2HData.

The test modules (tests/fabric/test_tls_records_mid_read.py here,
tests/guest/test_ktls.py in the guest) call these with the layer they expect."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest

import fx100io
from fx100io import errors
from support import chunk_bytes
from support.target_process import serve, tls_args
from support.tls_keys import KEY

NQN = "nqn.2026-12.io.fx100:tlsmid"
HOST = "nqn.2014-08.org.nvmexpress:uuid:f0100000-0000-4000-8000-00000000f1d1"
SIZE = 16 << 20
# The target sends a read's records 15 at a time: after 20 records of read data
# the record lands after the second send of the first read of 1 MiB or more.
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


def ticket_mid_read(tmp_path: Path, n: int, ktls: bool) -> None:
    """A NewSessionTicket between two records of an n-byte read's C2HData: the
    read is byte-exact, no reconnect, later reads go on on the same layer."""
    img, data = _image(tmp_path, f"ticket-{n}")
    log = tmp_path / "target.log"
    with serve([img], NQN, *tls_args(HOST, KEY), "--fault-tls-record", f"ticket:{AFTER}",
               log=log) as (_h, port, _p):
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


def end_mid_read(tmp_path: Path, kind: str, ktls: bool, capfd: pytest.CaptureFixture) -> None:
    """close_notify or an alert between two records of a 4 MiB read's C2HData:
    the read fails with our layer's error and reason, its buffer holds data or
    zeros or what it held (no byte of the record), and the queue reconnects and
    serves byte-exact reads on the same layer."""
    exc, code, why = ENDS[kind]
    img, data = _image(tmp_path, kind)
    n = 4 << 20
    log = tmp_path / "target.log"
    with serve([img], NQN, *tls_args(HOST, KEY), "--fault-tls-record", f"{kind}:{AFTER}",
               log=log) as (_h, port, _p):
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
        finally:
            dev.close()

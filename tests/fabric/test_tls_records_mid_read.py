"""A TLS record that is not data (NewSessionTicket, close_notify, a fatal or a
warning alert) in the middle of a read's C2HData, on our initiator's own record
layer, pinned with ktls=off (so a host whose kernel has the `tls` ULP still
tests ours) and asserted from the queue's stats.
The contract is shared with the lab guest's kTLS run (support/tls_midread.py,
tests/guest/test_ktls.py).  The target is on our record layer too (this host's
kernel has no `tls` ULP; --ktls off pins it where one has).  The fault fires on
every read path of the target.  Also: the target refuses the fault without TLS."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from support import REPO
from support.ktls import kernel_has_ktls
from support.target_process import serve, tls_args
from support.tls_keys import KEY
from support.tls_midread import (
    HOST,
    NQN,
    PATHS,
    _image,
    _uri,
    end_mid_read,
    target_layer,
    target_tls,
    ticket_mid_read,
    ticket_on_path,
    wait_tls_open,
)

import fx100io


@pytest.mark.parametrize("n", [1 << 20, 4 << 20], ids=["1MiB", "4MiB"])
def test_a_ticket_mid_read_is_dropped_and_the_read_is_byte_exact(tmp_path, n):
    ticket_mid_read(tmp_path, n, ktls=False)


@pytest.mark.parametrize("kind", ["close_notify", "fatal", "warning"])
def test_an_alert_mid_read_fails_the_read_cleanly_then_it_reconnects(tmp_path, kind, capfd):
    end_mid_read(tmp_path, kind, False, capfd)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_ticket_fault_fires_on_every_read_path(tmp_path, path):
    ticket_on_path(tmp_path, path, ktls=False)


def test_the_target_on_ktls_auto_falls_back_to_our_layer_here(tmp_path):
    """--ktls auto (the default) where the kernel has no `tls` ULP: the target's connections
    stay on our layer, and its control socket says so."""
    if kernel_has_ktls():
        pytest.skip("this kernel has the tls ULP: tests/guest/test_ktls.py checks auto there")
    img, data = _image(tmp_path, "auto")
    ctl = tmp_path / "ctl.sock"
    with serve([img], NQN, *tls_args(HOST, KEY), "--control", str(ctl)) as (_h, port, _p):
        with fx100io.open_device(_uri(port, False), queue_depth=4) as dev:
            out = np.empty(1 << 20, np.uint8)
            assert dev.read_into_blocking(0, out) == out.nbytes
            assert np.array_equal(out, data[:1 << 20])
            assert target_tls(ctl)["tls_open"] == 2  # (the admin queue and one I/O queue)
        target_layer(ctl, False)
        wait_tls_open(ctl, 0)  # (the host closed both: they ended on the target too)


@pytest.mark.parametrize("args", [["--fault-tls-record", "ticket:1"],
                                  ["--tls", "required", "--fault-tls-record", "ticket"],
                                  ["--tls", "required", "--fault-tls-record", "hello:3"],
                                  ["--tls", "required", "--fault-tls-record", "fatal:0"]],
                         ids=["no-tls", "no-count", "unknown-kind", "zero"])
def test_the_fault_is_refused_without_tls_or_malformed(tmp_path, args):
    img = tmp_path / "ns.img"
    img.write_bytes(b"\0" * 4096)
    p = subprocess.run([sys.executable, "-m", "fx100io", "target", "--listen", "127.0.0.1:0",
                        "--namespace", str(img), *args], cwd=str(REPO), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0
    assert "--fault-tls-record" in p.stderr, p.stderr

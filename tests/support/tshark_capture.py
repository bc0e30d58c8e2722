"""Capture NVMe/TCP traffic with tshark and let its dissector judge our PDUs:
an independent decoder, not our own parser."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest


def need_tshark() -> str:
    exe = shutil.which("tshark")
    if exe is None:
        pytest.skip("tshark is not installed (apt-get install tshark; tools/setup.sh does)")
    return exe


@contextlib.contextmanager
def capture(port: int, out: Path, iface: str = "any"):
    """Capture TCP port `port` into `out` for the duration of the block."""
    exe = need_tshark()
    err = out.with_suffix(".err")
    with open(err, "w") as ferr:
        p = subprocess.Popen([exe, "-i", iface, "-f", f"tcp port {port}", "-w", str(out), "-q"],
                             stderr=ferr, stdout=subprocess.DEVNULL)
    try:
        deadline = time.time() + 20
        while "Capturing on" not in err.read_text():
            if p.poll() is not None or time.time() > deadline:
                raise AssertionError(f"tshark did not start: {err.read_text()}")
            time.sleep(0.05)
        yield
        time.sleep(0.3)  # let the last segments reach the capture
    finally:
        p.send_signal(2)
        p.wait(timeout=20)


def decode(pcap: Path, port: int) -> tuple[Counter, list[str]]:
    """(count of each NVMe/TCP PDU type, lines tshark flags as malformed or
    expert errors)."""
    exe = need_tshark()
    args = [exe, "-r", str(pcap), "-d", f"tcp.port=={port},nvme-tcp"]
    types = subprocess.run(args + ["-T", "fields", "-e", "nvme-tcp.type"], capture_output=True,
                           text=True, check=True).stdout
    counts: Counter = Counter()
    for line in types.split():
        for t in line.split(","):
            counts[int(t)] += 1
    bad = subprocess.run(args + ["-Y", "_ws.malformed || _ws.expert.severity >= 8388608"],
                         capture_output=True, text=True, check=True).stdout
    return counts, [ln for ln in bad.splitlines() if ln.strip()]

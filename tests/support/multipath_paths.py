"""Helpers the multipath tests share: a URI of several loopback paths to one
subsystem, a sparse backing file two target processes or ports serve, and a
bounded wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from support.target_process import sparse_image


def paths_uri(nqn: str, ports: list[int], **q: object) -> str:
    """nvme+tcp://127.0.0.1:P1,127.0.0.1:P2/NQN?k=v..."""
    query = "&".join(f"{k}={v}" for k, v in q.items())
    hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
    return f"nvme+tcp://{hosts}/{nqn}" + (f"?{query}" if query else "")


def sparse_backing(tmp_path: Path, size: int) -> str:
    return sparse_image(tmp_path, size, "shared.img")


def wait_for(cond: Callable[[], object], what: str, seconds: float, step: float = 0.05) -> None:
    """Poll cond() until it holds; AssertionError naming what after seconds."""
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(step)

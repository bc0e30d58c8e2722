"""Start `fx100io target` as a real subprocess on loopback for a test."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from support import REPO


@contextlib.contextmanager
def _target(args: list[str], listens: int, log: Path | None
            ) -> Iterator[tuple[list[tuple[str, int]], subprocess.Popen]]:
    """Run `fx100io target ARGS`; yield ([(host, port) of each of its listens
    ports, in order], process) once it has printed them, and stop it at the end.

    Quiet by default; with log, the target logs to that file instead (a file,
    not a pipe: an undrained pipe would block the target's logging)."""
    cmd = [sys.executable, "-m", "fx100io", "target", *([] if log else ["-q"]), *args]
    err_to = open(log, "w") if log else subprocess.PIPE  # noqa: SIM115 (closed below)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_to, text=True, cwd=str(REPO))
    try:
        bound = []
        for _ in range(listens):
            line = p.stdout.readline() if p.stdout else ""
            if "listening on nvme+tcp://" not in line:
                err = p.stderr.read() if p.stderr else (log.read_text() if log else "")
                raise AssertionError(f"target did not start: {line!r} {err[-2000:]}")
            hostport = line.split("nvme+tcp://", 1)[1].split("/", 1)[0]
            host, _, port_s = hostport.rpartition(":")
            bound.append((host, int(port_s)))
        yield bound, p
    finally:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if log:
            err_to.close()  # type: ignore[union-attr]


def sparse_image(tmp_path: Path, size: int, name: str = "ns.img") -> str:
    """A sparse file of size bytes for the target to serve as a namespace."""
    p = tmp_path / name
    with open(p, "wb") as f:
        f.truncate(size)
    return str(p)


def tls_args(hostnqn: str, key: str, mode: str = "required") -> list[str]:
    """The target's options to serve hostnqn over TLS with key (its text)."""
    return ["--tls", mode, "--tls-key", f"{hostnqn}={key}"]


def _namespaces(namespaces: list[str]) -> list[str]:
    return [a for ns in namespaces for a in ("--namespace", ns)]


@contextlib.contextmanager
def serve(namespaces: list[str], nqn: str, *extra: str, port: int = 0,
          block_size: int = 512,
          log: Path | None = None) -> Iterator[tuple[str, int, subprocess.Popen]]:
    """Yield (host, port, process) once the target prints its endpoint (see _target
    for log)."""
    args = ["--listen", f"127.0.0.1:{port}", "--nqn", nqn, "--block-size", str(block_size),
            *extra, *_namespaces(namespaces)]
    with _target(args, 1, log) as (bound, p):
        yield bound[0][0], bound[0][1], p


@contextlib.contextmanager
def serve_ports(namespaces: list[str], nqn: str, listens: list[str], *extra: str,
                control: str | None = None, block_size: int = 512,
                log: Path | None = None) -> Iterator[tuple[list[int], subprocess.Popen]]:
    """Yield ([TCP port of port id 1, 2, ...], process) of a target listening on each
    of listens ('127.0.0.1:0', '127.0.0.1:0,ana_state=non-optimized', ...; options as
    `--listen` takes them), with a control socket at control (change states, close
    and open ports with fx100io.target_ctl.control(control, "ana-state 2 1
    inaccessible")).  Extra arguments as serve() takes them (e.g. --ana-state)."""
    args = ["--nqn", nqn, "--block-size", str(block_size), *extra]
    for listen in listens:
        args += ["--listen", listen]
    if control:
        args += ["--control", control]
    with _target(args + _namespaces(namespaces), len(listens), log) as (bound, p):
        yield [port for _, port in bound], p


def wait_port_free(port: int, seconds: float = 5.0) -> None:
    import socket
    deadline = time.time() + seconds
    while time.time() < deadline:
        with socket.socket() as s:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                return
            except OSError:
                time.sleep(0.1)


def threads(pid: int) -> int:
    """Threads of a running target process."""
    return len(os.listdir(f"/proc/{pid}/task"))


def fds(pid: int) -> int:
    """Open descriptors of a running target process."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def settled(fn, pid: int, want_at_most: int, seconds: float = 10.0) -> int:  # noqa: ANN001
    """fn(pid) once it is <= want_at_most, or its last value after seconds."""
    deadline = time.monotonic() + seconds
    while True:
        v = fn(pid)
        if v <= want_at_most or time.monotonic() > deadline:
            return v
        time.sleep(0.05)

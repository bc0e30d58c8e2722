"""A real redis-server for the shared pool's tests: its own loopback port
and directory, AOF with appendfsync always (what docs/shared-pool.md asks of a
deployment), never the system's service."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from support import IN_CI


def require_redis() -> str:
    exe = shutil.which("redis-server")
    if exe is None:
        if IN_CI:
            raise AssertionError("redis-server is not installed (the test command installs it)")
        pytest.skip("redis-server is not installed (Debian package redis-server)")
    try:
        import redis  # noqa: F401
    except ImportError:
        if IN_CI:
            raise
        pytest.skip("the redis Python package is not installed (pip install redis)")
    return exe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self, workdir: Path, port: int | None = None):
        self.exe = require_redis()
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
             "--protected-mode", "no", "--daemonize", "no", "--logfile", "redis.log"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # under tools/asan_suite.sh: the sanitizers are for our extension,
            # not for redis-server (whose jemalloc they would fight)
            env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
        deadline = time.time() + timeout
        import redis
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("redis-server exited: "
                                     + (self.dir / "redis.log").read_text()[-2000:])
            try:
                if redis.Redis(port=self.port, socket_timeout=0.5).ping():
                    return
            except redis.RedisError:
                time.sleep(0.05)
        raise AssertionError("redis-server did not answer")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=20)
        self.proc = None

    def client(self):  # noqa: ANN201
        import redis
        return redis.Redis(port=self.port, socket_timeout=2)


def serve(tmp_path: Path):  # noqa: ANN201
    """Body of each test file's redis_server fixture."""
    srv = RedisServer(tmp_path / "redis")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop(signal.SIGKILL)

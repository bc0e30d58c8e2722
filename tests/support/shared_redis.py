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


def free_cluster_port() -> int:
    """A free loopback port whose cluster bus port (+10000) is free too
    (Redis refuses a cluster port above 55535)."""
    import random
    for _ in range(200):
        port = random.randint(20000, 45000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    raise AssertionError("no free pair of loopback ports for a cluster node")


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

    def start(self, timeout: float = 10.0, extra: list[str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
             "--protected-mode", "no", "--daemonize", "no", "--logfile", "redis.log",
             *(extra or [])],
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


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass


def _wait(what: str, ok, timeout: float, logs: list[Path]) -> None:  # noqa: ANN001
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if ok():
                return
        except Exception:  # noqa: BLE001 (not up yet)
            pass
        time.sleep(0.1)
    tails = "\n".join(f"--- {p}\n" + (p.read_text()[-1500:] if p.exists() else "(none)")
                      for p in logs)
    raise AssertionError(f"{what} within {timeout} s\n{tails}")


class RedisSentinelSet:
    """One primary, two replicas and three sentinels (quorum 2, down after
    down_after_ms), each its own process, loopback port and directory."""

    SERVICE = "mymaster"

    def __init__(self, workdir: Path, down_after_ms: int = 1000):
        self.exe = require_redis()
        self.dir = workdir
        self.down_after_ms = down_after_ms
        self.servers = [RedisServer(workdir / f"redis{i}") for i in range(3)]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen] = []

    def url(self, query: str = "") -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.SERVICE}/0" + (f"?{query}" if query else "")

    def start(self, timeout: float = 20.0) -> None:
        import redis
        primary = self.servers[0]
        primary.start()
        for s in self.servers[1:]:
            s.start(extra=["--replicaof", "127.0.0.1", str(primary.port)])
        _wait("the replicas did not sync",
              lambda: primary.client().info("replication")["connected_slaves"] == 2
              and all(s.client().info("replication")["master_link_status"] == "up"
                      for s in self.servers[1:]), timeout,
              [s.dir / "redis.log" for s in self.servers])
        for i, port in enumerate(self.sentinel_ports):
            d = self.dir / f"sentinel{i}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "sentinel.conf").write_text(
                f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {d}\n"
                f"logfile {d / 'sentinel.log'}\n"
                f"sentinel monitor {self.SERVICE} 127.0.0.1 {primary.port} 2\n"
                f"sentinel down-after-milliseconds {self.SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.SERVICE} 10000\n"
                f"sentinel parallel-syncs {self.SERVICE} 1\n")
            self.sentinels.append(subprocess.Popen(
                [self.exe, str(d / "sentinel.conf"), "--sentinel"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}))

        def sentinels_ready() -> bool:
            for port in self.sentinel_ports:
                m = redis.Redis(port=port, socket_timeout=0.5).sentinel_master(self.SERVICE)
                if int(m["num-slaves"]) < 2 or int(m["num-other-sentinels"]) < 2:
                    return False
            return True
        _wait("the sentinels did not see the replicas and each other", sentinels_ready,
              timeout, [self.dir / f"sentinel{i}" / "sentinel.log" for i in range(3)])

    def primary(self) -> RedisServer:
        """The server the sentinels name as primary now."""
        import redis
        host, port = redis.Redis(port=self.sentinel_ports[0], socket_timeout=1) \
            .sentinel_get_master_addr_by_name(self.SERVICE)
        return next(s for s in self.servers if s.port == int(port))

    def stop(self) -> None:
        _kill(self.sentinels)
        for s in self.servers:
            s.stop(signal.SIGKILL)


class RedisClusterSet:
    """A Redis Cluster of three primaries, each with `replicas` replicas
    (none by default), each node its own process, loopback port and
    directory."""

    # (a replica's full sync starts at once, not after Redis's default 5 s wait for more
    # replicas: a restarted node follows its new primary within a second)
    ARGS = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "2000", "--repl-diskless-sync-delay", "0"]

    def __init__(self, workdir: Path, replicas: int = 0):
        self.exe = require_redis()
        self.cli = shutil.which("redis-cli") or "redis-cli"
        self.replicas = replicas
        self.servers = [RedisServer(workdir / f"node{i}", free_cluster_port())
                        for i in range(3 * (1 + replicas))]

    def url(self, query: str = "") -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.servers)
        return f"redis+cluster://{hosts}/" + (f"?{query}" if query else "")

    def start(self, timeout: float = 30.0) -> None:
        for s in self.servers:
            s.start(extra=self.ARGS)
        subprocess.run([self.cli, "--cluster", "create",
                        *(f"127.0.0.1:{s.port}" for s in self.servers),
                        "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=timeout)
        _wait("the cluster did not reach cluster_state:ok",
              lambda: all(s.client().cluster("info")["cluster_state"] == "ok"
                          for s in self.servers), timeout,
              [s.dir / "redis.log" for s in self.servers])
        if self.replicas:
            _wait("the cluster's replicas did not all follow their primaries",
                  lambda: all(s.client().info("replication").get("master_link_status") == "up"
                              for s in self.servers
                              if s.client().info("replication")["role"] == "slave")
                  and sum(s.client().info("replication")["role"] == "slave"
                          for s in self.servers) == 3 * self.replicas, timeout,
                  [s.dir / "redis.log" for s in self.servers])

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def replica_of(self, primary: RedisServer) -> RedisServer:
        """A replica that follows primary now."""
        return next(s for s in self.servers if s is not primary and s.proc is not None
                    and s.client().info("replication").get("master_port") == primary.port)

    def restart(self, s: RedisServer) -> None:
        """Start a killed node again, with its nodes.conf: it rejoins the cluster (a primary
        whose replica was promoted meanwhile comes back as that one's replica)."""
        s.start(extra=self.ARGS)

    def stop(self) -> None:
        for s in self.servers:
            s.stop(signal.SIGKILL)

"""Host processes of a shared pool for the tests (see shared_host.py)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

from support import REPO


class Host:
    def __init__(self, uris: list[str], index: str, **opts: Any):
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "support" / "shared_host.py"), ",".join(uris), index,
             json.dumps(opts)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            cwd=str(REPO), env=env)
        self._buf = b""
        assert self.read(60).get("ready"), "host did not start"

    def read(self, timeout: float = 60) -> dict:
        """The host's next reply line.  Lines are split here, from raw
        reads: a buffered reader would hide lines already read from select."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            r, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not r:
                if self.proc.poll() is None:
                    os.kill(self.proc.pid, signal.SIGUSR1)  # its stacks, on stderr
                    time.sleep(1)
                raise AssertionError(f"host {self.proc.pid} did not answer in {timeout} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"host {self.proc.pid} exited rc={self.proc.wait()}")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def __call__(self, timeout: float = 60, **cmd: Any) -> dict:
        self.send(**cmd)
        out = self.read(timeout)
        assert "wrong" not in out, out["wrong"]
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send(op="quit")
                self.proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()

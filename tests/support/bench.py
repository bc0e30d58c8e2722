"""`fx100io bench` run the two ways its tests run it (tests/bench): in this process through
its CLI entry point, and as a subprocess followed until its jobs run."""

from __future__ import annotations

import io
import subprocess
import threading

from fx100io.bench import cli
from support import REPO


def bench(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = cli.run(list(argv), stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


def popen_until_jobs_run(cmd: list[str]) -> tuple[subprocess.Popen, bytearray, threading.Thread]:
    """Start a bench command and return once its jobs run (its status line began on
    stderr): the process, what stderr said so far (still growing) and its reader."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(REPO))
    seen = bytearray()
    running = threading.Event()

    def watch_stderr() -> None:
        assert p.stderr is not None
        while chunk := p.stderr.read1(4096):
            seen.extend(chunk)
            if b"Jobs:" in seen:
                running.set()

    reader = threading.Thread(target=watch_stderr, daemon=True)
    reader.start()
    assert running.wait(120), seen.decode(errors="replace")
    return p, seen, reader

"""Runs shell commands inside the guest through its serial console.

The guest's /init serves a plain `sh` on ttyS0 after READY. The console echoes what we type,
so output is framed by marker lines that the echoed command cannot contain: the marker is
printed from two shell words glued together, which appear apart in the echo.
"""

from __future__ import annotations

import re
import socket
import time
import uuid
from pathlib import Path


class GuestCommandError(RuntimeError):
    """The console did not answer in time or could not be reached."""


def run(console_socket: Path, command: str, timeout: float = 120.0) -> tuple[int, str]:
    """Run command in the guest's shell; return (exit status, output with \\r removed)."""
    tag = uuid.uuid4().hex[:12]
    begin, end = f"FXBEGIN{tag}", f"FXEND{tag}"
    # A subshell, so `exit` or `cd` in command cannot end or change the console shell; stdin
    # from /dev/null, since that shell reads its commands from the console and a command
    # reading stdin would swallow the ones after it. The extra echo ends output lacking a newline.
    line = (f"echo FX''BEGIN{tag}; ( {command}\n) </dev/null; rc=$?; echo; "
            f"echo FX''END{tag} $rc\n")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as console:
        console.settimeout(1.0)
        try:
            console.connect(str(console_socket))
        except OSError as err:
            raise GuestCommandError(f"cannot reach guest console {console_socket}: {err}") from None
        console.sendall(line.encode())
        received = b""
        deadline = time.monotonic() + timeout
        pattern = re.compile(rf"^{begin}\r?\n(.*?)^{end} (\d+)\r?$".encode(), re.DOTALL | re.MULTILINE)
        while True:
            match = pattern.search(received)
            if match:
                output = match.group(1).decode(errors="replace").replace("\r", "")
                return int(match.group(2)), output[:-1]
            if time.monotonic() > deadline:
                raise GuestCommandError(f"guest command timed out after {timeout:.0f} s: {command}\n"
                                        f"console so far:\n{received.decode(errors='replace')[-2000:]}")
            try:
                chunk = console.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                raise GuestCommandError("guest console closed the connection")
            received += chunk

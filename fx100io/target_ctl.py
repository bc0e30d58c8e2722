"""`fx100io target-ctl PATH COMMAND ...`: change a running `fx100io target`
through its --control socket (csrc/target/control.c).

    fx100io target-ctl /run/fx100io-target.sock ana-state 2 1 inaccessible
    fx100io target-ctl /run/fx100io-target.sock ana-state 2 1 change optimized 2000
    fx100io target-ctl /run/fx100io-target.sock close-port 127.0.0.1:4421
    fx100io target-ctl /run/fx100io-target.sock open-port 2
    fx100io target-ctl /run/fx100io-target.sock ports

One command per connection: the target answers with any lines of output and
then "ok", or with "error: why".
"""

from __future__ import annotations

import errno
import socket
import sys

from fx100io.errors import Fx100ioValueError, FxConnectionError, FxTimeoutError

USAGE = """usage: fx100io target-ctl PATH COMMAND ...

commands:
  ana-state PORT GROUP STATE  PORT: port id (1..) or HOST:PORT; GROUP: 1..32 or all;
                              STATE: optimized, non-optimized, inaccessible,
                              persistent-loss, change
  ana-state PORT GROUP change [THEN [MS]]
                              change, then THEN (default: the state before) after
                              MS (default and at most 10000: ANATT)
  close-port PORT             end the port's connections and refuse new ones
                              (remove-listen is the same)
  open-port PORT              listen again on the port's address and TCP port
  ports                       each port: id, address, open/closed, groups' states
  tls                         TLS connections so far by record layer: ktls_conns N
                              (the kernel's, kTLS) tls_user_conns M (fx100io's),
                              and tls_open K (either, not yet ended)"""


class TargetControlError(Fx100ioValueError, RuntimeError):
    """The target refused a control command (the message says why).  An
    Fx100ioError (errno EINVAL) like everything fx100io raises, and still a
    RuntimeError for callers that caught it as one."""


def control(path: str, command: str, timeout: float = 5.0) -> str:
    """Send one command line to the target's control socket at path; return its
    output (without the final "ok").  Raises TargetControlError when the target
    refuses it, FxConnectionError when the socket cannot be reached or the
    connection breaks, FxTimeoutError when the target does not answer within
    timeout seconds (all Fx100ioErrors, so OSErrors too)."""
    if "\n" in command:
        raise ValueError("one command line, no newline")
    chunks = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(command.encode() + b"\n")
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
    except TimeoutError:
        raise FxTimeoutError(errno.ETIMEDOUT, f"the target's control socket gave no answer "
                             f"within {timeout:g} s", path) from None
    except OSError as e:
        raise FxConnectionError(e.errno or errno.ECONNRESET, "cannot reach the target's control "
                                f"socket ({e.strerror or e}; is the target running with "
                                "--control here?)", path) from None
    text = b"".join(chunks).decode(errors="replace")
    lines = text.splitlines()
    if not lines:
        raise TargetControlError("the target closed the control connection without an answer")
    if lines[-1].startswith("error:"):
        raise TargetControlError(lines[-1][len("error:"):].strip())
    if lines[-1] != "ok":
        raise TargetControlError(f"unexpected answer {lines[-1]!r}")
    return "\n".join(lines[:-1])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if len(args) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        out = control(args[0], " ".join(args[1:]))
    except TargetControlError as e:
        print(f"fx100io target-ctl: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # FxConnectionError, FxTimeoutError: the message names the socket
        print(f"fx100io target-ctl: error: {e}", file=sys.stderr)
        return 1
    if out:
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

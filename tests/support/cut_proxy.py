"""A loopback TCP proxy in front of a target that can cut one of the
connections it carries and refuse every new one, so a test can take down one
NVMe/TCP connection of a queue while the others (and the admin connection)
stay up."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class CutProxy:
    def __init__(self, upstream_port: int) -> None:
        self._up = upstream_port
        self._ls = socket.socket()
        self._ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._ls.bind(("127.0.0.1", 0))
        self._ls.listen(16)
        self.port = self._ls.getsockname()[1]
        self.refusing = threading.Event()
        self._lock = threading.Lock()
        self.conns: list[tuple[socket.socket, socket.socket]] = []  # in accept order
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self._ls.accept()
            except OSError:
                return  # closed
            if self.refusing.is_set():
                c.close()
                continue
            try:
                u = socket.create_connection(("127.0.0.1", self._up), timeout=5)
            except OSError:
                c.close()
                continue
            u.settimeout(None)
            for s in (c, u):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.conns.append((c, u))
            threading.Thread(target=self._pump, args=(c, u), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while d := a.recv(1 << 20):
                b.sendall(d)
        except OSError:
            pass
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self, index: int) -> None:
        """Refuse new connections from now on and break connection index
        (in accept order; negative counts from the last)."""
        self.refusing.set()
        with self._lock:
            pair = self.conns[index]
        for s in pair:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.refusing.set()
        self._ls.close()
        with self._lock:
            pairs = list(self.conns)
        for pair in pairs:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()


@contextlib.contextmanager
def cut_proxy(upstream_port: int) -> Iterator[CutProxy]:
    p = CutProxy(upstream_port)
    try:
        yield p
    finally:
        p.close()

"""A loopback proxy that breaks one TLS record from a target on its way to our initiator,
or from our initiator on its way to the target (tests/fabric/test_tls_io.py on our record
layer, tests/guest/test_ktls.py on the kernel's)."""

from __future__ import annotations

import socket
import threading


class RecordProxy:
    """A loopback proxy between our initiator and our target that reads the
    target's TLS records (their 5-byte headers are clear text) and, on the
    first connection that carries more than `after` records, breaks record
    number `after` as `how` says: "tag" flips a byte of its body, "oversize"
    sends a header claiming 2^14+257 bytes, "cut" closes mid-record.  With
    longer_than, the record broken is instead the first whose body is longer
    than that once `armed` is set.  Later connections pass through untouched.
    upstream: the records broken are the initiator's, on their way to the target."""

    def __init__(self, port: int, how: str, after: int = 40, longer_than: int | None = None,
                 upstream: bool = False):
        self.port, self.how, self.after, self.longer_than = port, how, after, longer_than
        self.upstream = upstream
        self.armed = threading.Event()
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.srv.settimeout(0.2)
        self.listen_port = self.srv.getsockname()[1]
        self.done = False
        self.fired = threading.Event()
        self.threads: list[threading.Thread] = []
        self.socks: list[socket.socket] = []
        self._start(self._accept)

    def _start(self, fn, *args) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept(self) -> None:
        while not self.done:
            try:
                a, _ = self.srv.accept()
            except OSError:
                continue
            b = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            self.socks += [a, b]
            if self.upstream:
                self._start(self._records, a, b)
                self._start(self._pipe, b, a)
            else:
                self._start(self._pipe, a, b)
                self._start(self._records, b, a)

    @staticmethod
    def _read(s: socket.socket, n: int) -> bytes:
        out = b""
        while len(out) < n:
            got = s.recv(n - len(out))
            if not got:
                raise ConnectionError
            out += got
        return out

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        self._cut(src, dst)

    def _records(self, src: socket.socket, dst: socket.socket) -> None:
        n = 0
        try:
            while True:
                hdr = self._read(src, 5)
                body = self._read(src, int.from_bytes(hdr[3:5], "big"))
                n += 1
                pick = (len(body) > self.longer_than and self.armed.is_set()
                        if self.longer_than is not None else n == self.after)
                if pick and not self.fired.is_set():
                    self.fired.set()
                    if self.how == "tag":
                        body = body[:100] + bytes([body[100] ^ 4]) + body[101:]
                    elif self.how == "oversize":
                        hdr = hdr[:3] + (16384 + 257).to_bytes(2, "big")
                    else:
                        dst.sendall(hdr + body[:len(body) // 2])
                        break
                dst.sendall(hdr + body)
        except OSError:
            pass
        self._cut(src, dst)

    @staticmethod
    def _cut(*socks: socket.socket) -> None:
        # shutdown first: a close alone leaves the socket open while the
        # other direction's thread is still blocked in recv on it
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.done = True
        self._cut(self.srv, *self.socks)
        for t in self.threads:
            t.join(5)

"""Whether this kernel can carry TLS records itself (kTLS): a loopback TCP
socket takes the `tls` ULP, as our initiator's first step toward it does."""

from __future__ import annotations

import socket

TCP_ULP = 31


def kernel_has_ktls() -> bool:
    with socket.create_server(("127.0.0.1", 0)) as srv, \
            socket.create_connection(srv.getsockname(), timeout=5) as c:
        a, _ = srv.accept()
        with a:
            try:
                c.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")
            except OSError:
                return False
            return True

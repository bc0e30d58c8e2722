"""Checks that something speaking NVMe/TCP answers at the lab's endpoint.

`start` only reports the endpoint after this handshake succeeds from where initiators run
(inside the lab's namespace for the fast path), so "ready" means reachable, not just booted.
"""

from __future__ import annotations

import socket
import struct
import threading

from . import networking

ICREQ, ICRESP = 0x00, 0x01
IC_PDU_LENGTH = 128


def _socket_in_netns(netns: str | None) -> socket.socket:
    """A TCP socket created in netns (a socket keeps the namespace it was created in).

    A short-lived thread enters the namespace so the calling thread's own network is untouched.
    """
    if netns is None:
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    result: dict = {}

    def create() -> None:
        try:
            networking.enter_netns_thread(netns)
            result["socket"] = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        except (OSError, networking.NetworkError) as err:  # re-raised in the caller
            result["error"] = err

    thread = threading.Thread(target=create, name="fabric-lab-netns-socket")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["socket"]


def icreq_handshake(host: str, port: int, netns: str | None = None, timeout: float = 10.0) -> dict:
    """Send an ICReq (PFV 0, no digests) and return the ICResp's fields; raise OSError/ValueError."""
    sock = _socket_in_netns(netns)
    with sock:
        sock.settimeout(timeout)
        sock.connect((host, port))
        # Common header (type, flags, hlen, pdo, plen) + PFV, HPDA, DGST, MAXR2T; rest reserved.
        icreq = struct.pack("<BBBBIHBBI", ICREQ, 0, IC_PDU_LENGTH, 0, IC_PDU_LENGTH, 0, 0, 0, 0)
        sock.sendall(icreq.ljust(IC_PDU_LENGTH, b"\0"))
        reply = b""
        while len(reply) < IC_PDU_LENGTH:
            chunk = sock.recv(IC_PDU_LENGTH - len(reply))
            if not chunk:
                raise ConnectionError(f"target closed after {len(reply)} bytes of ICResp")
            reply += chunk
    pdu_type, _flags, hlen, _pdo, plen, pfv, cpda, dgst, maxh2cdata = struct.unpack_from(
        "<BBBBIHBBI", reply)
    if pdu_type != ICRESP or hlen != IC_PDU_LENGTH or plen != IC_PDU_LENGTH:
        raise ValueError(f"not an ICResp: type {pdu_type:#x} hlen {hlen} plen {plen}")
    return {"pfv": pfv, "cpda": cpda, "dgst": dgst, "maxh2cdata": maxh2cdata}

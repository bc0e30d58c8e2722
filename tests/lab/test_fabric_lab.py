"""Smoke tests of the fabric lab against the real Linux NVMe-oF target (nvmet-tcp).

The PDUs are hand-coded here with struct, independently of fx100io's own implementation, so
these tests check the lab (and give fx100io a known-good reference exchange), not our code.
Layouts follow NVMe/TCP 1.0 and NVMe-oF 1.1 (see docs/nvme-tcp.md, "The protocol in one page").
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time
import uuid

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
# The fixture comes from the lab_fixture plugin (a conftest may load it too; loading twice is
# harmless).
pytest_plugins = ["support.lab_fixture"]

pytestmark = pytest.mark.lab

# PDU types and sizes (NVMe/TCP)
ICREQ, ICRESP, CAPSULE_CMD, CAPSULE_RESP, C2H_DATA, C2H_TERM_REQ = 0x00, 0x01, 0x04, 0x05, 0x07, 0x03
C2H_DATA_SUCCESS = 0x08
IC_LEN = 128
SQE_LEN, CQE_LEN = 64, 16
CH = struct.Struct("<BBBBI")  # pdu_type, flags, hlen, pdo, plen

# Commands
FABRICS, CONNECT, PROPERTY_SET, PROPERTY_GET = 0x7F, 0x01, 0x00, 0x04
GET_LOG_PAGE, IDENTIFY = 0x02, 0x06
SGL_METABUF = 0x40  # PSDT 01b: NVMe-oF commands must use SGLs
SGL_IN_CAPSULE = 0x01  # data block descriptor, offset subtype: data follows the SQE
SGL_TRANSPORT = 0x50  # transport data block: data moves in C2H/H2C PDUs
CC, CSTS = 0x14, 0x1C
CC_ENABLE = 0x00460001  # EN, IOSQES 6 (64 B), IOCQES 4 (16 B)
DISCOVERY_LOG = 0x70
TRTYPE_TCP = 3

UNLISTED_HOST_NQN = "nqn.2026-11.io.fx100:not-on-any-allow-list"


class NvmeStatus(Exception):
    def __init__(self, what: str, status: int):
        self.sct = (status >> 8) & 0x7
        self.sc = status & 0xFF
        super().__init__(f"{what}: NVMe status SCT {self.sct:#x} SC {self.sc:#x}")


def _recv_exact(sock: socket.socket, length: int) -> bytes:
    data = b""
    while len(data) < length:
        chunk = sock.recv(length - len(data))
        if not chunk:
            raise ConnectionError(f"target closed the connection ({len(data)}/{length} bytes)")
        data += chunk
    return data


def _connect_socket(lab) -> socket.socket:
    return socket.create_connection(lab.endpoint, timeout=30)


def _icreq() -> bytes:
    # Common header + PFV 0, HPDA 0, no digests, MAXR2T 0; the rest is reserved (zero).
    return CH.pack(ICREQ, 0, IC_LEN, 0, IC_LEN).ljust(8, b"\0") + struct.pack(
        "<HBBI", 0, 0, 0, 0).ljust(IC_LEN - 8, b"\0")


class AdminQueue:
    """Just enough of an NVMe/TCP host to reach a controller's admin queue."""

    def __init__(self, lab, subnqn: str, hostnqn: str):
        self.sock = _connect_socket(lab)
        self.cid = 0
        self.sock.sendall(_icreq())
        icresp = _recv_exact(self.sock, IC_LEN)
        assert icresp[0] == ICRESP
        self.cpda = icresp[10]
        self.cntlid = self.connect(subnqn, hostnqn)

    def close(self) -> None:
        self.sock.close()

    def _sqe(self, opcode: int, sgl_type: int, sgl_length: int, nsid: int = 0,
             cdw10_15: bytes = b"", fctype: int = 0) -> bytes:
        self.cid = (self.cid + 1) & 0xFFFF
        # opcode, flags, cid, nsid (fctype overlays nsid's first byte for fabrics commands)
        head = struct.pack("<BBHI", opcode, SGL_METABUF, self.cid, fctype if opcode == FABRICS else nsid)
        sgl = struct.pack("<QI3xB", 0, sgl_length, sgl_type)
        sqe = head + bytes(16) + sgl + cdw10_15.ljust(24, b"\0")
        assert len(sqe) == SQE_LEN
        return sqe

    def _submit(self, sqe: bytes, data: bytes = b"") -> None:
        hlen = 8 + SQE_LEN
        pdo = hlen if data else 0
        self.sock.sendall(CH.pack(CAPSULE_CMD, 0, hlen, pdo, hlen + len(data)) + sqe + data)

    def _complete(self, what: str) -> tuple[int, bytes]:
        """Read PDUs until this command's CapsuleResp; return (dword0|dword1<<32, data)."""
        data = bytearray()
        while True:
            pdu_type, flags, _hlen, pdo, plen = CH.unpack(_recv_exact(self.sock, 8))
            body = _recv_exact(self.sock, plen - 8)
            if pdu_type == C2H_DATA:
                cccid, datao, datal = struct.unpack_from("<H2xII", body, 0)
                assert cccid == self.cid
                start = pdo - 8
                data[datao:datao + datal] = body[start:start + datal]
                if flags & C2H_DATA_SUCCESS:
                    return 0, bytes(data)
            elif pdu_type == CAPSULE_RESP:
                result, _sqhd, _sqid, cid, status = struct.unpack_from("<QHHHH", body, 0)
                assert cid == self.cid
                if status >> 1:
                    raise NvmeStatus(what, status >> 1)
                return result, bytes(data)
            elif pdu_type == C2H_TERM_REQ:
                raise ConnectionError(f"{what}: target terminated the connection: {body.hex()}")
            else:
                raise AssertionError(f"{what}: unexpected PDU type {pdu_type:#x}")

    def connect(self, subnqn: str, hostnqn: str) -> int:
        # Connect data: HOSTID, CNTLID 0xFFFF (dynamic), SUBNQN at 256, HOSTNQN at 512.
        data = bytearray(1024)
        data[0:16] = uuid.uuid5(uuid.NAMESPACE_URL, hostnqn).bytes
        struct.pack_into("<H", data, 16, 0xFFFF)
        data[256:256 + len(subnqn)] = subnqn.encode()
        data[512:512 + len(hostnqn)] = hostnqn.encode()
        # RECFMT 0, QID 0 (admin), SQSIZE 31 (0-based), CATTR 0, KATO 0
        cdws = struct.pack("<HHHBxI", 0, 0, 31, 0, 0)
        sqe = self._sqe(FABRICS, SGL_IN_CAPSULE, len(data), cdw10_15=cdws, fctype=CONNECT)
        self._submit(sqe, bytes(data))
        result, _ = self._complete(f"Connect to {subnqn} as {hostnqn}")
        return result & 0xFFFF

    def property_get(self, offset: int, size8: bool = False) -> int:
        sqe = self._sqe(FABRICS, SGL_TRANSPORT, 0, fctype=PROPERTY_GET,
                        cdw10_15=struct.pack("<B3xI", 1 if size8 else 0, offset))
        self._submit(sqe)
        return self._complete(f"Property Get {offset:#x}")[0]

    def property_set(self, offset: int, value: int) -> None:
        sqe = self._sqe(FABRICS, SGL_TRANSPORT, 0, fctype=PROPERTY_SET,
                        cdw10_15=struct.pack("<B3xIQ", 0, offset, value))
        self._submit(sqe)
        self._complete(f"Property Set {offset:#x}")

    def enable(self, timeout: float = 30.0) -> None:
        self.property_set(CC, CC_ENABLE)
        deadline = time.monotonic() + timeout
        while not self.property_get(CSTS) & 1:
            assert time.monotonic() < deadline, "controller did not report CSTS.RDY"
            time.sleep(0.05)

    def read_admin(self, opcode: int, length: int, nsid: int = 0, cdw10_15: bytes = b"") -> bytes:
        self._submit(self._sqe(opcode, SGL_TRANSPORT, length, nsid=nsid, cdw10_15=cdw10_15))
        return self._complete(f"admin opcode {opcode:#x}")[1]

    def get_log_page(self, lid: int, length: int) -> bytes:
        numd = length // 4 - 1
        return self.read_admin(GET_LOG_PAGE, length,
                               cdw10_15=struct.pack("<II", lid | (numd & 0xFFFF) << 16, numd >> 16))

    def identify_namespace(self, nsid: int) -> bytes:
        return self.read_admin(IDENTIFY, 4096, nsid=nsid, cdw10_15=struct.pack("<I", 0))


def test_icreq_gets_well_formed_icresp(fabric_lab):
    with _connect_socket(fabric_lab) as sock:
        sock.sendall(_icreq())
        icresp = _recv_exact(sock, IC_LEN)
    pdu_type, flags, hlen, pdo, plen = CH.unpack_from(icresp)
    pfv, cpda, dgst, maxh2cdata = struct.unpack_from("<HBBI", icresp, 8)
    assert (pdu_type, flags, hlen, pdo, plen) == (ICRESP, 0, IC_LEN, 0, IC_LEN)
    assert pfv == 0
    assert cpda <= 31
    assert dgst == 0, "target enabled digests we did not ask for"
    assert maxh2cdata >= 4096 and maxh2cdata % 4 == 0
    assert icresp[16:] == bytes(IC_LEN - 16), "reserved ICResp bytes must be zero"


def test_discovery_log_lists_every_lab_subsystem(fabric_lab):
    queue = AdminQueue(fabric_lab, fabric_lab.discovery_nqn, fabric_lab.allowed_host_nqn)
    try:
        queue.enable()
        header = queue.get_log_page(DISCOVERY_LOG, 1024)
        numrec = struct.unpack_from("<Q", header, 8)[0]
        log = queue.get_log_page(DISCOVERY_LOG, 1024 * (numrec + 1))
    finally:
        queue.close()
    entries = {}
    for i in range(numrec):
        entry = log[1024 * (i + 1):1024 * (i + 2)]
        trtype, _adrfam, subtype = entry[0], entry[1], entry[2]
        trsvcid = entry[32:64].rstrip(b"\0 ").decode()
        subnqn = entry[256:512].rstrip(b"\0").decode()
        traddr = entry[512:768].rstrip(b"\0 ").decode()
        if subtype == 2:  # NVM subsystem (the discovery subsystem may list itself too)
            entries[subnqn] = (trtype, traddr, trsvcid)
    for sub in fabric_lab.subsystems:
        assert entries.get(sub.nqn) == (TRTYPE_TCP, fabric_lab.guest_ip, "4420"), entries


def test_allow_list_admits_only_listed_hosts(fabric_lab):
    guarded = [s for s in fabric_lab.subsystems if not s.allow_any_host]
    if not guarded:
        pytest.skip("this lab config has no allow-listed subsystem")
    for sub in guarded:
        queue = AdminQueue(fabric_lab, sub.nqn, fabric_lab.allowed_host_nqn)
        assert queue.cntlid != 0xFFFF
        queue.close()
        with pytest.raises(NvmeStatus) as refused:
            AdminQueue(fabric_lab, sub.nqn, UNLISTED_HOST_NQN).close()
        # Command specific status 0x84: Connect Invalid Host
        assert (refused.value.sct, refused.value.sc) == (1, 0x84)


def test_namespaces_have_configured_block_size_and_capacity(fabric_lab):
    for sub in fabric_lab.subsystems:
        queue = AdminQueue(fabric_lab, sub.nqn, fabric_lab.allowed_host_nqn)
        try:
            queue.enable()
            for ns in sub.namespaces:
                identify = queue.identify_namespace(ns.nsid)
                nsze = struct.unpack_from("<Q", identify, 0)[0]
                flbas = identify[26] & 0x0F
                lbads = identify[128 + 4 * flbas + 2]
                assert 1 << lbads == ns.block_size, f"{sub.nqn} ns {ns.nsid}"
                assert nsze * ns.block_size == ns.size_bytes, f"{sub.nqn} ns {ns.nsid}"
        finally:
            queue.close()


def test_guest_console_reads_the_target_config(fabric_lab):
    status, output = fabric_lab.guest("cat /sys/kernel/config/nvmet/ports/1/addr_trsvcid")
    assert (status, output.strip()) == (0, "4420")
    status, _ = fabric_lab.guest("exit 3")
    assert status == 3


def test_rdma_port_listens_on_soft_roce(fabric_lab):
    if fabric_lab.rdma_port is None:
        pytest.skip("lab started without --rdma")
    status, links = fabric_lab.guest("rdma link")
    assert status == 0 and "state ACTIVE" in links
    status, trtype = fabric_lab.guest("cat /sys/kernel/config/nvmet/ports/2/addr_trtype")
    assert trtype.strip() == "rdma"
    _, log = fabric_lab.guest("dmesg | grep nvmet_rdma")
    assert f"enabling port 2 ({fabric_lab.guest_ip}:{fabric_lab.rdma_port})" in log


def test_loopback_works_inside_the_lab_network(fabric_lab):
    # The whole suite may run inside the lab's netns; loopback tests must still work there.
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname(), timeout=5) as client:
        peer, _ = server.accept()
        with peer:
            client.sendall(b"ping")
            assert _recv_exact(peer, 4) == b"ping"

"""The URI options of the NVMe/TCP secure channel (tls, tls_key): the key text
is checked by the C parser (csrc/nvme_tcp/tls_psk.c) through fabric_uri, read
from a file with @FILE, hidden wherever a URI is shown, and a URI that asks
for TLS is never connected in clear text."""

from __future__ import annotations

import os
import socket
import threading

import pytest

import fx100io
from fx100io import _core, fabric_uri, uri_redact
from fx100io.errors import Fx100ioError, InvalidArgumentError, KernelSupportError

NQN = "nqn.2024-01.io.fx100io:tls"
# libnvme's test/psk.c key (32 bytes, HH 01) and its 48-byte twin (HH 02)
KEY = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"
KEY48 = "NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ==:"
BAD_CRC = KEY[:-2] + "Y:"


def _uri(query: str, port: int = 4420) -> str:
    return f"nvme+tcp://127.0.0.1:{port}/{NQN}?{query}"


def _lines(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.split("\n") if line)


@pytest.mark.parametrize("key", [KEY, KEY48])
def test_an_inline_key_turns_tls_on_and_travels_apart_from_the_target_string(key):
    for query in (f"tls_key={key}", f"tls=1&tls_key={key}"):
        target, secrets = fabric_uri.to_transport(_uri(query))
        assert _lines(target)["tls"] == "1"
        assert "NVMeTLSkey" not in target
        assert _lines(secrets)["tls_key"] == key


# every secret option takes @FILE the same way: (option, a good value, a bad one, why)
SECRET_OPTIONS_FILES = [
    ("tls_key", KEY, BAD_CRC, "CRC"),
    ("dhchap_secret", None, "DHHC-1:00:AAAA:", "32, 48 or 64"),
    ("dhchap_ctrl_secret", None, "DHHC-1:00:AAAA:", "32, 48 or 64"),
]


def _good(option: str, value: str | None) -> str:
    if value is not None:
        return value
    from support.target_auth_host import SECRET_A
    return SECRET_A


def _with(option: str, value: str) -> str:
    # dhchap_ctrl_secret needs dhchap_secret beside it
    extra = f"&dhchap_secret={_good('dhchap_secret', None)}" if option == "dhchap_ctrl_secret" else ""
    return _uri(f"{option}={value}{extra}")


@pytest.mark.parametrize("option, good, bad, why", SECRET_OPTIONS_FILES)
def test_a_key_file_is_read_and_its_newline_dropped(tmp_path, option, good, bad, why):
    good = _good(option, good)
    f = tmp_path / "key"
    f.write_text(good + "\n")
    f.chmod(0o600)
    target, secrets = fabric_uri.to_transport(_with(option, f"@{f}"))
    assert _lines(secrets)[option] == good
    assert good not in target and str(f) not in target
    if option == "tls_key":
        assert _lines(target)["tls"] == "1"


@pytest.mark.parametrize("value, why", [
    (BAD_CRC, "CRC does not match"),
    ("DHHC-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:", 'starts with "NVMeTLSkey-1:"'),
    ("NVMeTLSkey-1:03:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:", "00, 01 or 02"),
    (KEY48.replace(":02:", ":01:"), "does not match its hash field"),
    ("", "NVMeTLSkey-1:HH:<base64>:"),
])
def test_a_bad_key_is_refused_with_why_and_never_quoted(value, why):
    with pytest.raises(InvalidArgumentError, match="tls_key") as e:
        fabric_uri.parse(_uri(f"tls_key={value}"))
    assert why in str(e.value)
    if value:
        assert value not in str(e.value) and value[16:40] not in str(e.value)


@pytest.mark.parametrize("option, good, bad, why", SECRET_OPTIONS_FILES)
def test_a_bad_key_file_is_named_and_its_content_never_quoted(tmp_path, option, good, bad, why):
    with pytest.raises(InvalidArgumentError, match=f"{option}: cannot read .*missing"):
        fabric_uri.parse(_with(option, f"@{tmp_path}/missing"))
    f = tmp_path / "bad"
    f.write_text(bad)
    with pytest.raises(InvalidArgumentError, match=f"{option} \\(in {f}\\).*{why}") as e:
        fabric_uri.parse(_with(option, f"@{f}"))
    assert bad not in str(e.value)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InvalidArgumentError, match="not a regular file"):
        fabric_uri.parse(_with(option, f"@{fifo}"))
    big = tmp_path / "big"
    big.write_bytes(b"x" * 10000)
    with pytest.raises(InvalidArgumentError, match="not a key file"):
        fabric_uri.parse(_with(option, f"@{big}"))


def test_tls_without_a_key_and_tls_off_with_one_are_refused():
    with pytest.raises(InvalidArgumentError, match="tls=1 needs tls_key"):
        fabric_uri.parse(_uri("tls=1"))
    with pytest.raises(InvalidArgumentError, match="contradict"):
        fabric_uri.parse(_uri(f"tls=0&tls_key={KEY}"))
    # tls=0 alone is the default, said out loud
    assert fabric_uri.parse(_uri("tls=0"))["tls"] == "0"


def test_the_c_parser_is_the_one_python_asks():
    assert _core.tls_key_error(KEY) is None
    assert "CRC" in _core.tls_key_error(BAD_CRC)


@pytest.mark.parametrize("query", [f"tls_key={KEY}", f"tlskey={KEY}", f"tls_key%3D{KEY}",
                                   "tls_key=@/etc/nvme/tls.key"])
def test_redaction_hides_keys_and_key_files(query):
    shown = uri_redact.redact(_uri(query))
    assert "VRLbtnN9" not in shown and "/etc/nvme" not in shown
    assert "VRLbtnN9" not in uri_redact.redact_url(_uri(query))


def test_a_uri_asking_for_tls_is_never_connected_in_clear():
    """The first bytes a URI with a key sends are a TLS handshake record (type
    22), never a clear-text ICReq (type 0); a peer that does not answer with
    TLS fails the open with a clear error."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        srv.settimeout(10)
        port = srv.getsockname()[1]
        first: list[bytes] = []

        def peer() -> None:
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(10)
                first.append(conn.recv(5))
                conn.sendall(bytes(8))  # a clear-text answer

        t = threading.Thread(target=peer)
        t.start()
        try:
            with pytest.raises(Fx100ioError) as e:
                fx100io.open_device(_uri(f"tls_key={KEY}&connect_timeout_ms=2000", port))
        finally:
            t.join(15)
        assert first and first[0][:1] == b"\x16" and first[0][1:3] == b"\x03\x01"
        assert "VRLbtnN9" not in str(e.value)


def test_kernel_discovery_asking_for_tls_is_refused_not_read_in_clear():
    # discovery_options() is what the kernel path reads
    with pytest.raises(KernelSupportError, match="needs the tlshd daemon"):
        fabric_uri.discovery_options(f"nvme+tcp://127.0.0.1:8009/?tls_key={KEY}")
    with pytest.raises(InvalidArgumentError, match="tls=1 needs tls_key"):
        fabric_uri.discovery_options("nvme+tcp://127.0.0.1:8009/?tls=1")
    with pytest.raises(InvalidArgumentError, match="tls is for nvme\\+tcp"):
        fabric_uri.discover(f"nvme+rdma://127.0.0.1:4420/?tls_key={KEY}")

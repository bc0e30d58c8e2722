"""The lab's tlshd fetcher (tools/fabric_lab/fabric_lab/tlshd.py) without the network: where it
reads the archive from, how it reads the signed index, which cached version it picks, and
that an unreachable archive or an index that fails gpgv is a TlshdUnavailable that says so
(the guest's kernel TLS tests then skip with that reason).  The real fetch runs at every lab
start and in tests/guest/test_kernel_tls.py."""

from __future__ import annotations

import contextlib
import lzma
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "fabric_lab"
sys.path.insert(0, str(TOOLS))

from fabric_lab import tlshd  # noqa: E402

RELEASE = """Origin: Debian
Codename: trixie
SHA256:
 b449439c113900c8607c1005f7a1ec0704d0f3b7376ba312b2150c79e4e4e06c 10538456 main/source/Sources.xz
 0d6f5a9cfb1c3b0b4f1f0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6 4242 main/binary-amd64/Packages.xz
"""


def test_the_archive_is_the_one_the_apt_sources_use(tmp_path, monkeypatch):
    monkeypatch.delenv("FX100IO_DEBIAN_MIRROR", raising=False)
    d = tmp_path / "apt"
    (d / "sources.list.d").mkdir(parents=True)
    (d / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.invalid/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://mirror.invalid/debian/\nSuites: bookworm\n")
    assert tlshd.mirror(d) == "http://mirror.invalid/debian"
    (d / "sources.list").write_text("deb [signed-by=/k.gpg] http://other.invalid/debian bookworm main\n")
    assert tlshd.mirror(d) == "http://other.invalid/debian"  # sources.list is read first
    assert tlshd.mirror(tmp_path / "none") == tlshd.DEFAULT_MIRROR
    monkeypatch.setenv("FX100IO_DEBIAN_MIRROR", "http://set.invalid/debian/")
    assert tlshd.mirror(d) == "http://set.invalid/debian"


def test_the_signed_index_names_the_packages_index():
    digest, size = tlshd._index_entry(RELEASE, "main/binary-amd64/Packages.xz")
    assert digest.startswith("0d6f5a9c") and size == 4242
    with pytest.raises(tlshd.TlshdUnavailable, match="lists no main/binary-arm64"):
        tlshd._index_entry(RELEASE, "main/binary-arm64/Packages.xz")
    packages = ("Package: ktls-utils-doc\nVersion: 9\n\nPackage: ktls-utils\nVersion: 1.0.0-1\n"
                "Filename: pool/main/k/ktls-utils/ktls-utils_1.0.0-1_amd64.deb\nSHA256: ab\n"
                "Description: x\n continued\n")
    fields = tlshd._package_stanza(packages)
    assert fields["Version"] == "1.0.0-1" and fields["SHA256"] == "ab"
    with pytest.raises(tlshd.TlshdUnavailable, match="has no ktls-utils"):
        tlshd._package_stanza("Package: other\n")
    with pytest.raises(tlshd.TlshdUnavailable, match="SHA-256"):
        tlshd._sha256_ok(b"tampered", "00" * 32, "x.deb")


def test_the_newest_cached_version_is_used_without_the_network(tmp_path, monkeypatch):
    monkeypatch.setenv("FX100IO_TLSHD_CACHE", str(tmp_path))
    monkeypatch.setenv("FX100IO_DEBIAN_MIRROR", "http://127.0.0.1:9/debian")
    assert tlshd.cached() is None
    for version, executable in (("1.0.0-1", True), ("1.10.0-1", True), ("1.2.0-1", True),
                                ("2.0.0-1", False)):  # (not executable: a broken entry)
        _cache_entry(tmp_path / f"ktls-utils_{version}", executable)
    _cache_entry(tmp_path / "ktls-utils_3.0.0-1.tmp")  # a fetch that was cut short
    changed = _cache_entry(tmp_path / "ktls-utils_2.1.0-1")
    changed.write_text("#!/bin/sh\necho changed since it was cached\n")
    _cache_entry(tmp_path / "ktls-utils_2.2.0-1")
    (tmp_path / "ktls-utils_2.2.0-1" / "SOURCE").write_text("sha256 00\n")  # no tlshd-sha256
    want = tmp_path / "ktls-utils_1.10.0-1" / "tlshd"
    assert tlshd.cached() == want
    assert tlshd.ensure(log=lambda m: None) == want


def _cache_entry(version_dir: Path, executable: bool = True) -> Path:
    """A cache entry as ensure() leaves it: tlshd and a SOURCE recording its SHA-256."""
    version_dir.mkdir()
    binary = version_dir / "tlshd"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755 if executable else 0o644)
    (version_dir / "SOURCE").write_text(f"tlshd-sha256 {tlshd._binary_digest(binary)}\n")
    return binary


@pytest.fixture(autouse=True)
def _no_apt_get(monkeypatch):
    """These tests must never install packages on the machine running them."""
    def refuse(*args):
        raise AssertionError("the fetcher ran apt-get (ldd reported nothing missing)")

    monkeypatch.setattr(tlshd, "_install_runtime", refuse)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_archive_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("FX100IO_TLSHD_CACHE", str(tmp_path / "cache"))
    url = f"http://127.0.0.1:{_closed_port()}/debian"
    monkeypatch.setenv("FX100IO_DEBIAN_MIRROR", url)
    with pytest.raises(tlshd.TlshdUnavailable, match=f"cannot download {url}/dists/trixie/InRelease"):
        tlshd.ensure(log=lambda m: None)
    assert tlshd.cached() is None


def test_an_index_that_fails_gpgv_is_refused(tmp_path, monkeypatch):
    """An archive (here a loopback server) whose InRelease is not signed by Debian's key."""

    body = (b"-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n" + RELEASE.encode()
            + b"-----BEGIN PGP SIGNATURE-----\n\nAAAA\n-----END PGP SIGNATURE-----\n")
    with _archive(body) as (url, _served):
        monkeypatch.setenv("FX100IO_TLSHD_CACHE", str(tmp_path / "cache"))
        monkeypatch.setenv("FX100IO_DEBIAN_MIRROR", url)
        with pytest.raises(tlshd.TlshdUnavailable, match="failed gpgv"):
            tlshd.ensure(log=lambda m: None)
        assert tlshd.cached() is None


@pytest.fixture(scope="module")
def throwaway_signer(tmp_path_factory):
    """A signing key made for these tests (in its own GNUPGHOME) and a keyring of its public
    half, standing in for Debian's: (clearsign(text) -> bytes, keyring path)."""
    import os
    import shutil
    import subprocess

    if shutil.which("gpg") is None or shutil.which("gpgv") is None:
        pytest.skip("gpg and gpgv are needed to sign a fixture InRelease (apt-get install gpg gpgv)")
    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    env = dict(os.environ, GNUPGHOME=str(home))
    subprocess.run(["gpg", "--batch", "-q", "--passphrase", "", "--quick-gen-key",
                    "fx100io test <test@invalid>", "ed25519", "sign", "never"],
                   env=env, check=True, capture_output=True, timeout=60)
    keyring = home / "keyring.gpg"
    keyring.write_bytes(subprocess.run(["gpg", "--batch", "--export"], env=env, check=True,
                                       capture_output=True, timeout=60).stdout)

    def clearsign(text: str) -> bytes:
        return subprocess.run(["gpg", "--batch", "-q", "--clearsign"], input=text.encode(),
                              env=env, check=True, capture_output=True, timeout=60).stdout

    return clearsign, keyring


FORGED = " ff" + "00" * 31 + " 4242 main/binary-amd64/Packages.xz\n"


def test_a_signed_index_is_read_only_as_signed(throwaway_signer, tmp_path):
    clearsign, keyring = throwaway_signer
    signed = clearsign(RELEASE)
    release = tlshd.verified_release(signed, tmp_path, keyring)
    assert tlshd._index_entry(release, "main/binary-amd64/Packages.xz")[0].startswith("0d6f5a9c")
    # an index put in front of (or after) the signed block, which gpgv alone accepts
    for forged in (b"SHA256:\n" + FORGED.encode() + b"\n" + signed,
                   signed + b"\nSHA256:\n" + FORGED.encode()):
        with pytest.raises(tlshd.TlshdUnavailable, match="text outside its one signed message"):
            tlshd.verified_release(forged, tmp_path, keyring)
    # a changed byte inside the signed block: gpgv's BADSIG
    with pytest.raises(tlshd.TlshdUnavailable, match="failed gpgv"):
        tlshd.verified_release(signed.replace(b"Origin: Debian", b"Origin: Debiam"),
                               tmp_path, keyring)
    # signed, but for another release (an older one could be replayed)
    with pytest.raises(tlshd.TlshdUnavailable, match="names codename bookworm"):
        tlshd.verified_release(clearsign(RELEASE.replace("trixie", "bookworm")), tmp_path, keyring)


def test_a_forged_index_in_front_of_the_signed_one_is_not_fetched(throwaway_signer, tmp_path,
                                                                   monkeypatch):
    """The whole fetch, from a loopback archive serving a good InRelease with a forged index
    in front: refused before anything is downloaded or cached."""
    clearsign, keyring = throwaway_signer
    body = b"SHA256:\n" + FORGED.encode() + b"\n" + clearsign(RELEASE)
    with _archive(body) as (url, served):
        monkeypatch.setattr(tlshd, "KEYRING", keyring)
        monkeypatch.setenv("FX100IO_TLSHD_CACHE", str(tmp_path / "cache"))
        monkeypatch.setenv("FX100IO_DEBIAN_MIRROR", url)
        with pytest.raises(tlshd.TlshdUnavailable, match="outside its one signed message"):
            tlshd.ensure(log=lambda m: None)
        assert served == ["/debian/dists/trixie/InRelease"] and tlshd.cached() is None


@contextlib.contextmanager
def _archive(body: bytes):
    """A loopback 'archive' answering every GET with body: (its /debian URL, the paths asked)."""
    served: list[str] = []

    class Archive(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the http.server API)
            served.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = _serve(Archive)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/debian", served
    finally:
        server.shutdown()
        server.server_close()


def _serve(handler):
    server = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_slow_or_oversized_download_is_cut_off(monkeypatch):
    class Drip(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the http.server API)
            self.send_response(200)
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b"x" * 65536 if self.path == "/big" else b"x")
                    self.wfile.flush()
                    if self.path != "/big":
                        time.sleep(0.2)
            except OSError:
                pass

        def log_message(self, *args):
            pass

    server = _serve(Drip)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        monkeypatch.setattr(tlshd, "DOWNLOAD_DEADLINE_S", 1)
        started = time.monotonic()
        with pytest.raises(tlshd.TlshdUnavailable, match="took longer than 1 s"):
            tlshd._get(f"{url}/slow")
        assert time.monotonic() - started < 5
        with pytest.raises(tlshd.TlshdUnavailable, match="larger than the 200000 bytes"):
            tlshd._get(f"{url}/big", limit=200_000)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("failure", [
    subprocess.TimeoutExpired(["tlshd", "--help"], 30),
    subprocess.CalledProcessError(2, ["dpkg-deb", "-x"]),
    KeyError("SHA256"),
    ValueError("not enough values to unpack"),
    lzma.LZMAError("Input format not supported by decoder"),
])
def test_every_failure_of_the_fetch_is_tlshd_unavailable(failure, tmp_path, monkeypatch):
    """So that the lab start only warns (lab_control catches TlshdUnavailable) and the guest's
    kernel TLS tests skip saying why."""
    monkeypatch.setenv("FX100IO_TLSHD_CACHE", str(tmp_path))

    def fail(base, log):
        raise failure

    monkeypatch.setattr(tlshd, "_fetch", fail)
    with pytest.raises(tlshd.TlshdUnavailable, match=type(failure).__name__):
        tlshd.ensure(log=lambda m: None)


def test_runtime_libraries_are_installed_only_when_ldd_misses_one(tmp_path, monkeypatch):
    binary = tmp_path / "tlshd"
    binary.write_text("#!/bin/sh\necho 'usage: tlshd [-chsv]'\n")
    binary.chmod(0o755)
    asked = []
    monkeypatch.setattr(tlshd, "_unresolved", lambda b: "")
    tlshd._loads_here(binary, log=lambda m: None)  # the autouse fixture refuses apt-get
    answers = iter(["libnl-genl-3.so.200", ""])
    monkeypatch.setattr(tlshd, "_unresolved", lambda b: next(answers))
    monkeypatch.setattr(tlshd, "_install_runtime", lambda missing, log: asked.append(missing))
    tlshd._loads_here(binary, log=lambda m: None)
    assert asked == ["libnl-genl-3.so.200"]

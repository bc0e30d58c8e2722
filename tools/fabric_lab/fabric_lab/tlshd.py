"""tlshd, the TLS handshake daemon of the Linux kernel's NVMe/TCP TLS, for the lab guest.

Both kernel sides (nvme-tcp, nvmet-tcp) hand each TLS handshake to `tlshd` through the
netlink handshake family.  tlshd is in ktls-utils, which Debian 12 does not package (in
bookworm or bookworm-backports); Debian 13 (trixie) does.  This module fetches trixie's
ktls-utils .deb from the Debian archive the host's apt sources already use, checks it
through Debian's own chain of trust (trixie's InRelease signature, verified by gpgv against
the host's debian-archive-keyring, names the Packages index by SHA-256, which names the .deb
by SHA-256), unpacks only `usr/sbin/tlshd` and caches it under
/var/cache/fx100io/tlshd/<version>/ (FX100IO_TLSHD_CACHE), so a machine fetches it once.

Why the binary and not a build from source: the archive this project's machines reach
serves trixie's source index but not ktls-utils' source files (its .dsc and .orig.tar.xz,
of 1.0.0-1 and of sid's 1.4.0-1, answer 404 while the .deb answers 200).  Trixie's tlshd
1.0.0 needs glibc >= 2.34 and GnuTLS symbol versions up to GNUTLS_3_7_3, which bookworm's
libc6 2.36 and libgnutls30 3.7.9 provide: `ensure()` checks that the binary loads with the
host's libraries (ldd, then `tlshd --help`) before caching it, and installs the runtime
libraries with apt-get only when ldd reports one missing.  The cache entry records the
binary's SHA-256, checked each time it is used.  (The guest runs the host's root, so the
cached binary runs there as it is.)

`python3 tools/fabric_lab/lab.py tlshd` prints the cached binary's path (fetching it first
when needed); exit status 3 when the archive cannot be reached and nothing is cached.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

SUITE = "trixie"
PACKAGE = "ktls-utils"
ARCH = "amd64"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# tlshd's shared libraries, as bookworm names their packages
RUNTIME_PACKAGES = ("libgnutls30", "libkeyutils1", "libglib2.0-0", "libnl-3-200",
                    "libnl-genl-3-200")
TIMEOUT_S = 60
# a whole download (the .deb, Packages.xz) at most this long
DOWNLOAD_DEADLINE_S = 300
APT_TIMEOUT_S = 300


class TlshdUnavailable(RuntimeError):
    """tlshd could not be had: the archive is unreachable (and nothing is cached), or what
    it served failed a check.  The message says which."""


def cache_dir() -> Path:
    return Path(os.environ.get("FX100IO_TLSHD_CACHE", "/var/cache/fx100io/tlshd"))


def _binary_digest(binary: Path) -> str:
    return hashlib.sha256(binary.read_bytes()).hexdigest()


def _intact(version_dir: Path) -> bool:
    """A finished cache entry (not a `.tmp` staging directory a cut-short fetch left) whose
    executable tlshd still has the SHA-256 recorded in its SOURCE when it was cached."""
    binary = version_dir / "tlshd"
    if version_dir.name.endswith(".tmp") or not os.access(binary, os.X_OK):
        return False
    try:
        recorded = re.search(r"(?m)^tlshd-sha256 ([0-9a-f]{64})$",
                             (version_dir / "SOURCE").read_text())
        return recorded is not None and _binary_digest(binary) == recorded.group(1)
    except OSError:
        return False


def cached() -> Path | None:
    """The newest intact cached tlshd, or None.  Versions sort as Debian's do for the plain
    N.N.N-N that ktls-utils uses."""
    found = [p / "tlshd" for p in cache_dir().glob("*") if _intact(p)]

    def key(path: Path) -> list[int]:
        return [int(n) for n in re.findall(r"\d+", path.parent.name)]

    return max(found, key=key) if found else None


def mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian archive the host's apt sources use (its first `.../debian` URI, one-line or
    deb822), so the machine's own choice of mirror or proxy is followed;
    FX100IO_DEBIAN_MIRROR overrides."""
    override = os.environ.get("FX100IO_DEBIAN_MIRROR")
    if override:
        return override.rstrip("/")
    texts = []
    for path in [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*"))]:
        try:
            texts.append(path.read_text())
        except OSError:
            continue
    for text in texts:
        for uri in re.findall(r"(?m)^(?:deb\s+(?:\[[^\]]*\]\s+)?|URIs:\s*)(\S+)", text):
            if re.search(r"/debian/?$", uri):
                return uri.rstrip("/")
    return DEFAULT_MIRROR


def _get(url: str, limit: int = 4 << 20) -> bytes:
    """The body at url, at most `limit` bytes, within DOWNLOAD_DEADLINE_S in total: urlopen's
    timeout bounds each socket operation only, so a server that drips a byte a minute
    would otherwise hold the lab start for ever."""
    deadline = time.monotonic() + DOWNLOAD_DEADLINE_S
    body = bytearray()
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:  # noqa: S310 (http(s) only)
            while chunk := response.read1(1 << 16):  # (read() waits for all 64 KiB)
                body += chunk
                if len(body) > limit:
                    raise TlshdUnavailable(f"{url} is larger than the {limit} bytes expected")
                if time.monotonic() > deadline:
                    raise TlshdUnavailable(f"{url} took longer than {DOWNLOAD_DEADLINE_S} s")
    except (urllib.error.URLError, OSError) as err:
        raise TlshdUnavailable(f"cannot download {url}: {err}") from err
    return bytes(body)


def _sha256_ok(data: bytes, digest: str, what: str) -> None:
    got = hashlib.sha256(data).hexdigest()
    if got != digest:
        raise TlshdUnavailable(f"{what}: SHA-256 {got} is not the {digest} its index names")


CLEARSIGN_BEGIN = b"-----BEGIN PGP SIGNED MESSAGE-----\n"
CLEARSIGN_END = b"-----END PGP SIGNATURE-----"


def _only_the_signed_message(signed: bytes) -> None:
    """gpgv accepts a clearsigned message with any unsigned text before or after it (and
    exits 0), so, as apt does, refuse a file that holds anything outside one signed block."""
    if (not signed.startswith(CLEARSIGN_BEGIN) or signed.count(CLEARSIGN_BEGIN) != 1
            or signed.count(CLEARSIGN_END) != 1 or not signed.rstrip().endswith(CLEARSIGN_END)):
        raise TlshdUnavailable(f"{SUITE}'s InRelease holds text outside its one signed message")


def verified_release(signed: bytes, work: Path, keyring: Path | None = None) -> str:
    """The text gpgv verified in a clearsigned InRelease (only that: gpgv writes the signed
    part to PLAIN), checked by gpgv against the Debian archive keyring: a VALIDSIG and no
    BADSIG/ERRSIG on its status lines, and the Codename this module fetches."""
    keyring = keyring or KEYRING
    _only_the_signed_message(signed)
    (work / "InRelease").write_bytes(signed)
    plain = work / "InRelease.verified"
    plain.unlink(missing_ok=True)
    check = subprocess.run(["gpgv", "--status-fd", "1", "--keyring", str(keyring),
                            "--output", str(plain), str(work / "InRelease")],
                           capture_output=True, text=True, check=False, timeout=TIMEOUT_S)
    status = [line.split()[1] for line in check.stdout.splitlines()
              if line.startswith("[GNUPG:] ") and len(line.split()) > 1]
    if (check.returncode != 0 or "VALIDSIG" not in status
            or {"BADSIG", "ERRSIG", "EXPKEYSIG", "REVKEYSIG"} & set(status)):
        raise TlshdUnavailable(f"{SUITE}'s InRelease failed gpgv against {keyring}: "
                               f"{check.stderr.strip()[-300:]}")
    release = plain.read_text()
    codename = re.search(r"(?m)^Codename:\s*(\S+)\s*$", release)
    if codename is None or codename.group(1) != SUITE:
        raise TlshdUnavailable(f"the InRelease signed for {SUITE} names codename "
                               f"{codename.group(1) if codename else 'none'}")
    return release


def _index_entry(release: str, name: str) -> tuple[str, int]:
    """(SHA-256, size) of a file the Release text lists under SHA256:."""
    section = release.split("\nSHA256:\n", 1)[-1]
    for line in section.splitlines():
        if not line.startswith(" "):
            break
        digest, size, path = line.split()
        if path == name:
            return digest, int(size)
    raise TlshdUnavailable(f"{SUITE}'s InRelease lists no {name}")


def _package_stanza(packages: str) -> dict[str, str]:
    for stanza in packages.split("\n\n"):
        if stanza.startswith(f"Package: {PACKAGE}\n"):
            fields = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith(" "):
                    k, _, v = line.partition(":")
                    fields[k] = v.strip()
            return fields
    raise TlshdUnavailable(f"{SUITE}'s Packages index has no {PACKAGE}")


def _install_runtime(missing_libraries: str, log) -> None:
    """apt-get install tlshd's runtime libraries; called only when ldd found one missing,
    each apt-get bounded by APT_TIMEOUT_S so that a lab start cannot hang on it."""
    missing = [p for p in RUNTIME_PACKAGES
               if subprocess.run(["dpkg", "-s", p], capture_output=True, check=False,
                                 timeout=TIMEOUT_S).returncode]
    if not missing:
        raise TlshdUnavailable(f"tlshd lacks libraries no runtime package gives: {missing_libraries}")
    log(f"tlshd: ldd found {missing_libraries} missing: apt-get install {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, capture_output=True,
                   timeout=APT_TIMEOUT_S)
    done = subprocess.run(["apt-get", "install", "-y", "-qq", *missing], capture_output=True,
                          text=True, check=False, env=env, timeout=APT_TIMEOUT_S)
    if done.returncode != 0:
        raise TlshdUnavailable(f"apt-get install {' '.join(missing)} failed: "
                               f"{done.stderr.strip()[-300:]}")


def _unresolved(binary: Path) -> str:
    """The libraries ldd cannot find for binary ('' when all resolve)."""
    ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False,
                         timeout=TIMEOUT_S)
    if ldd.returncode != 0:
        raise TlshdUnavailable(f"{binary} does not load here: {ldd.stdout.strip()[-300:]}")
    return " ".join(line.split()[0] for line in ldd.stdout.splitlines() if "not found" in line)


def _loads_here(binary: Path, log) -> None:
    """The binary must resolve every library (installing the runtime packages only when ldd
    says one is missing) and start (its usage line) on this host."""
    missing = _unresolved(binary)
    if missing:
        _install_runtime(missing, log)
        missing = _unresolved(binary)
        if missing:
            raise TlshdUnavailable(f"{binary} does not load here: {missing} not found")
    usage = subprocess.run([str(binary), "--help"], capture_output=True, text=True,
                           check=False, timeout=30)
    if "usage: tlshd" not in usage.stdout + usage.stderr:
        raise TlshdUnavailable(f"{binary} --help did not print its usage: "
                               f"{(usage.stdout + usage.stderr).strip()[-300:]}")


def ensure(log=print) -> Path:
    """Path of a cached tlshd, fetched and checked first when none is cached.  Every way the
    fetch can fail is a TlshdUnavailable (the lab start then only warns)."""
    have = cached()
    if have is not None:
        return have
    for tool in ("gpgv", "dpkg-deb", "ldd"):
        if shutil.which(tool) is None:
            raise TlshdUnavailable(f"no {tool} here to check and unpack tlshd")
    if not KEYRING.is_file():
        raise TlshdUnavailable(f"no {KEYRING} (debian-archive-keyring) to check trixie's index")
    try:
        return _fetch(mirror(), log)
    except (subprocess.SubprocessError, KeyError, ValueError, lzma.LZMAError, OSError) as err:
        raise TlshdUnavailable(f"fetching tlshd failed: {type(err).__name__}: {err}") from err


def _fetch(base: str, log) -> Path:
    with tempfile.TemporaryDirectory(prefix="fx100io-tlshd-") as tmp:
        work = Path(tmp)
        release = verified_release(_get(f"{base}/dists/{SUITE}/InRelease"), work)
        name = f"main/binary-{ARCH}/Packages.xz"
        digest, size = _index_entry(release, name)
        packed = _get(f"{base}/dists/{SUITE}/{name}", limit=2 * size)
        _sha256_ok(packed, digest, name)
        fields = _package_stanza(lzma.decompress(packed).decode("utf-8", "replace"))
        version, filename = fields["Version"], fields["Filename"]
        if not re.fullmatch(r"[0-9A-Za-z.+~-]+", version):
            raise TlshdUnavailable(f"{PACKAGE}'s version {version!r} is not a Debian version")
        log(f"tlshd: fetching {PACKAGE} {version} ({SUITE}) from {base}")
        deb = work / Path(filename).name
        deb.write_bytes(_get(f"{base}/{filename}", limit=2 * int(fields["Size"])))
        _sha256_ok(deb.read_bytes(), fields["SHA256"], deb.name)
        unpacked = work / "x"
        subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True,
                       capture_output=True, timeout=TIMEOUT_S)
        binary = unpacked / "usr/sbin/tlshd"
        _loads_here(binary, log)
        target = cache_dir() / f"{PACKAGE}_{version}"
        staging = target.with_name(target.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        shutil.copy2(binary, staging / "tlshd")
        (staging / "SOURCE").write_text(f"{base}/{filename}\nsha256 {fields['SHA256']}\n"
                                        f"tlshd-sha256 {_binary_digest(binary)}\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    log(f"tlshd: cached {target / 'tlshd'}")
    return target / "tlshd"

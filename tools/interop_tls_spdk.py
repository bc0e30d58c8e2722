#!/usr/bin/env python3
"""NVMe/TCP secure channels (TLS 1.3, PSK) against SPDK, both ways, in one run.

SPDK is built outside the repo by ../shared/tools/spdk-peer.sh (`build`, once);
CI does not build it, so this is a command of its own (docs/testing.md).  Root
(hugepages).  Everything stays on 127.0.0.1.

  1. SPDK's nvmf_tgt (started as `spdk-peer.sh start` does, reactor on core 0, but
     with its ssl socket's buffers at 2 MiB: SSL_BUF_SIZE says why) gets
     three secure-channel listeners (and a fourth, below) (`nvmf_subsystem_add_listener -k`), one
     subsystem each, whose host has a PSK from SPDK's keyring:
       4422  NVMeTLSkey-1:01: (32 bytes, SHA-256)  TLS_AES_128_GCM_SHA256
       4423  NVMeTLSkey-1:02: (48 bytes, SHA-384)  TLS_AES_256_GCM_SHA384
       4424  NVMeTLSkey-1:00: (32 bytes, no hash: the configured PSK is the retained one)
     SPDK picks the suite from the key's length and uses the PSK identity
     `NVMe0R0x <hostnqn> <subnqn>` (it has no NVMe1R form), as our initiator
     does by default.  Our initiator (`tls_key=@FILE`) writes and reads each,
     32 x 4 KiB and 32 x 1 MiB submitted together (QD32), and checks the bytes,
     again after a second open (new handshakes); a fourth listener (4425) asks
     for TLS and bidirectional DH-HMAC-CHAP on the same connections; SPDK's
     discovery log must name each listener's secure channel; a wrong key, a
     missing DH-HMAC-CHAP secret and a clear-text connect must fail clearly.
  2. Our target (`fx100io target --tls required --tls-key HOST=@FILE`) under
     spdk_nvme_perf with `-S ssl --psk-path FILE`: sequential 4 KiB writes over
     the whole namespace (perf fills each buffer with one byte, 1..8; every
     block of our backing file must then be one such byte repeated), 1 MiB
     reads; both suites; perf with a wrong key must fail and our target log why;
     TLS with bidirectional DH-HMAC-CHAP (perf --dhchap-key/--dhchap-ctrlr-key,
     our --dhchap-key/--dhchap-ctrl-key), and without the secret refused.
  3. Speed, against SPDK's TLS target (4422, RAM namespace), our initiator
     (`fx100io bench`, core 1) vs spdk_nvme_perf with TLS (core 1), interleaved
     per round, medians: 1 MiB reads QD32 (goal >= 1.0x) and 4 KiB random reads
     QD32 (goal >= 0.8x).  --clear adds both tools in clear text against the same
     target (4420, spdk-peer.sh's RAM namespace) to the same rounds: what TLS costs each.

  python3 tools/interop_tls_spdk.py [--rounds 3] [--seconds 5] [--clear] [--skip-interop] [--skip-bench]
                                    [--spdk-ssl-defaults]

Exits 1 if an interop check fails (the speed goals are printed, not enforced).
On every exit (a failure, an error, Ctrl-C, SIGTERM) nvmf_tgt is stopped, our
target and perf runs killed, hugepages given back and the PSK files removed; a
pid file left by a dead nvmf_tgt is cleaned, one of a live one refuses the run.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import glob
import os
import re
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import bench_nvme_tcp_spdk as spdk_bench  # noqa: E402  (the SPDK helpers of the clear-text bench)

import fx100io  # noqa: E402
from fx100io import errors  # noqa: E402

SPDK = spdk_bench.SPDK
PEER = spdk_bench.PEER
HOST = "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100"
OUR_NQN = "nqn.2026-12.io.fx100:interop-tls"
MiB = 1 << 20
# (name, hash byte HH, key bytes, port, suite OpenSSL reports)
SUITES = [("sha256", 1, 32, 4422, "TLS_AES_128_GCM_SHA256"),
          ("sha384", 2, 48, 4423, "TLS_AES_256_GCM_SHA384"),
          ("nohash", 0, 32, 4424, "TLS_AES_128_GCM_SHA256")]
# DH-HMAC-CHAP secrets for the subsystem that asks for both (fixed test secrets, as in tests/)
DH_HOST = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:"
DH_CTRL = "DHHC-1:00:Vse+lQXC74j55LLeogykqUyoq6cyGRWl2MHdprBpN13YAtvd:"
AUTH_NQN, AUTH_PORT = "nqn.2016-06.io.spdk:tls-auth", 4425
TARGET_START_S = 60   # our target prints its URI within this, or the run fails
PIDFILE = "/var/tmp/spdk-tgt.pid"   # spdk-peer.sh's
FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"  {'ok  ' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        FAILED.append(what)


def interchange(hh: int, key: bytes) -> str:
    """A configured PSK as `nvme gen-tls-key` prints it (CRC-32 little endian)."""
    return (f"NVMeTLSkey-1:{hh:02x}:"
            + base64.b64encode(key + zlib.crc32(key).to_bytes(4, "little")).decode() + ":")


def key_file(d: str, name: str, hh: int, n: int) -> str:
    """A key file as SPDK's keyring takes it: 0600, no trailing newline."""
    path = os.path.join(d, f"psk-{name}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(interchange(hh, os.urandom(n)))
    return path


def _rpc(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH="/usr/sbin:/usr/bin:/sbin:/bin",
               PYTHONPATH=os.path.join(SPDK, "python"),
               LD_LIBRARY_PATH=os.path.join(SPDK, "build", "lib"))
    return subprocess.run([os.path.join(SPDK, "scripts", "rpc.py"), *args], env=env,
                          capture_output=True, text=True, timeout=60, cwd=SPDK)


def rpc_out(*args: str) -> str:
    """An RPC's answer on one line (whitespace squeezed); a failed one ends the run."""
    r = _rpc(*args)
    if r.returncode != 0:
        raise SystemExit(f"rpc.py {' '.join(args)} failed:\n{r.stdout}{r.stderr}")
    return " ".join(r.stdout.split())


def rpc(*args: str) -> None:
    rpc_out(*args)


def rpc_ok(*args: str) -> bool:
    """Whether the target answers (its RPC socket is up), without failing the run."""
    return _rpc(*args).returncode == 0


# SPDK's ssl socket sets SO_SNDBUF and SO_RCVBUF to 4 KiB (MIN_SO_SNDBUF_SIZE, g_ssl_impl_opts in
# module/sock/posix/posix.c; applied in spdk_sock_posix_fd_create, lib/sock/sock.c, to the
# listening socket, whose accepted sockets inherit it); its posix (clear-text) socket sets 2 MiB.
# The kernel doubles that to 8 KiB and turns autotuning off, and the nvmf TCP transport raises
# only the receive side (nvmf_tcp_icreq_handle), so the target's TLS sockets can have about two
# 16 KiB records unacknowledged: each 128 KiB C2HData then waits for the host's ACKs, and a
# host that delays its ACK (the kernel's 40 ms minimum once the connection is interactive)
# stalls every read by 40 ms (docs/benchmarks.md, "Over TLS, against SPDK's TLS target").
# The target's TLS sockets get the clear-text socket's 2 MiB instead, so that TLS and clear
# text are compared on like buffers; sock_impl_set_options is allowed only before the
# framework starts, hence --wait-for-rpc.  --spdk-ssl-defaults keeps SPDK's 4 KiB.
SSL_BUF_SIZE = 2 * MiB
# what nr_hugepages was before start_spdk raised it: stop_spdk puts it back
_hugepages_before: int | None = None


def start_spdk(ssl_defaults: bool) -> None:
    """spdk-peer.sh start's target, its ns1 only (core 0; nqn.2016-06.io.spdk:cnode1 with a 512 MiB RAM
    namespace on 127.0.0.1:4420, discovery there too), but with the ssl socket's buffers
    set before the framework starts (unless ssl_defaults)."""
    global _hugepages_before
    with open("/proc/sys/vm/nr_hugepages") as f:
        if _hugepages_before is None:
            _hugepages_before = int(f.read().strip() or 0)
    with open("/proc/sys/vm/nr_hugepages", "w") as f:
        f.write("1024")  # 2 GiB of 2 MiB pages: the target's and perf's
    with open("/proc/mounts") as f:
        mounted = any(ln.split()[2] == "hugetlbfs" for ln in f if len(ln.split()) > 2)
    if not mounted:
        os.makedirs("/dev/hugepages", exist_ok=True)
        subprocess.run(["mount", "-t", "hugetlbfs", "nodev", "/dev/hugepages"], check=True)
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(SPDK, "build", "lib"))
    with open("/var/tmp/spdk-tgt.log", "w") as log:  # the child keeps its own descriptor
        tgt = subprocess.Popen([os.path.join(SPDK, "build", "bin", "nvmf_tgt"), "-m", "0x1",
                                "--wait-for-rpc"], stdout=log, stderr=subprocess.STDOUT,
                               env=env, cwd=SPDK, start_new_session=True)
    with open(PIDFILE, "w") as f:
        f.write(str(tgt.pid))  # stop_spdk's, as spdk-peer.sh's own start writes it
    for _ in range(100):
        if tgt.poll() is not None:
            raise SystemExit(f"nvmf_tgt exited ({tgt.returncode}); its log: /var/tmp/spdk-tgt.log")
        if rpc_ok("spdk_get_version"):
            break
        time.sleep(0.2)
    else:
        raise SystemExit("nvmf_tgt did not answer RPCs in 20 s; its log: /var/tmp/spdk-tgt.log")
    if not ssl_defaults:
        rpc("sock_impl_set_options", "-i", "ssl", "--send-buf-size", str(SSL_BUF_SIZE),
            "--recv-buf-size", str(SSL_BUF_SIZE))
    rpc("framework_start_init")
    print(f"SPDK's ssl socket options: {rpc_out('sock_impl_get_options', '-i', 'ssl')}", flush=True)
    nqn = spdk_bench.SPDK_NQN
    rpc("nvmf_create_transport", "-t", "TCP")
    rpc("bdev_malloc_create", "-b", "Malloc0", "512", "512")  # 512 MiB RAM, 512 B blocks
    rpc("nvmf_create_subsystem", nqn, "-a", "-s", "SPDK00000000000001")
    rpc("nvmf_subsystem_add_ns", nqn, "Malloc0")
    rpc("nvmf_subsystem_add_listener", nqn, "-t", "tcp", "-a", "127.0.0.1", "-s", "4420")
    rpc("nvmf_subsystem_add_listener", "discovery", "-t", "tcp", "-a", "127.0.0.1", "-s", "4420")


def spdk_tls_subsystems(keys: dict[str, str]) -> None:
    for name, _hh, _n, port, _suite in SUITES:
        nqn = f"nqn.2016-06.io.spdk:tls-{name}"
        rpc("keyring_file_add_key", f"k-{name}", keys[name])
        rpc("bdev_malloc_create", "-b", f"MallocTls{port}", "64", "512")
        rpc("nvmf_create_subsystem", nqn, "-s", f"SPDK0000000000{port}")  # no -a: listed hosts
        rpc("nvmf_subsystem_add_ns", nqn, f"MallocTls{port}")
        rpc("nvmf_subsystem_add_listener", nqn, "-t", "tcp", "-a", "127.0.0.1", "-s", str(port),
            "-k")  # -k: secure channel required
        rpc("nvmf_subsystem_add_host", nqn, HOST, "--psk", f"k-{name}")


def spdk_tls_auth_subsystem(d: str) -> None:
    """TLS and bidirectional DH-HMAC-CHAP on one subsystem (4425, the SHA-256 PSK)."""
    for name, secret in (("dh-host", DH_HOST), ("dh-ctrl", DH_CTRL)):
        path = os.path.join(d, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret)
        rpc("keyring_file_add_key", name, path)
    rpc("bdev_malloc_create", "-b", "MallocTlsAuth", "16", "512")
    rpc("nvmf_create_subsystem", AUTH_NQN, "-s", f"SPDK0000000000{AUTH_PORT}")
    rpc("nvmf_subsystem_add_ns", AUTH_NQN, "MallocTlsAuth")
    rpc("nvmf_subsystem_add_listener", AUTH_NQN, "-t", "tcp", "-a", "127.0.0.1", "-s",
        str(AUTH_PORT), "-k")
    rpc("nvmf_subsystem_add_host", AUTH_NQN, HOST, "--psk", "k-sha256", "--dhchap-key",
        "dh-host", "--dhchap-ctrlr-key", "dh-ctrl")


def spdk_uri(port: int, name: str, key: str, **q: object) -> str:
    query = {"hostnqn": HOST, "tls_key": key, "queues": 1, "connect_timeout_ms": 5000, **q}
    return (f"nvme+tcp://127.0.0.1:{port}/nqn.2016-06.io.spdk:tls-{name}?"
            + "&".join(f"{k}={v}" for k, v in query.items()))


def waves(dev: fx100io.Device, op: int, bufs: list[np.ndarray], base: int) -> None:
    """All of bufs in one submission (QD = len(bufs)); each must move all its bytes."""
    reqs = [(op, base + i * len(b), b) for i, b in enumerate(bufs)]
    for c in dev.submit_blocking(reqs):
        if c[0] != len(bufs[0]) or c[1]:
            raise AssertionError(f"a request completed with {c}, not {len(bufs[0])} bytes")


def initiator_against_spdk(keys: dict[str, str], bad_key: str) -> None:
    print("\n1. our initiator -> SPDK nvmf_tgt, secure channel (TLS 1.3 PSK)", flush=True)
    pool = fx100io.BufferPool(100 * MiB)
    sets = {bs: [[pool.alloc(bs) for _ in range(32)] for _ in range(3)] for bs in (4096, MiB)}
    for name, hh, n, port, suite in SUITES:
        uri = spdk_uri(port, name, "@" + keys[name])
        what = f"{suite} (NVMeTLSkey-1:{hh:02x}:, {n} bytes, identity NVMe0R0{2 if n == 48 else 1})"
        try:
            for bs, base in ((4096, 0), (MiB, 8 * MiB)):
                src, out, out2 = sets[bs]
                for b in src:
                    b[:] = np.frombuffer(os.urandom(bs), dtype=np.uint8)
                with fx100io.open_device(uri, queue_depth=32) as dev:
                    waves(dev, fx100io.OP_WRITE, src, base)
                    dev.flush_blocking()
                    waves(dev, fx100io.OP_READ, out, base)
                    same = all(np.array_equal(a, b) for a, b in zip(src, out))
                    st = dev.queue_stats()
                check(same, f"{what}: 32 x {bs >> 10} KiB written and read at QD32, bytes equal "
                      f"(direct {st.get('bytes_direct', '?')} B, copied {st.get('bytes_copied', '?')} B)")
                with fx100io.open_device(uri, queue_depth=32) as dev:  # new handshakes
                    waves(dev, fx100io.OP_READ, out2, base)
                check(all(np.array_equal(a, b) for a, b in zip(src, out2)),
                      f"{what}: {bs >> 10} KiB read again after a second open, bytes equal")
        except (errors.Fx100ioError, AssertionError) as e:
            check(False, f"{what}: {e}")
        if name == "sha256":
            print_qd1_latency(f"{suite}: SPDK's target", port, f"nqn.2016-06.io.spdk:tls-{name}",
                              keys[name])
    # TLS and DH-HMAC-CHAP (bidirectional) on the same connections
    auth = (f"nvme+tcp://127.0.0.1:{AUTH_PORT}/{AUTH_NQN}?hostnqn={HOST}&tls_key=@{keys['sha256']}"
            "&connect_timeout_ms=5000")
    try:
        src, out, _ = sets[MiB]
        for b, o in zip(src[:8], out[:8]):  # new bytes, and no stale ones to match by chance
            b[:] = np.frombuffer(os.urandom(MiB), dtype=np.uint8)
            o[:] = 0
        with fx100io.open_device(f"{auth}&dhchap_secret={DH_HOST}&dhchap_ctrl_secret={DH_CTRL}",
                                 queue_depth=32) as dev:
            waves(dev, fx100io.OP_WRITE, src[:8], 0)
            waves(dev, fx100io.OP_READ, out[:8], 0)
        check(all(np.array_equal(a, b) for a, b in zip(src[:8], out[:8])),
              "TLS + bidirectional DH-HMAC-CHAP: 8 x 1 MiB written and read, bytes equal")
    except (errors.Fx100ioError, AssertionError) as e:
        check(False, f"TLS + bidirectional DH-HMAC-CHAP: {e}")
    try:
        with fx100io.open_device(auth):
            check(False, "TLS without the DH-HMAC-CHAP secret SPDK asks for: the open succeeded")
    except errors.Fx100ioError as e:
        check(isinstance(e, errors.DevicePermissionError),
              f"TLS without the DH-HMAC-CHAP secret SPDK asks for: {type(e).__name__}: {e}")
    # SPDK's discovery log names the secure channel of each listener
    try:
        entries = {e["trsvcid"]: e
                   for e in fx100io.discover(f"nvme+tcp://127.0.0.1:4420/?hostnqn={HOST}")}
    except errors.Fx100ioError as e:
        print(f"  discovery on 4420 failed: {e}")
        entries = {}
    want = [str(p) for *_x, p, _s in SUITES] + [str(AUTH_PORT)]
    check(all(entries.get(p, {}).get("treq") == "required" and entries[p].get("sectype") == "tls1.3"
              for p in want) and entries.get("4420", {}).get("sectype") == "none",
          "SPDK's discovery log: treq required, sectype tls1.3 on ports "
          + ", ".join(want) + "; sectype none on 4420")
    # a wrong key of the right kind: SPDK aborts the handshake, we say so and never go on in clear
    t0 = time.monotonic()
    try:
        with fx100io.open_device(spdk_uri(4422, "sha256", "@" + bad_key)):
            check(False, "wrong key: the open succeeded")
    except errors.Fx100ioError as e:
        check("TLS" in str(e) and time.monotonic() - t0 < 5.5,
              f"wrong key fails in {time.monotonic() - t0:.2f} s: {type(e).__name__}: {e}")
    # no TLS at all against a listener that requires it
    t0 = time.monotonic()
    try:
        u = f"nvme+tcp://127.0.0.1:4422/nqn.2016-06.io.spdk:tls-sha256?hostnqn={HOST}&connect_timeout_ms=5000"
        with fx100io.open_device(u):
            check(False, "clear text to a secure-channel listener: the open succeeded")
    except errors.Fx100ioError as e:
        check(time.monotonic() - t0 < 5.5,
              f"clear text to SPDK's TLS listener fails in {time.monotonic() - t0:.2f} s: "
              f"{type(e).__name__}: {e}")


def perf_cmd(port: int, nqn: str, psk: str, *args: str) -> list[str]:
    tr = (f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn} hostnqn:{HOST} "
          "ns:1")
    return [os.path.join(SPDK, "build", "bin", "spdk_nvme_perf"), "-r", tr, "-S", "ssl",
            "--psk-path", psk, "-c", "0x2", *args]


def run_perf(cmd: list[str], timeout: float) -> tuple[int, str]:
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(SPDK, "build", "lib"))
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        # (its output comes as bytes here even with text=True; its hugetlbfs files
        # are removed by stop_spdk)
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
        return -1, f"timed out after {timeout} s\n{out}"
    return r.returncode, r.stdout + r.stderr


def total_iops(out: str) -> float:
    total = [ln for ln in out.splitlines() if ln.strip().startswith("Total")]
    return float(total[-1].split(":", 1)[1].split()[0]) if total else 0.0


def print_qd1_latency(what: str, port: int, nqn: str, psk: str) -> None:
    """spdk_nvme_perf's 128 KiB reads at QD1 (its Total line: IOPS, MiB/s, then average,
    min and max latency in us): the per-read time that bounds the QD32 figures of
    section 3 (docs/benchmarks.md).  Printed, not checked."""
    rc, out = run_perf(perf_cmd(port, nqn, psk, "-q", "1", "-o", "131072", "-w", "read",
                                "-t", "2"), 60)
    total = [ln for ln in out.splitlines() if ln.strip().startswith("Total")]
    f = total[-1].split(":", 1)[1].split() if total else []
    if rc != 0 or len(f) < 4:
        print(f"  note {what}: perf 128 KiB reads QD1 gave no figures (rc {rc})", flush=True)
        return
    print(f"  note {what}: perf 128 KiB reads QD1: {float(f[1]) * MiB / 1e6:.1f} MB/s, latency "
          f"average {float(f[2]) / 1e3:.2f} ms, min {float(f[3]) / 1e3:.2f} ms", flush=True)


def start_our_target(backing: str, key: str, log: str, *extra: str) -> tuple[subprocess.Popen, int]:
    with open(log, "w") as errf:  # the child keeps its own descriptor
        p = subprocess.Popen([sys.executable, "-m", "fx100io", "target", "--listen", "127.0.0.1:0",
                              "--nqn", OUR_NQN, "--namespace", backing, "--tls", "required",
                              "--tls-key", f"{HOST}=@{key}", *extra],
                             stdout=subprocess.PIPE, stderr=errf, text=True, cwd=ROOT)
    line = ""
    try:
        # its first line is its URI; one that never comes must not hang the run
        ready = select.select([p.stdout], [], [], TARGET_START_S)[0] if p.stdout else []
        line = p.stdout.readline() if ready and p.stdout else ""
    finally:
        if "nvme+tcp://" not in line:
            p.kill()
            p.wait()
    if "nvme+tcp://" not in line:
        with open(log) as f:
            raise SystemExit(f"our target did not start: {line!r}\n{f.read()[-2000:]}")
    return p, int(line.split("nvme+tcp://", 1)[1].split("/", 1)[0].rpartition(":")[2])


def perf_against_our_target(keys: dict[str, str], bad_key: str, d: str) -> None:
    print("\n2. spdk_nvme_perf -S ssl -> our target (--tls required)", flush=True)
    size = 16 * MiB
    for name, hh, n, _port, suite in SUITES[:2]:
        backing = os.path.join(d, f"our-ns-{name}.img")
        with open(backing, "wb") as f:
            f.truncate(size)
        log = os.path.join(d, f"our-target-{name}.log")
        tgt, port = start_our_target(backing, keys[name], log)
        what = f"{suite} (NVMeTLSkey-1:{hh:02x}:, {n} bytes)"
        try:
            rc, out = run_perf(perf_cmd(port, OUR_NQN, keys[name], "-q", "32", "-o", "4096",
                                        "-w", "write", "-t", "3"), 60)
            iops = total_iops(out)
            check(rc == 0 and iops > 0, f"{what}: perf 4 KiB sequential writes QD32, rc {rc}, "
                  f"{iops:.0f} IOPS" + ("" if rc == 0 else f"\n{out[-1500:]}"))
            data = np.fromfile(backing, dtype=np.uint8).reshape(-1, 4096)
            uniform = bool((data == data[:, :1]).all())
            vals = set(np.unique(data[:, 0]).tolist())
            check(uniform and vals <= set(range(1, 9)),
                  f"{what}: every 4 KiB block of our file is one of perf's fill bytes 1..8 "
                  f"(uniform {uniform}, values {sorted(vals)})")
            rc, out = run_perf(perf_cmd(port, OUR_NQN, keys[name], "-q", "32", "-o", str(MiB),
                                        "-w", "read", "-t", "3"), 60)
            iops = total_iops(out)
            check(rc == 0 and iops > 0, f"{what}: perf 1 MiB reads QD32, rc {rc}, "
                  f"{iops * MiB / 1e6:.1f} MB/s" + ("" if rc == 0 else f"\n{out[-1500:]}"))
            if name == "sha256":
                print_qd1_latency(f"{what}: our target", port, OUR_NQN, keys[name])
                rc, out = run_perf(perf_cmd(port, OUR_NQN, bad_key, "-q", "1", "-o", "4096",
                                            "-w", "read", "-t", "1"), 60)
                time.sleep(0.2)
                with open(log) as f:
                    tlog = f.read()
                reason = [ln for ln in tlog.splitlines() if "PSK" in ln]
                # perf exits 0 when it attaches no controller: its output says so
                no_ctrl = total_iops(out) == 0 and "No valid NVMe controllers" in out
                check((rc != 0 or no_ctrl) and bool(reason),
                      f"perf with a wrong key attaches nothing (rc {rc}, "
                      f"{'no controller' if no_ctrl else out[-300:]!r}); our target logs: "
                      f"{reason[-1].strip() if reason else tlog[-300:]!r}")
        finally:
            stop_our_target(tgt)
            os.unlink(backing)


def stop_our_target(tgt: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 20 s."""
    tgt.terminate()
    try:
        tgt.wait(20)
    except subprocess.TimeoutExpired:
        tgt.kill()
        tgt.wait()


def perf_with_auth_against_our_target(keys: dict[str, str], d: str) -> None:
    """TLS and bidirectional DH-HMAC-CHAP, spdk_nvme_perf as the host, our target."""
    secrets = {}
    for name, secret in (("dh-host", DH_HOST), ("dh-ctrl", DH_CTRL)):
        secrets[name] = os.path.join(d, f"perf-{name}")
        fd = os.open(secrets[name], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret)
    backing = os.path.join(d, "our-ns-auth.img")
    with open(backing, "wb") as f:
        f.truncate(16 * MiB)
    log = os.path.join(d, "our-target-auth.log")
    tgt, port = start_our_target(backing, keys["sha256"], log, "--dhchap-key",
                                 f"{HOST}=@{secrets['dh-host']}", "--dhchap-ctrl-key",
                                 f"{HOST}=@{secrets['dh-ctrl']}")
    try:
        rc, out = run_perf(perf_cmd(port, OUR_NQN, keys["sha256"], "-q", "32", "-o", "4096",
                                    "-w", "randrw", "-M", "50", "-t", "2", "--dhchap-key",
                                    secrets["dh-host"], "--dhchap-ctrlr-key", secrets["dh-ctrl"]), 60)
        iops = total_iops(out)
        check(rc == 0 and iops > 0, f"TLS + bidirectional DH-HMAC-CHAP: perf 4 KiB random "
              f"reads and writes QD32, rc {rc}, {iops:.0f} IOPS"
              + ("" if rc == 0 and iops > 0 else f"\n{out[-1500:]}"))
        rc, out = run_perf(perf_cmd(port, OUR_NQN, keys["sha256"], "-q", "1", "-o", "4096",
                                    "-w", "read", "-t", "1"), 60)
        why = [ln.split("*ERROR*:")[-1].strip() for ln in out.splitlines() if "auth" in ln.lower()]
        check(total_iops(out) == 0 and "No valid NVMe controllers" in out,
              "TLS without the DH-HMAC-CHAP secret our target asks for: perf attaches nothing"
              + (f" ({why[0]})" if why else ""))
    finally:
        stop_our_target(tgt)
        os.unlink(backing)


def bench(rounds: int, seconds: int, keys: dict[str, str], clear: bool) -> None:
    print("\n3. against SPDK's TLS target (4422, RAM ns, loopback, 1 queue): our initiator vs "
          "spdk_nvme_perf -S ssl, both on core 1", flush=True)
    nqn = "nqn.2016-06.io.spdk:tls-sha256"
    # ktls=off: spdk_nvme_perf's ssl socket seals records in userspace (OpenSSL) unless
    # given --enable-ktls, so ours does too, where the kernel has the tls module as well
    uri = spdk_uri(4422, "sha256", "@" + keys["sha256"], connect_timeout_ms=10000, ktls="off")
    clear_uri = f"nvme+tcp://127.0.0.1:4420/{spdk_bench.SPDK_NQN}?ns=1&queues=1"
    rows: dict[str, list[float]] = {}
    for r in range(rounds):
        cur: dict[str, float] = {}
        for label, rw, bs, fxbs in (("4k", "randread", 4096, "4k"), ("1m", "read", MiB, "1m")):
            # the order turns each round, so neither tool always runs first (cold) or second
            for tool in (("spdk", "fx") if r % 2 == 0 else ("fx", "spdk")):
                if tool == "spdk":
                    rc, out = run_perf(perf_cmd(4422, nqn, keys["sha256"], "-q", "32", "-o",
                                                str(bs), "-w", rw, "-t", str(seconds)), seconds + 60)
                    iops = total_iops(out)
                    if iops <= 0:
                        raise SystemExit(f"spdk_nvme_perf over TLS gave no Total line (rc {rc}):"
                                         f"\n{out[-2000:]}")
                    cur[f"spdk {label}"] = iops * bs
                else:
                    res, _ = spdk_bench.fx_bench(uri, rw, fxbs, 32, seconds, size="60m")
                    cur[f"fx {label}"] = res["iops"] * bs
            if clear:  # the same target in clear text (4420): what TLS costs each tool
                cur[f"spdk clear {label}"] = spdk_bench.spdk_perf(rw, bs, 32, seconds)["iops"] * bs
                res, _ = spdk_bench.fx_bench(clear_uri, rw, fxbs, 32, seconds)
                cur[f"fx clear {label}"] = res["iops"] * bs
        for k, v in cur.items():
            rows.setdefault(k, []).append(v)
        print(f"round {r + 1}: " + "  ".join(f"{k} {v / 1e6:.1f} MB/s" for k, v in cur.items())
              + "  ratios " + "  ".join(f"{lb} {cur[f'fx {lb}'] / cur[f'spdk {lb}']:.2f}x"
                                        for lb in ("4k", "1m")), flush=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\n| SPDK nvmf_tgt, TLS 1.3 PSK (AES-128-GCM), {rounds} rounds of {seconds} s, medians "
          "| spdk_nvme_perf -S ssl | fx100io | ratio | goal |")
    print("|---|---|---|---|---|")
    for label, unit, goal in (("1m", "1 MiB read QD32", ">= 1.0x"), ("4k", "4 KiB randread QD32", ">= 0.8x")):
        s, f = med[f"spdk {label}"], med[f"fx {label}"]
        per_round = sorted(a / b for a, b in zip(rows[f"fx {label}"], rows[f"spdk {label}"]))
        print(f"| {unit}, MB/s (IOPS) | {s / 1e6:.1f} ({s / (MiB if label == '1m' else 4096):.0f}) "
              f"| {f / 1e6:.1f} ({f / (MiB if label == '1m' else 4096):.0f}) | {f / s:.2f}x "
              f"(rounds {per_round[0]:.2f}-{per_round[-1]:.2f}x) | {goal} |")
    if clear:
        for label, unit in (("1m", "1 MiB read QD32"), ("4k", "4 KiB randread QD32")):
            sc, fc = med[f"spdk clear {label}"], med[f"fx clear {label}"]
            print(f"| {unit} in clear text (4420), MB/s | {sc / 1e6:.1f} | {fc / 1e6:.1f} "
                  f"| {fc / sc:.2f}x | TLS/clear: perf {med[f'spdk {label}'] / sc:.3f}x, "
                  f"fx100io {med[f'fx {label}'] / fc:.3f}x |")


def spdk_target_pid() -> int | None:
    """The pid in spdk-peer.sh's pid file if that process is alive and is nvmf_tgt."""
    try:
        with open(PIDFILE) as f:
            pid = int(f.read().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return pid if b"nvmf_tgt" in f.read() else None
    except (OSError, ValueError):
        return None


def stop_spdk() -> None:
    """Stop nvmf_tgt whatever state start left it in, then spdk-peer.sh stop
    (hugepages back to 0); the pid file goes even when the target is dead."""
    pid = spdk_target_pid()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):  # it exits within a second or two; then it is killed
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # start_spdk's child: reaped, or /proc keeps it
            if not os.path.exists(f"/proc/{pid}"):
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)  # our child: no zombie left behind
    with contextlib.suppress(FileNotFoundError):
        os.unlink(PIDFILE)
    # perf runs killed on a timeout leave their hugetlbfs files (spdk_pid<PID>map_<N>)
    for path in glob.glob("/dev/hugepages/spdk_pid*map_*"):
        m = re.match(r"spdk_pid(\d+)map_", os.path.basename(path))
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            with contextlib.suppress(OSError):
                os.unlink(path)
    subprocess.run(["bash", PEER, "stop"], check=False, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=60)
    # the pages go back even where spdk-peer.sh is missing or failed
    with contextlib.suppress(OSError), open("/proc/sys/vm/nr_hugepages", "w") as f:
        f.write(str(_hugepages_before or 0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--skip-interop", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--clear", action="store_true",
                    help="also run both tools in clear text against the same SPDK target")
    ap.add_argument("--spdk-ssl-defaults", action="store_true",
                    help="keep SPDK's 4 KiB ssl socket buffers on its target (its reads then "
                    "stall on the host's delayed ACKs; see SSL_BUF_SIZE)")
    a = ap.parse_args()
    perf = os.path.join(SPDK, "build", "bin", "spdk_nvme_perf")
    if not (os.access(perf, os.X_OK) and os.access(os.path.join(SPDK, "build", "bin", "nvmf_tgt"), os.X_OK)):
        print(f"skipped: SPDK is not built in {SPDK} (SPDK_MIRROR=... {PEER} build)")
        return 0
    if os.geteuid() != 0:
        print("refused: needs root (SPDK's hugepages, set up by spdk-peer.sh start)")
        return 2
    if spdk_target_pid() is not None:
        print(f"refused: an SPDK target is already running ({PIDFILE}); {PEER} stop")
        return 2
    with contextlib.suppress(FileNotFoundError):
        os.unlink(PIDFILE)  # a dead target's (spdk-peer.sh stop keeps it when its kill fails)
    # SIGTERM (timeout, a session's end) unwinds like Ctrl-C, so every finally
    # below runs: SPDK stopped, our target and perf killed, the PSK files removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="fx100io-tls-interop-") as d:
        keys = {name: key_file(d, name, hh, n) for name, hh, n, _p, _s in SUITES}
        bad = key_file(d, "wrong", 1, 32)
        try:
            # start also sets up the hugepages spdk_nvme_perf needs in section 2; it can
            # fail after nvmf_tgt is up (an RPC), so it is inside the try
            start_spdk(a.spdk_ssl_defaults)
            spdk_tls_subsystems(keys)
            spdk_tls_auth_subsystem(d)
            if not a.skip_interop:
                initiator_against_spdk(keys, bad)
                perf_against_our_target(keys, bad, d)
                perf_with_auth_against_our_target(keys, d)
            if not a.skip_bench:
                bench(a.rounds, a.seconds, keys, a.clear)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the cleanup
            stop_spdk()
    if FAILED:
        print(f"\n{len(FAILED)} interop check(s) failed:\n  " + "\n  ".join(FAILED))
        return 1
    print("\nall interop checks passed" if not a.skip_interop else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())

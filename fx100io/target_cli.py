"""`fx100io target`: serve files and block devices as an NVMe/TCP target.

    fx100io target --listen 127.0.0.1:4420 --nqn nqn.2024-01.io.fx100io:kv \\
        --namespace /dev/shm/ns1.img [--namespace /dev/nvme0n1 ...] \\
        [--dhchap-key HOSTNQN=@/etc/fx100io/host.key [--dhchap-ctrl-key HOSTNQN=@ctrl.key]]

The C target (csrc/target/) runs in a worker thread without the GIL; the main
thread only waits, so SIGINT/SIGTERM reach Python's handlers, which stop the
target; connections are closed and written data is flushed before exit.
"""

from __future__ import annotations

import argparse
import os
import signal
import stat
import sys
import threading

from fx100io.fabric_options import BY_NAME as _URI_OPTIONS
from fx100io.target_faults import parse_fault_tls_record

# --ktls takes what the initiator's URI key ktls takes (auto first: the default)
KTLS_CHOICES = _URI_OPTIONS["ktls"].choices

DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery"
DEFAULT_NQN = "nqn.2024-01.io.fx100io:target"
DEFAULT_PORT = 4420
HASHES = ("sha256", "sha384", "sha512")
DHGROUPS = ("null", "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"fx100io target: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="fx100io target",
        description="Serve files and block devices as NVMe/TCP namespaces (with a discovery "
        "subsystem) to any NVMe/TCP host: fx100io's initiator, Linux nvme-tcp, SPDK.",
    )
    p.add_argument("--listen", action="append", default=None,
                   metavar="HOST:PORT[,ana_group=G][,ana_state=STATE]",
                   help="address to listen on (IPv6 as [::1]:4420; port 0 picks a free one; "
                   f"default 0.0.0.0:{DEFAULT_PORT}); repeatable: each is a port of its own "
                   "(port id 1, 2, ... in order); ana_state sets this port's state of group G "
                   "(without ana_group: of every group)")
    p.add_argument("--nqn", default=DEFAULT_NQN, help=f"subsystem NQN (default {DEFAULT_NQN})")
    p.add_argument("--namespace", action="append", default=[], metavar="PATH", required=True,
                   help="file or block device to serve; repeat for namespaces 1, 2, ...; "
                   "PATH,ana_group=G puts it in ANA group G (1..32; default 1)")
    p.add_argument("--block-size", type=int, choices=(512, 4096), default=512,
                   help="logical block size of every namespace (default 512)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NQN",
                   help="host NQN allowed to connect; repeatable (default: any host)")
    p.add_argument("--max-io-queues", type=int, default=64, metavar="N",
                   help="I/O queues granted per controller (default 64)")
    m = p.add_argument_group(
        "asymmetric namespace access (several ports)",
        "Every ANA group is optimized through every port unless told; a running target's "
        "states change through its --control socket (fx100io target-ctl).")
    m.add_argument("--ana-state", action="append", default=[], metavar="PORT:GROUP=STATE",
                   help="initial state of ANA group GROUP (1..32 or all) through PORT (a port "
                   "id or the --listen HOST:PORT): optimized, non-optimized, inaccessible, "
                   "persistent-loss or change (left after ANATT, 10 s, for the state before); "
                   "repeatable")
    m.add_argument("--control", metavar="PATH",
                   help="unix socket (mode 0600) taking control commands: ana-state PORT GROUP "
                   "STATE, ana-state PORT GROUP change [THEN [MS]], close-port PORT, open-port PORT, "
                   "ports; a live target's socket at PATH is never taken over")
    a = p.add_argument_group(
        "in-band authentication (DH-HMAC-CHAP)",
        "A host given a secret must authenticate on every queue (admin and I/O) before any "
        "other command is served; hosts with a secret are allowed to connect, and once any "
        "host has one, hosts with neither a secret nor --allow-host are refused (as host "
        "entries in Linux nvmet).  The discovery subsystem does not authenticate.  Secrets "
        "are in the DHHC-1 form of `nvme gen-dhchap-key`; write @FILE to read one from a "
        "file (so it is not in the process list).  Secrets are never logged.")
    a.add_argument("--dhchap-key", action="append", default=[], metavar="HOSTNQN=SECRET",
                   help="the host's secret (nvmet's dhchap_key); repeatable, one per host")
    a.add_argument("--dhchap-ctrl-key", action="append", default=[], metavar="HOSTNQN=SECRET",
                   help="our (the controller's) secret for that host, so that it can "
                   "authenticate us too (bidirectional; nvmet's dhchap_ctrl_key)")
    a.add_argument("--dhchap-hash", default=",".join(HASHES), metavar="LIST",
                   help="hash functions we accept, comma separated (nvmet's dhchap_hash; "
                   f"default all: {','.join(HASHES)}); the strongest the host offers too "
                   "is used")
    a.add_argument("--dhchap-dhgroup", default=",".join(DHGROUPS), metavar="LIST",
                   help="DH groups we accept, comma separated (nvmet's dhchap_dhgroup; "
                   f"default all: {','.join(DHGROUPS)}); the strongest the host offers too "
                   "is used (null: no Diffie-Hellman, the secret alone)")
    s = p.add_argument_group(
        "secure channel (TLS 1.3 with a pre-shared key; docs/target.md)",
        "Keys are the configured PSKs of `nvme gen-tls-key` (NVMeTLSkey-1:HH:...:), one per "
        "host; write @FILE to read one from a file.  The handshake comes before ICReq on every "
        "queue; a host with a wrong key or none fails it, with a log line.")
    s.add_argument("--tls", choices=("required", "optional"), default=None,
                   help="required: every host must do TLS (as nvmet's treq required); optional: "
                   "a host may also connect in clear text")
    s.add_argument("--tls-key", action="append", default=[], metavar="HOSTNQN=KEY",
                   help="a host's configured TLS PSK; repeatable, one per host")
    s.add_argument("--ktls", choices=KTLS_CHOICES, default=KTLS_CHOICES[0],
                   help="where a TLS connection's records are sealed and opened after the "
                   "handshake: auto (by the kernel, kTLS, where it has the tls module; else "
                   "by fx100io; the default) or off (always by fx100io); as the initiator's "
                   "URI key ktls")
    lim = p.add_argument_group("limits against hostile, broken or vanished hosts")
    lim.add_argument("--max-connections", type=int, default=1024, metavar="N",
                     help="connections open at once (default 1024); at the limit a new one "
                     "evicts the oldest still in its handshake, else the longest idle queue "
                     "of a controller without keep alive (KATO 0) idle for 1 s or more, else "
                     "it is closed at once; with a log line")
    lim.add_argument("--io-buffer-budget", type=int, default=256, metavar="MIB",
                     help="MiB of data buffers for all connections together (default 256, "
                     "at least 8): commands in flight and admin data, each I/O queue at most "
                     "32 MiB; shared between peer addresses (while n have some or wait, one "
                     "may take more only up to 1/n, a lone one 3/4), so that a host that "
                     "holds all it can never keeps another waiting; commands that do not "
                     "fit wait for room")
    lim.add_argument("--handshake-timeout-ms", type=int, default=10000, metavar="MS",
                     help="close a connection that has not completed ICReq and Connect this "
                     "long after it connected (default 10000)")
    lim.add_argument("--stall-timeout-ms", type=int, default=30000, metavar="MS",
                     help="close a connection whose host does not complete a PDU within this "
                     "long of its first byte, or stops reading what we send for this long "
                     "(default 30000); silence between PDUs is bounded by the controller's "
                     "KATO, or --idle-timeout-ms.  A PDU is at most 128 KiB of data, so each "
                     "queue needs at least 128 KiB per stall timeout (4.4 KB/s at the "
                     "default): raise it for many queues over a slow link")
    lim.add_argument("--idle-timeout-ms", type=int, default=300000, metavar="MS",
                     help="close a Connected queue whose controller has keep alive off (KATO 0) "
                     "once it has received nothing, with no command in progress, for this "
                     "long (default 300000 = 5 min; 0 = never); controllers with a KATO are "
                     "closed when their KATO expires instead")
    p.add_argument("-v", "--verbose", action="store_true", help="log every command")
    p.add_argument("-q", "--quiet", action="store_true", help="no log lines (benchmarks)")
    f = p.add_argument_group("fault injection (tests)")
    f.add_argument("--fault-drop-after", type=int, default=0, metavar="N",
                   help="close each connection after it sent N PDUs")
    f.add_argument("--fault-delay-ms", type=int, default=0, metavar="MS",
                   help="delay each command's response by MS milliseconds")
    f.add_argument("--fault-corrupt-ddgst", type=int, default=0, metavar="N",
                   help="corrupt the data digest of every Nth C2HData PDU of a connection")
    f.add_argument("--fault-tls-record", default="", metavar="KIND:N",
                   help="with --tls: once, send a TLS record that is not data (KIND: ticket, "
                   "close_notify, fatal or warning alert), sealed with the connection's keys "
                   "(by the kernel on kTLS), inside the first C2HData of more than 16 KiB "
                   "whose data reaches a connection's Nth 16 KiB record of read data, "
                   "between two of its records")
    return p


def parse_listen(text: str) -> tuple[str, int]:
    """'HOST:PORT', '[V6]:PORT', 'HOST' or ':PORT' -> (host, port)."""
    host, port = text, str(DEFAULT_PORT)
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"--listen {text!r}: missing ']'")
        host, rest = text[1:end], text[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"--listen {text!r}: expected [HOST]:PORT")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    elif text.count(":") > 1:
        raise ValueError(f"--listen {text!r}: write IPv6 addresses as [ADDR]:PORT")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen {text!r}: port must be 0..65535")
    return host or "0.0.0.0", int(port)


ANA_STATES = ("optimized", "non-optimized", "inaccessible", "persistent-loss", "change")
MAX_PORTS = 16
ANA_GROUPS = 32


def _ana_group(text: str, what: str, allow_all: bool = False) -> int:
    if allow_all and text == "all":
        return 0
    if not text.isdigit() or not 1 <= int(text) <= ANA_GROUPS:
        raise ValueError(f"{what}: ANA group {text!r} must be 1..{ANA_GROUPS}"
                         + (" or all" if allow_all else ""))
    return int(text)


def _ana_state(text: str, what: str) -> str:
    if text not in ANA_STATES:
        raise ValueError(f"{what}: ANA state {text!r} must be one of {', '.join(ANA_STATES)}")
    return text


def parse_listens(texts: list[str]) -> tuple[list[tuple[str, int]], list[tuple[int, int, str]],
                                              list[str]]:
    """--listen values -> ([(host, port)], [(port id, group, state)], [text as given])."""
    if len(texts) > MAX_PORTS:
        raise ValueError(f"--listen: at most {MAX_PORTS} ports")
    listens: list[tuple[str, int]] = []
    ana: list[tuple[int, int, str]] = []
    given: list[str] = []
    for i, text in enumerate(texts, start=1):
        addr, *opts = text.split(",")
        group, state = 0, None
        for o in opts:
            key, eq, val = o.partition("=")
            if key == "ana_group" and eq:
                group = _ana_group(val, f"--listen {text!r}")
            elif key == "ana_state" and eq:
                state = _ana_state(val, f"--listen {text!r}")
            else:
                raise ValueError(f"--listen {text!r}: unknown option {o!r} "
                                 "(ana_group=G, ana_state=STATE)")
        # (ana_group alone leaves the group as it is: optimized, unless --ana-state)
        listens.append(parse_listen(addr))
        given.append(addr)
        if state is not None:
            ana.append((i, group, state))
    return listens, ana, given


def parse_ana_state(text: str, given: list[str],
                    listens: list[tuple[str, int]]) -> tuple[int, int, str]:
    """'PORT:GROUP=STATE' (PORT: port id or a --listen HOST:PORT) -> (port id, group, state)."""
    left, eq, state = text.rpartition("=")
    port_s, colon, group_s = left.rpartition(":")
    if not eq or not colon or not port_s:
        raise ValueError(f"--ana-state {text!r}: expected PORT:GROUP=STATE")
    group = _ana_group(group_s, f"--ana-state {text!r}", allow_all=True)
    _ana_state(state, f"--ana-state {text!r}")
    if port_s.isdigit():
        pid = int(port_s)
    else:
        names = [{g, f"{h}:{p}", f"[{h}]:{p}"} for g, (h, p) in zip(given, listens)]
        found = [i for i, n in enumerate(names, start=1) if port_s in n]
        if not found:
            raise ValueError(f"--ana-state {text!r}: no --listen {port_s}")
        pid = found[0]
    if not 1 <= pid <= len(listens):
        raise ValueError(f"--ana-state {text!r}: port id {pid}: 1..{len(listens)}")
    return pid, group, state


def parse_namespace(text: str) -> tuple[str, int]:
    """'PATH[,ana_group=G]' -> (path, group)."""
    path, sep, g = text.rpartition(",ana_group=")
    if not sep:
        return text, 1
    return path, _ana_group(g, f"--namespace {text!r}")


def _check_fault_tls_record(spec: str, tls: str | None) -> None:
    """--fault-tls-record KIND:N: a known KIND, N >= 1, and only with --tls."""
    if not spec:
        return
    parse_fault_tls_record(spec)
    if not tls:
        raise ValueError("--fault-tls-record needs --tls (it sends a TLS record)")


def _check_nqn(nqn: str, what: str) -> None:
    if not nqn.startswith("nqn.") or len(nqn.encode()) > 223:
        raise ValueError(f"{what} {nqn!r} is not an NQN (nqn.YYYY-MM.reverse.domain:name, "
                         "at most 223 bytes)")


def _check_namespace(path: str, block_size: int) -> None:
    try:
        st = os.stat(path)
    except OSError as e:
        raise ValueError(f"--namespace {path}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ValueError(f"--namespace {path}: is a directory")
    if stat.S_ISREG(st.st_mode) and st.st_size < block_size:
        raise ValueError(f"--namespace {path}: {st.st_size} bytes is less than one "
                         f"{block_size}-byte block")
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        raise ValueError(f"--namespace {path}: neither a regular file nor a block device")
    if not os.access(path, os.R_OK | os.W_OK):
        raise ValueError(f"--namespace {path}: needs read and write permission")


def _secret_arg(text: str, opt: str, kind: str = "dhchap") -> tuple[str, str]:
    """'HOSTNQN=SECRET' or 'HOSTNQN=@FILE' -> (hostnqn, secret), a DH-HMAC-CHAP
    secret or (kind "tls") a TLS key.  Errors name the host and the option, never
    the secret."""
    nqn, sep, secret = text.partition("=")
    if not sep or not nqn:
        raise ValueError(f"{opt} takes HOSTNQN=SECRET or HOSTNQN=@FILE")
    _check_nqn(nqn, opt)
    if secret.startswith("@"):
        try:
            with open(secret[1:], encoding="ascii") as f:
                secret = f.read().strip()
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) else "not ASCII text"
            raise ValueError(f"{opt} for {nqn}: cannot read {secret[1:]}: {why}") from None
    else:
        secret = secret.strip()
    from fx100io import _core
    problem = (_core.tls_key_error if kind == "tls" else _core.dhchap_secret_error)(secret)
    if problem:
        raise ValueError(f"{opt} for {nqn}: {problem}")
    return nqn, secret


def dhchap_hosts(keys: list[str], ctrl_keys: list[str]) -> list[tuple[str, str, str | None]]:
    """--dhchap-key / --dhchap-ctrl-key values -> [(hostnqn, secret, ctrl_secret)]."""
    hosts: dict[str, str] = {}
    ctrl: dict[str, str] = {}
    for text in keys:
        nqn, secret = _secret_arg(text, "--dhchap-key")
        if nqn in hosts:
            raise ValueError(f"--dhchap-key: two secrets for {nqn}")
        hosts[nqn] = secret
    for text in ctrl_keys:
        nqn, secret = _secret_arg(text, "--dhchap-ctrl-key")
        if nqn in ctrl:
            raise ValueError(f"--dhchap-ctrl-key: two secrets for {nqn}")
        if nqn not in hosts:
            raise ValueError(f"--dhchap-ctrl-key for {nqn}: give the host's own secret "
                             "(--dhchap-key) too; the controller's alone authenticates nobody")
        ctrl[nqn] = secret
    return [(nqn, secret, ctrl.get(nqn)) for nqn, secret in hosts.items()]


def tls_hosts(keys: list[str]) -> dict[str, str]:
    """--tls-key values -> {hostnqn: key text}."""
    hosts: dict[str, str] = {}
    for text in keys:
        nqn, key = _secret_arg(text, "--tls-key", "tls")
        if nqn in hosts:
            raise ValueError(f"--tls-key: two keys for {nqn}")
        hosts[nqn] = key
    return hosts


def _id_list(text: str, names: tuple[str, ...], opt: str) -> list[str]:
    out = []
    for item in text.split(","):
        name = item.strip().lower()
        if name.startswith("hmac(") and name.endswith(")"):
            name = name[5:-1]
        if name not in names:
            raise ValueError(f"{opt}: unknown {item.strip()!r} (one of {', '.join(names)})")
        if name not in out:
            out.append(name)
    return out


def _raise_open_files_limit(connections: int) -> None:
    """Each connection is a descriptor: lift the soft limit toward the hard
    one so that --max-connections can be reached (the target lowers its limit
    with a log line where it cannot)."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 3 * connections + 256  # a socket, an io_uring and an eventfd per queue
        if soft != resource.RLIM_INFINITY and soft < want:
            new = want if hard == resource.RLIM_INFINITY else min(want, hard)
            if new > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    except (ImportError, OSError, ValueError):
        pass


def endpoint(host: str, port: int, nqn: str) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"nvme+tcp://{shown}:{port}/{nqn}"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        listens, ana, given = parse_listens(args.listen or [f"0.0.0.0:{DEFAULT_PORT}"])
        host, port = listens[0]
        ana += [parse_ana_state(a, given, listens) for a in args.ana_state]
        ns_groups = [parse_namespace(n) for n in args.namespace]
        args.namespace = [n for n, _ in ns_groups]
        _check_nqn(args.nqn, "--nqn")
        if args.nqn == DISCOVERY_NQN:
            raise ValueError("--nqn: the discovery NQN is served anyway; name your subsystem")
        for h in args.allow_host:
            _check_nqn(h, "--allow-host")
        keys = dhchap_hosts(args.dhchap_key, args.dhchap_ctrl_key)
        hashes = _id_list(args.dhchap_hash, HASHES, "--dhchap-hash")
        dhgroups = _id_list(args.dhchap_dhgroup, DHGROUPS, "--dhchap-dhgroup")
        for path in args.namespace:
            _check_namespace(path, args.block_size)
        for opt in ("max_io_queues", "fault_drop_after", "fault_delay_ms", "fault_corrupt_ddgst"):
            if getattr(args, opt) < 0:
                raise ValueError(f"--{opt.replace('_', '-')} must not be negative")
        _check_fault_tls_record(args.fault_tls_record, args.tls)
        if not 1 <= args.max_io_queues <= 65534:
            raise ValueError("--max-io-queues must be 1..65534")
        for opt in ("max_connections", "handshake_timeout_ms", "stall_timeout_ms"):
            if not 1 <= getattr(args, opt) <= 0xFFFFFFFF:
                raise ValueError(f"--{opt.replace('_', '-')} must be 1..4294967295")
        if not 8 <= args.io_buffer_budget <= 1 << 22:
            raise ValueError("--io-buffer-budget must be 8..4194304 (MiB)")
        if not 0 <= args.idle_timeout_ms <= 0xFFFFFFFF:
            raise ValueError("--idle-timeout-ms must be 0..4294967295 (0: never)")
        tls_keys = tls_hosts(args.tls_key)
        if tls_keys and not args.tls:
            raise ValueError("--tls-key needs --tls required or --tls optional")
        if args.ktls == "off" and not args.tls:
            # (it picks the record layer of TLS connections: without --tls there are none,
            # and a caller who asked for it expects TLS)
            raise ValueError("--ktls off needs --tls required or --tls optional")
        if args.tls == "required" and not tls_keys:
            raise ValueError("--tls required needs a --tls-key for each host that may connect")
    except ValueError as e:
        print(f"fx100io target: error: {e}", file=sys.stderr)
        return 2

    _raise_open_files_limit(args.max_connections)
    from fx100io import _core

    result: dict[str, BaseException | None] = {"error": None}
    stop = threading.Event()

    def ready(bound_ports: list[int]) -> None:
        # (one line per port, in port id order; the first as before)
        for (h, _), bp in zip(listens, bound_ports):
            print(f"listening on {endpoint(h, bp, args.nqn)}", flush=True)

    def serve() -> None:
        try:
            _core.target_serve(host, str(port), args.nqn, args.namespace,
                               block_size=args.block_size, allow_hosts=args.allow_host,
                               dhchap_hosts=keys, dhchap_hashes=hashes,
                               dhchap_dhgroups=dhgroups,
                               tls=args.tls or "", tls_hosts=list(tls_keys.items()),
                               ktls=args.ktls,
                               max_io_queues=args.max_io_queues,
                               max_connections=args.max_connections,
                               io_buffer_budget_mib=args.io_buffer_budget,
                               handshake_timeout_ms=args.handshake_timeout_ms,
                               stall_timeout_ms=args.stall_timeout_ms,
                               idle_timeout_ms=args.idle_timeout_ms,
                               fault_drop_after=args.fault_drop_after,
                               fault_delay_ms=args.fault_delay_ms,
                               fault_corrupt_ddgst=args.fault_corrupt_ddgst,
                               fault_tls_record=args.fault_tls_record,
                               verbose=args.verbose, quiet=args.quiet,
                               listens=[(h, str(pt)) for h, pt in listens],
                               ana_states=ana,
                               ns_ana_groups=[g for _, g in ns_groups],
                               control_path=args.control, ready_ports=ready)
        except BaseException as e:  # reported by the main thread
            result["error"] = e

    # (_core.pyi does not declare target_stop yet)
    stop_all = _core.target_stop

    def on_signal(signum: int, frame: object) -> None:
        stop.set()
        stop_all()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    worker = threading.Thread(target=serve, name="fx100io-target", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.2)
            if stop.is_set():
                stop_all()  # again: a signal may beat the target's start
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    err = result["error"]
    if err is not None:
        if isinstance(err, OSError):
            print(f"fx100io target: {err}", file=sys.stderr)
            return 1
        raise err
    return 0


if __name__ == "__main__":
    sys.exit(main())

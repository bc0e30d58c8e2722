"""The NVMe-oF URI's query options, declared once.

Each row says what the option is called in a URI, what the C transport's
target string calls it (csrc/host/dev.c reads those key=value lines), which
values it takes, which transports have it, how the kernel path hands it to
``nvme connect`` and whether it is a secret.  fabric_uri's parser checks URIs
against this table, uri_redact hides the secret ones, and tests hold the C
key list (``_core.fabric_target_keys()``) and the kernel path to it.

Pure data, no C core: uri_redact (and through it the benchmark's reports)
imports it without the extension.
"""

from __future__ import annotations

from dataclasses import dataclass

TCP = "nvme+tcp"
RDMA = "nvme+rdma"
BOTH = (TCP, RDMA)

# kinds: how fabric_uri checks the value
INT = "int"  # decimal digits only, within range
BOOL = "bool"  # 0, 1, true or false; the transport gets 0 or 1
TEXT = "text"  # a string the parser checks on its own (hostnqn, hostid)
SECRET = "secret"  # a DH-HMAC-CHAP secret or TLS key, checked by the C parser that reads it
CHOICE = "choice"  # one of FabricOption.choices


@dataclass(frozen=True)
class FabricOption:
    name: str  # the URI query key
    kind: str  # INT, BOOL, TEXT or SECRET
    doc: str
    target_key: str = ""  # the C target string's key; "" means the same as name
    range: tuple[int, int] | None = None  # INT only: lowest and highest allowed
    range_note: str = ""  # said after the range when a value is out of it
    schemes: tuple[str, ...] = BOTH  # URI schemes that have the option
    # nvme connect's option that carries it on the kernel path; None: none does
    kernel_flag: str | None = None
    # the kernel has no per-controller equivalent: the kernel path drops the option
    userspace_only: bool = False
    # where a secret goes in nvme-cli's JSON configuration (the kernel path never puts
    # a secret on a command line)
    kernel_config_key: str | None = None
    # CHOICE only: the values it takes, the first being the default
    choices: tuple[str, ...] = ()
    # read by the multipath layer (fx100io/multipath.py) above the C devices, which never
    # see it: it has no key in the C target string
    multipath: bool = False

    @property
    def key(self) -> str:
        """The C target string's key."""
        return self.target_key or self.name

    @property
    def secret(self) -> bool:
        return self.kind == SECRET


OPTIONS: tuple[FabricOption, ...] = (
    FabricOption("ns", INT, "namespace id (1)", target_key="nsid",
                 # 0xFFFFFFFF is the broadcast NSID
                 range=(1, 0xFFFFFFFE)),
    FabricOption("queues", INT, "I/O connections per thread (1; nvme+rdma: 2, or 1 where the "
                 "controller grants fewer I/O queues than 16)", range=(1, 64),
                 kernel_flag="--nr-io-queues"),
    FabricOption("kato_ms", INT, "keep alive timeout (30000)", range=(0, 0xFFFFFFFF),
                 range_note=" (0 turns keep alive off)", kernel_flag="--keep-alive-tmo"),
    FabricOption("connect_timeout_ms", INT, "connect timeout (10000)", range=(1, 0x7FFFFFFF),
                 userspace_only=True),
    FabricOption("io_timeout_ms", INT, "a command with no answer for this long fails and its "
                 "connection is re-made (30000)", range=(1, 0x7FFFFFFF), userspace_only=True),
    FabricOption("max_xfer", INT, "bytes per NVMe command (1 MiB, capped by the controller's "
                 "MDTS)", range=(1, 0xFFFFFFFF), userspace_only=True),
    # 0: no pause between attempts / fail at once while disconnected
    FabricOption("reconnect_ms", INT, "pause after a failed connect attempt (200)",
                 range=(0, 0x7FFFFFFF), userspace_only=True),
    FabricOption("max_reconnects", INT, "failed connect attempts a waiting request sits "
                 "through (3)", range=(0, 0x7FFFFFFF), userspace_only=True),
    # Linux's NVMe/RDMA host and target stop at 128 entries; so do we
    FabricOption("qsize", INT, "entries per I/O queue (the controller's limit)", range=(2, 128),
                 schemes=(RDMA,), kernel_flag="--queue-size"),
    FabricOption("hdgst", BOOL, "header digests (0)", schemes=(TCP,), kernel_flag="--hdr-digest"),
    FabricOption("ddgst", BOOL, "data digests (0)", schemes=(TCP,), kernel_flag="--data-digest"),
    FabricOption("hostnqn", TEXT, "host NQN (this machine's stable identity)",
                 kernel_flag="--hostnqn"),
    FabricOption("hostid", TEXT, "host ID, 32 hex digits or a UUID (this machine's)",
                 kernel_flag="--hostid"),
    FabricOption("dhchap_secret", SECRET, "the host's DH-HMAC-CHAP secret, DHHC-1:HH:<base64>: "
                 "as nvme gen-dhchap-key prints it, or @FILE holding it",
                 kernel_config_key="dhchap_key"),
    FabricOption("paths", CHOICE, "which paths to the subsystem a URI names: 'listed' (the "
                 "comma-separated HOST:PORT list of its authority) or 'discover' (those and "
                 "every address the discovery log and its referrals list for the subsystem)",
                 choices=("listed", "discover"), userspace_only=True, multipath=True),
    FabricOption("policy", CHOICE, "how I/O is spread over the live paths: 'round-robin' or "
                 "'queue-depth' (the path with the fewest commands in flight)",
                 choices=("round-robin", "queue-depth"), userspace_only=True, multipath=True),
    FabricOption("unidentified_ns", CHOICE, "several paths to a namespace that reports no "
                 "NGUID, EUI-64 or UUID: 'refuse' (two namespaces of one size could not be told "
                 "apart) or 'allow' (matched by size and block size alone)",
                 choices=("refuse", "allow"), userspace_only=True, multipath=True),
    FabricOption("discover_secrets", CHOICE, "with paths=discover, where the DH-HMAC-CHAP "
                 "secrets go: 'listed' (only to the URI's own HOST:PORTs: a discovery log or "
                 "referral naming another address is not followed) or 'any' (to every address "
                 "a discovery log or referral names)",
                 choices=("listed", "any"), userspace_only=True, multipath=True),
    FabricOption("dhchap_ctrl_secret", SECRET, "the controller's DH-HMAC-CHAP secret "
                 "(bidirectional authentication; inline or @FILE)", kernel_config_key="dhchap_ctrl_key"),
    # NVMe/TCP secure channel (TLS 1.3 with a PSK, docs/nvme-tcp.md): the kernel path
    # refuses both for now (kernel/uri_args.py) rather than connect in clear text
    FabricOption("tls", BOOL, "TLS 1.3 secure channel with a pre-shared key (0; tls_key "
                 "turns it on)", schemes=(TCP,), kernel_flag="--tls"),
    FabricOption("tls_key", SECRET, "the configured TLS PSK, NVMeTLSkey-1:HH:<base64>: as "
                 "nvme gen-tls-key prints it, or @FILE holding it", schemes=(TCP,),
                 kernel_config_key="tls_key"),
    FabricOption("ktls", CHOICE, "where a TLS connection's records are sealed and opened: "
                 "'auto' (by the kernel, kTLS, where it has the tls module; else by fx100io) "
                 "or 'off' (always by fx100io)", choices=("auto", "off"), schemes=(TCP,),
                 userspace_only=True),
)

BY_NAME: dict[str, FabricOption] = {o.name: o for o in OPTIONS}

# keys of the C target string that come from the URI's authority and path, not its query
ENDPOINT_KEYS = ("host", "port", "subnqn")

SECRET_OPTIONS: tuple[str, ...] = tuple(o.name for o in OPTIONS if o.secret)


def target_keys() -> tuple[str, ...]:
    """Every key the C transport's target string may carry."""
    return (*ENDPOINT_KEYS, *(o.key for o in OPTIONS if not o.multipath))

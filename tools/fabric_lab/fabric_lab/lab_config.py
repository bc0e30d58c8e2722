"""What the lab exports: subsystems, namespaces, ports and the network around the guest.

A LabConfig is plain data (JSON in and out, stored in the state file so tests can read it).
It is turned into two things: QEMU arguments for emulated NVMe drives (qemu_vm) and a shell
script of calls to the helper functions that the guest's /init defines (guest_setup_script).
Keeping all decisions here means the guest side stays a dumb executor of configfs writes.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from . import lab_paths

DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery"
DEFAULT_HOST_NQN = "nqn.2026-11.io.fx100:lab-host"
RAM_SUBSYSTEM_NQN = "nqn.2026-11.io.fx100:lab-ram"
NVME_SUBSYSTEM_NQN = "nqn.2026-11.io.fx100:lab-nvme"
AUTH_SUBSYSTEM_NQN = "nqn.2026-11.io.fx100:lab-auth"
# Hosts of the lab-auth subsystem: one with a host secret only (the target authenticates the
# host), one with a controller secret too (bidirectional). These are test secrets of a lab
# that only ever listens inside its own network namespace, in nvme gen-dhchap-key's form.
AUTH_HOST_NQN = "nqn.2026-11.io.fx100:lab-auth-host"
AUTH_BIDIR_HOST_NQN = "nqn.2026-11.io.fx100:lab-auth-bidir"
AUTH_HOST_KEY = "DHHC-1:00:Fk5BrphAEh+AKiyiFKyx9mEPahMAssuR+Alaq7JthZkNeG2K:"
AUTH_BIDIR_HOST_KEY = "DHHC-1:01:Fk5BrphAEh+AKiyiFKyx9mEPahMAssuR+Alaq7JthZkNeG2K:"
AUTH_BIDIR_CTRL_KEY = ("DHHC-1:02:dnmXMOwPD0655WZ10LuG+9oL0hfAtdfRj5Qm1NlyhBYHAgmvaDWRKYgf"
                       "U0YLNXEU1ikU7g==:")
# What nvmet's hosts/<nqn>/dhchap_hash and dhchap_dhgroup accept.
DHCHAP_HASHES = ("hmac(sha256)", "hmac(sha384)", "hmac(sha512)")
DHCHAP_DHGROUPS = ("null", "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192")

# brd: the kernel's RAM disk, always 512-byte logical blocks.
# null_blk: memory-backed null_blk device made through configfs; any block size.
# nvme: a QEMU-emulated NVMe drive (-device nvme) backed by a sparse file on the host.
BACKENDS = ("brd", "null_blk", "nvme")
BLOCK_SIZES = (512, 4096)
NET_MODES = ("netns", "user")
# Guest memory besides RAM disks: the kernel, page cache of the shared host root, tmpfs /tmp,
# and the guest userland's processes (python + numpy + pytest take about 200 MiB; RDMA tests
# register pinned buffers of tens of MiB; fio). TCG allocates it lazily on the host.
BASE_GUEST_MEMORY_MIB = 1536

_NQN_MAX = 223  # NVMe base spec: NQNs are at most 223 bytes
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class LabConfigError(ValueError):
    """The lab configuration is inconsistent; the message says which field and why."""


@dataclass
class Namespace:
    backend: str = "brd"
    size_mib: int = 256
    block_size: int = 512
    nsid: int = 0  # 0 = next free nsid in the subsystem


@dataclass
class HostKey:
    """DH-HMAC-CHAP settings of one host entry in nvmet (hosts/<nqn>/dhchap_*). A host with
    a key must authenticate to every subsystem that admits it."""
    key: str                      # the host's secret (DHHC-1:...)
    ctrl_key: str = ""            # the controller's secret: bidirectional authentication
    hash: str = "hmac(sha256)"    # the hash the target picks (the host must offer it)
    dhgroup: str = "null"         # the DH group the target picks ("null": none)


@dataclass
class Subsystem:
    nqn: str
    namespaces: list[Namespace] = field(default_factory=list)
    allow_any_host: bool = True
    allowed_hosts: list[str] = field(default_factory=list)
    # host NQN (one of allowed_hosts) -> its DH-HMAC-CHAP settings
    host_keys: dict[str, HostKey] = field(default_factory=dict)


@dataclass
class LabConfig:
    subsystems: list[Subsystem] = field(default_factory=list)
    net: str = "netns"
    netns: str = field(default_factory=lab_paths.default_netns_name)
    tap: str = "fxlab0"
    host_ip: str = "10.88.0.1"
    guest_ip: str = "10.88.0.2"
    prefix_len: int = 24
    tcp_port: int = 4420
    # user-mode networking only: QEMU listens on 127.0.0.1:<this> and forwards to the guest.
    host_forward_port: int = 14420
    rdma: bool = False
    rdma_port: int = 4421
    guest_cpus: int = 2
    # 0 = the RAM disks plus BASE_GUEST_MEMORY_MIB for the kernel and the guest userland.
    guest_memory_mib: int = 0

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def default(cls) -> LabConfig:
        """The lab the tests expect: one RAM-disk subsystem open to all, one NVMe-drive
        subsystem with 4096-byte blocks behind a host allow-list."""
        return cls(subsystems=[
            Subsystem(nqn=RAM_SUBSYSTEM_NQN, allow_any_host=True,
                      namespaces=[Namespace(backend="brd", size_mib=256, block_size=512)]),
            Subsystem(nqn=NVME_SUBSYSTEM_NQN, allow_any_host=False,
                      allowed_hosts=[DEFAULT_HOST_NQN],
                      namespaces=[Namespace(backend="nvme", size_mib=256, block_size=4096)]),
            Subsystem(nqn=AUTH_SUBSYSTEM_NQN, allow_any_host=False,
                      allowed_hosts=[AUTH_HOST_NQN, AUTH_BIDIR_HOST_NQN],
                      host_keys={AUTH_HOST_NQN: HostKey(key=AUTH_HOST_KEY),
                                 AUTH_BIDIR_HOST_NQN: HostKey(key=AUTH_BIDIR_HOST_KEY,
                                                              ctrl_key=AUTH_BIDIR_CTRL_KEY)},
                      namespaces=[Namespace(backend="null_blk", size_mib=64, block_size=4096)]),
        ])

    @classmethod
    def from_dict(cls, data: dict, validate: bool = True) -> LabConfig:
        """Build a config from JSON data. validate=False is for the state of a lab that is
        already running: it must stay stoppable even if the rules changed since it started."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise LabConfigError(f"unknown lab config keys {sorted(unknown)}; known: {sorted(known)}")
        values = dict(data)
        subsystems = []
        for i, sub in enumerate(values.pop("subsystems", [])):
            sub = dict(sub)
            try:
                namespaces = [Namespace(**ns) for ns in sub.pop("namespaces", [])]
                host_keys = {host: HostKey(**key)
                             for host, key in dict(sub.pop("host_keys", {})).items()}
                subsystems.append(Subsystem(namespaces=namespaces, host_keys=host_keys, **sub))
            except TypeError as err:
                raise LabConfigError(f"subsystems[{i}]: {err}") from None
        config = cls(subsystems=subsystems, **values)
        if validate:
            config.validate()
        return config

    @classmethod
    def load(cls, path: Path) -> LabConfig:
        """Read a JSON config file. Keys not given keep their defaults; a file without
        "subsystems" gets the default subsystems."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise LabConfigError(f"cannot read lab config {path}: {err}") from None
        if "subsystems" not in data:
            data["subsystems"] = cls.default().to_dict()["subsystems"]
        return cls.from_dict(data)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def same_target_as(self, other: LabConfig) -> bool:
        """True if both configs build the same lab; the namespace name is only where it runs."""
        mine, theirs = self.to_dict(), other.to_dict()
        mine.pop("netns")
        theirs.pop("netns")
        return mine == theirs

    # ---- checks -------------------------------------------------------------------------

    def validate(self) -> None:
        """Number namespaces and reject anything the guest would fail on, with a clear reason."""
        if self.net not in NET_MODES:
            raise LabConfigError(f"net must be one of {NET_MODES}, not {self.net!r}")
        if not _NAME.match(self.netns):
            raise LabConfigError(f"netns name {self.netns!r} may only use letters, digits, _ . -")
        if not _NAME.match(self.tap) or len(self.tap) > 15:
            raise LabConfigError(f"tap name {self.tap!r} must be 1-15 characters of [A-Za-z0-9_.-]")
        try:
            network = ipaddress.ip_network(f"{self.host_ip}/{self.prefix_len}", strict=False)
            guest = ipaddress.ip_address(self.guest_ip)
        except ValueError as err:
            raise LabConfigError(f"bad lab addresses: {err}") from None
        if guest not in network or guest == ipaddress.ip_address(self.host_ip):
            raise LabConfigError(f"guest_ip {self.guest_ip} must be another address in {network}")
        for name in ("tcp_port", "rdma_port", "host_forward_port"):
            port = getattr(self, name)
            if not 1 <= port <= 65535:
                raise LabConfigError(f"{name} {port} is not a TCP port")
        if self.rdma and self.rdma_port == self.tcp_port:
            raise LabConfigError("rdma_port and tcp_port must differ")
        if not self.subsystems:
            raise LabConfigError("the lab needs at least one subsystem")
        brd_sizes = {ns.size_mib for sub in self.subsystems for ns in sub.namespaces
                     if ns.backend == "brd"}
        if len(brd_sizes) > 1:
            # brd makes all its disks at module load with one rd_size.
            raise LabConfigError(f"brd namespaces must all have one size (have {sorted(brd_sizes)}"
                                 " MiB); use backend null_blk for RAM disks of other sizes")
        seen_nqns = set()
        for sub in self.subsystems:
            self._validate_subsystem(sub)
            if sub.nqn in seen_nqns:
                raise LabConfigError(f"subsystem {sub.nqn} is listed twice")
            seen_nqns.add(sub.nqn)
        self.host_keys()  # one key per host NQN across subsystems

    @staticmethod
    def _validate_nqn(nqn: str, what: str) -> None:
        if not nqn.startswith("nqn.") or len(nqn.encode()) > _NQN_MAX:
            raise LabConfigError(f"{what} {nqn!r} must start with 'nqn.' and be <= {_NQN_MAX} bytes")
        if "/" in nqn or any(c.isspace() for c in nqn):
            raise LabConfigError(f"{what} {nqn!r} must not contain '/' or whitespace (configfs name)")

    def _validate_subsystem(self, sub: Subsystem) -> None:
        self._validate_nqn(sub.nqn, "subsystem NQN")
        if sub.nqn == DISCOVERY_NQN:
            raise LabConfigError("the discovery NQN is built in; do not configure it")
        for host in sub.allowed_hosts:
            self._validate_nqn(host, f"allowed host of {sub.nqn}")
        for host, key in sub.host_keys.items():
            if host not in sub.allowed_hosts:
                raise LabConfigError(f"{sub.nqn}: host_keys names {host}, which is not in "
                                     "allowed_hosts (nvmet asks only allow-listed hosts)")
            for name, secret in (("key", key.key), ("ctrl_key", key.ctrl_key)):
                if (secret or name == "key") and not re.fullmatch(
                        r"DHHC-1:0[0-3]:[A-Za-z0-9+/]+={0,2}:", secret):
                    raise LabConfigError(f"{sub.nqn}: {name} of {host} is not a DHHC-1:NN:<base64>: "
                                         "secret (make one with nvme gen-dhchap-key)")
            if key.hash not in DHCHAP_HASHES:
                raise LabConfigError(f"{sub.nqn}: hash {key.hash!r} of {host} not in {DHCHAP_HASHES}")
            if key.dhgroup not in DHCHAP_DHGROUPS:
                raise LabConfigError(f"{sub.nqn}: dhgroup {key.dhgroup!r} of {host} not in "
                                     f"{DHCHAP_DHGROUPS}")
        if sub.allow_any_host and sub.allowed_hosts:
            raise LabConfigError(f"{sub.nqn}: allowed_hosts needs allow_any_host false")
        if not sub.allow_any_host and not sub.allowed_hosts:
            raise LabConfigError(f"{sub.nqn}: no host could connect (allow_any_host false, "
                                 "allowed_hosts empty)")
        if not sub.namespaces:
            raise LabConfigError(f"{sub.nqn}: a subsystem needs at least one namespace")
        used = {ns.nsid for ns in sub.namespaces if ns.nsid}
        next_nsid = 1
        for ns in sub.namespaces:
            if ns.backend not in BACKENDS:
                raise LabConfigError(f"{sub.nqn}: backend {ns.backend!r} not in {BACKENDS}")
            if ns.block_size not in BLOCK_SIZES:
                raise LabConfigError(f"{sub.nqn}: block_size {ns.block_size} not in {BLOCK_SIZES}")
            if ns.backend == "brd" and ns.block_size != 512:
                raise LabConfigError(f"{sub.nqn}: brd RAM disks have 512-byte blocks; use "
                                     "backend null_blk (RAM) or nvme for 4096")
            if ns.size_mib <= 0:
                raise LabConfigError(f"{sub.nqn}: size_mib must be positive")
            if not ns.nsid:
                while next_nsid in used:
                    next_nsid += 1
                ns.nsid = next_nsid
                used.add(next_nsid)
        nsids = [ns.nsid for ns in sub.namespaces]
        if len(set(nsids)) != len(nsids):
            raise LabConfigError(f"{sub.nqn}: duplicate nsid in {nsids}")

    # ---- derived facts ------------------------------------------------------------------

    def all_namespaces(self) -> list[tuple[Subsystem, Namespace]]:
        return [(sub, ns) for sub in self.subsystems for ns in sub.namespaces]

    def ram_disk_mib(self) -> int:
        """Guest RAM taken by RAM disks (all brd disks have one size, see validate)."""
        brd = [ns.size_mib for _, ns in self.all_namespaces() if ns.backend == "brd"]
        null_blk = [ns.size_mib for _, ns in self.all_namespaces() if ns.backend == "null_blk"]
        return (max(brd) * len(brd) if brd else 0) + sum(null_blk)

    def memory_mib(self) -> int:
        return self.guest_memory_mib or BASE_GUEST_MEMORY_MIB + self.ram_disk_mib()

    def nvme_drives(self) -> list[tuple[str, Namespace]]:
        """(serial, namespace) for each QEMU NVMe drive; the serial finds it in the guest."""
        drives = [ns for _, ns in self.all_namespaces() if ns.backend == "nvme"]
        return [(f"fxlab{i}", ns) for i, ns in enumerate(drives)]

    def host_keys(self) -> dict[str, HostKey]:
        """Host NQN -> its DH-HMAC-CHAP settings, over all subsystems. nvmet keeps keys on
        the host entry, shared by every subsystem: two different settings for one host are
        refused."""
        keys: dict[str, HostKey] = {}
        for sub in self.subsystems:
            for host, key in sub.host_keys.items():
                if host in keys and keys[host] != key:
                    raise LabConfigError(f"host {host} has different host_keys in two subsystems; "
                                         "nvmet keeps one key per host NQN")
                keys[host] = key
        return keys

    def allowed_host_nqn(self) -> str:
        """A host NQN that the subsystems without authentication admit (the first allow-list
        entry of one, else the default)."""
        for sub in self.subsystems:
            if sub.allowed_hosts and not sub.host_keys:
                return sub.allowed_hosts[0]
        return DEFAULT_HOST_NQN

    def endpoint(self) -> tuple[str, int]:
        """Where an initiator on the host reaches the target's TCP port."""
        if self.net == "user":
            return "127.0.0.1", self.host_forward_port
        return self.guest_ip, self.tcp_port

    # ---- the guest's side ---------------------------------------------------------------

    def guest_setup_script(self) -> str:
        """Shell calls, run by the guest's /init after it loaded modules, that build the
        target in configfs. The lab_* functions are defined in guest_init.sh."""
        q = shlex.quote
        lines = ["# generated by tools/fabric_lab from the lab config; sourced by /init",
                 f"lab_network eth0 {q(self.guest_ip)}/{self.prefix_len} {q(self.host_ip)}"]
        brd = [ns for _, ns in self.all_namespaces() if ns.backend == "brd"]
        if brd:
            lines.append(f"lab_brd_disks {len(brd)} {max(ns.size_mib for ns in brd) * 1024}")
        hosts = sorted({h for sub in self.subsystems for h in sub.allowed_hosts})
        lines += [f"lab_host {q(h)}" for h in hosts]
        for host, key in sorted(self.host_keys().items()):
            lines.append(f"lab_host_key {q(host)} {q(key.hash)} {q(key.dhgroup)} {q(key.key)} "
                         f"{q(key.ctrl_key)}")
        nvme_serials = {id(ns): serial for serial, ns in self.nvme_drives()}
        brd_index = null_index = 0
        for sub in self.subsystems:
            lines.append(f"lab_subsystem {q(sub.nqn)} {1 if sub.allow_any_host else 0}")
            lines += [f"lab_allow_host {q(sub.nqn)} {q(h)}" for h in sub.allowed_hosts]
            for ns in sub.namespaces:
                if ns.backend == "brd":
                    device = f"/dev/ram{brd_index}"
                    brd_index += 1
                elif ns.backend == "null_blk":
                    lines.append(f"lab_null_blk_disk fxlab{null_index} {ns.size_mib} {ns.block_size}")
                    device = "$LAB_DEVICE"
                    null_index += 1
                else:
                    lines.append(f"lab_nvme_disk {nvme_serials[id(ns)]}")
                    device = "$LAB_DEVICE"
                lines.append(f'lab_namespace {q(sub.nqn)} {ns.nsid} "{device}"')
        lines.append(f"lab_port 1 tcp {q(self.guest_ip)} {self.tcp_port}")
        if self.rdma:
            lines.append("lab_rxe eth0")
            lines.append(f"lab_port 2 rdma {q(self.guest_ip)} {self.rdma_port}")
        for sub in self.subsystems:
            lines.append(f"lab_port_subsystem 1 {q(sub.nqn)}")
            if self.rdma:
                lines.append(f"lab_port_subsystem 2 {q(sub.nqn)}")
        return "\n".join(lines) + "\n"

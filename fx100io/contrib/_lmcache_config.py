"""Options of the fx100io LMCache plugin, read from LMCache's ``extra_config``.

LMCache hands every plugin the whole engine config; our keys live under
``storage_plugin.<name>.`` where ``<name>`` is whatever the user listed in
``storage_plugins``. This module finds that name, validates every value and turns
mistakes into one readable :class:`PluginConfigError`, because LMCache swallows
constructor exceptions into a single log line (see the plugin's ``__init__``).

Nothing here imports lmcache or touches a device, so it is cheap to test.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from fx100io import units
from fx100io.uri_redact import redact, redact_url

# The plugin name the README documents; used when the config does not point at us.
DEFAULT_PLUGIN_NAME = "fx100io"
MODULE_PATH = "fx100io.contrib.lmcache"

CREATE_MODES = ("auto", "never", "always")
ENGINES = ("auto", "io_uring", "psync")

# Keys we understand; anything else under our prefix is a typo worth reporting.
KNOWN_KEYS = frozenset(
    {
        "module_path",
        "class_name",
        "devices",
        "size",
        "create",
        "queue_depth",
        "max_io",
        "direct",
        "o_direct",
        "engine",
        "capacity",
        "host_nqn",
        "timeout_s",
        "retry_after_s",
        "register_buffers",
        "path",
        "shared_index",
        "shared_name",
    }
)
# how nvme+tcp:// and nvme+rdma:// devices are reached: fx100io's own initiator, or the
# kernel's (attached with nvme-cli, then used as a block device)
PATHS = ("user", "kernel")


# URI schemes that reach an NVMe-oF target from userspace; only they take a host NQN.
_FABRIC_SCHEMES = ("nvme+tcp", "nvme+rdma")


class PluginConfigError(ValueError):
    """A storage_plugin.<name>.* value is missing or malformed."""


@dataclasses.dataclass(frozen=True)
class PluginOptions:
    name: str
    devices: tuple[str, ...]
    size: int | None
    create: str
    queue_depth: int
    max_io: int
    direct: Any  # True, False or "auto"
    engine: str
    capacity: int | None
    host_nqn: str | None
    timeout_s: float
    retry_after_s: float
    register_buffers: bool
    path: str = "user"
    # A shared pool (fx100io.SharedChunkStore): the redis:// URL of its index.
    # It may carry a password: out of the repr, masked in describe().
    shared_index: str | None = dataclasses.field(default=None, repr=False)
    shared_name: str | None = None

    def describe(self) -> str:
        """One log line that says what the plugin was asked to open."""
        return (
            f"devices={','.join(redact(d) for d in self.devices)} size={self.size} "
            f"create={self.create} "
            f"queue_depth={self.queue_depth} max_io={self.max_io} "
            f"direct={self.direct} engine={self.engine} "
            f"capacity={self.capacity} "
            f"host_nqn={self.host_nqn} timeout_s={self.timeout_s} "
            f"retry_after_s={self.retry_after_s} register_buffers={self.register_buffers} "
            f"path={self.path}"
            + (f" shared_index={redact_url(self.shared_index)}" if self.shared_index else "")
        )


def parse_size(value: Any, what: str) -> int | None:
    """'64G', '512MiB', '1.5T', 4096 -> bytes (binary units, as disk tools use)."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise PluginConfigError(f"{what}: expected a size such as '64G', got {value!r}")
    try:
        n = units.parse_size(value)
    except ValueError:
        raise PluginConfigError(
            f"{what}: cannot read {value!r} as a size; use bytes or a number with "
            "K, M, G, T (binary units), e.g. '64G'"
        ) from None
    if n <= 0:
        raise PluginConfigError(f"{what}: size must be positive, got {value!r}")
    return n


def parse_bool(value: Any, what: str, default: bool) -> bool:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise PluginConfigError(f"{what}: expected true or false, got {value!r}")


def parse_direct(value: Any, what: str) -> Any:
    """O_DIRECT: true (required), false (page cache) or auto (when the filesystem has it)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return parse_bool(value, what, default="auto")  # type: ignore[arg-type]
    except PluginConfigError:
        raise PluginConfigError(f"{what}: expected true, false or auto, got {value!r}") from None


def _parse_number(value: Any, what: str, default: float, minimum: float, integer: bool) -> Any:
    if value is None or value == "":
        return default
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool):  # YAML 'yes' is not a count
        raise PluginConfigError(f"{what}: expected {kind}, got {value!r}")
    try:
        number = int(str(value)) if integer else float(value)
    except ValueError:
        raise PluginConfigError(f"{what}: expected {kind}, got {value!r}") from None
    if number < minimum:
        raise PluginConfigError(f"{what}: must be >= {minimum}, got {value!r}")
    return number


def _parse_max_io(value: Any, what: str) -> int:
    """Bytes per I/O piece: a size, a multiple of 4 KiB from 4 KiB to 1 GiB."""
    n = parse_size(value, what)
    if n is None:
        return 4 << 20
    if n < 4096 or n > 1 << 30 or n % 4096:
        raise PluginConfigError(f"{what}: expected a multiple of 4KiB between 4KiB and 1GiB, got {value!r}")
    return n


def find_plugin_name(storage_plugins: Any, extra_config: Mapping[str, Any], class_name: str) -> str:
    """The name under which the user registered this plugin.

    The constructor is not told its own name, so we look for the listed plugin whose
    module_path and class_name point at us. With no match we fall back to the
    documented name, so a config that only sets the devices still gets a clear error.
    """
    listed = list(storage_plugins or [])
    ours = [
        name
        for name in listed
        if extra_config.get(f"storage_plugin.{name}.module_path") == MODULE_PATH
        and extra_config.get(f"storage_plugin.{name}.class_name") == class_name
    ]
    if len(ours) > 1:
        raise PluginConfigError(
            f"storage_plugins lists {ours} all pointing at {MODULE_PATH}.{class_name}; "
            "LMCache does not tell a plugin which entry it was built for, so use one entry "
            "(stripe several devices with a comma-separated 'devices' instead)"
        )
    if ours:
        return ours[0]
    return DEFAULT_PLUGIN_NAME


def _expand(uri: str, worker_id: int, world_size: int) -> str:
    """Fill {worker_id}/{world_size} so each tensor-parallel worker gets its own device."""
    try:
        return uri.format(worker_id=worker_id, world_size=world_size)
    except (KeyError, IndexError, ValueError) as exc:
        raise PluginConfigError(
            f"devices: {redact(uri)!r} has an unknown placeholder ({exc}); only {{worker_id}} and "
            "{world_size} are filled in"
        ) from None


def _with_host_nqn(uri: str, host_nqn: str | None) -> str:
    """Carry the host NQN to fabric URIs as a query parameter the device layer reads."""
    parts = urlsplit(uri)
    if host_nqn is None or parts.scheme not in _FABRIC_SCHEMES:
        return uri
    query = dict(parse_qsl(parts.query))
    query.setdefault("hostnqn", host_nqn)
    return urlunsplit(parts._replace(query=urlencode(query, safe=":.-")))


def _check_uri(uri: str) -> None:
    scheme = urlsplit(uri).scheme
    if uri.startswith("/") or scheme in ("file",) + _FABRIC_SCHEMES:
        return
    raise PluginConfigError(
        f"devices: {redact(uri)!r} is not a device URI; use file:///path, /path (a file or block "
        "device), or nvme+tcp://host:port/<subsystem NQN>"
    )


def file_path(uri: str) -> str | None:
    """The local path behind a file:// or plain-path URI, else None."""
    if uri.startswith("/"):
        return uri
    parts = urlsplit(uri)
    if parts.scheme == "file":
        return parts.path
    return None


def _parse_shared_index(value: Any, what: str) -> str | None:
    if value is None or str(value).strip() == "":
        return None
    url = str(value).strip()
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise PluginConfigError(f"{what}: expected a redis:// URL, got {redact_url(url)!r}")
    return url


def parse_options(
    storage_plugins: Any,
    extra_config: Mapping[str, Any] | None,
    class_name: str,
    worker_id: int = 0,
    world_size: int = 1,
) -> PluginOptions:
    extra = dict(extra_config or {})
    name = find_plugin_name(storage_plugins, extra, class_name)
    prefix = f"storage_plugin.{name}."
    ours = {k[len(prefix) :]: v for k, v in extra.items() if k.startswith(prefix)}

    unknown = sorted(set(ours) - KNOWN_KEYS)
    if unknown:
        raise PluginConfigError(
            f"unknown key(s) {[prefix + k for k in unknown]}; known: "
            f"{sorted(KNOWN_KEYS - {'module_path', 'class_name'})}"
        )

    raw_devices = ours.get("devices")
    if raw_devices is None or str(raw_devices).strip() == "":
        raise PluginConfigError(
            f"{prefix}devices is required: one or more comma-separated device URIs, e.g. "
            f"'{prefix}devices: \"file:///var/lib/fx100io/kv.img\"'"
        )
    if isinstance(raw_devices, (list, tuple)):
        items = [str(d) for d in raw_devices]
    else:
        items = str(raw_devices).split(",")
    host_nqn = ours.get("host_nqn") or None
    devices = []
    for item in items:
        uri = item.strip()
        if not uri:
            raise PluginConfigError(f"{prefix}devices: empty entry in {raw_devices!r}")
        uri = _expand(uri, worker_id, world_size)
        _check_uri(uri)
        devices.append(_with_host_nqn(uri, None if host_nqn is None else str(host_nqn)))
    if len(set(devices)) != len(devices):
        raise PluginConfigError(f"{prefix}devices: the same device is listed twice: {raw_devices!r}")

    create = str(ours.get("create", "auto")).strip().lower()
    if create not in CREATE_MODES:
        raise PluginConfigError(
            f"{prefix}create: expected one of {list(CREATE_MODES)}, got {ours.get('create')!r} "
            "('auto' formats only a missing or empty file; 'always' erases the store at "
            "every start)"
        )

    if "direct" in ours and "o_direct" in ours:
        raise PluginConfigError(f"{prefix}direct and {prefix}o_direct are the same option; set one")
    direct_key = "o_direct" if "o_direct" in ours else "direct"

    engine = str(ours.get("engine", "auto")).strip().lower()
    if engine not in ENGINES:
        raise PluginConfigError(
            f"{prefix}engine: expected one of {list(ENGINES)}, got {ours.get('engine')!r} ('auto' "
            "uses io_uring and falls back to plain pread/pwrite, with a warning, where io_uring "
            "is disabled)"
        )

    path = str(ours.get("path", "user")).strip().lower()
    if path not in PATHS:
        raise PluginConfigError(
            f"{prefix}path: expected one of {list(PATHS)}, got {ours.get('path')!r} ('user': "
            "nvme+tcp:// and nvme+rdma:// devices through fx100io's own initiator; 'kernel': "
            "attached by the kernel with nvme-cli and used as block devices)"
        )

    return PluginOptions(
        name=name,
        devices=tuple(devices),
        size=parse_size(ours.get("size"), prefix + "size"),
        create=create,
        # 16 pieces of 4 MiB in flight: on the fast device this beat 64 x 1 MiB by
        # about 5% in cold prefix loads (fewer, larger requests for the loop driver),
        # and tied on the virtio disk (tools/bench_lmcache).
        queue_depth=_parse_number(ours.get("queue_depth"), prefix + "queue_depth", 16, 1, True),
        max_io=_parse_max_io(ours.get("max_io"), prefix + "max_io"),
        direct=parse_direct(ours.get(direct_key), prefix + direct_key),
        engine=engine,
        capacity=parse_size(ours.get("capacity"), prefix + "capacity"),
        host_nqn=None if host_nqn is None else str(host_nqn),
        timeout_s=float(_parse_number(ours.get("timeout_s"), prefix + "timeout_s", 30.0, 0.001, False)),
        retry_after_s=float(
            _parse_number(ours.get("retry_after_s"), prefix + "retry_after_s", 10.0, 0.0, False)
        ),
        register_buffers=parse_bool(ours.get("register_buffers"), prefix + "register_buffers", True),
        path=path,
        shared_index=_parse_shared_index(ours.get("shared_index"), prefix + "shared_index"),
        shared_name=str(ours["shared_name"]) if ours.get("shared_name") else None,
    )


def should_create(options: PluginOptions) -> bool:
    """Whether to format the devices at start, per the 'create' mode.

    'auto' formats only when every device is a local file that is missing or empty:
    that is a first start, and formatting can lose nothing. A half-present stripe is a
    config mistake (a device renamed or lost) that formatting would paper over.
    """
    if options.create == "always":
        return True
    if options.create == "never" or options.shared_index:
        # A shared pool is formatted once, for every host (create: always on one
        # of them, or SharedChunkStore(..., create=True)): hosts starting at
        # once must not each format it.
        return False
    paths = [file_path(uri) for uri in options.devices]
    if any(p is None or p.startswith("/dev/") for p in paths):
        # Block devices and fabric namespaces are not created by us; a blank one is
        # formatted after opening finds no store on it (see is_blank).
        return False
    local = [p for p in paths if p is not None]  # all of them: checked just above
    fresh = [not os.path.exists(p) or (os.path.isfile(p) and os.path.getsize(p) == 0) for p in local]
    if all(fresh):
        return True
    if any(fresh):
        missing = [p for p, f in zip(paths, fresh) if f]
        raise PluginConfigError(
            f"devices: {missing} missing or empty while the other devices of the stripe exist; "
            "refusing to format a partial stripe (restore the files, or set create: always "
            "to start over)"
        )
    return False


# How much of a device must read as zeros before 'auto' treats it as blank.
BLANK_PROBE = 1 << 20


def is_blank(uri: str, path: str = "user") -> bool:
    """True if a device starts with BLANK_PROBE zero bytes (or is an empty file).

    Lets 'create: auto' format a brand-new disk or NVMe-oF namespace while never
    touching one that holds anything, not even data of another program. Any doubt
    (the device cannot be read) counts as not blank.
    """
    local = file_path(uri)
    if local is None:
        return _fabric_is_blank(uri, path)
    try:
        with open(local, "rb") as f:
            head = f.read(BLANK_PROBE)
    except OSError:
        return False
    return not head.strip(b"\0")


def _fabric_is_blank(uri: str, path: str = "user") -> bool:
    """Read the head of a remote namespace through fx100io itself (its own initiator, or
    the kernel's with path="kernel").

    This is the one place here that needs fx100io's core; it is imported only for
    fabric URIs.
    """
    if urlsplit(uri).scheme not in _FABRIC_SCHEMES:
        return False
    try:
        import fx100io

        with fx100io.open_device(uri, readonly=True, path=path) as dev:
            size = min(BLANK_PROBE, dev.size)
            size -= size % dev.block_size  # NVMe reads whole blocks
            if size <= 0:
                return False
            head = bytearray(size)
            if dev.read_into_blocking(0, head) != size:
                return False
    except Exception:  # noqa: BLE001 - unreadable is not blank; opening will report why
        return False
    return not head.strip(b"\0")

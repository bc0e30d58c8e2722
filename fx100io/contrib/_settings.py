"""A backend's settings and how its store is opened: one way in for every engine adapter.

The LMCache plugin, LMCache's MP-mode adapter, SGLang's HiCache backend and vLLM's tier
all take the same settings under the same names (``devices``, ``size``, ``capacity``,
``direct``, ``queue_depth``, ``max_io``, ``create``, ...), each from wherever that engine
keeps a backend's settings, often as strings ("1G", "true"). This module validates them
into one readable :class:`BackendConfigError` (engines tend to swallow constructor
exceptions into a single log line) and opens the store the way every adapter should:
formatting only what is safe to format, and claiming local devices for one process.

Parsing imports no engine and opens no device, so it is cheap to test (it does load
the fx100io package, and with it the C extension, for the size units).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from fx100io import locks, units
from fx100io.errors import Fx100ioMessageError, Fx100ioValueError
from fx100io.uri_redact import redact, redact_url

logger = logging.getLogger("fx100io.contrib")

# The name log lines use when the engine gives the backend none.
DEFAULT_NAME = "fx100io"

CREATE_MODES = ("auto", "never", "always")
# the class of the engine's prefetch reads (fx100io.Priority by name)
PRIORITIES = ("load", "store", "background")
ENGINES = ("auto", "io_uring", "psync")

# how nvme+tcp:// and nvme+rdma:// devices are reached: fx100io's own initiator, or the
# kernel's (attached with nvme-cli, then used as a block device)
PATHS = ("user", "kernel")


# URI schemes that reach an NVMe-oF target from userspace; only they take a host NQN.
_FABRIC_SCHEMES = ("nvme+tcp", "nvme+rdma")


class BackendConfigError(Fx100ioValueError):
    """A backend setting is missing or malformed (the message names the key)."""


class BackendStartError(Fx100ioMessageError, RuntimeError):
    """The configured devices could not be opened, formatted or claimed."""


def parse_size(value: Any, what: str) -> int | None:
    """'64G', '512MiB', '1.5T', 4096 -> bytes (binary units, as disk tools use)."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise BackendConfigError(f"{what}: expected a size such as '64G', got {value!r}")
    try:
        n = units.parse_size(value)
    except ValueError:
        raise BackendConfigError(
            f"{what}: cannot read {value!r} as a size; use bytes or a number with "
            "K, M, G, T (binary units), e.g. '64G'"
        ) from None
    if n <= 0:
        raise BackendConfigError(f"{what}: size must be positive, got {value!r}")
    return n


def parse_bool(value: Any, what: str, default: bool) -> bool:
    if value is None or (isinstance(value, str) and value.strip() == ""):
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
    raise BackendConfigError(f"{what}: expected true or false, got {value!r}")


def parse_direct(value: Any, what: str) -> Any:
    """O_DIRECT: true (required), false (page cache) or auto (when the filesystem has it)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return parse_bool(value, what, default="auto")  # type: ignore[arg-type]
    except BackendConfigError:
        raise BackendConfigError(f"{what}: expected true, false or auto, got {value!r}") from None


def _parse_number(value: Any, what: str, default: float, minimum: float, integer: bool) -> Any:
    if value is None or value == "":
        return default
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool):  # YAML 'yes' is not a count
        raise BackendConfigError(f"{what}: expected {kind}, got {value!r}")
    try:
        number = int(str(value)) if integer else float(value)
    except ValueError:
        raise BackendConfigError(f"{what}: expected {kind}, got {value!r}") from None
    if number < minimum:
        raise BackendConfigError(f"{what}: must be >= {minimum}, got {value!r}")
    return number


def _parse_max_io(value: Any, what: str, default: int) -> int:
    """Bytes per I/O piece: a size, a multiple of 4 KiB from 4 KiB to 1 GiB."""
    n = parse_size(value, what)
    if n is None:
        return default
    if n < 4096 or n > 1 << 30 or n % 4096:
        raise BackendConfigError(f"{what}: expected a multiple of 4KiB between 4KiB and 1GiB, got {value!r}")
    return n


def _expand(uri: str, worker_id: int, world_size: int, where: str) -> str:
    """Fill {worker_id}/{world_size} so each tensor-parallel worker gets its own device."""
    try:
        return uri.format(worker_id=worker_id, world_size=world_size)
    except (KeyError, IndexError, ValueError) as exc:
        raise BackendConfigError(
            f"{where}devices: {redact(uri)!r} has an unknown placeholder ({exc}); only {{worker_id}} and "
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


def _check_uri(uri: str, where: str) -> None:
    scheme = urlsplit(uri).scheme
    if uri.startswith("/") or scheme in ("file",) + _FABRIC_SCHEMES:
        return
    raise BackendConfigError(
        f"{where}devices: {redact(uri)!r} is not a device URI; use file:///path, /path (a file or block "
        "device), nvme+tcp://host:port/<subsystem NQN> or nvme+rdma://host:port/<subsystem NQN>"
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
    if not url.startswith(("redis://", "rediss://", "unix://", "redis+sentinel://",
                           "redis+cluster://")):
        raise BackendConfigError(f"{what}: expected a redis://, rediss://, unix://, "
                                 f"redis+sentinel:// or redis+cluster:// URL, got "
                                 f"{redact_url(url)!r}")
    return url


# How a setting is declared: what its key takes (parse(value, what, default) -> the typed
# value, or BackendConfigError naming `what`, the key as the user wrote it), the value an
# absent or empty key stands for, what it means, and how describe() shows it (None: not
# shown).
Parser = Callable[[Any, str, Any], Any]


def _choice(choices: tuple[str, ...], hint: str) -> Parser:
    """A parser for one of choices (any case, spaces around ignored); absent, null or
    empty is the default, as for the true/false keys."""
    def parse(value: Any, what: str, default: Any) -> str:
        if value is None or str(value).strip() == "":
            return str(default)
        text = str(value).strip().lower()
        if text not in choices:
            raise BackendConfigError(f"{what}: expected one of {list(choices)}, got {value!r} ({hint})")
        return text
    return parse


def _number(minimum: float, integer: bool) -> Parser:
    if integer:
        return lambda value, what, default: _parse_number(value, what, default, minimum, True)
    return lambda value, what, default: float(_parse_number(value, what, default, minimum, False))


def _size(value: Any, what: str, _default: None) -> int | None:
    return parse_size(value, what)


def _text_or_none(value: Any, what: str, _default: None) -> str | None:
    return str(value) if value else None


def _setting(parse: Parser | None, default: Any, doc: str, *,
             show: Callable[[Any], str | None] | None = str, aliases: tuple[str, ...] = (),
             field_default: Any = dataclasses.MISSING) -> Any:
    meta = {"parse": parse, "default": default, "doc": doc, "show": show, "aliases": aliases}
    if field_default is dataclasses.MISSING:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=field_default, metadata=meta)


def _show_devices(devices: tuple[str, ...]) -> str:
    return ",".join(redact(d) for d in devices)


def _show_shared_index(url: str | None) -> str | None:
    # it may carry a password: masked
    return redact_url(url) if url else None


@dataclasses.dataclass(frozen=True, repr=False)
class BackendSettings:
    """A backend's settings: each field below that is declared with _setting() is one
    key of every engine's configuration (the same name under each engine's prefix), and
    its declaration is the only one: the known keys, parsing, defaults, describe() and
    the documented list (documented_settings) are all read from it."""

    # the backend's name in log lines, and the prefix of its keys in error messages
    name: str
    where: str
    # parsed by parse_settings itself: it fills in worker placeholders and the host NQN
    devices: tuple[str, ...] = _setting(
        None, None, "one or more comma-separated device URIs (file:///path, /path, "
        "nvme+tcp://..., nvme+rdma://...); {worker_id} and {world_size} are filled in",
        show=_show_devices)
    size: int | None = _setting(
        _size, None,
        "bytes to format a new store with (K, M, G, T: binary units)")
    create: str = _setting(
        _choice(CREATE_MODES, "'auto' formats only a missing or empty file; 'always' erases "
                "the store at every start, and is refused with shared_index"), "auto",
        "when to format: auto (a missing or empty file, or a blank device), never, always")
    # 16 pieces of 4 MiB in flight: on the fast device this beat 64 x 1 MiB by
    # about 5% in cold prefix loads (fewer, larger requests for the loop driver),
    # and tied on the virtio disk (tools/bench_lmcache).
    queue_depth: int = _setting(_number(1, True), 16, "I/O pieces in flight, at least 1")
    max_io: int = _setting(
        _parse_max_io, 4 << 20, "bytes per I/O piece: a multiple of 4 KiB from 4 KiB to 1 GiB")
    direct: Any = _setting(  # True, False or "auto"
        lambda v, what, _default: parse_direct(v, what), "auto",
        "O_DIRECT: true, false or auto (where the filesystem has it)", aliases=("o_direct",))
    engine: str = _setting(
        _choice(ENGINES, "'auto' uses io_uring and falls back to plain pread/pwrite, with a "
                "warning, where io_uring is disabled"), "auto",
        "auto, io_uring or psync")
    capacity: int | None = _setting(
        _size, None, "bytes the store may fill (all of it)")
    host_nqn: str | None = _setting(
        _text_or_none, None, "host NQN for nvme+tcp:// and nvme+rdma:// devices")
    timeout_s: float = _setting(
        _number(0.001, False), 30.0,
        "seconds a store request may take before it counts as failed, at least 0.001")
    retry_after_s: float = _setting(
        _number(0.0, False), 10.0,
        "seconds the backend answers 'miss' after a device failure before trying again")
    register_buffers: bool = _setting(
        parse_bool, True, "register the engine's buffers with the kernel")
    path: str = _setting(
        _choice(PATHS, "'user': nvme+tcp:// and nvme+rdma:// devices through fx100io's own "
                "initiator; 'kernel': attached by the kernel with nvme-cli and used as block "
                "devices"), "user",
        "user or kernel: how nvme+tcp:// and nvme+rdma:// devices are reached",
        field_default="user")
    # off: loads go first in fx100io's queue only, never with the realtime I/O class,
    # which also holds back other processes' I/O on that disk (docs/python-api.md)
    io_priority: bool = _setting(
        parse_bool, True, "load reads carry the realtime I/O priority where the disk's "
        "scheduler orders by class (mq-deadline, bfq)", field_default=True)
    # The engines' prefetch reads (LMCache MP L2 loads and async loading, layerwise
    # retrieves, every SGLang read) hold a request until they end, so they are loads by
    # default; background puts them behind every store (docs/serving-engines.md,
    # "Priority") and is only for lookahead nobody waits on.
    prefetch_priority: str = _setting(
        _choice(PRIORITIES, "the class of the engine's prefetch reads"), "load",
        "load, store or background: the class of the engine's prefetch reads",
        field_default="load")
    # A shared pool (fx100io.SharedChunkStore): the redis:// URL of its index.
    # It may carry a password: out of the repr, masked in describe().
    shared_index: str | None = _setting(
        lambda v, what, _default: _parse_shared_index(v, what), None,
        "redis:// URL of a shared pool's index", show=_show_shared_index, field_default=None)
    shared_name: str | None = _setting(
        _text_or_none, None, "the shared pool's name", show=None, field_default=None)

    def __repr__(self) -> str:
        # device URIs may carry DH-HMAC-CHAP secrets: never print them
        return f"BackendSettings(name={self.name!r}, {self.describe()})"

    def describe(self) -> str:
        """One log line that says what the backend was asked to open."""
        shown = []
        for f in SETTINGS:
            show = f.metadata["show"]
            text = show(getattr(self, f.name)) if show else None
            if text is not None:
                shown.append(f"{f.name}={text}")
        return " ".join(shown)


# the dataclass's fields that are settings, in the order they are read and shown
SETTINGS = tuple(f for f in dataclasses.fields(BackendSettings) if "parse" in f.metadata)
# Keys we understand; anything else under our prefix is a typo worth reporting.
KNOWN_KEYS = frozenset(
    name for f in SETTINGS for name in (f.name, *f.metadata["aliases"]))


def documented_settings() -> list[str]:
    """The settings as the documentation lists them: one line each."""
    lines = []
    for f in SETTINGS:
        also = "".join(f" (also {a})" for a in f.metadata["aliases"])
        default = f.metadata["default"]
        shown = "" if default is None else f" (default: {default})"
        lines.append(f"{f.name}{also}: {f.metadata['doc']}{shown}")
    return lines


def parse_settings(
    values: Mapping[str, Any],
    where: str,
    *,
    name: str = DEFAULT_NAME,
    worker_id: int = 0,
    world_size: int = 1,
    extra_keys: Iterable[str] = (),
) -> BackendSettings:
    """Read a backend's settings from the flat mapping an engine hands over.

    ``where`` prefixes every key in error messages (``"adapter_params."``,
    ``"storage_plugin.fx100io."``), so the user sees the key as they wrote it.
    ``extra_keys`` are the engine's own keys that may sit beside ours (ignored here).
    """
    ours = {str(k): v for k, v in values.items() if str(k) not in set(extra_keys)}
    unknown = sorted(set(ours) - KNOWN_KEYS)
    if unknown:
        raise BackendConfigError(
            f"unknown key(s) {[where + k for k in unknown]}; known: {sorted(KNOWN_KEYS)}"
        )

    typed: dict[str, Any] = {"devices": _parse_devices(ours, where, worker_id, world_size)}
    for f in SETTINGS:
        parse = f.metadata["parse"]
        if parse is None:
            continue
        given = [k for k in (f.name, *f.metadata["aliases"]) if k in ours]
        if len(given) > 1:
            raise BackendConfigError(f"{where}{given[0]} and {where}{given[1]} are the same "
                                     "option; set one")
        key = given[0] if given else f.name
        default = f.metadata["default"]
        typed[f.name] = parse(ours.get(key, default), where + key, default)

    if typed["create"] == "always" and typed["shared_index"]:
        # 'always' formats at every start; a shared pool is live across restarts and
        # hosts, so the second start (a restart, another host) would erase every chunk
        # every host stored. Refused here, before any device or key is touched.
        raise BackendConfigError(
            f"{where}create: 'always' cannot be used with {where}shared_index: it would "
            "format the shared pool at every start, erasing what every host stored. "
            "Create the pool once (fx100io.SharedChunkStore(..., create=True)), then "
            f"start with {where}create: auto (or never), which opens it")
    return BackendSettings(name=name, where=where, **typed)


def _parse_devices(ours: Mapping[str, Any], where: str, worker_id: int, world_size: int
                   ) -> tuple[str, ...]:
    """The devices setting: URIs checked, placeholders filled, the host NQN carried."""
    raw_devices = ours.get("devices")
    if raw_devices is None or str(raw_devices).strip() == "":
        raise BackendConfigError(
            f"{where}devices is required: one or more comma-separated device URIs, e.g. "
            f"{where}devices = \"file:///var/lib/fx100io/kv.img\""
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
            raise BackendConfigError(f"{where}devices: empty entry in {redact(str(raw_devices))!r}")
        uri = _expand(uri, worker_id, world_size, where)
        _check_uri(uri, where)
        devices.append(_with_host_nqn(uri, None if host_nqn is None else str(host_nqn)))
    if len(set(devices)) != len(devices):
        raise BackendConfigError(
            f"{where}devices: the same device is listed twice: {redact(str(raw_devices))!r}")
    return tuple(devices)


def should_create(options: BackendSettings) -> bool:
    """Whether to format the devices at start, per the 'create' mode.

    'auto' formats only when every device is a local file that is missing or empty:
    that is a first start, and formatting can lose nothing. A half-present stripe is a
    config mistake (a device renamed or lost) that formatting would paper over.
    """
    if options.create == "always":
        return True
    if options.create == "never" or options.shared_index:
        # A shared pool is formatted once, for every host, by
        # SharedChunkStore(..., create=True) (create: always with a shared index is
        # refused by parse_settings): hosts starting at once must not each format it.
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
        raise BackendConfigError(
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


# ------------------------------------------------------------------ opening the store


def prepare_files(options: BackendSettings, create: bool) -> None:
    """Before formatting: every file device needs a size and an existing folder."""
    if not create:
        return
    for uri in options.devices:
        path = file_path(uri)
        if path is None or path.startswith("/dev/") or (os.path.exists(path) and not os.path.isfile(path)):
            continue  # block devices and fabric namespaces bring their own size
        if options.size is None:
            raise BackendConfigError(
                f"{options.where}size is required to create {path} on first use (e.g. \"64G\")"
            )
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)


def lock_devices(options: BackendSettings, create: bool) -> list[locks.FileLock]:
    """Claim each local device for this process, or fail at start.

    A store's index lives in the memory of the process that opened it, so two
    processes on one device (typically two tensor-parallel workers given the same
    path) would overwrite each other's chunks. A claim (fx100io.locks) makes the second
    one fail loudly instead. Files that do not exist yet are created empty first (they
    are about to be formatted; an empty file is still 'fresh' to create: auto).
    The claim belongs to the process: this process's store takes its own lock inside
    it, and a second store on the same file in the same process is not stopped here
    (ChunkStore refuses it itself).
    """
    held: list[locks.FileLock] = []
    if options.shared_index:
        return held  # a shared pool: every host opens the same devices, by design
    try:
        for uri in options.devices:
            path = file_path(uri)
            if path is None:
                continue
            if not os.path.exists(path) and (not create or path.startswith("/dev/")):
                continue  # nothing to lock; opening will say it is missing
            claim = locks.claim(path, create=True, mode=0o644)
            if claim is None:
                raise BackendStartError(
                    f"{path} is in use by another process; give each worker its own "
                    f"device, e.g. {options.where}devices = "
                    '"file:///var/lib/fx100io/kv-{worker_id}.img"'
                )
            held.append(claim)
    except BaseException:
        locks.release_all(held)
        raise
    return held


def unlock_devices(held: list[locks.FileLock]) -> None:
    locks.release_all(held)


def open_store(options: BackendSettings, create: bool, log: logging.Logger | None = None) -> Any:
    """Open (or format, per ``create`` and the 'auto' rules) the ChunkStore or
    SharedChunkStore the settings name. Blocking; the calling thread gets the
    store's queues, so do its I/O from this thread."""
    log = log or logger
    try:
        import fx100io
    except ImportError as exc:
        raise BackendStartError(
            f"cannot import fx100io's core ({exc}); build it with `pip install -e .` in "
            "the fx100io checkout"
        ) from exc
    uris: Any = list(options.devices) if len(options.devices) > 1 else options.devices[0]

    def open_it(fmt: bool) -> Any:
        if options.shared_index:
            return fx100io.SharedChunkStore(
                uris,
                options.shared_index,
                create=fmt,
                size=options.size if fmt else None,
                name=options.shared_name if fmt else None,
                direct=options.direct,
                engine=options.engine,
                queue_depth=options.queue_depth,
                capacity=options.capacity,
                max_io=options.max_io,
                io_priority=options.io_priority,
            )
        return fx100io.ChunkStore(
            uris,
            create=fmt,
            size=options.size if fmt else None,
            direct=options.direct,
            engine=options.engine,
            queue_depth=options.queue_depth,
            capacity=options.capacity,
            max_io=options.max_io,
            path=options.path,
            io_priority=options.io_priority,
        )

    try:
        try:
            store = open_it(create)
        except fx100io.errors.NotAStoreError:
            # A brand-new disk has no store yet; 'auto' formats it only if it is
            # blank, so a device holding anything else is never overwritten.
            # Never a shared pool's: every host would format it (should_create).
            if (create or options.create != "auto" or options.shared_index
                    or not all(is_blank(u, options.path) for u in options.devices)):
                raise
            log.warning("fx100io: %s blank, formatting it", ", ".join(redact(d) for d in options.devices))
            create = True
            store = open_it(True)
    except Exception as exc:
        action = "format" if create else "open"
        hint = ""
        if isinstance(exc, fx100io.errors.NotAStoreError):
            hint = (
                " (it holds something that is not an fx100io store and is not blank; "
                "create: always would erase it)"
            )
        elif not create and options.create == "never":
            hint = " (create: never, so nothing is formatted; use create: auto)"
        shown = ", ".join(redact(d) for d in options.devices)
        raise BackendStartError(f"could not {action} {shown}: {exc}{hint}") from exc
    log.info(
        "fx100io: %s store on %s",
        "formatted new" if create else "opened existing",
        ", ".join(redact(d) for d in options.devices),
    )
    return store


class BackendStore:
    """An opened store and the device locks that go with it; ``close()`` releases both."""

    def __init__(self, store: Any, held: list[locks.FileLock]) -> None:
        self.store = store
        self._locks = held
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.store.close()
        finally:
            unlock_devices(self._locks)

    def __enter__(self) -> BackendStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_backend_store(settings: BackendSettings, *, log: logging.Logger | None = None) -> BackendStore:
    """Everything a backend does at start: decide whether to format (create: auto formats
    only a missing or empty file, or a blank device), make folders, claim local devices
    for this process, open the store. Blocking; the calling thread owns the store's
    queues (ChunkStore gives each thread its own), so use and close it from there."""
    create = should_create(settings)
    prepare_files(settings, create)
    held = lock_devices(settings, create)
    try:
        store = open_store(settings, create, log)
    except BaseException:
        unlock_devices(held)
        raise
    return BackendStore(store, held)

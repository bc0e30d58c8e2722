"""Several paths to one NVMe-oF namespace as one device (issue 27, part 1).

``nvme+tcp://10.0.0.1:4420,10.0.1.1:4420/NQN?policy=queue-depth`` opens one
:class:`~fx100io.device.Device` per path: each its own controller, queues
and background connector.  Every path must show the same namespace (NGUID,
EUI-64, UUID from Identify Namespace and the Namespace Identification
Descriptor list, size, block size); one that shows another is refused with
PathMismatchError.

Who owns what (docs/architecture.md, "Buffers"): the caller owns the buffer
and the multipath request; a path's Device owns one *attempt* of it, from
its submit until its completion is reaped.  A request is on at most one path
at a time: it moves to another path only after the attempt's completion came
back (so the failed path no longer touches the buffer), and the caller's
future is resolved once, with the first success or the final error.  A
cancelled request goes through the path Device's own cancel (it returns only
once the attempt stopped touching the buffer).

What moves a request: a path error (a dropped or refused connection, a
command past io_timeout_ms, a protocol error, a controller re-opened onto
another namespace, or an NVMe Path Related Status, SCT 3h, without DNR).
Anything else (a media error, a bad argument) is the caller's answer on any
path and is returned as is.  Requests go to optimized paths (ANA: the
namespace's group state in each controller's ANA log page, LID 0Ch; a
controller that reports no ANA counts as optimized), to non-optimized ones
only when no optimized one is live, never to inaccessible ones.  The ANA
log of each path is read at open, when a path comes back, and every
ANA_POLL_S by one thread of the device (the asynchronous event notice is
not handled yet); a Path Related Status on a completion takes the path out
at once.  A path that failed is taken out of the rotation
and a thread of its own (never the caller's, never the event loop) brings it
back: it re-opens the path's Device if it had none, then reads one block
until a read succeeds, reconnect_ms apart.  While no path is live a request
waits; it fails only once it has waited io_timeout_ms with no live path.

Writes: a write that fails over is re-issued whole, with the caller's data.
A path error with a status means the command did not run; after a lost
connection it may or may not have run on the old path.  Both copies carry
the same data for the same blocks, so the blocks end right whichever ran.
A caller that orders writes to the same blocks by waiting for the first's
completion is safe when the old path's controller is gone (its process died,
or its keep alive ran out): then no late copy can land.  After a silent
network split, a controller still alive may run the old copy until its keep
alive timeout (kato_ms) ends the association: a second write to the same
blocks acknowledged within that window can be overwritten by the first one's
data.  The kernel's multipath has the same window.
"""

from __future__ import annotations

import errno as _errno
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from fx100io import _core, fabric_uri
from fx100io.aio import Completion
from fx100io.errors import (
    DeviceClosedError,
    Fx100ioError,
    FxTimeoutError,
    InvalidArgumentError,
    NvmeStatusError,
    PathMismatchError,
    UnsupportedTransportError,
    error_from_errno,
    error_from_status,
)

if TYPE_CHECKING:
    import asyncio

    from fx100io.device import Device

log = logging.getLogger("fx100io")

# Completion errnos that say "this path", not "this request".
PATH_ERRNOS = frozenset({
    _errno.ECONNRESET, _errno.EPIPE, _errno.ECONNREFUSED, _errno.ECONNABORTED,
    _errno.ENOTCONN, _errno.EHOSTUNREACH, _errno.ENETUNREACH, _errno.ENETDOWN,
    _errno.ETIMEDOUT, _errno.ETIME, _errno.EPROTO, _errno.EBADMSG, _errno.ESTALE,
    _errno.ESHUTDOWN,
})
SCT_PATH = 0x3  # Path Related Status: 01h persistent loss, 02h inaccessible, 03h transition
WAIT_STEP_S = 0.02  # how often a request with no live path looks again
# A request moves at most this many times per path: paths that keep coming
# back and failing at once cannot keep it forever.
MAX_MOVES = 8
MAX_DISCOVERY = 8  # discovery controllers paths=discover reads, referrals included

LIVE, DOWN, REFUSED = "live", "down", "refused"
# ANA states (NVMe Base 2.0, the ANA log page), and ours for "none reported"
ANA_NONE, ANA_OPTIMIZED, ANA_NONOPTIMIZED, ANA_INACCESSIBLE, ANA_LOSS, ANA_CHANGE = 0, 1, 2, 3, 4, 15
ANA_NAMES = {ANA_NONE: "none", ANA_OPTIMIZED: "optimized", ANA_NONOPTIMIZED: "non-optimized",
             ANA_INACCESSIBLE: "inaccessible", ANA_LOSS: "persistent-loss",
             ANA_CHANGE: "change"}
ANA_POLL_S = 1.0  # how often the ANA log of each path is read (until the AER is handled)


def path_error(res: int, status: int) -> bool:
    """Whether a completion (res, status) is the path's fault, so that the
    request may run on another path."""
    if status:
        sct, dnr = (status >> 8) & 0x7, bool(status & 0x4000)
        return sct == SCT_PATH and not dnr
    return res < 0 and (-res in PATH_ERRNOS or -res == _errno.EIO)


def _exc_path_error(e: BaseException) -> bool:
    if isinstance(e, NvmeStatusError):
        return path_error(-5, e.status)
    return isinstance(e, OSError) and not isinstance(e, DeviceClosedError) and \
        e.errno is not None and (e.errno in PATH_ERRNOS or e.errno == _errno.EIO)


class _Path:
    def __init__(self, uri: str):
        self.uri = uri
        self.label = fabric_uri.redact(uri)
        self.dev: Device | None = None
        self.state = DOWN
        self.why = ""
        self.inflight = 0
        self.commands = 0
        self.bytes = 0
        self.errors = 0
        self.failovers = 0
        self.prober: threading.Thread | None = None
        #: ANA state of the namespace's group on this path (ANA_*); ANA_NONE
        #: where the controller reports none (the path counts as optimized)
        self.ana = ANA_NONE
        self.ana_group = 0
        #: held around calls into the path's C device from the threads of
        #: this module (ANA reads), so that close never frees it under them
        self.dev_lock = threading.Lock()

    def stats(self) -> dict[str, Any]:
        return {"path": self.label, "state": self.state, "why": self.why,
                "ana_group": self.ana_group, "ana_state": ANA_NAMES.get(self.ana, str(self.ana)),
                "commands": self.commands, "bytes": self.bytes, "errors": self.errors,
                "failovers": self.failovers, "inflight": self.inflight}


class MultipathDevice:
    """One namespace reached over several paths: the Device API (read_into,
    write_from, flush, submit, start and their blocking twins), with each
    request re-issued on another live path when its path fails.  Use
    :func:`fx100io.open_device` with a multipath URI."""

    def __init__(self, uri: str, *, readonly: bool = False, **opts: Any):
        from fx100io.device import Device

        self._Device = Device
        self.uri = fabric_uri.redact(uri)
        mopts = fabric_uri.multipath_options(uri)
        self.policy = mopts["policy"]
        uris = fabric_uri.split_paths(uri)
        if mopts["paths"] == "discover":
            uris = _discovered(uris)
        first = fabric_uri.parse(uris[0])
        self.io_timeout_s = int(first.get("io_timeout_ms", "30000")) / 1000
        self._retry_s = max(int(first.get("reconnect_ms", "200")), 50) / 1000
        self._opts = {**opts, "readonly": readonly}
        self._lock = threading.Lock()
        self._closed = False
        self._closing = threading.Event()
        self._rr = 0
        self._ref: tuple[Any, ...] | None = None  # (size, block_size, ns_ids) of the namespace
        self._paths = [_Path(_member_uri(u)) for u in uris]
        errors: list[BaseException] = []
        for p in self._paths:
            try:
                self._attach(p, self._open_path(p))
            except PathMismatchError:
                self._close_paths()
                raise
            except OSError as e:
                p.why = str(e)
                errors.append(e)
        if not any(p.state == LIVE for p in self._paths):
            self._close_paths()
            raise errors[0]
        for p in self._paths:
            if p.state == DOWN:
                log.warning("fx100io: multipath %s: path %s is down at open (%s); it is "
                            "retried in the background", self.uri, p.label, p.why)
                self._start_prober(p)
        for p in self._paths:
            self._read_ana(p)
        self._watcher: threading.Thread | None = None
        if any(p.ana_group for p in self._paths):
            self._watcher = threading.Thread(target=self._watch_ana, daemon=True,
                                             name="fx100io-mpath-ana")
            self._watcher.start()
        self.target = self._live()[0].dev.target  # type: ignore[union-attr]
        self.transport = self._live()[0].dev.transport  # type: ignore[union-attr]
        self.engine = "io_uring"
        self.path = "user"
        self.kernel_attachment = None

    # -- paths -------------------------------------------------------------
    def _open_path(self, p: _Path) -> Device:
        dev = self._Device(p.uri, **self._opts)
        ident = (dev.size, dev.block_size, dev._dev.ns_ids)
        with self._lock:
            ref = self._ref
            if ref is None:
                self._ref = ident
        if ref is not None and ident != ref:
            dev.close()
            with self._lock:
                p.state, p.why = REFUSED, "another namespace"
            raise PathMismatchError(
                _errno.ESTALE, f"path {p.label} shows another namespace than {self._paths[0].label} "
                f"(size, block size, NGUID, EUI-64 or UUID differ): refused", self.uri)
        if ref is None and not any(any(b) for b in ident[2]):
            log.warning("fx100io: multipath %s: the namespace reports no NGUID, EUI-64 or UUID; "
                        "paths are matched by size and block size only", self.uri)
        return dev

    def _attach(self, p: _Path, dev: Device) -> None:
        with self._lock:
            closed = self._closed
            if not closed:
                p.dev, p.state, p.why = dev, LIVE, ""
        if closed:
            dev.close()

    def _live(self) -> list[_Path]:
        return [p for p in self._paths if p.state == LIVE]

    def _pick(self) -> _Path | None:
        """A live path by the policy, or None: an optimized one (or one
        whose controller reports no ANA), else a non-optimized one."""
        with self._lock:
            live = [p for p in self._live() if p.ana in (ANA_NONE, ANA_OPTIMIZED)] or \
                [p for p in self._live() if p.ana == ANA_NONOPTIMIZED]
            if not live:
                return None
            if self.policy == "queue-depth":
                p = min(live, key=lambda q: q.inflight)
            else:
                self._rr += 1
                p = live[self._rr % len(live)]
            p.inflight += 1
            return p

    def _done(self, p: _Path, res: int, nbytes: int, failed: BaseException | str | None) -> None:
        start = False
        with self._lock:
            p.inflight -= 1
            if failed is None:
                p.commands += 1
                p.bytes += max(res, 0) if nbytes else 0
                return
            p.errors += 1
            p.failovers += 1
            if p.state == LIVE:
                p.state, p.why = DOWN, str(failed)
                start = True
        if start:
            log.warning("fx100io: multipath %s: path %s failed (%s); its requests move to "
                        "another path", self.uri, p.label, p.why)
            self._start_prober(p)

    def _read_ana(self, p: _Path) -> None:
        """Read path p's ANA state from its controller (blocks on the
        network: never on an event loop)."""
        with p.dev_lock:
            dev = p.dev
            if dev is None or self._closed:
                return
            try:
                grp, state = dev._dev.ana_state()
            except OSError as e:
                if e.errno == _errno.EOPNOTSUPP:
                    grp, state = 0, ANA_NONE
                else:
                    return  # no controller now: the path's errors say so
        with self._lock:
            if state != p.ana and p.ana_group:
                log.warning("fx100io: multipath %s: path %s: ANA group %d is %s (was %s)",
                            self.uri, p.label, grp, ANA_NAMES.get(state, state),
                            ANA_NAMES.get(p.ana, p.ana))
            p.ana_group, p.ana = grp, state

    def _watch_ana(self) -> None:
        """Re-read every opened path's ANA state, ANA_POLL_S apart."""
        while not self._closing.wait(ANA_POLL_S):
            for p in self._paths:
                if p.dev is not None and p.state != REFUSED:
                    self._read_ana(p)

    def _release(self, p: _Path) -> None:
        with self._lock:
            p.inflight -= 1

    def _start_prober(self, p: _Path) -> None:
        with self._lock:
            if self._closed or p.state == REFUSED or (p.prober and p.prober.is_alive()):
                return
            p.prober = threading.Thread(target=self._probe, args=(p,), daemon=True,
                                        name="fx100io-mpath-probe")
            p.prober.start()

    def _probe(self, p: _Path) -> None:
        """Bring path p back, off every caller's thread: re-open its Device
        if it has none, then read one block until a read succeeds."""
        buf = None
        while not self._closing.wait(self._retry_s):
            try:
                if p.dev is None:
                    self._attach(p, self._open_path(p))
                    with self._lock:
                        if p.state == LIVE:
                            p.state = DOWN  # opened: still proven by a read below
                dev = p.dev
                if dev is None:
                    return
                if buf is None:
                    buf = bytearray(dev.block_size)
                dev.read_into_blocking(0, buf)
                self._read_ana(p)
            except PathMismatchError as e:
                log.error("fx100io: multipath %s: %s", self.uri, e)
                with self._lock:
                    p.state, p.why = REFUSED, str(e)
                return
            except OSError as e:
                with self._lock:
                    p.why = str(e)
                continue
            with self._lock:
                if self._closed:
                    return
                p.state, p.why = LIVE, ""
            log.warning("fx100io: multipath %s: path %s is back", self.uri, p.label)
            return

    def _no_path(self, last: Completion | None) -> Completion:
        """What a request gets when it found no live path for io_timeout_ms
        (or moved MAX_MOVES times per path): -ETIMEDOUT, which _check turns
        into an FxTimeoutError naming every path and why it is out."""
        return (-_errno.ETIMEDOUT, 0)

    # -- one request, over paths ---------------------------------------------
    async def _one(self, op: int, offset: int, buf: Any) -> Completion:
        """Run one request to its end on some path: the first completion
        that is not a path error, or (-ETIMEDOUT, 0) once no path was live
        for io_timeout_ms (or it moved MAX_MOVES times per path)."""
        import asyncio

        from fx100io.device import _io_done

        last: Completion | None = None
        waiting_since: float | None = None
        moves = 0
        while True:
            if self._closed:
                raise DeviceClosedError(9, "device is closed", self.uri)
            if moves >= MAX_MOVES * len(self._paths):
                return self._no_path(last)
            p = self._pick()
            if p is None:
                now = time.monotonic()
                waiting_since = waiting_since or now
                if now - waiting_since >= self.io_timeout_s:
                    return self._no_path(last)
                await asyncio.sleep(WAIT_STEP_S)
                continue
            waiting_since = None
            dev = p.dev
            try:
                assert dev is not None
                r = dev._request(op, offset, buf)
                drv = dev._driver(True)
                (f,) = drv.submit([r])
                done = await _io_done(drv, f)
            except BaseException as e:
                if isinstance(e, Exception) and _exc_path_error(e) and not self._closed:
                    self._done(p, 0, 0, e)
                    last = (-(getattr(e, "errno", 0) or _errno.EIO), getattr(e, "status", 0))
                    moves += 1
                    continue
                self._release(p)
                raise
            if path_error(done[0], done[1]) and not self._closed:
                self._done(p, done[0], 0, _describe(done))
                last = done
                moves += 1
                continue
            self._done(p, done[0], r[3], None)
            return done

    def _one_blocking(self, op: int, offset: int, buf: Any) -> Completion:
        last: Completion | None = None
        waiting_since: float | None = None
        moves = 0
        while True:
            if self._closed:
                raise DeviceClosedError(9, "device is closed", self.uri)
            if moves >= MAX_MOVES * len(self._paths):
                return self._no_path(last)
            p = self._pick()
            if p is None:
                now = time.monotonic()
                waiting_since = waiting_since or now
                if now - waiting_since >= self.io_timeout_s:
                    return self._no_path(last)
                time.sleep(WAIT_STEP_S)
                continue
            waiting_since = None
            dev = p.dev
            try:
                assert dev is not None
                r = dev._request(op, offset, buf)
                done = dev._driver().run_blocking([r])[0]
            except BaseException as e:
                if isinstance(e, Exception) and _exc_path_error(e) and not self._closed:
                    self._done(p, 0, 0, e)
                    last = (-(getattr(e, "errno", 0) or _errno.EIO), getattr(e, "status", 0))
                    moves += 1
                    continue
                self._release(p)
                raise
            if path_error(done[0], done[1]) and not self._closed:
                self._done(p, done[0], 0, _describe(done))
                last = done
                moves += 1
                continue
            self._done(p, done[0], r[3], None)
            return done

    def _check(self, offset: int, done: Completion) -> int:
        res, status = done[0], done[1]
        if status:
            raise error_from_status(status, f"{self.uri} offset {offset}")
        if res < 0:
            err = error_from_errno(-res, f"{self.uri} offset {offset}")
            if -res == _errno.ETIMEDOUT:
                err = FxTimeoutError(_errno.ETIMEDOUT, f"no path carried it (none live for "
                                     f"{self.io_timeout_s:g} s, or each failed it {MAX_MOVES} "
                                     "times) "
                                     f"({'; '.join(p.label + ': ' + p.why for p in self._paths)})",
                                     f"{self.uri} offset {offset}")
            raise err
        return res

    # -- the Device API ------------------------------------------------------
    def _any_dev(self) -> Device:
        for p in self._paths:
            if p.dev is not None:
                return p.dev
        raise DeviceClosedError(9, "device is closed", self.uri)

    @property
    def size(self) -> int:
        return int(self._ref[0]) if self._ref else 0

    @property
    def block_size(self) -> int:
        return int(self._ref[1]) if self._ref else 0

    @property
    def direct(self) -> bool:
        return self._any_dev().direct

    @property
    def is_block_device(self) -> bool:
        return False

    @property
    def aligned_only(self) -> bool:
        return self._any_dev().aligned_only

    @property
    def closed(self) -> bool:
        return self._closed

    def path_stats(self) -> list[dict[str, Any]]:
        """One dict per path, in the URI's order: path (its URI, secrets
        hidden), state ("live", "down", "refused"), why (the last error of
        a path not live), commands and bytes it completed, errors and
        failovers (requests that left it for another path), inflight."""
        with self._lock:
            return [p.stats() for p in self._paths]

    def queue_stats(self) -> dict[str, int]:
        """The calling thread's queue counters summed over its paths, plus
        failovers (every path's)."""
        out: dict[str, int] = {}
        for p in self._paths:
            d = getattr(p.dev._local, "driver", None) if p.dev is not None else None
            if d is None:
                continue
            for k, v in d.queue.stats().items():
                out[k] = out.get(k, 0) + int(v)
        with self._lock:
            out["failovers"] = sum(p.failovers for p in self._paths)
        return out

    def features(self) -> list[str]:
        return self._any_dev().features()

    def raw_queue(self) -> _core.Queue:
        raise UnsupportedTransportError(
            95, "a multipath device has no one raw queue: open one path's URI for that", self.uri)

    async def submit(self, reqs: list[tuple[int, int, Any]]) -> list[Completion]:
        futs = self.start(reqs)
        return [await f for f in futs]

    def start(self, reqs: list[tuple[int, int, Any]]) -> list[asyncio.Future]:
        import asyncio

        dev = self._any_dev()
        for op, off, buf in reqs:  # the caller's mistakes raise now, as Device.start's do
            dev._request(op, off, buf)
        loop = asyncio.get_running_loop()
        return [loop.create_task(self._one(op, off, buf)) for op, off, buf in reqs]

    async def read_into(self, offset: int, buf: Any) -> int:
        return self._check(offset, await self._one(_core.OP_READ, offset, buf))

    async def write_from(self, offset: int, buf: Any) -> int:
        return self._check(offset, await self._one(_core.OP_WRITE, offset, buf))

    async def flush(self) -> None:
        """Flush on every live path (a flush makes durable what its own
        controller completed)."""
        for p in self._live():
            if p.dev is not None:
                try:
                    await p.dev.flush()
                except Fx100ioError as e:
                    if not _exc_path_error(e):
                        raise
                    self._done_flush_failed(p, e)

    def _done_flush_failed(self, p: _Path, e: BaseException) -> None:
        with self._lock:
            p.inflight += 1
        self._done(p, 0, 0, e)

    def submit_blocking(self, reqs: list[tuple[int, int, Any]]) -> list[Completion]:
        return [self._one_blocking(op, off, buf) for op, off, buf in reqs]

    def read_into_blocking(self, offset: int, buf: Any) -> int:
        return self._check(offset, self._one_blocking(_core.OP_READ, offset, buf))

    def write_from_blocking(self, offset: int, buf: Any) -> int:
        return self._check(offset, self._one_blocking(_core.OP_WRITE, offset, buf))

    def flush_blocking(self) -> None:
        for p in self._live():
            if p.dev is not None:
                try:
                    p.dev.flush_blocking()
                except Fx100ioError as e:
                    if not _exc_path_error(e):
                        raise
                    self._done_flush_failed(p, e)

    # -- lifetime ------------------------------------------------------------
    def _close_paths(self) -> None:
        with self._lock:
            self._closed = True
            devs = [(p, p.dev) for p in self._paths if p.dev is not None]
            probers = [p.prober for p in self._paths if p.prober is not None]
        self._closing.set()
        for p, d in devs:
            with p.dev_lock:
                d.close()
        watcher = getattr(self, "_watcher", None)
        if watcher is not None:
            probers.append(watcher)
        for t in probers:
            if t is not threading.current_thread():
                t.join(timeout=5)

    def close(self) -> None:
        """Close every path (Device.close each: requests in flight are
        waited for, those waiting fail with DeviceClosedError) and stop the
        threads that bring paths back."""
        if self._closed:
            return
        self._close_paths()

    def __enter__(self) -> MultipathDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> MultipathDevice:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"size={self.size}, block_size={self.block_size}"
        paths = ", ".join(f"{p.label} {p.state}" for p in self._paths)
        return f"MultipathDevice({self.uri!r}, policy={self.policy}, [{paths}], {state})"


def _describe(done: Completion) -> str:
    res, status = done[0], done[1]
    if status:
        return str(error_from_status(status))
    return str(error_from_errno(-res))


def _member_uri(uri: str) -> str:
    """A path's own URI: the multipath options dropped (no C device reads
    them), and max_reconnects=1: a request meeting a connection that is down
    waits for one reconnect attempt of its queue (each thread has its own
    connections: one that dropped while another thread's proved the path
    back is re-made at once), and fails over when that attempt fails (a
    refused connect: at once) instead of sitting through several."""
    head, sep, query = uri.partition("?")
    keep = [kv for kv in query.split("&") if kv and kv.split("=", 1)[0] not in
            ("paths", "policy", "max_reconnects")]
    return head + "?" + "&".join([*keep, "max_reconnects=1"])


def _discovered(uris: list[str]) -> list[str]:
    """The listed paths, then every other address of the same transport that
    the discovery log lists for the subsystem: the log of the first listed
    address, and of the discovery controllers its referrals name (Linux's
    target lists only the port asked on, and points at its other ports by
    referrals), at most MAX_DISCOVERY of them."""
    first = uris[0]
    scheme = fabric_uri.scheme_of(first)
    opts = fabric_uri.parse(first)
    head, _, query = first.partition("?")
    disc_q = "&".join(kv for kv in query.split("&")
                      if kv.split("=", 1)[0] in ("hostnqn", "hostid", "dhchap_secret",
                                                 "dhchap_ctrl_secret"))
    tail = head.split("://", 1)[1]
    tail = tail[tail.find("/"):] if "/" in tail else "/"
    seen = {(fabric_uri.parse(u)["host"], fabric_uri.parse(u)["port"]) for u in uris}
    out = list(uris)
    todo = [(opts["host"], opts["port"])]
    asked: set[tuple[str, str]] = set()
    while todo and len(asked) < MAX_DISCOVERY:
        where = todo.pop(0)
        if where in asked:
            continue
        asked.add(where)
        host = f"[{where[0]}]" if ":" in where[0] else where[0]
        try:
            entries = fabric_uri.discover(f"{scheme}://{host}:{where[1]}"
                                          + (f"?{disc_q}" if disc_q else ""))
        except OSError as e:
            if where == (opts["host"], opts["port"]):
                raise InvalidArgumentError(_errno.EINVAL, f"paths=discover: reading the "
                                           f"discovery log failed: {e}",
                                           fabric_uri.redact(first)) from e
            log.warning("fx100io: paths=discover: the discovery log at %s:%s: %s", *where, e)
            continue
        for ent in entries:
            if ent.get("trtype") != fabric_uri.SCHEMES[scheme]:
                continue
            addr = (str(ent.get("traddr", "")).strip(), str(ent.get("trsvcid", "")).strip())
            if not all(addr):
                continue
            if str(ent.get("subtype", "")).startswith("discovery"):
                todo.append(addr)
                continue
            if ent.get("subnqn") != opts["subnqn"] or addr in seen:
                continue
            seen.add(addr)
            h = f"[{addr[0]}]" if ":" in addr[0] else addr[0]
            out.append(f"{scheme}://{h}:{addr[1]}{tail}" + (f"?{query}" if query else ""))
    return out

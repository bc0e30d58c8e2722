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
ANA_POLL_S by a thread per path (the asynchronous event notice is not
handled yet); a Path Related Status on a completion takes the path out at
once.  A path that failed is taken out of the rotation and a thread of its
own (never the caller's, never the event loop) brings it back: it closes
the path's Device first when a write's attempt may still run there (below),
re-opens it if it has none, then reads one block, reconnect_ms apart, until
the controller answers with anything that is not a path error.  While no path is live a request
waits; it fails only once it has waited io_timeout_ms with no live path.

Writes: a write that fails over is re-issued whole, with the caller's data.
A path error with a status (SCT 3h), or a connection that was refused or
never made, means the command did not run: it moves at once.  After a lost
connection or a command past io_timeout_ms it may still run on the old
path later (a stalled target holds the capsule in its socket buffer and runs
it when it resumes), so its re-issue is held until that controller's
association has provably ended: the path's Device is closed (its keep alive
stops: the host sends that controller nothing more), and then kato_ms plus
HOLD_SLACK_S pass.  A controller that enforces its keep alive timeout has
by then ended the association and runs none of its commands (NVMe Base 2.0,
Keep Alive; TP4129's command quiesce time is the same wait).  So a caller
that orders writes to the same blocks by waiting for the first's completion
never sees the first land over the second, provided the target drops a
controller whose keep alive expired before it runs what it received from
it, also a capsule it reads only after a stall of its own (a paused process
or VM freezes its keep alive timer too): our target is being made to; Linux
nvmet is not known to (docs/nvme-tcp.md, "Writes that move").  A write with
several pieces moves at once only when every failed piece carried a status;
one piece lost to a timeout or a drop makes the whole write held.  A hold
whose old Device is not closed within io_timeout_ms + HOLD_CLOSE_S fails
with the path's error.  The price: such a write
completes kato_ms (default 30 s; lower it in the URI for faster failover)
after its path failed, later than io_timeout_ms.  With kato_ms=0 (no keep
alive) no end can be proven: the write fails with its path's error instead
of moving.  Reads move at once.
"""

from __future__ import annotations

import errno as _errno
import ipaddress
import logging
import re
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from fx100io import _core, fabric_uri
from fx100io import priority as prio
from fx100io.aio import Completion, close_in_thread
from fx100io.errors import (
    BufferStillInUseError,
    DeviceClosedError,
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
# Added to kato_ms before a write whose old attempt may still run is re-issued:
# two clocks and the target's own timer granularity (ours checks every 100 ms).
HOLD_SLACK_S = 0.5
# How long a held write waits for its old Device's close beyond io_timeout_ms
# (that close waits for its requests in flight, and for each event loop
# reading one of its queues to let go of it: up to 2 s a loop).
HOLD_CLOSE_S = 10.0
# Errnos that prove the command never reached a controller: it moves at once.
NOT_SENT_ERRNOS = frozenset({_errno.ECONNREFUSED, _errno.EHOSTUNREACH, _errno.ENETUNREACH,
                             _errno.ESTALE})
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*$")


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


def _same_ids(a: tuple[bytes, ...], b: tuple[bytes, ...]) -> bool | None:
    """Whether two namespaces' (NGUID, EUI-64, UUID) name one namespace:
    False when a kind both reported differs, True when none differs and at
    least one kind both reported is equal, None when no kind was reported by
    both (an unreported kind proves nothing; two volumes that report
    different kinds would otherwise pass as one)."""
    both = [(x, y) for x, y in zip(a, b) if any(x) and any(y)]
    if any(x != y for x, y in both):
        return False
    return True if both else None


def _is_write(op: int) -> bool:
    return op & ~_core.OP_CRC32C == _core.OP_WRITE


class _Fence:
    """The end of one controller association of a path: done_at is set (on
    the monotonic clock) once the host closed that Device, so it sends the
    controller nothing more; the controller's keep alive timer runs out
    kato after that.  made_at bounds the wait for that close (HOLD_CLOSE_S)."""

    __slots__ = ("done_at", "made_at")

    def __init__(self) -> None:
        self.done_at: float | None = None
        self.made_at = time.monotonic()


# Guards a Device's _mp_fence against its close: whichever of "make the
# fence" and "the Device closed" comes second stamps done_at, so no fence of
# a closed Device waits for a close that already happened.
_FENCE_LOCK = threading.Lock()


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
        #: a prober owns this path's revival; cleared (under the device's
        #: lock) in the same step that ends it, so a path failing again right
        #: after it came back always gets a prober
        self.probing = False
        self.watcher: threading.Thread | None = None
        #: ANA state of the namespace's group on this path (ANA_*); ANA_NONE
        #: where the controller reports none (the path counts as optimized)
        self.ana = ANA_NONE
        self.ana_group = 0
        #: held around every use of the path's C device from a thread of this
        #: module (open, probe read, ANA read, close) and around the making of
        #: a queue on it from an event loop (taken without waiting there), so
        #: close never frees the device under any of them
        self.dev_lock = threading.Lock()
        #: set when a write's attempt on p.dev may still run: the prober
        #: closes that Device first and stamps the fence
        self.fence: _Fence | None = None
        #: writes completed through this path since its last good flush
        self.dirty = False

    def stats(self) -> dict[str, Any]:
        return {"path": self.label, "state": self.state, "why": self.why,
                "ana_group": self.ana_group, "ana_state": ANA_NAMES.get(self.ana, str(self.ana)),
                "commands": self.commands, "bytes": self.bytes, "errors": self.errors,
                "failovers": self.failovers, "inflight": self.inflight}


def _close_device(dev: Device) -> None:
    """Close a path's Device from a thread of this module: each event loop
    that reads one of its queues is asked to stop reading it first (a loop's
    reader is that loop's to remove), then the Device closes (its requests in
    flight are waited for; those waiting fail with DeviceClosedError)."""
    import asyncio

    with dev._lock:
        drivers = list(dev._drivers)
    for d in drivers:
        loop = d._loop
        if loop is None or loop.is_closed():
            continue
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop or not loop.is_running():  # nothing reads it concurrently
            d.detach()
            continue
        done = threading.Event()

        def detach(d: Any = d, done: threading.Event = done) -> None:
            try:
                d.detach()
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(detach)
        except RuntimeError:
            continue  # closed meanwhile
        done.wait(2.0)  # a loop that is not running never reads it again anyway
    dev.close()
    with _FENCE_LOCK:  # writes held on this Device's association may count from now
        fence = getattr(dev, "_mp_fence", None)
        if fence is not None and fence.done_at is None:
            fence.done_at = time.monotonic()


def _probe_thread(ref: weakref.ref[MultipathDevice], p: _Path, closing: threading.Event,
                  retry_s: float) -> None:
    """Bring path p back (MultipathDevice._probe_step, retry_s apart) until
    it is back, refused, or the device closes or is collected: the thread
    holds the device only while a step runs, so a device nobody closed can
    still be collected."""
    first = True
    while first or not closing.wait(retry_s):
        first = False
        self = ref()
        if self is None:
            return
        try:
            if not self._probe_step(p):
                return
        except Exception:  # a bug must not leave the path with no prober
            log.exception("fx100io: multipath: bringing path %s back", p.label)
        finally:
            del self


def _ana_thread(ref: weakref.ref[MultipathDevice], p: _Path, closing: threading.Event) -> None:
    """Re-read path p's ANA state ANA_POLL_S apart: one thread per path, so
    a path whose admin queue hangs delays only its own updates."""
    while not closing.wait(ANA_POLL_S):
        self = ref()
        if self is None:
            return
        try:
            if p.state != REFUSED:
                self._read_ana(p)
        finally:
            del self


# What _Steps.next() tells a driver to do: sleep (seconds) and ask again; end
# the request with (completion); issue it on (path), which _pick took.
_WAIT, _END, _ISSUE = "wait", "end", "issue"


class _Steps:
    """One request's way over the paths: when to hold, pick, move and give up,
    written once for the two drivers that follow it (MultipathDevice._one on an
    event loop, _one_blocking on a thread), which only get queues, send and
    wait.  A driver loops:

        next()                 (_WAIT, s): sleep s, ask again; (_END, done): the
                               request ends with done; (_ISSUE, p): try path p
                               (picked: its inflight counts this attempt).
                               Raises DeviceClosedError once the device closed.
        no_queue(p)            p gave no queue (being closed, re-opened or its
                               ANA read): the seconds to sleep before next()
        sending()              the request goes out on a queue
        failed(p, dev, e, sent) the attempt raised e: True when the driver must
                               re-raise it (the caller's error, or a write that
                               may have run and cannot move); else it moves
        completed(p, dev, done, nbytes) the attempt completed: True when the
                               request ends with done; False when it moves

    A request moves at most MAX_MOVES times per path, waits at most
    io_timeout_ms for a live path, and a write that may still run on the
    path it left is held (no path picked) until that path's fence allows."""

    def __init__(self, mp: MultipathDevice, op: int, avoid_busy: bool) -> None:
        self.mp, self.op = mp, op
        # with avoid_busy, a path that gave no queue is taken again only when no
        # other is live (an event loop need not wait for one path's connect)
        self.avoid_busy = avoid_busy
        self.last: Completion | None = None  # the last attempt's failure
        self.waiting_since: float | None = None  # since when no path was had
        self.moves = 0
        self.hold: _Fence | None = None
        self.busy: set[_Path] = set()

    def next(self) -> tuple[str, Any]:
        mp = self.mp
        while True:
            if mp._closed:
                raise DeviceClosedError(9, "device is closed", mp.uri)
            if self.hold is not None:
                left = mp._hold_left(self.hold)
                if left is not None and left < 0:
                    return _END, self.last or mp._no_path(self.last)
                if left is None or left > 0:
                    return _WAIT, min(left or WAIT_STEP_S, WAIT_STEP_S * 5)
                self.hold = None
                continue
            if self.moves >= MAX_MOVES * len(mp._paths):
                return _END, mp._no_path(self.last)
            p = mp._pick(self.busy)
            if p is not None:
                return _ISSUE, p
            now = time.monotonic()
            self.waiting_since = self.waiting_since or now
            if now - self.waiting_since >= mp.io_timeout_s:
                return _END, mp._no_path(self.last)
            return _WAIT, WAIT_STEP_S

    def no_queue(self, p: _Path) -> float:
        self.mp._release(p)
        self.waiting_since = self.waiting_since or time.monotonic()
        if not self.avoid_busy:
            return WAIT_STEP_S
        fresh = p not in self.busy
        self.busy.add(p)
        return 0 if fresh else WAIT_STEP_S

    def sending(self) -> None:
        self.waiting_since = None

    def failed(self, p: _Path, dev: Device | None, e: BaseException, sent: bool) -> bool:
        what, fence = self.mp._after(p, dev, self.op, 0, 0, e, sent) \
            if isinstance(e, Exception) and dev is not None else ("raise", None)
        if what == "raise":
            self.mp._release(p)
            return True
        if what == "fail":
            return True
        self.last = (-(getattr(e, "errno", 0) or _errno.EIO), getattr(e, "status", 0))
        self.moves += 1
        self.hold = fence
        return False

    def completed(self, p: _Path, dev: Device, done: Completion, nbytes: int) -> bool:
        mp = self.mp
        if path_error(done[0], done[1]) and not mp._closed:
            what, fence = mp._after(p, dev, self.op, done[0], done[1], None, True)
            if what == "fail":
                return True
            self.last = done
            self.moves += 1
            self.hold = fence
            return False
        mp._done(p, done[0], nbytes, None, write=_is_write(self.op))
        return True


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
        self._allow_unidentified = mopts["unidentified_ns"] == "allow"
        uris = fabric_uri.split_paths(uri)
        if mopts["paths"] == "discover":
            uris = _discovered(uris)
        first = fabric_uri.parse(uris[0])
        self.io_timeout_s = int(first.get("io_timeout_ms", "30000")) / 1000
        self.kato_s = int(first.get("kato_ms", "30000")) / 1000
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
                with p.dev_lock:
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
        # Each path's ANA state is followed by a thread of its own whenever
        # there is more than one path (a path down at open, or whose first
        # read failed, may report ANA later).
        if len(self._paths) > 1:
            ref = weakref.ref(self)
            for p in self._paths:
                p.watcher = threading.Thread(target=_ana_thread, args=(ref, p, self._closing),
                                             daemon=True, name="fx100io-mpath-ana")
                p.watcher.start()
        self.target = self._live()[0].dev.target  # type: ignore[union-attr]
        self.transport = self._live()[0].dev.transport  # type: ignore[union-attr]
        self.engine = "io_uring"
        self.path = "user"
        self.kernel_attachment = None

    # -- paths -------------------------------------------------------------
    def _open_path(self, p: _Path) -> Device:
        """Open path p's Device (the caller holds p.dev_lock) and hold it to
        the namespace the other paths show: identifiers are compared where
        both sides reported them."""
        dev = self._Device(p.uri, **self._opts)
        ident = (dev.size, dev.block_size, dev._dev.ns_ids)
        with self._lock:
            ref = self._ref
            if ref is None:
                self._ref = ident
        if ref is not None:
            same = ident[:2] == ref[:2] and _same_ids(ident[2], ref[2])
            if same is None and (self._allow_unidentified or not any(
                    any(b) for ids in (ident[2], ref[2]) for b in ids)):
                same = True  # nothing to compare; refused below unless allowed
            if not same:
                dev.close()
                with self._lock:
                    p.state, p.why = REFUSED, "another namespace"
                if same is None:
                    with self._lock:
                        p.why = "no namespace identifier in common"
                    raise PathMismatchError(
                        _errno.ESTALE, f"path {p.label} and {self._paths[0].label} report no "
                        "namespace identifier of the same kind (NGUID, EUI-64 or UUID), so "
                        "they cannot be told to show one namespace: refused "
                        "(unidentified_ns=allow accepts them)", self.uri)
                raise PathMismatchError(
                    _errno.ESTALE, f"path {p.label} shows another namespace than "
                    f"{self._paths[0].label} (size, block size, NGUID, EUI-64 or UUID differ): "
                    "refused", self.uri)
            with self._lock:  # identifiers one side had not reported are kept
                assert self._ref is not None
                self._ref = (*self._ref[:2], tuple(
                    a if any(a) else b for a, b in zip(self._ref[2], ident[2])))
        if not any(any(b) for b in ident[2]) and len(self._paths) > 1 and \
                not self._allow_unidentified:
            dev.close()
            with self._lock:
                p.state, p.why = REFUSED, "no namespace identifier"
            raise PathMismatchError(
                _errno.ESTALE, f"path {p.label}: the namespace reports no NGUID, EUI-64 or UUID, "
                "so two of its paths cannot be told from paths to two namespaces of one size: "
                "refused (unidentified_ns=allow accepts them)", self.uri)
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

    def _pick(self, busy: set[_Path] | frozenset[_Path] = frozenset(),
              ready: Any = None) -> _Path | None:
        """A live path by the policy, or None: an optimized one (or one
        whose controller reports no ANA), else a non-optimized one; with
        ready, one of that tier for which ready(path) holds.  Paths in busy
        (this request could not get a queue there without waiting) are
        taken only when no other is live."""
        with self._lock:
            live = [p for p in self._live() if p.ana in (ANA_NONE, ANA_OPTIMIZED)] or \
                [p for p in self._live() if p.ana == ANA_NONOPTIMIZED]
            if ready is not None:
                live = [p for p in live if ready(p)]
            if not live:
                return None
            live = [p for p in live if p not in busy] or live
            if self.policy == "queue-depth":
                p = min(live, key=lambda q: q.inflight)
            else:
                self._rr += 1
                p = live[self._rr % len(live)]
            p.inflight += 1
            return p

    def _done(self, p: _Path, res: int, nbytes: int, failed: BaseException | str | None,
              write: bool = False) -> None:
        with self._lock:
            p.inflight -= 1
            if failed is None:
                p.commands += 1
                p.bytes += max(res, 0) if nbytes else 0
                if write:
                    p.dirty = True
                return
            p.errors += 1
            p.failovers += 1
        self._path_failed(p, failed)

    def _path_failed(self, p: _Path, failed: BaseException | str,
                     fence_of: Device | None = None) -> _Fence | None:
        """Take p out of the rotation (its prober brings it back).  With
        fence_of (a write's attempt on that Device may still run): the
        fence that ends that Device's association, made if none is pending;
        None when no end can be proven (kato_ms=0)."""
        fence = None
        start = False
        with self._lock:
            if fence_of is not None and self.kato_s > 0:
                with _FENCE_LOCK:
                    fence = getattr(fence_of, "_mp_fence", None)
                    if fence is None:
                        fence = fence_of._mp_fence = _Fence()  # type: ignore[attr-defined]
                        if p.dev is fence_of:
                            p.fence = fence  # its prober closes it
                        # else it is being closed (a refused path, a fence
                        # branch): _close_device stamps it when done
                        if fence_of.closed:  # closed already: it sends nothing more
                            fence.done_at = time.monotonic()
            if p.state == LIVE:
                p.state, p.why = DOWN, str(failed)
                start = True
        if start:
            log.warning("fx100io: multipath %s: path %s failed (%s); its requests move to "
                        "another path", self.uri, p.label, p.why)
        self._start_prober(p)
        return fence

    def _read_ana(self, p: _Path) -> None:
        """Read path p's ANA state from its controller (blocks on the
        network: never on an event loop)."""
        with p.dev_lock:
            dev = p.dev
            if dev is None or self._closed or dev.closed:
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

    def _release(self, p: _Path) -> None:
        with self._lock:
            p.inflight -= 1

    def _start_prober(self, p: _Path) -> None:
        with self._lock:
            if self._closed or p.state in (REFUSED, LIVE) or p.probing:
                return
            p.probing = True
            p.prober = threading.Thread(target=_probe_thread,
                                        args=(weakref.ref(self), p, self._closing, self._retry_s),
                                        daemon=True, name="fx100io-mpath-probe")
            p.prober.start()

    def _probe_step(self, p: _Path) -> bool:
        """One try at bringing path p back, off every caller's thread: end a
        fenced association first (close its Device), re-open the Device if
        there is none, then read one block: any completion that is not a
        path error proves the path up.  False: stop (back, refused,
        closed)."""
        with p.dev_lock:
            if self._closed:
                with self._lock:
                    p.probing = False
                return False
            fence = p.fence
            if fence is not None:
                dev = p.dev
                with self._lock:
                    p.dev = None
                if dev is not None:
                    _close_device(dev)
                with self._lock:
                    fence.done_at = time.monotonic()
                    p.fence = None
            try:
                if p.dev is None:
                    self._attach(p, self._open_path(p))
                    with self._lock:
                        if p.state == LIVE:
                            p.state = DOWN  # opened: still proven by a read below
                dev = p.dev
                if dev is None:  # closed meanwhile
                    with self._lock:
                        p.probing = False
                    return False
                buf = bytearray(dev.block_size)
                try:
                    dev.read_into_blocking(0, buf)
                except OSError as e:
                    if _exc_path_error(e) or isinstance(e, DeviceClosedError):
                        raise
                    # a media error, a reservation conflict...: the
                    # controller answered, so the path is up
            except PathMismatchError as e:
                log.error("fx100io: multipath %s: %s", self.uri, e)
                dev = p.dev
                with self._lock:
                    p.state, p.why, p.dev, p.probing = REFUSED, str(e), None, False
                if dev is not None:  # a refused path keeps nothing open
                    _close_device(dev)
                return False
            except OSError as e:
                with self._lock:
                    p.why = str(e)
                return True
        self._read_ana(p)
        with self._lock:
            p.probing = False
            if self._closed:
                return False
            p.state, p.why = LIVE, ""
        log.warning("fx100io: multipath %s: path %s is back", self.uri, p.label)
        return False

    def _no_path(self, last: Completion | None) -> Completion:
        """What a request gets when it found no live path for io_timeout_ms
        (or moved MAX_MOVES times per path): -ETIMEDOUT, which _check turns
        into an FxTimeoutError naming every path and why it is out."""
        return (-_errno.ETIMEDOUT, 0)

    def _queue_guard(self, p: _Path, dev: Device) -> tuple[Any, Any]:
        """What the thread making an event loop's queue on dev holds and
        asks (Device._loop_driver): p.dev_lock, so the path's close waits
        for the connect rather than free the device under it (and its fence
        is stamped only once the controller hears nothing more)."""
        return p.dev_lock, lambda: p.dev is dev and not dev.closed and p.state == LIVE

    async def _loop_driver(self, p: _Path, dev: Device) -> Any:
        """This event loop thread's queue on dev, made off the loop (a
        connect) when it has none; None when the path went away meanwhile."""
        d = dev._loop_ready()
        if d is not None:
            return d
        return await dev._loop_driver(self._queue_guard(p, dev))

    async def _first_queue(self, p: _Path) -> Any:
        """No live path has a queue on this event loop: make one on each
        (off the loop) and wait for the first.  p's making (a done future:
        its result, or its error, is the caller's) when p's came first;
        None when another's did (pick again).  A path whose making failed
        meanwhile is taken out of the rotation with that error."""
        import asyncio

        assert p.dev is not None
        loop = asyncio.get_running_loop()
        mine = p.dev._start_loop_queue(loop, self._queue_guard(p, p.dev))
        others = {}
        for q in self._live():
            dev = q.dev
            if q is not p and dev is not None and dev.transport in fabric_uri.SCHEMES and \
                    not dev.closed and dev._loop_ready() is None:
                others[dev._start_loop_queue(loop, self._queue_guard(q, dev))] = q
        await asyncio.wait([mine, *others], return_when=asyncio.FIRST_COMPLETED)
        if mine.done():
            return mine
        got = False
        for f, q in others.items():
            if not f.done():
                continue
            e = f.exception()
            if e is None:
                got = got or f.result() is not None
            elif _exc_path_error(e):
                self._path_failed(q, e)
        if not got:
            await asyncio.sleep(WAIT_STEP_S)  # nothing new to run on: never a busy loop
        return None

    def _ready_elsewhere(self, p: _Path) -> _Path | None:
        """p has no queue on this event loop yet: start making it (off the
        loop) and pick a path that has one, so the request need not wait
        for a connect while another path can carry it now; None when no
        such path is live."""
        import asyncio

        dev = p.dev
        if dev is None or dev.transport not in fabric_uri.SCHEMES or dev.closed:
            return None
        dev._start_loop_queue(asyncio.get_running_loop(), self._queue_guard(p, dev))
        q = self._pick(ready=lambda q: q is not p and q.dev is not None and
                       q.dev._loop_ready() is not None)
        if q is not None:
            self._release(p)
        return q

    def _blocking_driver(self, p: _Path, dev: Device) -> Any:
        """This thread's queue on dev (made under p.dev_lock: never raced
        with the path's close), or None when the path went away."""
        d = getattr(dev._local, "driver", None)
        if d is not None:
            return d
        with p.dev_lock:
            if p.dev is not dev or dev.closed:
                return None
            return dev._driver()

    def _after(self, p: _Path, dev: Device, op: int, res: int, status: int,
               exc: BaseException | None, sent: bool) -> tuple[str, _Fence | None]:
        """Sort out a failed attempt of op on path p (its Device dev):
        ("raise", None) the caller's error; ("move", None) run it on another
        path now; ("hold", fence) a write that may still run on dev: run it
        elsewhere once the fence says the association ended; ("fail", None)
        a write whose old attempt may still run and no end can be proven."""
        if isinstance(exc, BufferStillInUseError):
            return "raise", None  # the kernel may still write the buffer: never reissue into it
        if exc is not None:
            closed_under = isinstance(exc, DeviceClosedError) and \
                (p.dev is not dev or getattr(dev, "_mp_fence", None) is not None)
            if not (_exc_path_error(exc) or closed_under) or self._closed:
                return "raise", None
            err = getattr(exc, "errno", 0) or _errno.EIO
            status = int(getattr(exc, "status", 0) or 0)  # NvmeStatusError: did not run
            why: BaseException | str = exc
        else:
            if not path_error(res, status) or self._closed:
                return "raise", None
            err = -res
            why = _describe((res, status))
        with self._lock:
            p.inflight -= 1
            p.errors += 1
            p.failovers += 1
        may_have_run = sent and _is_write(op) and not status and err not in NOT_SENT_ERRNOS
        if not may_have_run:
            self._path_failed(p, why)
            return "move", None
        fence = self._path_failed(p, why, fence_of=dev)
        return ("hold", fence) if fence is not None else ("fail", None)

    def _hold_left(self, fence: _Fence) -> float | None:
        """Seconds until a write held on fence may run elsewhere (0: now);
        None while the old Device is not closed yet; -1.0 when its close
        did not come within io_timeout_ms + HOLD_CLOSE_S (a backstop: the
        write then fails with its path's error rather than wait forever)."""
        if fence.done_at is None:
            if time.monotonic() - fence.made_at > self.io_timeout_s + HOLD_CLOSE_S:
                return -1.0
            return None
        return max(0.0, fence.done_at + self.kato_s + HOLD_SLACK_S - time.monotonic())

    # -- one request, over paths ---------------------------------------------
    async def _one(self, op: int, offset: int, buf: Any, priority: Any = None,
                   stream: int = 0) -> Completion:
        """Run one request to its end on some path: the first completion
        that is not a path error, or (-ETIMEDOUT, 0) once no path was live
        for io_timeout_ms (or it moved MAX_MOVES times per path).  The
        event loop's driver of _Steps: it adds only what a loop needs (a
        path whose queue on this loop is ready goes first; a queue is made
        off the loop)."""
        import asyncio

        from fx100io.device import _io_done

        steps = _Steps(self, op, avoid_busy=True)
        while True:
            what, arg = steps.next()
            if what is _WAIT:
                await asyncio.sleep(arg)
                continue
            if what is _END:
                return arg
            p: _Path = arg
            made = None  # p's queue for this loop, made while this request waited
            if p.dev is not None and p.dev._loop_ready() is None:
                q = self._ready_elsewhere(p)
                if q is not None:
                    p = q
                else:
                    try:
                        made = await self._first_queue(p)
                    except BaseException:  # cancelled: nothing was sent
                        self._release(p)
                        raise
                    if made is None:
                        self._release(p)  # another path's queue came first: pick again
                        continue
            dev = p.dev
            try:
                if made is not None:
                    drv = made.result()  # the making's error, if it failed, is this attempt's
                else:
                    drv = await self._loop_driver(p, dev) if dev is not None else None
            except BaseException as e:  # this loop's queue could not be made: not sent
                if steps.failed(p, dev, e, sent=False):
                    raise
                continue
            if drv is None:  # being closed, re-opened or its ANA read: another path first
                await asyncio.sleep(steps.no_queue(p))
                continue
            assert dev is not None
            steps.sending()
            sent = False
            try:
                r = dev._request(op, offset, buf, priority, stream)
                (f,) = drv.submit([r])
                sent = True
                done = await _io_done(drv, f)
            except BaseException as e:
                if steps.failed(p, dev, e, sent):
                    raise
                continue
            if steps.completed(p, dev, done, r[3]):
                return done

    def _one_blocking(self, op: int, offset: int, buf: Any, priority: Any = None,
                      stream: int = 0) -> Completion:
        """_one on the calling thread: the blocking driver of _Steps."""
        steps = _Steps(self, op, avoid_busy=False)
        while True:
            what, arg = steps.next()
            if what is _WAIT:
                time.sleep(arg)
                continue
            if what is _END:
                return arg
            p: _Path = arg
            dev = p.dev
            try:
                drv = self._blocking_driver(p, dev) if dev is not None else None
            except BaseException as e:
                if steps.failed(p, dev, e, sent=False):
                    raise
                continue
            if drv is None:
                time.sleep(steps.no_queue(p))
                continue
            assert dev is not None
            steps.sending()
            try:
                r = dev._request(op, offset, buf, priority, stream)
                done = drv.run_blocking([r])[0]
            except BaseException as e:
                # run_blocking hands C the request before anything can fail
                # but the queue: assume it was sent
                if steps.failed(p, dev, e, sent=True):
                    raise
                continue
            if steps.completed(p, dev, done, r[3]):
                return done

    def _check(self, offset: int, done: Completion) -> int:
        res, status = done[0], done[1]
        if status:
            raise error_from_status(status, f"{self.uri} offset {offset}")
        if res < 0:
            err = error_from_errno(-res, f"{self.uri} offset {offset}")
            if -res == _errno.ESTALE:
                err = PathMismatchError(_errno.ESTALE, "a path's controller came back onto "
                                        "another namespace", f"{self.uri} offset {offset}")
            if -res == _errno.ETIMEDOUT:
                err = FxTimeoutError(_errno.ETIMEDOUT, f"no path carried it (none live for "
                                     f"{self.io_timeout_s:g} s, or each failed it {MAX_MOVES} "
                                     "times, or a write timed out with kato_ms=0, so it could "
                                     "not move) "
                                     f"({'; '.join(p.label + ': ' + p.why for p in self._paths)})",
                                     f"{self.uri} offset {offset}")
            raise err
        return res

    # -- the Device API ------------------------------------------------------
    def _any_dev(self) -> Device:
        """An open path's Device (a live one first), for what every path
        answers alike (block size rules, features)."""
        for states in ((LIVE,), (DOWN,)):
            for p in self._paths:
                dev = p.dev
                if p.state in states and dev is not None and not dev.closed:
                    return dev
        raise DeviceClosedError(9, "device is closed" if self._closed else "no path is open",
                                self.uri)

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

    async def submit(self, reqs: list[tuple[int, int, Any]], *, priority: Any = None,
                     stream: int | None = None) -> list[Completion]:
        """Run the requests concurrently.  Cancelled, it cancels every one
        of them and returns only once each stopped touching its buffer."""
        import asyncio

        futs = self.start(reqs, priority=priority, stream=stream)
        try:
            return list(await asyncio.gather(*futs))
        except BaseException:
            for f in futs:
                f.cancel()
            for f in futs:
                while not f.done():
                    try:
                        await asyncio.wait([f])
                    except asyncio.CancelledError:
                        pass  # cancelled again: the requests still have to come back
                if not f.cancelled():
                    f.exception()  # seen
            raise

    # priority= and stream= as Device's (fx100io.priority): each path's
    # queue orders the pieces it carries by them
    def start(self, reqs: list[tuple[int, int, Any]], *, priority: Any = None,
              stream: int | None = None) -> list[asyncio.Future]:
        import asyncio

        prio.parse(priority, prio.LOAD)  # before _any_dev: a bad one is never "no path"
        sid = prio.stream_or_new(stream)
        dev = self._any_dev()
        # the caller's mistakes raise now, as Device.start's do
        dev._requests(reqs, priority, sid)
        loop = asyncio.get_running_loop()
        return [loop.create_task(self._one(op, off, buf, priority, sid)) for op, off, buf in reqs]

    # a bad priority= raises InvalidArgumentError at once, not after a wait
    # for a live path (each attempt's Device would refuse it only then)
    async def read_into(self, offset: int, buf: Any, *, priority: Any = None) -> int:
        prio.parse(priority, prio.LOAD)
        return self._check(offset, await self._one(_core.OP_READ, offset, buf, priority,
                                                   prio.new_stream()))

    async def write_from(self, offset: int, buf: Any, *, priority: Any = None) -> int:
        prio.parse(priority, prio.STORE)
        return self._check(offset, await self._one(_core.OP_WRITE, offset, buf, priority,
                                                   prio.new_stream()))

    def _flush_targets(self) -> list[_Path]:
        with self._lock:
            dirty = [p for p in self._paths if p.dirty and p.state != REFUSED]
        return dirty

    def _flush_failed(self, p: _Path, e: BaseException | str) -> None:
        with self._lock:
            p.dirty = True
            p.errors += 1
        self._path_failed(p, e)

    def _flush_timeout(self, p: _Path | None) -> FxTimeoutError:
        """The error of a flush that found no way through p (or any path):
        reported once, as fsync reports a lost writeback once; the next
        flush covers the writes after it."""
        if p is not None:
            with self._lock:
                p.dirty = False
        where = p.label + ": " + p.why if p is not None else \
            "; ".join(q.label + ": " + q.why for q in self._paths)
        return FxTimeoutError(_errno.ETIMEDOUT, f"flush: no path to flush through for "
                              f"{self.io_timeout_s:g} s ({where}); writes completed before it "
                              "may not be durable", self.uri)

    async def flush(self, *, priority: Any = None) -> None:
        """Make completed writes durable: a flush through every path that
        completed writes since its last flush (the volatile write cache is
        each controller's), or through one live path when none did.  A path
        that is down is waited for up to io_timeout_ms, then FxTimeoutError
        (never a success that is not one; reported once: the next flush
        covers later writes); a flush that fails on a path is sent again
        once that path is back."""
        import asyncio

        prio.parse(priority, prio.STORE)  # a bad one raises before any path is marked flushed
        deadline = time.monotonic() + self.io_timeout_s
        targets: list[_Path | None] = list(self._flush_targets()) or [None]
        for want in targets:
            while True:
                if self._closed:
                    raise DeviceClosedError(9, "device is closed", self.uri)
                p = want if want is not None and want.state == LIVE else \
                    (self._pick_any_live() if want is None else None)
                if want is not None and want.state == REFUSED:
                    raise PathMismatchError(_errno.ESTALE, f"flush: path {want.label} was "
                                            f"refused ({want.why}); writes completed through it "
                                            "cannot be flushed", self.uri)
                dev = p.dev if p is not None else None
                try:
                    drv = await self._loop_driver(p, dev) if p is not None and dev is not None \
                        else None
                except OSError as e:  # this loop's queue could not be made
                    if not _exc_path_error(e) or p is None:
                        raise
                    self._flush_failed(p, e)
                    drv = None
                if drv is None:
                    if time.monotonic() >= deadline:
                        raise self._flush_timeout(want)
                    await asyncio.sleep(WAIT_STEP_S)
                    continue
                assert p is not None and dev is not None
                with self._lock:
                    p.dirty = False
                from fx100io.device import _io_done

                r = dev._request(_core.OP_FLUSH, 0, None, priority)
                try:
                    (f,) = drv.submit([r])
                    done = await _io_done(drv, f)
                except BaseException as e:
                    if isinstance(e, Exception) and (_exc_path_error(e) or isinstance(
                            e, DeviceClosedError)) and not self._closed:
                        self._flush_failed(p, e)
                        continue
                    with self._lock:
                        p.dirty = True
                    raise
                if self._flush_done(p, done):
                    break

    def _flush_done(self, p: _Path, done: Any) -> bool:
        """A flush's completion on path p: False to try another path (p failed as a
        path and is marked so), True when it is the answer; a device error marks p
        dirty again and raises."""
        if path_error(done[0], done[1]) and not self._closed:
            self._flush_failed(p, _describe(done))
            return False
        if done[1] or done[0] < 0:
            with self._lock:
                p.dirty = True
            self._check(0, done)
        return True

    def _pick_any_live(self) -> _Path | None:
        p = self._pick()
        if p is not None:
            self._release(p)
        return p

    def submit_blocking(self, reqs: list[tuple[int, int, Any]], *, priority: Any = None,
                        stream: int | None = None) -> list[Completion]:
        prio.parse(priority, prio.LOAD)  # checked even when no path is open
        sid = prio.stream_or_new(stream)
        try:
            dev = self._any_dev()
        except DeviceClosedError:
            dev = None  # no path open right now: each request waits for one, as documented
        if dev is not None:
            dev._requests(reqs, priority, sid)  # the caller's mistakes raise now
        return [self._one_blocking(op, off, buf, priority, sid) for op, off, buf in reqs]

    def read_into_blocking(self, offset: int, buf: Any, *, priority: Any = None) -> int:
        prio.parse(priority, prio.LOAD)
        return self._check(offset, self._one_blocking(_core.OP_READ, offset, buf, priority,
                                                      prio.new_stream()))

    def write_from_blocking(self, offset: int, buf: Any, *, priority: Any = None) -> int:
        prio.parse(priority, prio.STORE)
        return self._check(offset, self._one_blocking(_core.OP_WRITE, offset, buf, priority,
                                                      prio.new_stream()))

    def flush_blocking(self, *, priority: Any = None) -> None:
        """flush(), blocking."""
        prio.parse(priority, prio.STORE)  # a bad one raises before any path is marked flushed
        deadline = time.monotonic() + self.io_timeout_s
        targets: list[_Path | None] = list(self._flush_targets()) or [None]
        for want in targets:
            while True:
                if self._closed:
                    raise DeviceClosedError(9, "device is closed", self.uri)
                if want is not None and want.state == REFUSED:
                    raise PathMismatchError(_errno.ESTALE, f"flush: path {want.label} was "
                                            f"refused ({want.why}); writes completed through it "
                                            "cannot be flushed", self.uri)
                p = want if want is not None and want.state == LIVE else \
                    (self._pick_any_live() if want is None else None)
                dev = p.dev if p is not None else None
                try:
                    drv = self._blocking_driver(p, dev) if p is not None and dev is not None \
                        else None
                except OSError as e:
                    if not _exc_path_error(e) or p is None:
                        raise
                    self._flush_failed(p, e)
                    drv = None
                if drv is None:
                    if time.monotonic() >= deadline:
                        raise self._flush_timeout(want)
                    time.sleep(WAIT_STEP_S)
                    continue
                assert p is not None and dev is not None
                with self._lock:
                    p.dirty = False
                try:
                    done = drv.run_blocking([dev._request(_core.OP_FLUSH, 0, None, priority)])[0]
                except Exception as e:
                    if (_exc_path_error(e) or isinstance(e, DeviceClosedError)) and \
                            not self._closed:
                        self._flush_failed(p, e)
                        continue
                    with self._lock:
                        p.dirty = True
                    raise
                if self._flush_done(p, done):
                    break

    # -- lifetime ------------------------------------------------------------
    def _close_paths(self) -> None:
        """Stop the threads, then close every path's Device: each under its
        dev_lock, so no prober or ANA read of this module is inside it (a
        prober in a connect finishes it first: at most connect_timeout_ms)."""
        with self._lock:
            self._closed = True
        self._closing.set()
        me = threading.current_thread()
        for p in self._paths:
            with p.dev_lock:
                with self._lock:
                    dev, p.dev = p.dev, None
                if dev is not None:
                    _close_device(dev)
                if p.fence is not None and p.fence.done_at is None:
                    p.fence.done_at = time.monotonic()
        for p in self._paths:
            for t in (p.prober, p.watcher):
                if t is not None and t is not me:
                    t.join(timeout=10)  # they hold no device now: they see _closing and end

    def close(self) -> None:
        """Close every path (Device.close each: requests in flight are
        waited for, those waiting fail with DeviceClosedError) and stop the
        threads that bring paths back and follow ANA.  This blocks on the
        network (a prober inside a connect finishes it first: up to
        connect_timeout_ms a path), so in async code use ``await
        dev.aclose()`` or ``async with``."""
        if self._closed:
            return
        self._close_paths()

    def __del__(self) -> None:
        # Collected unclosed: its threads end; each path's Device closes
        # itself when collected.
        closing = getattr(self, "_closing", None)
        if closing is not None:
            closing.set()

    def __enter__(self) -> MultipathDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> MultipathDevice:
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close off the event loop (a path's close may wait on the
        network).  Cancelled, the close still ends in its thread; the device
        is closed to new requests at once."""
        await self.aclose()

    async def aclose(self) -> None:
        """close(), off the event loop: this loop stops reading the paths'
        queues here, the rest runs in a thread."""
        import asyncio

        if self._closed:
            return
        with self._lock:
            self._closed = True  # new requests fail from now on
        for p in self._paths:
            dev = p.dev
            if dev is not None:
                with dev._lock:
                    drivers = list(dev._drivers)
                for d in drivers:
                    if d._loop is asyncio.get_running_loop():
                        d.detach()
        await close_in_thread(self._close_paths, "fx100io-mpath-close")

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
    from fx100io import fabric_options as fo

    drop = {o.key for o in fo.OPTIONS if o.multipath} | {"max_reconnects"}
    head, sep, query = uri.partition("?")
    keep = [kv for kv in query.split("&") if kv and kv.split("=", 1)[0] not in drop]
    return head + "?" + "&".join([*keep, "max_reconnects=1"])


def _valid_address(traddr: str, trsvcid: str) -> bool:
    """Whether a discovery log entry's address is one to build a URI from:
    a port number, and an IP literal or a host name (the log comes from the
    network: nothing else may reach the URI's authority or query)."""
    if not trsvcid.isdigit() or not 0 < int(trsvcid) < 65536:
        return False
    try:
        ipaddress.ip_address(traddr)
        return True
    except ValueError:
        return len(traddr) <= 253 and bool(_HOSTNAME.match(traddr))


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
    listed = set(seen)
    # A discovery log (or a spoofed one) can name any address: the host's
    # secret goes through a DH-HMAC-CHAP exchange with whatever answers there
    # (a challenge/response to attack offline; with one-way authentication,
    # a controller the host writes to).  So by default it goes only where
    # the user pointed it.
    guarded = "dhchap_secret" in opts and \
        fabric_uri.multipath_options(first)["discover_secrets"] == "listed"
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
            if not _valid_address(*addr):
                log.warning("fx100io: paths=discover: skipped a discovery log entry with a bad "
                            "address %r port %r", addr[0][:64], addr[1][:32])
                continue
            if guarded and addr not in listed:
                log.warning("fx100io: paths=discover: not following %s:%s, which the URI does "
                            "not list: the host's DH-HMAC-CHAP secret goes only to listed "
                            "addresses (discover_secrets=any sends it there too)",
                            addr[0][:64], addr[1][:32])
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

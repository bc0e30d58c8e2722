"""Multipath (fx100io/multipath.py) under the faults a review found: a
write that timed out on a stalled path must not land over a later
acknowledged write, close racing a path's revival, flush with paths down,
cancellation of every await, namespaces without identifiers, discovery
entries that do not hold an address, and a device that is never closed.

Real `fx100io target` processes on loopback serve one backing file; a
stalled target is SIGSTOPped (its capsules wait in its socket buffer and run
when it is SIGCONTed).  The unit-level ones use a stand-in Device class
where a real target cannot show the case (a namespace with no identifier).
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
import weakref

import numpy as np
import pytest
from support.multipath_paths import paths_uri, sparse_backing
from support.multipath_paths import wait_for as _wait_for
from support.target_process import serve

import fx100io
from fx100io import _core, errors, fabric_uri
from fx100io import multipath as mp
from fx100io.device import Device
from fx100io.multipath import MultipathDevice

NQN = "nqn.2026-12.io.fx100:multipath-faults"
BS = 4096
SIZE = 16 << 20
WAIT_S = 20.0


def mp_uri(ports: list[int], **q: object) -> str:
    return paths_uri(NQN, ports, **q)


@pytest.fixture
def backing(tmp_path):
    return sparse_backing(tmp_path, SIZE)


def wait_for(cond, what: str, seconds: float = WAIT_S) -> None:  # noqa: ANN001
    _wait_for(cond, what, seconds, 0.02)


def _stopped(pid: int) -> bool:
    """Every thread of pid is stopped (state T): SIGSTOP takes a running
    thread only when it next enters the kernel, so right after the kill the
    target may still serve requests."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                # the state follows the command name, which is in parentheses
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            continue  # a thread that ended meanwhile
        if state not in ("T", "t"):
            return False
    return True


def _stop(proc) -> None:  # noqa: ANN001
    """SIGSTOP a target and wait until it provably serves nothing more."""
    os.kill(proc.pid, signal.SIGSTOP)
    wait_for(lambda: _stopped(proc.pid), f"target {proc.pid} stopped", 10.0)


class _Warmup:
    """Write from this thread (or event loop) until every path is live and has
    served one of its writes with none failing meanwhile, so it has a queue on
    each path's current Device.  A path may come up late (its connect or first
    command timed out under load and its prober brings it back): stopping b
    before then leaves no write to send it.  The sync and async loops share
    this rule: write(), then done(), then sleep pause() seconds."""

    def __init__(self, dev) -> None:  # noqa: ANN001
        self.dev = dev
        self.deadline = time.monotonic() + WAIT_S
        self.before = dev.path_stats()
        self.i = 0
        self.data = np.full(BS, 0x11, np.uint8)

    def offset(self) -> int:
        return (self.i % 4) * BS

    def done(self) -> bool:
        """After a write: True when every path is live and served a write since
        the last error; a path that erred may be re-opened as a Device without
        our queue, so the count starts again."""
        now = self.dev.path_stats()
        if any(n["errors"] != b["errors"] for n, b in zip(now, self.before)):
            self.before = now
        elif all(n["state"] == "live" and n["commands"] > b["commands"]
                 for n, b in zip(now, self.before)):
            return True
        assert time.monotonic() < self.deadline, f"a path never served a write: {now}"
        self.i += 1
        return False

    def pause(self) -> float:
        return 0.02 if self.i > 4 else 0.0


def _warm(dev) -> None:  # noqa: ANN001
    w = _Warmup(dev)
    while True:
        dev.write_from_blocking(w.offset(), w.data)
        if w.done():
            return
        time.sleep(w.pause())


async def _awarm(dev) -> None:  # noqa: ANN001
    w = _Warmup(dev)
    while True:
        await dev.write_from(w.offset(), w.data)
        if w.done():
            return
        await asyncio.sleep(w.pause())


def _resume(proc) -> None:  # noqa: ANN001
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)


# -- 1: a write that moved after a timeout ---------------------------------

def test_write_moved_after_timeout_never_lands_over_a_later_write(backing):
    """W1 goes to a stalled path, times out and moves; W2 to the same blocks
    is acknowledged after W1.  The stalled target resumes and runs its copy
    of W1: that must happen before W1's re-issue completes (the re-issue is
    held until the old association provably ended), so the medium ends with
    W2's bytes."""
    kato_ms = 3000
    with serve([backing], NQN) as (_, pa, _a), serve([backing], NQN) as (_, pb, proc_b):
        dev = fx100io.open_device(mp_uri([pa, pb], io_timeout_ms=500, reconnect_ms=50,
                                         connect_timeout_ms=500, kato_ms=kato_ms))
        result: dict[str, object] = {}
        warm, stalled = threading.Event(), threading.Event()

        def writer() -> None:
            try:
                _warm(dev)  # this thread's queue on each path made
                warm.set()
                stalled.wait(WAIT_S)
                for i in range(16):  # the first write that goes to b and moves is W1
                    before = dev.path_stats()[1]["failovers"]
                    t0 = time.monotonic()
                    dev.write_from_blocking(i * BS, np.full(BS, 0xAA, np.uint8))
                    if dev.path_stats()[1]["failovers"] > before:
                        result["off"], result["w1_s"] = i * BS, time.monotonic() - t0
                        break
                else:
                    result["error"] = "no write went to path b"
                    return
                dev.write_from_blocking(result["off"], np.full(BS, 0xBB, np.uint8))  # W2
            except BaseException as e:  # noqa: BLE001 (reported by the test below)
                result["error"] = e

        try:
            t = threading.Thread(target=writer, daemon=True)
            t.start()
            assert warm.wait(WAIT_S)
            _stop(proc_b)
            stalled.set()
            wait_for(lambda: dev.path_stats()[1]["state"] == "down", "path b down")
            # b resumes 2 s later: W1 moved at once would be done, and W2 too,
            # by then; held for the old controller's keep alive, W1 is not,
            # and b's stale copy runs before W1 is re-issued
            t.join(2.0)
            _resume(proc_b)
            t.join(WAIT_S)
            assert not t.is_alive()
            assert "error" not in result, result
            time.sleep(1.0)  # anything still queued at b has run by now
            with open(backing, "rb") as f:
                f.seek(int(result["off"]))  # type: ignore[call-overload]
                got = f.read(BS)
            assert got == b"\xbb" * BS, f"W1 landed over W2: {got[:4]!r}"
            # the re-issue waited for the controller's keep alive to run out
            assert float(result["w1_s"]) >= kato_ms / 1000  # type: ignore[arg-type]
            buf = np.zeros(BS, np.uint8)
            assert dev.read_into_blocking(int(result["off"]), buf) == BS  # type: ignore[call-overload]
            assert bytes(buf) == b"\xbb" * BS
        finally:
            _resume(proc_b)
            dev.close()


def test_write_moved_past_a_stall_longer_than_kato_never_lands(backing, tmp_path):
    """b stays stopped until W1 has been re-issued on a and W2 acknowledged
    there: longer than kato_ms.  When b resumes, W1's capsule (and the keep
    alives queued before it) are read from its socket after the KATO ran
    out: the target must drop the controller without running any of them
    (checked at that moment, not at its next keep-alive tick), so the medium
    keeps W2's bytes."""
    kato_ms = 2000
    log = tmp_path / "b.log"
    with serve([backing], NQN) as (_, pa, _a), \
            serve([backing], NQN, log=log) as (_, pb, proc_b):
        dev = fx100io.open_device(mp_uri([pa, pb], io_timeout_ms=500, reconnect_ms=50,
                                         connect_timeout_ms=500, kato_ms=kato_ms))
        try:
            _warm(dev)  # this thread's queue on each path made
            _stop(proc_b)
            t_stop = time.monotonic()
            off = None
            for i in range(16):  # the first write that goes to b and moves is W1
                before = dev.path_stats()[1]["failovers"]
                dev.write_from_blocking(i * BS, np.full(BS, 0xAA, np.uint8))
                if dev.path_stats()[1]["failovers"] > before:
                    off = i * BS
                    break
            assert off is not None, "no write went to path b"
            dev.write_from_blocking(off, np.full(BS, 0xBB, np.uint8))  # W2, on a
            # the stall outlasted the KATO of b's controller (W1 waited for it)
            assert time.monotonic() - t_stop > kato_ms / 1000
            _resume(proc_b)
            wait_for(lambda: "past KATO" in log.read_text()
                     or "no command within KATO" in log.read_text(),
                     "b to drop its controller", 10.0)
            time.sleep(1.0)  # anything b would still run has run by now
            with open(backing, "rb") as f:
                f.seek(off)
                got = f.read(BS)
            assert got == b"\xbb" * BS, f"W1 landed over W2 after b's KATO: {got[:4]!r}"
            buf = np.zeros(BS, np.uint8)
            assert dev.read_into_blocking(off, buf) == BS
            assert bytes(buf) == b"\xbb" * BS
        finally:
            _resume(proc_b)
            dev.close()


def test_write_with_no_keep_alive_fails_instead_of_moving(backing):
    """kato_ms=0: nothing ends the old association, so a write whose attempt
    may still run there is not re-issued: the caller gets the path's error."""
    with serve([backing], NQN) as (_, pa, _a), serve([backing], NQN) as (_, pb, proc_b):
        dev = fx100io.open_device(mp_uri([pa, pb], io_timeout_ms=500, reconnect_ms=50,
                                         kato_ms=0))
        try:
            _stop(proc_b)
            failed = 0
            for i in range(8):
                try:
                    dev.write_from_blocking(i * BS, np.full(BS, 0xCC, np.uint8))
                except errors.FxTimeoutError:
                    failed += 1
            assert failed >= 1, dev.path_stats()
            assert dev.path_stats()[1]["state"] == "down"
        finally:
            _resume(proc_b)
            dev.close()


# -- 2: close while a path is being brought back ---------------------------

def test_close_waits_for_a_prober_inside_the_device(backing, monkeypatch):
    """A prober thread inside a path's Device (its connect to a stalled
    target) is never raced by close: the Device is closed only after the
    prober's call returned."""
    events: list[tuple[str, int, float]] = []
    inside: dict[int, int] = {}
    overlap: list[str] = []
    lock = threading.Lock()
    real_read, real_close = Device.read_into_blocking, Device.close

    def read(self, off, buf):  # noqa: ANN001, ANN202
        if not threading.current_thread().name.startswith("fx100io-mpath"):
            return real_read(self, off, buf)
        with lock:
            inside[id(self)] = inside.get(id(self), 0) + 1
            events.append(("read", id(self), time.monotonic()))
        try:
            return real_read(self, off, buf)
        finally:
            with lock:
                inside[id(self)] -= 1

    def close(self):  # noqa: ANN001, ANN202
        with lock:
            if inside.get(id(self)):
                overlap.append(self.uri)
        return real_close(self)

    monkeypatch.setattr(Device, "read_into_blocking", read)
    monkeypatch.setattr(Device, "close", close)
    with serve([backing], NQN) as (_, pa, _a), serve([backing], NQN) as (_, pb, proc_b):
        dev = fx100io.open_device(mp_uri([pa, pb], io_timeout_ms=1000, connect_timeout_ms=2000,
                                         reconnect_ms=50))
        try:
            buf = np.zeros(BS, np.uint8)
            _stop(proc_b)
            for _ in range(4):  # one goes to b, times out, moves: b's prober starts
                dev.read_into_blocking(0, buf)
            wait_for(lambda: any(e[0] == "read" for e in events), "the prober's read")
            time.sleep(0.3)  # inside its connect to the stalled target now
            dev.close()
            assert not overlap, f"a Device was closed under its prober: {overlap}"
            for p in dev._paths:
                assert p.prober is None or not p.prober.is_alive()
                assert p.watcher is None or not p.watcher.is_alive()
        finally:
            _resume(proc_b)
            dev.close()


# -- 3: flush ----------------------------------------------------------------

def test_flush_with_every_path_down_fails(backing):
    with serve([backing], NQN) as (_, pa, proc_a), serve([backing], NQN) as (_, pb, proc_b):
        dev = fx100io.open_device(mp_uri([pa, pb], io_timeout_ms=800, reconnect_ms=50))
        try:
            dev.write_from_blocking(0, np.full(BS, 1, np.uint8))
            dev.flush_blocking()
            dev.write_from_blocking(0, np.full(BS, 2, np.uint8))
            for p in (proc_a, proc_b):
                p.kill()
                p.wait(10)
            t0 = time.monotonic()
            with pytest.raises(errors.FxTimeoutError, match="flush"):
                dev.flush_blocking()
            assert time.monotonic() - t0 < 0.8 + 3.0

            async def flush() -> None:
                await dev.flush()

            with pytest.raises(errors.FxTimeoutError, match="flush"):
                asyncio.run(flush())
        finally:
            dev.close()


def test_flush_goes_through_every_path_that_took_writes(backing):
    """Writes spread over both paths: flush reaches both controllers; a path
    that dies before the flush is waited for and flushed once it is back."""
    with serve([backing], NQN) as (_, pa, _a), serve([backing], NQN) as (_, pb, proc_b):
        dev = fx100io.open_device(mp_uri([pa, pb], io_timeout_ms=8000, reconnect_ms=50))
        try:
            for i in range(8):
                dev.write_from_blocking(i * BS, np.full(BS, i, np.uint8))
            assert all(p.dirty for p in dev._paths)
            dev.flush_blocking()
            assert not any(p.dirty for p in dev._paths)
            for i in range(8):
                dev.write_from_blocking(i * BS, np.full(BS, 9, np.uint8))
            assert dev._paths[1].dirty
            proc_b.kill()
            proc_b.wait(10)
            done: list[BaseException | None] = []
            t = threading.Thread(target=lambda: done.append(_try(dev.flush_blocking)), daemon=True)
            t.start()
            time.sleep(0.5)
            assert not done, "flush returned while a path with unflushed writes was down"
            with serve([backing], NQN, port=pb):
                t.join(WAIT_S)
                assert done == [None]
            assert not any(p.dirty for p in dev._paths)
        finally:
            dev.close()


def test_a_flush_with_a_bad_priority_marks_no_path_flushed(backing):
    """A flush refused for its priority= argument flushed nothing, so every path
    that took writes still counts as unflushed (the next flush goes through it)."""
    import asyncio

    with serve([backing], NQN) as (_, pa, _a), serve([backing], NQN) as (_, pb, _b):
        dev = fx100io.open_device(mp_uri([pa, pb], io_timeout_ms=8000))
        try:
            for i in range(8):
                dev.write_from_blocking(i * BS, np.full(BS, i, np.uint8))
            assert all(p.dirty for p in dev._paths)
            with pytest.raises(ValueError):
                dev.flush_blocking(priority="urgent")
            with pytest.raises(ValueError):
                asyncio.run(dev.flush(priority="urgent"))
            assert all(p.dirty for p in dev._paths)
            dev.flush_blocking()
            assert not any(p.dirty for p in dev._paths)
        finally:
            dev.close()


def _try(fn) -> BaseException | None:  # noqa: ANN001
    try:
        fn()
    except BaseException as e:  # noqa: BLE001
        return e
    return None


# -- 4/5: namespace identity -------------------------------------------------

class _FakeDev:
    """Stands in for a path's C device: a namespace with given identifiers."""

    def __init__(self, ids: tuple[bytes, bytes, bytes]):
        self.ns_ids = ids

    def ana_state(self) -> tuple[int, int]:
        raise OSError(95, "no ANA")


def _fake_device_class(ids_by_port: dict[str, tuple[bytes, bytes, bytes]], read_error=None):  # noqa: ANN001, ANN202
    class FakeDevice:
        def __init__(self, uri: str, **_: object):
            port = uri.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]
            self.uri = uri
            self._dev = _FakeDev(ids_by_port[port])
            self.size, self.block_size = SIZE, 512
            self.target, self.transport = uri, "nvme+tcp"
            self.closed = False
            self._lock = threading.Lock()
            self._drivers: list[object] = []
            self.reads = 0

        def read_into_blocking(self, off: int, buf: object) -> int:
            self.reads += 1
            if read_error is not None:
                raise read_error
            return 512

        def close(self) -> None:
            self.closed = True

    return FakeDevice


Z16, Z8 = bytes(16), bytes(8)
URI2 = f"nvme+tcp://127.0.0.1:1,127.0.0.1:2/{NQN}"


def test_unidentified_namespace_is_refused_over_several_paths(monkeypatch):
    import fx100io.device

    monkeypatch.setattr(fx100io.device, "Device", _fake_device_class({"1": (Z16, Z8, Z16),
                                                                      "2": (Z16, Z8, Z16)}))
    with pytest.raises(errors.PathMismatchError, match="no NGUID, EUI-64 or UUID"):
        MultipathDevice(URI2)
    dev = MultipathDevice(URI2 + "?unidentified_ns=allow")
    try:
        assert [s["state"] for s in dev.path_stats()] == ["live", "live"]
    finally:
        dev.close()


def test_identifiers_compared_only_where_both_paths_report_them(monkeypatch):
    import fx100io.device

    u = b"\x11" * 16
    # path 2 did not report the UUID (its CNS 03h was refused): same namespace
    monkeypatch.setattr(fx100io.device, "Device", _fake_device_class({"1": (Z16, Z8, u),
                                                                      "2": (Z16, Z8, Z16)}))
    dev = MultipathDevice(URI2 + "?unidentified_ns=allow")
    try:
        assert [s["state"] for s in dev.path_stats()] == ["live", "live"]
    finally:
        dev.close()
    monkeypatch.setattr(fx100io.device, "Device", _fake_device_class({"1": (Z16, Z8, u),
                                                                      "2": (Z16, Z8, b"\x22" * 16)}))
    with pytest.raises(errors.PathMismatchError, match="another namespace"):
        MultipathDevice(URI2)


def test_namespaces_reporting_disjoint_identifier_kinds_are_refused(monkeypatch):
    """One path's namespace reports only an NGUID, the other's only a UUID:
    nothing proves them one namespace (two volumes of one size would look
    the same), so the second path is refused unless unidentified_ns=allow;
    a third path reporting both kinds, matching both, ties them together."""
    import fx100io.device

    n, u = b"\xaa" * 16, b"\xbb" * 16
    monkeypatch.setattr(fx100io.device, "Device", _fake_device_class({"1": (n, Z8, Z16),
                                                                      "2": (Z16, Z8, u)}))
    with pytest.raises(errors.PathMismatchError, match="no namespace identifier of the same kind"):
        MultipathDevice(URI2)
    dev = MultipathDevice(URI2 + "?unidentified_ns=allow")
    try:
        assert [s["state"] for s in dev.path_stats()] == ["live", "live"]
    finally:
        dev.close()
    uri3 = f"nvme+tcp://127.0.0.1:1,127.0.0.1:3,127.0.0.1:2/{NQN}"
    monkeypatch.setattr(fx100io.device, "Device", _fake_device_class({"1": (n, Z8, Z16),
                                                                      "3": (n, Z8, u),
                                                                      "2": (Z16, Z8, u)}))
    dev = MultipathDevice(uri3)
    try:
        assert [s["state"] for s in dev.path_stats()] == ["live"] * 3
    finally:
        dev.close()
    # a kind both report that differs refuses, whatever else is equal
    monkeypatch.setattr(fx100io.device, "Device", _fake_device_class({"1": (n, Z8, u),
                                                                      "2": (n, Z8, b"\xcc" * 16)}))
    with pytest.raises(errors.PathMismatchError, match="another namespace"):
        MultipathDevice(URI2 + "?unidentified_ns=allow")


def test_estale_is_a_path_mismatch_only_on_fabric_devices(tmp_path):
    assert not isinstance(errors.error_from_errno(116), errors.PathMismatchError)
    p = tmp_path / "f.img"
    p.write_bytes(bytes(BS))
    with fx100io.open_device(str(p)) as dev:
        with pytest.raises(OSError) as e:
            dev._check((0, None, 0, BS, 0), (-116, 0))
        assert not isinstance(e.value, errors.PathMismatchError)


# -- 6: what proves a path up ------------------------------------------------

def test_prober_counts_a_media_error_as_a_live_path(monkeypatch):
    import fx100io.device

    u = b"\x11" * 16
    media = errors.error_from_status(0x281)  # SCT 2h: unrecovered read error on LBA 0
    monkeypatch.setattr(fx100io.device, "Device", _fake_device_class(
        {"1": (Z16, Z8, u), "2": (Z16, Z8, u)}, read_error=media))
    dev = MultipathDevice(URI2)
    try:
        p = dev._paths[1]
        dev._path_failed(p, "test: path down")
        wait_for(lambda: p.state == "live", "path 2 back after a media error on LBA 0")
        # a path error does not: the path stays down
        monkeypatch.setattr(type(p.dev), "read_into_blocking",
                            lambda self, off, buf: (_ for _ in ()).throw(
                                errors.error_from_errno(104)))
        dev._path_failed(p, "test: path down again")
        time.sleep(0.5)
        assert p.state == "down"
    finally:
        dev.close()


def test_a_path_refused_on_revival_keeps_nothing_open(monkeypatch):
    """Path 2's controller comes back onto another namespace: the path is
    refused, its old and new Devices are both closed, and the other path
    goes on."""
    import fx100io.device

    ids = {"1": (Z16, Z8, b"\x11" * 16), "2": (Z16, Z8, b"\x11" * 16)}
    cls = _fake_device_class(ids)
    made: list[object] = []
    real_init = cls.__init__

    def init(self, uri: str, **kw: object) -> None:
        real_init(self, uri, **kw)
        made.append(self)

    monkeypatch.setattr(cls, "__init__", init)
    monkeypatch.setattr(fx100io.device, "Device", cls)
    dev = MultipathDevice(URI2)
    try:
        p = dev._paths[1]
        old = p.dev
        ids["2"] = (Z16, Z8, b"\x22" * 16)
        dev._path_failed(p, "test: lost", fence_of=old)  # closed, then re-opened
        wait_for(lambda: p.state == "refused", "path 2 refused")
        assert p.dev is None and "another namespace" in p.why
        port2 = [d for d in made if d.uri.split("/")[2].endswith(":2")]  # type: ignore[attr-defined]
        assert len(port2) == 2 and all(d.closed for d in port2)  # type: ignore[attr-defined]
        assert dev._paths[0].state == "live" and not dev._paths[0].dev.closed  # type: ignore[union-attr]
        assert dev._any_dev() is dev._paths[0].dev
    finally:
        dev.close()


def test_a_write_held_on_a_device_being_closed_is_released(monkeypatch):
    """A write's attempt fails on a path's Device while that Device is
    being closed outside the fence (the path was refused: p.dev is None
    already, the close waits for loops to let go): its fence is stamped
    when that close ends, so the write moves after kato instead of waiting
    until the MultipathDevice is closed; a close that never comes fails it
    after io_timeout_ms + HOLD_CLOSE_S."""
    import fx100io.device

    ids = {"1": (Z16, Z8, b"\x11" * 16), "2": (Z16, Z8, b"\x11" * 16)}
    monkeypatch.setattr(fx100io.device, "Device", _fake_device_class(ids))
    dev = MultipathDevice(URI2 + "?kato_ms=200&io_timeout_ms=500")
    try:
        p = dev._paths[1]
        old = p.dev
        with dev._lock:  # the refused branch: the path lets go of its Device, then closes it
            p.state, p.dev = mp.REFUSED, None
        fence = dev._path_failed(p, "test: lost", fence_of=old)
        assert fence is not None and dev._hold_left(fence) is None  # not closed yet
        mp._close_device(old)  # type: ignore[arg-type]
        left = dev._hold_left(fence)
        assert left is not None and 0 < left <= 0.2 + mp.HOLD_SLACK_S
        # a Device closed before its fence is made: the fence counts from now
        p2 = dev._paths[0]
        other = p2.dev
        mp._close_device(other)  # type: ignore[arg-type]
        with dev._lock:
            p2.dev = None
        fence2 = dev._path_failed(p2, "test: lost", fence_of=other)
        assert fence2 is not None and fence2.done_at is not None
        # the backstop: a close that never comes
        stuck = mp._Fence()
        assert dev._hold_left(stuck) is None
        stuck.made_at -= 0.5 + mp.HOLD_CLOSE_S + 0.1
        assert dev._hold_left(stuck) == -1.0
    finally:
        dev.close()


# -- 7/8: cancellation --------------------------------------------------------

def test_cancelled_submit_cancels_and_awaits_every_request(backing):
    with serve([backing], NQN) as (_, pa, _a), serve([backing], NQN) as (_, pb, proc_b):
        dev = fx100io.open_device(mp_uri([pa, pb], io_timeout_ms=1500, reconnect_ms=50))
        started: list[asyncio.Future] = []
        real_start = dev.start

        def start(reqs, **kw):  # noqa: ANN001, ANN003, ANN202
            futs = real_start(reqs, **kw)
            started.extend(futs)
            return futs

        dev.start = start  # type: ignore[method-assign]

        async def main() -> None:
            bufs = [np.zeros(BS, np.uint8) for _ in range(8)]
            await dev.submit([(_core.OP_READ, 0, b) for b in bufs])  # this loop's queues made
            _stop(proc_b)
            # Some of a batch get stuck on the stalled path b; on a loaded machine
            # a whole batch can land on a first, so try a few batches.
            for _ in range(5):
                started.clear()
                task = asyncio.ensure_future(dev.submit([(_core.OP_READ, i * BS, b)
                                                         for i, b in enumerate(bufs)]))
                await asyncio.sleep(0.2)
                if not task.done():
                    break
                await task
            assert not task.done(), "no batch of 8 reads reached the stalled path"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, WAIT_S)
            # nothing of it still runs or touches a buffer
            assert started and all(f.done() for f in started), \
                [f for f in started if not f.done()]

        try:
            asyncio.run(main())
        finally:
            _resume(proc_b)
            dev.close()


def test_cancelled_request_waiting_for_a_path(backing):
    """A read waiting with no live path (asyncio.sleep) and one in flight on
    a stalled path (_io_done) are each cancelled cleanly."""
    with serve([backing], NQN) as (_, pa, proc_a), serve([backing], NQN) as (_, pb, proc_b):
        dev = fx100io.open_device(mp_uri([pa, pb], io_timeout_ms=3000, reconnect_ms=50))

        async def main() -> None:
            buf = np.zeros(BS, np.uint8)
            for _ in range(4):  # this loop's queue on each path made
                await dev.read_into(0, buf)
            for p in (proc_a, proc_b):
                _stop(p)
            t = asyncio.ensure_future(dev.read_into(0, buf))  # in flight on a stalled path
            await asyncio.sleep(0.2)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(t, WAIT_S)
            with dev._lock:  # both targets are stalled: no path comes back on its own
                for p in dev._paths:
                    p.state = mp.DOWN
            t = asyncio.ensure_future(dev.read_into(0, buf))  # waiting for a path
            await asyncio.sleep(0.1)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(t, WAIT_S)
            assert all(s["inflight"] == 0 for s in dev.path_stats()), dev.path_stats()

        try:
            asyncio.run(main())
        finally:
            for p in (proc_a, proc_b):
                _resume(p)
            dev.close()


def test_cancelled_while_held_and_while_flushing(backing):
    """A write held for a stalled path's association, and a flush waiting
    for a path that took writes, are each cancelled at once."""
    with serve([backing], NQN) as (_, pa, _a), serve([backing], NQN) as (_, pb, proc_b):
        dev = fx100io.open_device(mp_uri([pa, pb], io_timeout_ms=500, reconnect_ms=50,
                                         connect_timeout_ms=500, kato_ms=30000))

        async def main() -> None:
            data = np.full(BS, 0x5A, np.uint8)
            await _awarm(dev)  # this loop's queue on each path made; both paths dirty
            _stop(proc_b)
            tasks = [asyncio.ensure_future(dev.write_from(i * BS, data)) for i in range(4)]
            deadline = time.monotonic() + WAIT_S
            while dev.path_stats()[1]["state"] == "live":
                assert time.monotonic() < deadline, f"path b never went down: {dev.path_stats()}"
                await asyncio.sleep(0.02)
            await asyncio.sleep(1.0)  # b's writes timed out and are held (kato 30 s)
            held = [t for t in tasks if not t.done()]
            assert held, "no write was held for the stalled path"
            for t in held:
                t.cancel()
            t0 = time.monotonic()
            for t in held:
                with pytest.raises(asyncio.CancelledError):
                    await asyncio.wait_for(t, WAIT_S)
            assert time.monotonic() - t0 < 2.0
            flushing = asyncio.ensure_future(dev.flush())  # b took writes and is down
            await asyncio.sleep(0.2)
            assert not flushing.done()
            flushing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(flushing, WAIT_S)

        try:
            asyncio.run(main())
        finally:
            _resume(proc_b)
            dev.close()


def test_async_close_keeps_the_loop_running_and_survives_cancel(backing):
    """aclose (async with's exit) closes in a thread: the loop goes on
    meanwhile, and a cancelled close still ends with the device closed."""
    with serve([backing], NQN) as (_, pa, _a), serve([backing], NQN) as (_, pb, proc_b):
        dev = fx100io.open_device(mp_uri([pa, pb], io_timeout_ms=1000, reconnect_ms=50))

        async def main() -> int:
            buf = np.zeros(BS, np.uint8)
            await dev.read_into(0, buf)
            _stop(proc_b)  # b's close waits on its shutdown handshake
            ticks = 0

            async def tick() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            ticker = asyncio.ensure_future(tick())
            closing = asyncio.ensure_future(dev.aclose())
            await asyncio.sleep(0.3)
            closing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await closing
            assert dev.closed
            with pytest.raises(errors.DeviceClosedError):
                await dev.read_into(0, buf)
            ticker.cancel()
            return ticks

        try:
            ticks = asyncio.run(main())
            assert ticks >= 5, "the loop stood still while the device closed"
            wait_for(lambda: all(p.dev is None for p in dev._paths), "the close thread's end")
        finally:
            _resume(proc_b)
            dev.close()


# -- M7: a path whose queue cannot be had without waiting -------------------

def test_first_request_skips_a_path_whose_lock_is_held(backing):
    """policy=queue-depth: this loop has no queue on path 1 yet and path 1's
    lock is held (its ANA read hangs on a stalled admin queue, say): the
    request goes to path 2, which is live, instead of re-picking path 1
    until it fails with no path."""
    with serve([backing], NQN) as (_, pa, _a), serve([backing], NQN) as (_, pb, _b):
        dev = fx100io.open_device(mp_uri([pa, pb], policy="queue-depth", io_timeout_ms=1500))
        with open(backing, "r+b") as f:
            f.write(b"\x5c" * BS)

        async def main() -> bytes:
            buf = np.zeros(BS, np.uint8)
            assert await asyncio.wait_for(dev.read_into(0, buf), WAIT_S) == BS
            return bytes(buf)

        p1 = dev._paths[0]
        try:
            assert p1.dev_lock.acquire(timeout=WAIT_S)
            try:
                got = asyncio.run(main())
            finally:
                p1.dev_lock.release()
            assert got == b"\x5c" * BS
            assert dev.path_stats()[1]["commands"] >= 1, dev.path_stats()
        finally:
            dev.close()


# -- 10: discovery entries -----------------------------------------------------

def test_discovery_entries_with_bad_addresses_are_skipped(monkeypatch):
    assert mp._valid_address("10.0.0.1", "4420")
    assert mp._valid_address("fe80::1", "4420")
    assert mp._valid_address("target-1.example", "4420")
    for addr, port in (("10.9.9.9", "4420/NQN?ns=9#"), ("10.9.9.9", "0"), ("10.9.9.9", "99999"),
                       ("a/b", "4420"), ("h?x=1", "4420"), ("h#x", "4420"), ("", "4420"),
                       ("a..b", "4420"), ("x" * 300, "4420")):
        assert not mp._valid_address(addr, port), (addr, port)
    entries = [
        {"trtype": "tcp", "traddr": "10.9.9.9", "trsvcid": "4420/NQN?ns=9#", "subnqn": NQN,
         "subtype": "nvme"},
        {"trtype": "tcp", "traddr": "10.0.0.2", "trsvcid": "4421", "subnqn": NQN,
         "subtype": "nvme"},
    ]
    monkeypatch.setattr(fabric_uri, "discover", lambda uri: entries)
    out = mp._discovered([f"nvme+tcp://10.0.0.1:4420/{NQN}?hostnqn=nqn.2014-08.io.fx100:h"])
    assert out[1:] == [f"nvme+tcp://10.0.0.2:4421/{NQN}?hostnqn=nqn.2014-08.io.fx100:h"]


def test_discovery_sends_secrets_only_to_listed_addresses(monkeypatch):
    """With a DH-HMAC-CHAP secret, paths=discover follows no address the URI
    does not list (a spoofed log could name any): neither a referral nor a
    subsystem entry; discover_secrets=any follows them, secrets and all."""
    secret = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:"
    asked: list[str] = []
    entries = {
        "10.0.0.1": [
            {"trtype": "tcp", "traddr": "10.0.0.1", "trsvcid": "4421", "subnqn": NQN,
             "subtype": "nvme"},
            {"trtype": "tcp", "traddr": "10.6.6.6", "trsvcid": "4420", "subnqn": NQN,
             "subtype": "nvme"},
            {"trtype": "tcp", "traddr": "10.7.7.7", "trsvcid": "8009",
             "subnqn": "nqn.2014-08.org.nvmexpress.discovery", "subtype": "discovery"}],
        "10.7.7.7": [],
    }

    def discover(uri: str) -> list[dict[str, str]]:
        asked.append(uri)
        return entries[fabric_uri.parse(uri)["host"]]

    monkeypatch.setattr(fabric_uri, "discover", discover)
    base = f"nvme+tcp://10.0.0.1:4420,10.0.0.1:4421/{NQN}?hostnqn=nqn.2014-08.io.fx100:h" \
        f"&dhchap_secret={secret}"
    out = mp._discovered(fabric_uri.split_paths(base))
    assert len(out) == 2, out  # only the listed two
    assert [fabric_uri.parse(u)["host"] for u in asked] == ["10.0.0.1"]
    asked.clear()
    out = mp._discovered(fabric_uri.split_paths(base + "&discover_secrets=any"))
    assert [fabric_uri.parse(u)["host"] for u in out] == ["10.0.0.1", "10.0.0.1", "10.6.6.6"]
    assert [fabric_uri.parse(u)["host"] for u in asked] == ["10.0.0.1", "10.7.7.7"]
    assert all(secret in u for u in asked + out)
    # no secret: nothing to guard, every address is followed
    asked.clear()
    out = mp._discovered(fabric_uri.split_paths(base.replace(f"&dhchap_secret={secret}", "")))
    assert len(out) == 3 and len(asked) == 2


# -- 12: a device nobody closed ------------------------------------------------

def test_unclosed_device_is_collected(backing):
    with serve([backing], NQN) as (_, pa, _a), serve([backing], NQN) as (_, pb, _b):
        dev = fx100io.open_device(mp_uri([pa, pb]))
        threads = [p.watcher for p in dev._paths if p.watcher is not None]
        assert threads
        ref = weakref.ref(dev)
        del dev
        gc.collect()
        wait_for(lambda: ref() is None or not gc.collect(), "collection")
        assert ref() is None, "an unclosed MultipathDevice is kept alive by its threads"
        for t in threads:
            t.join(5)
            assert not t.is_alive()


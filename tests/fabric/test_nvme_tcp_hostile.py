"""Hostile or broken PDUs from a controller end the queue with an error:
never a crash, never a byte written outside the destination buffer, never a
hang past the timeout, never a write reported done that the controller did
not properly take."""

from __future__ import annotations

import time

import numpy as np
import pytest
from support.evil_target import READ_SCENARIOS, WRITE_SCENARIOS, EvilTarget

import fx100io
from fx100io import errors

GUARD = 64 << 10
OPTS = "?io_timeout_ms=2000&kato_ms=0"


@pytest.mark.parametrize("scenario", READ_SCENARIOS)
def test_hostile_read_responses(scenario):
    evil = EvilTarget(scenario)
    try:
        dev = fx100io.open_device(evil.uri + OPTS)
        try:
            assert dev.block_size == 512 and dev.size == 8192 * 512
            arena = np.full(GUARD + 8192 + GUARD, 0x5C, dtype=np.uint8)
            dest = arena[GUARD:GUARD + 8192]
            t0 = time.time()
            with pytest.raises(errors.Fx100ioError) as ei:
                dev.read_into_blocking(0, dest)
            assert time.time() - t0 < 5, "no hang past the I/O timeout"
            assert isinstance(ei.value, (errors.FxProtocolError, errors.FxConnectionError,
                                         errors.FxTimeoutError)), repr(ei.value)
            # nothing outside the destination was touched
            assert (arena[:GUARD] == 0x5C).all() and (arena[GUARD + 8192:] == 0x5C).all()
            # writes still work on a fresh connection (the target only lies on reads)
            dev.write_from_blocking(0, np.zeros(512, np.uint8))
        finally:
            dev.close()
    finally:
        evil.close()


@pytest.mark.parametrize("scenario", ["success-without-last", "r2t-for-read",
                                      "success-without-data"])
def test_hostile_read_is_a_protocol_error(scenario):
    """These break a rule the host checks at once: a clear protocol error,
    not a wait for the I/O timeout."""
    evil = EvilTarget(scenario)
    try:
        dev = fx100io.open_device(evil.uri + "?io_timeout_ms=10000&kato_ms=0")
        try:
            t0 = time.time()
            with pytest.raises(errors.FxProtocolError):
                dev.read_into_blocking(0, np.zeros(8192, np.uint8))
            assert time.time() - t0 < 5
        finally:
            dev.close()
    finally:
        evil.close()


def _pattern(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


# (length of the write, target knobs): r2t-flood on a 1 MiB write with
# MAXH2CDATA 4096 is the case seen in the wild; r2t-for-incapsule needs a
# controller that takes 8 KiB in the capsule.
_WRITE_SETUP = {
    "r2t-flood": (1 << 20, {"maxh2cdata": 4096}),
    "r2t-for-incapsule": (4096, {"ioccsz": (8192 + 64) // 16}),
}


@pytest.mark.parametrize("scenario", WRITE_SCENARIOS)
def test_hostile_write_responses(scenario):
    n, knobs = _WRITE_SETUP.get(scenario, (64 << 10, {}))
    evil = EvilTarget(scenario, **knobs)
    try:
        dev = fx100io.open_device(evil.uri + OPTS)
        try:
            data = _pattern(n, 1)
            t0 = time.time()
            with pytest.raises(errors.FxProtocolError):
                dev.write_from_blocking(0, data)
            assert time.time() - t0 < 5, "no hang past the I/O timeout"
            # the host tore the connection down
            assert evil.io_closed.wait(5), "connection still up after a protocol error"
            assert (data == _pattern(n, 1)).all(), "the source buffer was not touched"
            # the next commands, on a fresh connection, work: the target now
            # behaves and must hold exactly what we write
            again = _pattern(n, 2)
            assert dev.write_from_blocking(0, again) == n
            back = np.zeros(n, np.uint8)
            assert dev.read_into_blocking(0, back) == n
            assert (back == again).all()
        finally:
            dev.close()
    finally:
        evil.close()


def test_good_target_write_read_roundtrip():
    """The target the hostile tests compare against: R2T writes (split at a
    small MAXH2CDATA) and in-capsule writes land and read back."""
    evil = EvilTarget("good", maxh2cdata=4096, ioccsz=(8192 + 64) // 16)
    try:
        dev = fx100io.open_device(evil.uri + OPTS)
        try:
            for n, seed in ((4096, 3), (1 << 20, 4)):
                data = _pattern(n, seed)
                assert dev.write_from_blocking(0, data) == n
                back = np.zeros(n, np.uint8)
                dev.read_into_blocking(0, back)
                assert (back == data).all()
            assert evil.incapsule_writes == 1 and evil.r2t_writes == 1
        finally:
            dev.close()
    finally:
        evil.close()


def test_icdoff_nonzero_is_honoured():
    """A controller whose in-capsule data starts ICDOFF 16-byte units into the
    capsule: the written bytes must land where they were meant to."""
    evil = EvilTarget("good", ioccsz=(8192 + 64) // 16, icdoff=2)
    try:
        dev = fx100io.open_device(evil.uri + OPTS)
        try:
            data = _pattern(4096, 5)
            assert dev.write_from_blocking(0, data) == 4096
            back = np.zeros(4096, np.uint8)
            dev.read_into_blocking(0, back)
            assert (back == data).all()
            # we place in-capsule data only at ICDOFF 0: here the write went by R2T
            assert evil.incapsule_writes == 0 and evil.r2t_writes == 1
        finally:
            dev.close()
    finally:
        evil.close()


@pytest.mark.parametrize("knobs", [
    {"nsze": 1 << 60, "lbads": 12},   # nsze * block size overflows 64 bits
    {"lbads": 21, "mdts": 8},         # 2 MiB blocks, MDTS 1 MiB: no block fits a command
    {"lbads": 13, "mdts": 1},         # 8 KiB blocks, MDTS 8 KiB with 4 KiB pages: fine
])
def test_namespace_geometry(knobs):
    evil = EvilTarget("good", **knobs)
    try:
        if knobs.get("lbads") == 13:
            dev = fx100io.open_device(evil.uri + OPTS)
            try:
                assert dev.block_size == 8192
                data = _pattern(8192 * 3, 6)   # three commands of one block each
                assert dev.write_from_blocking(0, data) == len(data)
                back = np.zeros(len(data), np.uint8)
                dev.read_into_blocking(0, back)
                assert (back == data).all()
            finally:
                dev.close()
            return
        t0 = time.time()
        with pytest.raises(errors.FxProtocolError):
            fx100io.open_device(evil.uri + OPTS).close()
        assert time.time() - t0 < 5
    finally:
        evil.close()

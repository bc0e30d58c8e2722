"""Hostile or broken PDUs from a controller end the queue with an error:
never a crash, never a byte written outside the destination buffer, never a
hang past the timeout."""

from __future__ import annotations

import time

import numpy as np
import pytest
from evil_target import SCENARIOS, EvilTarget

import fx100io
from fx100io import errors

GUARD = 64 << 10


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_hostile_read_responses(scenario):
    evil = EvilTarget(scenario)
    try:
        dev = fx100io.open_device(f"nvme+tcp://127.0.0.1:{evil.port}/nqn.2026-11.io.evil"
                                  "?io_timeout_ms=2000&kato_ms=0")
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

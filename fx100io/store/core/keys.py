"""Keys as every store takes them: str or bytes, 1 to KEY_MAX bytes."""

from __future__ import annotations

from typing import Any

from fx100io import _core
from fx100io.errors import InvalidArgumentError, KeyTooLongError

KEY_MAX = _core.KEY_MAX


def normalize_key(key: Any) -> bytes:
    if isinstance(key, str):
        k = key.encode()
    elif isinstance(key, (bytes, bytearray, memoryview)):
        k = bytes(key)
    else:
        raise InvalidArgumentError(22, f"keys are str or bytes, got {type(key).__name__}")
    if not 0 < len(k) <= KEY_MAX:
        raise KeyTooLongError(22, f"key must be 1 to {KEY_MAX} bytes, got {len(k)}")
    return k

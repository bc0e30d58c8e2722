"""Values of the store model (tests/store/test_store_model.py) and its killed
writer process: each embeds its key and a version, so an older value or
another key's can never pass for the right one."""

from __future__ import annotations

BLOCK = 4096
SMALL_KEYS = [f"k{i}" for i in range(24)]
SIZES = [0, 1, 100, 4096, 5000]  # 0: just the key and version


def make_value(key: str, version: str, size: int) -> bytes:
    """Unique per (key, version); size pads it (never below the identity)."""
    ident = f"{key}#{version}#".encode()
    return ident + bytes((len(ident) + i) % 251 for i in range(max(0, size - len(ident))))


def blocks(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK * BLOCK

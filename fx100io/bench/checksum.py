"""CRC32C for --verify.

The core's C implementation (SSE4.2 when the CPU has it) is the one to use;
the table-driven Python version below only exists so option parsing, job
files and reports can be exercised before the extension is built, and so a
user sees a slow-but-correct verify rather than an ImportError.  Both give
the same value: crc32c(b"123456789") == 0xE3069283.
"""

from __future__ import annotations

from collections.abc import Callable

_POLY = 0x82F63B78  # Castagnoli, reflected


def _make_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _make_table()


def crc32c_python(data, crc: int = 0) -> int:  # type: ignore[no-untyped-def]
    """Reference CRC32C; ~1 MB/s, fine for small test blocks only."""
    c = crc ^ 0xFFFFFFFF
    table = _TABLE
    for b in memoryview(data).cast("B"):
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _pick() -> tuple[Callable[..., int], bool]:
    try:
        from fx100io._core import crc32c as native  # type: ignore[import-not-found]

        return native, True
    except ImportError:
        return crc32c_python, False


crc32c, NATIVE = _pick()

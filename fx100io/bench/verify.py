"""--verify=crc32c: a self-describing header on every written block.

Layout of the first 32 bytes of each block (little endian):
    magic "FXV1" | crc32c | offset u64 | length u32 | write seq u32 | 8 pad
The CRC covers everything after its own field (header rest + payload), so a
flipped bit anywhere is caught, and the stored offset catches a block that
landed at the wrong place (a misdirected or lost write) even when its CRC is
intact.  The format is ours, not fio's: fio's verify headers are not read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from .checksum import crc32c

MAGIC = b"FXV1"
HEADER = struct.Struct("<4sIQII8x")
HEADER_SIZE = HEADER.size  # 32
MAX_REPORTED = 10


def stamp(buf, offset: int, length: int, seq: int) -> None:  # type: ignore[no-untyped-def]
    """Write a header for ``offset`` into buf and seal it with the CRC."""
    HEADER.pack_into(buf, 0, MAGIC, 0, offset, length, seq & 0xFFFFFFFF)
    crc = crc32c(memoryview(buf)[8:length])
    struct.pack_into("<I", buf, 4, crc)


def check(buf, offset: int, length: int) -> str | None:  # type: ignore[no-untyped-def]
    """None if the block read from ``offset`` is intact, else why not."""
    if length < HEADER_SIZE:
        return f"block of {length} bytes is too small for a verify header"
    magic, crc, hdr_off, hdr_len, _seq = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        return f"no verify header (magic {magic!r}, expected {MAGIC!r}): block never written with --verify, or overwritten"
    if hdr_len != length:
        return f"header says length {hdr_len}, block is {length}"
    if hdr_off != offset:
        return f"header says offset {hdr_off:#x}: block landed at the wrong place"
    actual = crc32c(memoryview(buf)[8:length])
    if actual != crc:
        return f"crc32c mismatch: stored {crc:#010x}, computed {actual:#010x}"
    return None


@dataclass
class VerifyLog:
    """What verification checked and what it found (first few failures kept)."""

    blocks: int = 0
    bytes: int = 0
    errors: int = 0
    failures: list[str] = field(default_factory=list)

    def record(self, offset: int, length: int, problem: str | None) -> None:
        self.blocks += 1
        self.bytes += length
        if problem is not None:
            self.errors += 1
            if len(self.failures) < MAX_REPORTED:
                self.failures.append(f"offset {offset} ({offset:#x}), {length} bytes: {problem}")

    def merge(self, other: VerifyLog) -> None:
        self.blocks += other.blocks
        self.bytes += other.bytes
        self.errors += other.errors
        self.failures.extend(other.failures[: max(0, MAX_REPORTED - len(self.failures))])

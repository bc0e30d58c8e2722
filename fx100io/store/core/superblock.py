"""Block 0 of every store device, and the sealed-block codec that it, the
local store's index half headers and the shared pool's extent headers
share: a packed body, its CRC32C, zero padding to one block.

Each kind of store has its own magic at the start of block 0, both
declared here so that each refuses the other's devices without importing
the other (the shared store needs redis).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from fx100io import _core
from fx100io.device import Device
from fx100io.errors import NotAStoreError
from fx100io.pool import aligned_array

BLOCK = 4096
SB_MAGIC = b"FX100IO\x00STORE\x00v1"  # a ChunkStore's device
SHARED_SB_MAGIC = b"FX100IO\x00SHARED\x00\x00"  # a namespace of a shared pool


def align_up(n: int, a: int = BLOCK) -> int:
    return (n + a - 1) // a * a


def new_set_id() -> bytes:
    """The id that every device of one store carries in its superblock."""
    return uuid.uuid4().bytes


def seal(body: bytes) -> bytes:
    """body, its CRC32C, zeros to one block."""
    return (body + struct.pack("<I", _core.crc32c(body))).ljust(BLOCK, b"\0")


def is_sealed(raw: bytes, n: int) -> bool:
    """Whether the n-byte body at the start of raw carries its CRC32C."""
    (crc,) = struct.unpack_from("<I", raw, n)
    return bool(crc == _core.crc32c(raw[:n]))


def unseal_superblock(raw: bytes, magic: bytes, fmt: str, target: str, absent: str,
                      corrupt: str) -> tuple[Any, ...]:
    """The fields of the superblock in raw (block 0), magic first; refuses
    (NotAStoreError) a block without this magic (absent) or whose checksum
    does not match (corrupt)."""
    if raw[:len(magic)] != magic:
        raise NotAStoreError(22, absent, target)
    if not is_sealed(raw, struct.calcsize(fmt)):
        raise NotAStoreError(74, corrupt, target)
    return struct.unpack_from(fmt, raw)


def read_block0(dev: Device) -> bytes:
    """Block 0 of dev as far as it could be read."""
    raw = aligned_array(BLOCK)
    got = dev.read_into_blocking(0, raw)
    return raw.tobytes()[:got]


def write_block0(dev: Device, block: bytes) -> None:
    """Write block 0 of dev and make it durable."""
    raw = aligned_array(BLOCK)
    raw[:] = memoryview(block)
    dev.write_from_blocking(0, raw)
    dev.flush_blocking()


class OneOfASet(Protocol):
    """What the set checks read of a superblock."""
    set_id: bytes
    dev_index: int
    ndevs: int


def check_same_set(sbs: Sequence[OneOfASet], uris: list[str], foreign: str) -> None:
    """Refuse a device of another store than the first: foreign, followed by
    the first device's URI, says so."""
    for sb, u in zip(sbs, uris):
        if sb.set_id != sbs[0].set_id:
            raise NotAStoreError(22, f"{foreign} {uris[0]}", u)


def check_whole_set(sbs: Sequence[OneOfASet], uris: list[str], incomplete: str) -> None:
    """Refuse a set with devices missing or given twice: incomplete is
    formatted with ndevs (the set's) and given."""
    ndevs = sbs[0].ndevs
    if ndevs != len(sbs) or sorted(sb.dev_index for sb in sbs) != list(range(ndevs)):
        raise NotAStoreError(22, incomplete.format(ndevs=ndevs, given=len(sbs)), uris[0])

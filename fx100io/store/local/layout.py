"""On-device layout of a ChunkStore member device.

::

    0            superblock (one 4 KiB block)
    index_off    index half A: header block, then log segments
    +index_half  index half B: the same; the valid header with the higher
                 generation is the live half, the other receives compactions
    data_off     data extents (block aligned)

The superblock is written last when formatting, so a device whose format was
interrupted is not mistaken for a store.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass

from fx100io.errors import InvalidArgumentError, NotAStoreError
from fx100io.store.core.superblock import (
    BLOCK,
    SB_MAGIC,
    align_up,
    is_sealed,
    seal,
    unseal_superblock,
)

SB_FMT = "<16sII Q 16s II QQ QQ Q"
IDX_MAGIC = b"FXIDXHDR"
IDX_FMT = "<8sQ"
VERSION = 1
MIN_INDEX_HALF = 1 << 20
MAX_INDEX_HALF = 128 << 20
MAX_BLOCK = 1 << 20


@dataclass
class Superblock:
    block_size: int
    dev_size: int
    set_id: bytes
    dev_index: int
    ndevs: int
    index_off: int
    index_half: int
    data_off: int
    data_size: int
    created_ns: int

    def encode(self) -> bytes:
        return seal(struct.pack(SB_FMT, SB_MAGIC, VERSION, self.block_size, self.dev_size,
                                self.set_id, self.dev_index, self.ndevs, self.index_off,
                                self.index_half, self.data_off, self.data_size,
                                self.created_ns))

    @classmethod
    def decode(cls, raw: bytes, target: str) -> Superblock:
        (_, version, bs, dev_size, set_id, idx, ndevs, ioff, ihalf, doff, dsize,
         created) = unseal_superblock(
            raw, SB_MAGIC, SB_FMT, target,
            absent="no fx100io store on this device (pass create=True to format it)",
            corrupt="the store's superblock is corrupt (checksum mismatch)")
        if version != VERSION:
            raise NotAStoreError(22, f"store format version {version} is not supported", target)
        return cls(bs, dev_size, set_id, idx, ndevs, ioff, ihalf, doff, dsize, created)


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def check_geometry(sb: Superblock, dev_size: int, dev_block_size: int, target: str) -> None:
    """Refuse a superblock whose layout does not fit the device it is on
    (a truncated file, a shrunk device, or a superblock that a bug or a
    forger wrote with a valid checksum): replaying such a store would read
    and reuse blocks that are not there or not its own."""
    def bad(why: str) -> NotAStoreError:
        return NotAStoreError(22, f"the store's layout does not fit this device: {why}", target)

    bs = sb.block_size
    if bs < BLOCK or bs & (bs - 1) or bs > MAX_BLOCK:
        raise bad(f"block size {bs} is not a power of two from {BLOCK} to {MAX_BLOCK}")
    if bs % dev_block_size:
        raise bad(f"the store's block size {bs} is not a multiple of the device's "
                  f"{dev_block_size}")
    if dev_size < sb.dev_size:
        raise NotAStoreError(
            22, f"the device is {_size(dev_size)} but the store was formatted for "
            f"{_size(sb.dev_size)} (truncated file or shrunk device?)", target)
    if not 0 <= sb.dev_index < sb.ndevs:
        raise bad(f"device {sb.dev_index} of a store of {sb.ndevs} devices")
    if sb.index_off < BLOCK or sb.index_off % bs:
        raise bad(f"the index starts at {sb.index_off}, inside the superblock or unaligned")
    if sb.index_half < 2 * bs or sb.index_half % bs:
        raise bad(f"an index half of {sb.index_half} bytes is not a whole number of blocks "
                  "with room for a header and a segment")
    if sb.data_off != sb.index_off + 2 * sb.index_half:
        raise bad(f"the data area starts at {sb.data_off}, not after the index "
                  f"({sb.index_off + 2 * sb.index_half})")
    if sb.data_size < bs or sb.data_size % bs:
        raise bad(f"a data area of {sb.data_size} bytes is not a whole number of blocks")
    if sb.data_off + sb.data_size > sb.dev_size:
        raise bad(f"the data area ends at {sb.data_off + sb.data_size}, past the end of the "
                  f"device it was formatted for ({sb.dev_size} bytes)")


def plan(dev_size: int, block_size: int, dev_index: int, ndevs: int, set_id: bytes,
         index_half: int | None, target: str) -> Superblock:
    """Choose the layout of a device being formatted."""
    bs = max(block_size, BLOCK)
    if index_half is None:
        # About 1/512 of the device: room for ~10^5 chunk records per MiB
        # of chunks per GiB, and a compaction only every few thousand puts.
        index_half = min(MAX_INDEX_HALF, max(MIN_INDEX_HALF, dev_size // 512))
    index_half = align_up(index_half, bs)
    index_off = bs
    data_off = index_off + 2 * index_half
    data_size = (dev_size - data_off) // bs * bs
    if data_size < bs:
        raise InvalidArgumentError(
            28, f"device of {dev_size} bytes is too small for a store "
            f"(needs more than {data_off} bytes)"
            + ("; a new or empty file: pass size= to create it that large" if dev_size == 0
               else ""), target)
    return Superblock(bs, dev_size, set_id, dev_index, ndevs, index_off, index_half,
                      data_off, data_size, time.time_ns())


def new_generation() -> int:
    """A random first generation, so the segments of an earlier store on
    the same device can never pass for this one's."""
    return int.from_bytes(os.urandom(6), "little") + 1


def encode_index_header(generation: int) -> bytes:
    return seal(struct.pack(IDX_FMT, IDX_MAGIC, generation))


def decode_index_header(raw: bytes) -> int | None:
    """Generation of a valid index half header, else None."""
    magic, gen = struct.unpack_from(IDX_FMT, raw)
    if magic != IDX_MAGIC or not is_sealed(raw, struct.calcsize(IDX_FMT)):
        return None
    return int(gen)

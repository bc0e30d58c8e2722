"""On-namespace format of a shared pool.

::

    0          superblock (one 4 KiB block): pool name, set id, device index
    data_off   extents: each one header block, then the chunk's data padded
               to whole blocks

An extent's header names its key, length, CRC32C and version, so the index
can be re-derived from the namespaces alone (``fx100io shared-rebuild``).
It is written after the data and made durable with it, before the chunk is
published in the index.
"""

from __future__ import annotations

import re
import struct
import time
from dataclasses import dataclass

from fx100io.errors import InvalidArgumentError, NotAStoreError
from fx100io.store.core.keys import KEY_MAX
from fx100io.store.core.superblock import (
    BLOCK,
    align_up,
    is_sealed,
    seal,
    unseal_superblock,
)
from fx100io.store.core.superblock import SHARED_SB_MAGIC as SB_MAGIC

SB_FMT = "<16sII16sII QQ Q 64s"
VERSION = 1
HDR_MAGIC = b"FXSHEXT1"
HDR_FMT = "<8s16sIIQQII"
HDR_LEN = struct.calcsize(HDR_FMT)


# A pool's name is part of every Redis key of its index (``fx100io:{name}:...``)
# and of the pattern that finds them: glob characters (``* ? [ ] \\``) would
# make one pool's name match another's keys, and ``{ }`` would move the
# Cluster hash tag.  So: letters, digits, dot, underscore and hyphen.
NAME_RULE = "1 to 64 characters of A-Z a-z 0-9 . _ -, the first a letter or digit"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_name(name: object, given_for: str = "") -> str:
    """name if it is a valid pool name, else InvalidArgumentError naming the
    rule.  given_for: the option that names an existing pool (name=,
    --name); an older fx100io allowed other names, and the message then
    says how such a pool is opened all the same."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        hint = ""
        if given_for:
            hint = (f"; a pool that an older fx100io made under such a name is opened, and "
                    f"rebuilt, without {given_for} (its name is read from its namespaces)")
        raise InvalidArgumentError(22, f"a shared pool's name must be {NAME_RULE} (it is part "
                                   f"of the index's Redis keys), got {name!r}{hint}")
    return name


def extent_len(length: int) -> int:
    """Bytes an extent for a chunk of length bytes takes: header + data."""
    return BLOCK + align_up(length)


@dataclass
class Superblock:
    set_id: bytes
    dev_index: int
    ndevs: int
    data_off: int
    data_size: int
    created_ns: int
    name: str

    def encode(self) -> bytes:
        return seal(struct.pack(SB_FMT, SB_MAGIC, VERSION, BLOCK, self.set_id, self.dev_index,
                                self.ndevs, self.data_off, self.data_size, self.created_ns,
                                self.name.encode()[:64]))

    @classmethod
    def decode(cls, raw: bytes, target: str) -> Superblock:
        _, version, bs, set_id, idx, ndevs, doff, dsize, created, name = unseal_superblock(
            raw, SB_MAGIC, SB_FMT, target,
            absent="no shared fx100io pool on this namespace (pass create=True to format it)",
            corrupt="the pool's superblock is corrupt (checksum mismatch)")
        if version != VERSION or bs != BLOCK:
            raise NotAStoreError(22, f"shared pool format {version}/{bs} is not supported",
                                 target)
        return cls(set_id, idx, ndevs, doff, dsize, created, name.rstrip(b"\0").decode())


def plan(dev_size: int, dev_index: int, ndevs: int, set_id: bytes, name: str,
         target: str) -> Superblock:
    data_off = BLOCK
    data_size = (dev_size - data_off) // BLOCK * BLOCK
    if data_size < 2 * BLOCK:
        raise InvalidArgumentError(28, f"namespace of {dev_size} bytes is too small for a "
                                   "shared pool", target)
    return Superblock(set_id, dev_index, ndevs, data_off, data_size, time.time_ns(), name)


@dataclass
class ExtentHeader:
    set_id: bytes
    dev_index: int
    version: int
    length: int
    crc: int
    key: bytes

    def encode(self) -> bytes:
        return seal(struct.pack(HDR_FMT, HDR_MAGIC, self.set_id, self.dev_index, 0,
                                self.version, self.length, self.crc, len(self.key)) + self.key)

    @classmethod
    def decode(cls, raw: bytes | memoryview) -> ExtentHeader | None:
        """The header in a block, or None where the block holds none (or a
        torn or foreign one)."""
        raw = bytes(raw[:BLOCK])
        if raw[:8] != HDR_MAGIC:
            return None
        _, set_id, dev, _pad, ver, length, crc, klen = struct.unpack_from(HDR_FMT, raw)
        if not 0 < klen <= KEY_MAX or HDR_LEN + klen + 4 > BLOCK:
            return None
        end = HDR_LEN + klen
        if not is_sealed(raw, end):
            return None
        return cls(set_id, dev, ver, length, crc, raw[HDR_LEN:end])

"""Moving one chunk (or one piece of it) to or from its extent on a device,
its CRC32C computed in C as the bytes move.  Both stores place chunks this
way; only where the extent starts differs (the shared pool puts a header
block before the data)."""

from __future__ import annotations

import asyncio
from typing import Any

from fx100io import _core
from fx100io.device import Device
from fx100io.errors import error_from_errno
from fx100io.pool import aligned_array

READ, WRITE, FLUSH = _core.OP_READ, _core.OP_WRITE, _core.OP_FLUSH
CRC = _core.OP_CRC32C


def bounced_head(dev: Device, n: int) -> int:
    """Bytes of an n-byte chunk moved in place; the rest (under one block)
    goes through a bounce block on devices that move whole blocks only."""
    return n - n % dev.block_size if dev.aligned_only else n


def io_parts(dev: Device, op: int, off: int, mv: memoryview) -> tuple[list, Any]:
    """The I/Os that move mv at off, the first asking for its CRC32C
    (computed in C as its pieces land).  Devices that move whole blocks
    only (NVMe-oF) get the last partial block through a zero-padded
    bounce block: the extent owns that whole block, so padding is safe
    here.  For reads, fixup(total) copies the tail in and returns the
    bytes that belong to the chunk."""
    n = mv.nbytes
    head = bounced_head(dev, n)
    if head == n:
        return [(op | CRC, off, mv)], None
    bs = dev.block_size
    rem = n - head
    tail = aligned_array(bs)
    parts: list[tuple[int, int, Any]] = [(op | CRC, off, mv[:head])] if head else []
    parts.append((op, off + head, tail))
    if op == WRITE:
        tail[:rem] = mv[head:]
        return parts, None

    def fixup(total: int) -> int:
        if total < n:
            return total
        mv[head:] = tail[:rem].tobytes()  # under one block
        return n
    return parts, fixup


def chunk_crc(dev: Device, mv: memoryview, done: list) -> int:
    """The CRC32C of mv from the completions of its io_parts: the first
    part's comes from C; a bounced tail (under one block) is summed here
    over the bytes that belong to the chunk, and the two are joined."""
    n = mv.nbytes
    head = bounced_head(dev, n)
    if head == n:
        return done[0][2]  # type: ignore[no-any-return]
    tail_crc = _core.crc32c(mv[head:])
    return _core.crc32c_combine(done[0][2], tail_crc, n - head) if head else tail_crc


async def written(dev: Device, fs: list, parts: list) -> list:
    """The completions of the writes of parts (started as fs); raises the
    first write's error.  Shielded: a cancelled put still sees its writes
    end, and its cleanup waits for the rest."""
    done = []
    for f, (_op, off, _b) in zip(fs, parts):
        completion = await asyncio.shield(f)
        if completion[0] < 0:
            raise error_from_errno(-completion[0], f"{dev.target}: write chunk at {off}")
        done.append(completion)
    return done


async def landed(fs: list, fixup: Any) -> tuple[int, list]:
    """(bytes read or a negative errno, completions) of the reads fs of one
    view of io_parts.  Shielded: a cancel must not cancel the futures, whose
    I/O goes on regardless; the caller's cleanup waits for them instead."""
    done = [await asyncio.shield(f) for f in fs]
    res = 0
    for r, *_x in done:
        res = r if r < 0 or res < 0 else res + r
    if fixup is not None and res >= 0:
        res = fixup(res)
    return res, done

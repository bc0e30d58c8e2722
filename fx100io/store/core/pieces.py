"""A caller's chunk memory: one buffer, or a list or tuple of buffers that
hold the chunk piece after piece (a host page whose K and V lie apart).
The stores and the serving-engine adapters move chunks through these."""

from __future__ import annotations

from typing import Any

from fx100io import _core
from fx100io.errors import InvalidArgumentError, ReadOnlyBufferError
from fx100io.pool import aligned_array


def one_buffer(b: Any, writable: bool) -> memoryview:
    """b as a flat byte memoryview; writable: a chunk is read into it."""
    try:
        mv = memoryview(b)
    except TypeError:
        raise InvalidArgumentError(22, f"expected a buffer, got {type(b).__name__}") from None
    if writable and mv.readonly:
        raise ReadOnlyBufferError(30, "cannot read a chunk into a read-only buffer")
    if not mv.contiguous:
        raise InvalidArgumentError(22, "buffers must be contiguous")
    return mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv


def pieces(b: Any, writable: bool) -> list[memoryview]:
    """One chunk's memory as byte memoryviews: a buffer, or a list or tuple
    of buffers holding the chunk piece after piece."""
    return [one_buffer(one, writable) for one in (b if isinstance(b, (list, tuple)) else (b,))]


def nbytes(ps: list[memoryview]) -> int:
    return sum(p.nbytes for p in ps)


def placed_pieces(ps: list[memoryview]) -> list[tuple[int, memoryview]]:
    """(position in the chunk, piece) for every piece that holds bytes."""
    out, pos = [], 0
    for p in ps:
        if p.nbytes:
            out.append((pos, p))
        pos += p.nbytes
    return out


def limit(ps: list[memoryview], n: int) -> list[memoryview]:
    """The first n bytes of the pieces."""
    out = []
    for p in ps:
        if n <= 0:
            break
        out.append(p[:n])
        n -= min(n, p.nbytes)
    return out


def gather(ps: list[memoryview]) -> memoryview:
    """The pieces one after the other in one new aligned buffer."""
    out = aligned_array(nbytes(ps)).data
    pos = 0
    for p in ps:
        out[pos:pos + p.nbytes] = p
        pos += p.nbytes
    return out


def scatter(src: memoryview, ps: list[memoryview]) -> None:
    """src's bytes into the pieces, one after the other."""
    pos = 0
    for p in ps:
        p[:] = src[pos:pos + p.nbytes]
        pos += p.nbytes


def join_crc(crc: int, crc_len: int, piece_crc: int, piece_len: int) -> int:
    """The CRC32C of a run of bytes followed by a piece, from both CRCs."""
    return _core.crc32c_combine(crc, piece_crc, piece_len) if crc_len else piece_crc

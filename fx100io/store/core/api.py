"""The chunk store API that every store offers (ChunkStore,
SharedChunkStore), as a Protocol: what an adapter may rely on whichever
store it is given, and what tests/store/test_store_conformance.py checks of each."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class ChunkStoreAPI(Protocol):
    """Keys (str or bytes, 1 to KEY_MAX bytes) to chunks of bytes, each
    checked against its CRC32C when read: a mismatch is a miss, never data."""

    async def batch_put(self, keys: Sequence[Any], bufs: Sequence[Any], *,
                        priority: Any = None) -> None:
        """Store each buffer under its key, durably; replaces existing chunks.
        priority (fx100io.Priority or its name): "store" by default,
        "background" for work nobody waits for."""

    async def batch_get(self, keys: Sequence[Any], bufs: Sequence[Any], *,
                        priority: Any = None) -> list[bool]:
        """Fill each buffer with its key's chunk; True where found and intact.
        priority: "load" by default (it goes before stores), "background"
        for a prefetch."""

    async def batch_exists(self, keys: Iterable[Any]) -> int:
        """How many leading keys are present (the prefix hit count)."""

    async def delete(self, key: Any) -> bool:
        """Remove a chunk durably; False if it was not there."""

    def batch_put_blocking(self, keys: Sequence[Any], bufs: Sequence[Any], *,
                           priority: Any = None) -> None: ...

    def batch_get_blocking(self, keys: Sequence[Any], bufs: Sequence[Any], *,
                           priority: Any = None) -> list[bool]: ...

    def batch_exists_blocking(self, keys: Iterable[Any]) -> int: ...

    def delete_blocking(self, key: Any) -> bool: ...

    def contains(self, key: Any) -> bool: ...

    def chunk_size(self, key: Any) -> int | None: ...

    def keys(self) -> list[bytes]: ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...

    async def aclose(self) -> None: ...

    @property
    def closed(self) -> bool: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc: object) -> None: ...

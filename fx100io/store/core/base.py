"""What every store is made of besides its own I/O, written once: the
open/closed state, and the blocking twins and context managers:
each ``*_blocking`` method runs its async twin to the end through the
store's runner (``_run_blocking``): the local store's per-thread loop
(fx100io.store.core.loop), the shared store's loop thread of its own.  A
blocking call interrupted (Ctrl-C) is cancelled and run to its end by that
runner before the interrupt goes on."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any, TypeVar, cast

from fx100io.errors import StoreClosedError

S = TypeVar("S", bound="StoreBase")


class StoreBase(ABC):
    """Base of a store: it gives the runner and the async API, and gets the
    blocking twins and the context managers.  It sets _closed (False until
    close())."""

    _closed: bool

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(9, f"{type(self).__name__} is closed")

    @abstractmethod
    def _run_blocking(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run coro to its end from a thread that runs no event loop."""

    @abstractmethod
    async def batch_put(self, keys: Sequence[Any], bufs: Sequence[Any], *,
                        priority: Any = None) -> None: ...

    @abstractmethod
    async def batch_get(self, keys: Sequence[Any], bufs: Sequence[Any], *,
                        priority: Any = None) -> list[bool]: ...

    @abstractmethod
    async def batch_exists(self, keys: Iterable[Any]) -> int: ...

    @abstractmethod
    async def delete(self, key: Any) -> bool: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    async def aclose(self) -> None: ...

    def _get_to_the_end(self, keys: Sequence[Any], bufs: Sequence[Any], priority: Any = None
                        ) -> Coroutine[Any, Any, list[bool]]:
        """The coroutine batch_get_blocking runs: batch_get, unless a get
        leaves work behind it that a blocking call must not (the shared
        store's unpinning)."""
        return self.batch_get(keys, bufs, priority=priority)

    def batch_put_blocking(self, keys: Sequence[Any], bufs: Sequence[Any], *,
                           priority: Any = None) -> None:
        self._run_blocking(self.batch_put(keys, bufs, priority=priority))

    def batch_get_blocking(self, keys: Sequence[Any], bufs: Sequence[Any], *,
                           priority: Any = None) -> list[bool]:
        return cast(list[bool], self._run_blocking(self._get_to_the_end(keys, bufs, priority)))

    def batch_exists_blocking(self, keys: Iterable[Any]) -> int:
        return cast(int, self._run_blocking(self.batch_exists(keys)))

    def delete_blocking(self, key: Any) -> bool:
        return cast(bool, self._run_blocking(self.delete(key)))

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self: S) -> S:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

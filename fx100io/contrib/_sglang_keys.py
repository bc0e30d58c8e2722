"""The store keys of fx100io's SGLang HiCache backend (no sglang import: checked alone).

SGLang's page hashes carry no rank, model or pool shape, so every store key spells out
all of them, each field escaped by :mod:`._keys` (one-to-one: no two scopes, pools or
page keys share a store key, whatever the strings hold)::

    sgl2/<namespace>/<model>/<ranks>/page/<layout>/<dtype>/p<page size>/<geometry>/<key>
    sgl2/<namespace>/<model>/<ranks>/flat/<key>

The geometry (layers, heads, head dims, the sizes of a page's pieces) is written out, not
hashed, so the store key is the whole engine key: a chunk is only ever found under the
key it was written with. A key longer than the store's limit (1024 bytes) is refused by
the store (the page is not kept, its read is a miss), never shortened.

``sgl1`` keys (before) escaped names with ``quote()``, which leaves ``~`` as it is and
stood ``~`` for an empty name, so the namespaces "" and "~" shared one scope; their
chunks are no longer read.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import _keys

VERSION = "sgl2"


def scope(namespace: str, model_name: str | None, ranks: str) -> str:
    """What every key of one backend instance starts with (then a ``/``)."""
    return _keys.join([VERSION, namespace, model_name or "", ranks])


def geometry(fields: Sequence[tuple[str, object]], page_sizes: Sequence[int]) -> str:
    """The host pool's shape as text: ``name=value`` pairs, then the piece sizes."""
    return ",".join(f"{k}={v}" for k, v in fields) + ";" + ",".join(map(str, page_sizes))


def page_prefix(scope_text: str, layout: str, dtype: str, page_size: int, geom: str) -> str:
    return scope_text + _keys.SEP + _keys.join(["page", layout, dtype, f"p{page_size}", geom])


def page_key(prefix: str, key: str) -> str:
    return prefix + _keys.SEP + _keys.escape(key)


def flat_key(scope_text: str, key: str) -> str:
    # the tensor API moves a tensor SGLang shaped; kept apart from pages
    return scope_text + _keys.SEP + _keys.join(["flat", key])

"""How an engine's key becomes a store key, one-to-one, for every adapter.

Every adapter turns a key of its engine (LMCache's CacheEngineKey or ObjectKey, an SGLang
page hash and its scope, a vLLM OffloadKey and its namespace) into a store key. That
mapping must be injective: two keys the engine keeps apart must never share a store key,
or one request is served another's KV. Joining fields with a separator is only
injective if no field can contain the separator, which tag values, model names and
namespaces (user strings) can. So every field goes through :func:`escape`, which
percent-escapes the separator and the escape character itself, and fields are joined
with ``/``: splitting at ``/`` and unescaping gives the fields back, so distinct field
lists give distinct texts.

No engine import here: the mappings can be checked on their own.
"""

from __future__ import annotations

from collections.abc import Iterable

SEP = "/"


def escape(field: str) -> str:
    """``field`` with ``%`` and ``/`` percent-escaped (``%`` first: the escape character
    must itself be escaped, or ``%2F`` in a field would read back as ``/``)."""
    return field.replace("%", "%25").replace("/", "%2F")


def unescape(text: str) -> str:
    # ``%25`` last: ``%252F`` is the field ``%2F``, not ``/``
    return text.replace("%2F", "/").replace("%25", "%")


def join(fields: Iterable[str]) -> str:
    """The fields, each escaped, separated by ``/``: one text per field list."""
    return SEP.join(escape(f) for f in fields)


def split(text: str) -> list[str]:
    """The fields :func:`join` was given."""
    return [unescape(f) for f in text.split(SEP)]


def typed(value: object) -> str:
    """A field for a value that may be of several types, the type in front, so that the
    int 1 and the string "1" (different keys to an engine that compares with ==) stay
    apart. Values of other types fall back to their repr."""
    if isinstance(value, bool):
        return f"?{int(value)}"
    if isinstance(value, int):
        return f"i{value}"
    if isinstance(value, str):
        return f"s{value}"
    if isinstance(value, (bytes, bytearray)):
        return f"b{bytes(value).hex()}"
    if value is None:
        return "n"
    return f"r{type(value).__name__}:{value!r}"

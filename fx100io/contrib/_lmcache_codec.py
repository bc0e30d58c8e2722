"""How LMCache chunks are named and described inside a ChunkStore.

The store keeps raw bytes under string keys. Two store keys back one LMCache key:

* the data key holds the chunk's bytes exactly as they sit in the MemoryObj, so a
  read can land straight in the buffer LMCache allocated;
* the record key holds a small record (shape, dtype, format, ...) that a new process
  needs to allocate that buffer before reading, since LMCache allocates by shape.

Keeping the record out of the data chunk is what makes the zero-copy read possible:
a header inside the chunk would have to be read first or stripped by a copy.

No lmcache import at module level: torch and the MemoryFormat enum come in as
arguments, so the naming rules can be tested on their own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
from collections.abc import Sequence
from typing import Any

from fx100io.errors import Fx100ioValueError

from . import _keys

# Version tag in every store key: a future incompatible layout gets new names
# instead of misreading old chunks. lmc1 named keys by to_string() (ambiguous, see
# lmcache_key_text); its chunks are not read any more (misses, evicted as space is needed).
NAMESPACE = "lmc2"
MAX_STORE_KEY = 1024
# Long LMCache keys (many request tags) are hashed so they fit the store's limit;
# the record keeps the full key, so a hash collision is detected rather than served.
_HASH_OVER = 900

RECORD_MAGIC = b"FXLMC"
RECORD_VERSION = 1
_HEADER = struct.Struct("<5sBI")  # magic, version, payload length
MAX_RECORD = 1 << 20


class RecordError(Fx100ioValueError):
    """A stored record is damaged or belongs to another key."""


def lmcache_key_text(key: Any) -> str:
    """A unique, stable text for an LMCache key: every field that LMCache's ``==``
    compares, escaped and joined one-to-one (:mod:`._keys`).

    ``to_string()`` is not that: it joins the tags as ``k%v`` with ``@``, so the tags
    {user: "alice@b%c"} and {user: "alice", b: "c"} read the same, and it renders the
    int hash 0x1234 and the bytes hash b"\\x12\\x34" alike. Here each field stands
    alone, typed where LMCache's ``==`` tells types apart, and the key's class comes
    first (a layer key has one more field).
    """
    fields = [type(key).__name__, _keys.typed(key.model_name), _keys.typed(key.world_size),
              _keys.typed(key.worker_id), _keys.typed(key.chunk_hash), str(key.dtype)]
    if hasattr(key, "layer_id"):
        fields.append(_keys.typed(key.layer_id))
    tags = getattr(key, "tags", None)
    if tags is None:
        fields.append("T-")
    else:
        fields.append(f"T{len(tags)}")
        for name, value in tags:
            fields += [_keys.typed(name), _keys.typed(value)]
    return _keys.join(fields)


def _name(kind: str, text: str) -> str:
    raw = text.encode("utf-8")
    if len(raw) > _HASH_OVER:
        # "#" never follows the kind in a plain name (a "/" does): the two never meet
        return f"{NAMESPACE}/{kind}#" + hashlib.blake2b(raw, digest_size=32).hexdigest()
    name = f"{NAMESPACE}/{kind}/{text}"
    assert len(name.encode("utf-8")) <= MAX_STORE_KEY
    return name


def data_key(key_text: str) -> str:
    return _name("d", key_text)


def record_key(key_text: str) -> str:
    return _name("r", key_text)


@dataclasses.dataclass(frozen=True)
class ChunkRecord:
    """What it takes to allocate a MemoryObj for a stored chunk and check the read."""

    key_text: str
    nbytes: int
    fmt: str  # MemoryFormat member name
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]  # torch dtype names without the "torch." prefix
    cached_positions: tuple[int, ...] | None = None
    # Set on a record just read from the store (not stored, not compared): its chunk
    # needs no second record read in the same load.
    fresh: bool = dataclasses.field(default=False, compare=False)

    def encode(self) -> bytes:
        payload = json.dumps(
            {
                "key": self.key_text,
                "nbytes": self.nbytes,
                "fmt": self.fmt,
                "shapes": [list(s) for s in self.shapes],
                "dtypes": list(self.dtypes),
                "cached_positions": None if self.cached_positions is None else list(self.cached_positions),
            },
            separators=(",", ":"),
        ).encode("utf-8")
        return _HEADER.pack(RECORD_MAGIC, RECORD_VERSION, len(payload)) + payload

    @classmethod
    def decode(cls, blob: bytes | bytearray | memoryview, expect_key_text: str) -> ChunkRecord:
        blob = bytes(blob)
        if len(blob) < _HEADER.size:
            raise RecordError("record shorter than its header")
        magic, version, length = _HEADER.unpack_from(blob)
        if magic != RECORD_MAGIC:
            raise RecordError("not an fx100io LMCache record")
        if version != RECORD_VERSION:
            raise RecordError(f"record version {version}, this plugin reads {RECORD_VERSION}")
        if _HEADER.size + length > len(blob):
            raise RecordError("record truncated")
        try:
            doc = json.loads(blob[_HEADER.size : _HEADER.size + length])
            record = cls(
                key_text=str(doc["key"]),
                nbytes=int(doc["nbytes"]),
                fmt=str(doc["fmt"]),
                shapes=tuple(tuple(int(d) for d in s) for s in doc["shapes"]),
                dtypes=tuple(str(d) for d in doc["dtypes"]),
                cached_positions=None
                if doc.get("cached_positions") is None
                else tuple(int(p) for p in doc["cached_positions"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise RecordError(f"record payload unreadable: {exc}") from None
        if record.key_text != expect_key_text:
            raise RecordError(f"record belongs to {record.key_text!r}, not {expect_key_text!r}")
        if not record.shapes or len(record.shapes) != len(record.dtypes) or record.nbytes < 0:
            raise RecordError("record shapes/dtypes inconsistent")
        return record


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(torch: Any, name: str) -> Any:
    """Only real torch dtypes come back: a record must not name arbitrary attributes."""
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise RecordError(f"record names unknown dtype {name!r}")
    return value


def record_for(key_text: str, memory_obj: Any) -> ChunkRecord:
    """Describe a MemoryObj about to be stored."""
    meta = memory_obj.metadata
    shapes: Sequence[Any] = meta.shapes if meta.shapes is not None else [meta.shape]
    dtypes: Sequence[Any] = meta.dtypes if meta.dtypes is not None else [meta.dtype]
    positions = meta.cached_positions
    return ChunkRecord(
        key_text=key_text,
        nbytes=int(memory_obj.get_size()),
        fmt=meta.fmt.name,
        shapes=tuple(tuple(int(d) for d in s) for s in shapes),
        dtypes=tuple(dtype_name(d) for d in dtypes),
        cached_positions=None if positions is None else tuple(int(p) for p in positions.tolist()),
    )

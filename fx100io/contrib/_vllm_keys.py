"""The store keys of fx100io's vLLM tier (no vllm import: checked alone).

vLLM's OffloadKey names token content only (a block hash and a group index); the bytes
of a chunk also depend on the model, its KV dtype, the cache groups and the parallel
layout. All of that goes into a namespace, written as canonical JSON (one text per set
of values, whatever the strings hold) and folded into a 16-byte digest, since the layer
names alone can outgrow the store's 1024-byte keys::

    vllm:<namespace digest, hex>:<OffloadKey bytes, hex>

Both parts are fixed-alphabet hex behind a fixed prefix, so distinct (namespace, key)
pairs give distinct store keys unless two namespaces share a 128-bit digest.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def namespace(offloading_spec: Any, chunk_bytes: int, extra: str | None = None) -> bytes:
    """What makes two vLLM instances' chunks interchangeable, as a 16-byte digest.

    An OffloadKey names token content only; the bytes of a chunk also depend on the
    model, its KV dtype, the cache groups and the parallel layout, so all of it (and
    the chunk's size) goes into every store key.
    """
    cfg = getattr(offloading_spec, "config", None)
    fields: dict[str, Any] = {"chunk_bytes": int(chunk_bytes)}
    if cfg is not None:
        par = cfg.parallel
        fields.update(
            model=str(cfg.model.name),
            dtype=str(cfg.model.dtype),
            tokens_per_hash=int(cfg.cache.tokens_per_hash),
            blocks_per_chunk=int(cfg.cache.blocks_per_chunk),
            groups=[[int(g.tokens_per_block), list(g.layer_names)] for g in cfg.groups],
            parallel=[int(par.tp_size), int(par.pp_size), int(par.pcp_size),
                      int(par.dcp_size), int(par.world_size), int(par.rank)],
            replicated_layout=bool(getattr(cfg, "replicated_layout", False)),
            canonical_layout=bool(getattr(cfg, "canonical_layout", False)),
            kv_cache_layout=getattr(cfg, "kv_cache_layout", None),
        )
    if extra is not None:
        # What vLLM does not say: the weights' revision, a fine-tune, a quantisation.
        fields["namespace"] = extra
    raw = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(raw).digest()[:16]


def prefix(digest: bytes) -> bytes:
    """What every store key of one namespace starts with."""
    return b"vllm:" + digest.hex().encode() + b":"


def chunk_key(prefix_bytes: bytes, key: bytes) -> bytes:
    return prefix_bytes + bytes(key).hex().encode()

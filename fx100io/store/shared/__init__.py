"""SharedChunkStore: one pool of chunks on shared namespaces, many hosts.

Every host opens the same namespaces (files, block devices, NVMe-oF) and
the same Redis index.  One job per module:

- ``format``: the on-namespace format (superblock, per-extent headers);
- ``lua``: the index's atomic scripts (allocation, publication, reader
  pins, eviction, lease reclaim) -- every rule about the index is there;
- ``index_url``: the index= URL (one server, Sentinel, Cluster) parsed;
- ``index``: the Redis client side: one client per event loop, short
  timeouts, fail fast while Redis is unreachable, WAIT for replicas;
- ``store``: the SharedChunkStore facade and the durability protocol;
- ``rebuild``: re-deriving the index from the extent headers
  (``fx100io shared-rebuild``).
"""

from fx100io.store.shared.index import (
    IndexLostError,
    IndexNotReplicatedError,
    IndexUnavailableError,
)
from fx100io.store.shared.store import SharedChunkStore

__all__ = ["IndexLostError", "IndexNotReplicatedError", "IndexUnavailableError",
           "SharedChunkStore"]

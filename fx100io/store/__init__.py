"""The chunk store: keys to CRC-checked extents on one or more devices.

One job per module:

- ``chunkstore``: the ChunkStore facade (put, get, delete, stats) and the
  durability protocol it follows;
- ``layout``: the on-device format (superblock, index half headers);
- ``index_log``: the index log of one device: commit, compaction, replay;
- ``space``: extents, capacity and LRU eviction of one device;
- ``flock``: one store per device;
- ``loop``: the per-thread event loop of the blocking twins.
"""

from fx100io.store.chunkstore import KEY_MAX, ChunkStore, normalize_key
from fx100io.store.index_log import SEGMENT_RECORDS, IndexLog
from fx100io.store.loop import run_blocking
from fx100io.store.space import Entry, Member

__all__ = ["KEY_MAX", "SEGMENT_RECORDS", "ChunkStore", "Entry", "IndexLog", "Member",
           "normalize_key", "run_blocking"]

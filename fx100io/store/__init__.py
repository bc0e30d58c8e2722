"""The chunk stores: keys to CRC-checked extents on one or more devices.

Three packages side by side:

- ``core``: what every store shares: the store API (a Protocol), the
  blocking twins and context managers written once, keys, caller buffers
  and their pieces, extent I/O with its CRC32C, the sealed-block codec of
  superblocks and headers, the event loop of the blocking twins, and the
  settle of I/O a cancelled call started;
- ``local``: ChunkStore, one process's store: its on-device layout, its
  index log (commit, compaction, replay) and its space (extents, LRU);
- ``shared``: SharedChunkStore, one pool on namespaces that many hosts
  open, indexed in Redis (needs the redis package; not imported here).

``flock`` holds one ChunkStore per device.
"""

from fx100io.store.core.keys import KEY_MAX, normalize_key
from fx100io.store.core.loop import run_blocking
from fx100io.store.local.chunk_store import ChunkStore
from fx100io.store.local.index_log import SEGMENT_RECORDS, IndexLog
from fx100io.store.local.space import Entry, Member

__all__ = ["KEY_MAX", "SEGMENT_RECORDS", "ChunkStore", "Entry", "IndexLog", "Member",
           "normalize_key", "run_blocking"]

"""ChunkStore, one process's store on its own devices.  One job per module:

- ``chunk_store``: the ChunkStore facade (put, get, delete, stats) and the
  durability protocol it follows;
- ``layout``: the on-device format (superblock, index half headers);
- ``index_log``: the index log of one device: commit, compaction, replay;
- ``space``: extents, capacity and LRU eviction of one device.
"""

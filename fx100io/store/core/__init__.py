"""What the local and the shared chunk store share, written once.

- ``api``: the store API as a Protocol, which every store satisfies;
- ``base``: the base class of a store: the blocking twins and context
  managers, derived from the async methods through each store's runner,
  and the open/closed state;
- ``keys``: key normalisation and its limit;
- ``pieces``: a caller's buffers as pieces, gathered, scattered, CRC-joined;
- ``extent_io``: moving one chunk to or from an extent, its CRC32C
  computed in C as it moves;
- ``sealed``: the sealed-block codec (body, CRC32C, zero padding) of
  superblocks and headers, the block size and the two stores' magics;
- ``loop``: the per-thread event loop of the local store's blocking twins;
- ``settle``: waiting out I/O that a cancelled call started.
"""

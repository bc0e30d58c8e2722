"""Re-derive a shared pool's index from the extent headers on its
namespaces, after Redis lost it (``fx100io shared-rebuild``).

Every extent begins with a header (key, length, CRC32C, version) written
before the chunk was published.  The rebuild reads each namespace once,
keeps the newest version of each key among extents that do not overlap a
newer one and whose data still matches its CRC32C (a torn, unpublished or
partly reused extent fails it), and installs the index in one Redis
transaction; everything else is free space.

Whenever an extent leaves the index -- its chunk deleted, replaced by a
newer put of the key, or evicted -- it is held (P:tomb) until the host
that took it out erased its header, and only then freed; so a rebuild
brings back neither a deleted chunk nor an older value of a key.  What it
can still bring back, each time only while the extent's bytes were not
overwritten since:

- a chunk whose header a host could not erase: it died (or its device
  failed) between taking the extent out of the index and erasing the
  header, and the hold expired (lease_s); the value may be older than a
  later value of the key that was deleted since;
- a put that wrote its data and header but was never published (its host
  died, or Redis failed, between the flush and the publication): a value
  the caller was told had failed;
- with --no-verify, an extent whose header survived but whose data was
  partly overwritten.

Of two extents of a key, the one with the higher version wins.  Versions
are never below Redis's clock (microseconds) and the rebuild sets the
counter above every version on the namespaces, so a counter that Redis
rolled back (an everysec AOF losing its last second, a failover) resumes
above the versions it lost as long as the Redis hosts' clocks agree to
within that outage.

It refuses to replace the index of another pool of the same name, or a
create's claim on the name while that create is under way (pass force).
A name given (--name) must follow the pool-name rule (format.NAME_RULE); a
pool that an older fx100io made under a name outside it is rebuilt without
--name (the name comes from its superblocks, and every key pattern is
escaped).  A create that died leaves its claim on the name: the rebuild
replaces it once the claim's deadline passed.  Run it while no host is
writing (hosts that are running see "index lost" until it ends, and keep
working after).
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import time
from typing import Any

from fx100io import _core
from fx100io.device import Device, open_device
from fx100io.pool import aligned_array
from fx100io.store.shared import format as fmt
from fx100io.store.shared.index import RedisIndex
from fx100io.store.shared.store import DEFAULT_INDEX, Namespace, SharedChunkStore

SCAN_PIECE = 8 << 20


def scan(ns: Namespace) -> list[tuple[int, fmt.ExtentHeader]]:
    """(offset, header) of every valid header of this pool on ns."""
    out = []
    sb = ns.sb
    end = sb.data_off + sb.data_size
    buf = aligned_array(SCAN_PIECE)
    pos = sb.data_off
    while pos < end:
        n = min(SCAN_PIECE, end - pos)
        view = buf[:n]
        got = ns.dev.read_into_blocking(pos, view)
        raw = view[:got].tobytes()
        i = raw.find(fmt.HDR_MAGIC)
        while i >= 0:
            if i % fmt.BLOCK == 0:
                h = fmt.ExtentHeader.decode(raw[i:i + fmt.BLOCK])
                if h is not None and h.set_id == sb.set_id and h.dev_index == sb.dev_index:
                    out.append((pos + i, h))
            i = raw.find(fmt.HDR_MAGIC, i + 1)
        pos += n
    return out


def _data_ok(dev: Device, off: int, h: fmt.ExtentHeader) -> bool:
    if h.length == 0:
        return h.crc == 0
    buf = aligned_array(fmt.align_up(h.length))
    try:
        got = dev.read_into_blocking(off + fmt.BLOCK, buf)
    except OSError:
        return False
    return got >= h.length and _core.crc32c(buf[:h.length]) == h.crc


def rebuild(uris: list[str], index: str = DEFAULT_INDEX, *, name: str | None = None,
            capacity: int | None = None, verify: bool = True, force: bool = False,
            **opts: Any) -> dict[str, Any]:
    """Scan the namespaces and install the index they imply; returns a
    report (chunks, bytes, headers seen, rejected)."""
    if name is not None:
        fmt.check_name(name, given_for="--name")
    devices = [open_device(u, **opts) for u in uris]
    try:
        nss = SharedChunkStore._load(devices, list(uris), name)
        newest: dict[bytes, tuple[int, int, int, fmt.ExtentHeader]] = {}
        seen = rejected = top = 0
        free_lists: list[list[tuple[int, int]]] = []
        used: list[int] = []
        t0 = time.monotonic()
        kept_by_ns: list[list[tuple[int, int, fmt.ExtentHeader]]] = []
        for ns in nss:
            cands = scan(ns)
            seen += len(cands)
            top = max([top, *(h.version for _o, h in cands)])
            starts: list[int] = []
            ends: list[int] = []
            kept: list[tuple[int, int, fmt.ExtentHeader]] = []
            end = ns.sb.data_off + ns.sb.data_size
            for off, h in sorted(cands, key=lambda c: c[1].version, reverse=True):
                ext = fmt.extent_len(h.length)
                j = bisect.bisect_left(starts, off)
                overlaps = ((j < len(starts) and starts[j] < off + ext)
                            or (j > 0 and ends[j - 1] > off))
                old = newest.get(h.key)
                if (off + ext > end or overlaps or (old is not None and old[3].version > h.version)
                        or (verify and not _data_ok(ns.dev, off, h))):
                    rejected += 1
                    continue
                starts.insert(j, off)
                ends.insert(j, off + ext)
                kept.append((off, ext, h))
                newest[h.key] = (ns.index, off, ext, h)
            kept_by_ns.append(kept)
        for ns, kept in zip(nss, kept_by_ns):
            live = sorted((off, ext) for off, ext, h in kept
                          if newest.get(h.key, (None, None, None, None))[1] == off
                          and newest[h.key][0] == ns.index)
            free, pos = [], ns.sb.data_off
            for off, ext in live:
                if off > pos:
                    free.append((pos, off - pos))
                pos = off + ext
            if pos < ns.sb.data_off + ns.sb.data_size:
                free.append((pos, ns.sb.data_off + ns.sb.data_size - pos))
            free_lists.append(free)
            used.append(sum(ext for _o, ext in live))
        entries = [(key, f"{d} {off} {ext} {h.length} {h.crc} {h.version}", h.version)
                   for key, (d, off, ext, h) in newest.items()]
        per = None if capacity is None else capacity // len(nss)
        caps = [ns.sb.data_size if per is None else min(per, ns.sb.data_size) for ns in nss]
        idx = RedisIndex(index, nss[0].sb.name, nss[0].sb.set_id, timeout=5.0)
        try:
            idx.check_policy()
            idx.install(len(nss), caps, free_lists, entries, used, ver=top + 1,
                        replace="any" if force else "same")
        finally:
            idx.close()
        return dict(chunks=len(entries), bytes=sum(h.length for *_x, h in newest.values()),
                    headers=seen, rejected=rejected, seconds=round(time.monotonic() - t0, 3))
    finally:
        for d in devices:
            d.close()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="fx100io shared-rebuild",
        description="Re-derive a shared pool's Redis index from the extent headers on its "
        "namespaces (after Redis lost its data). Replaces whatever index of the pool Redis "
        "holds; run it while no host writes.")
    p.add_argument("namespaces", nargs="+", help="every namespace URI of the pool")
    p.add_argument("--index", default=DEFAULT_INDEX, help="redis://host:port/db, redis+sentinel://s1:p1,s2:p2/service/db or "
                   "redis+cluster://n1:p1,n2:p2/")
    p.add_argument("--name", help="the pool's name (checked against the namespaces); "
                   "leave it out for a pool named by an older fx100io outside today's rule")
    p.add_argument("--capacity", type=int, help="bytes of extents kept, whole pool")
    p.add_argument("--no-verify", action="store_true",
                   help="trust headers without reading the data to check its CRC32C")
    p.add_argument("--force", action="store_true",
                   help="replace the index of another pool of the same name in Redis")
    a = p.parse_args(argv)
    report = rebuild(a.namespaces, a.index, name=a.name, capacity=a.capacity,
                     verify=not a.no_verify, force=a.force)
    json.dump(report, sys.stdout)
    print()
    return 0

"""fio's "Disk stats": block-layer counters of the disks under the targets.

/proc/diskstats deltas over the run, for the whole disk a file lives on (or
the block device itself).  They count every I/O on that disk, ours and
anyone else's, which is what makes them useful: they show what actually
reached the device (merges, queueing, utilisation), not what we submitted.
Remote targets (nvme+tcp://) have no local disk and get no entry.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from .targets import local_path


def disk_of(path: str) -> str | None:
    """Kernel name of the whole disk holding ``path`` (vda, nvme0n1, loop3)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    dev = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
    sys_path = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    try:
        real = os.path.realpath(sys_path)
    except OSError:
        return None
    if not os.path.exists(real):
        return None  # tmpfs, overlay and other filesystems without a disk
    if os.path.exists(os.path.join(real, "partition")):
        real = os.path.dirname(real)  # fio reports the disk, not the partition
    return os.path.basename(real)


def disks_of(filenames: list[str]) -> list[str]:
    out: list[str] = []
    for f in filenames:
        path = local_path(f)
        name = disk_of(path) if path else None
        if name and name not in out:
            out.append(name)
    return out


def read_diskstats() -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 14:
                    out[parts[2]] = [int(x) for x in parts[3:14]]
    except OSError:
        pass
    return out


@dataclass
class DiskUtil:
    name: str
    read_ios: int
    write_ios: int
    read_merges: int
    write_merges: int
    read_ticks: int
    write_ticks: int
    in_queue: int
    util: float
    # Not in fio's entry: bytes the disk moved (sectors are 512 bytes in
    # /proc/diskstats whatever the device's block size).
    read_bytes: int = 0
    write_bytes: int = 0

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def diskutil_between(
    names: list[str], a: dict[str, list[int]], b: dict[str, list[int]], elapsed_ms: float
) -> list[DiskUtil]:
    out = []
    for name in names:
        if name not in a or name not in b:
            continue
        # Fields after the name: reads, read merges, sectors read, ms reading,
        # writes, write merges, sectors written, ms writing, in flight,
        # ms doing I/O, weighted ms.
        d = [y - x for x, y in zip(a[name], b[name])]
        util = min(100.0, 100.0 * d[9] / elapsed_ms) if elapsed_ms > 0 else 0.0
        out.append(DiskUtil(name, d[0], d[4], d[1], d[5], d[3], d[7], d[10], util, d[2] * 512, d[6] * 512))
    return out

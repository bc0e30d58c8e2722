"""Opening a job's target through fx100io, the way fio prepares its files.

fio creates a missing file, extends a short one, "lays out" (writes) the
region before a read job so reads return real data, and drops the file's
page cache before buffered jobs (invalidate=1).  We do the same so that a job
file means the same work under both tools.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any

from fx100io.uri_redact import redact

from .errors import BenchError
from .options import Job

REMOTE_SCHEMES = ("nvme+tcp://", "nvme+rdma://")


def local_path(filename: str) -> str | None:
    """Filesystem path of a local target, None for a remote URI."""
    if filename.startswith("file://"):
        return filename[len("file://") :]
    if "://" in filename:
        return None
    return filename


def core() -> Any:
    """The fx100io core module, or a clear error if it is not built."""
    try:
        import fx100io

        fx100io.open_device  # noqa: B018 - probe that the core API is there
        return fx100io
    except (ImportError, AttributeError) as e:
        raise BenchError(
            f"the fx100io core is not available ({e}); build it with 'pip install -e .' first"
        ) from None


@dataclass
class Target:
    device: Any
    uri: str
    path: str | None  # local file or block device, else None
    is_blockdev: bool
    created: bool  # we made or grew it, so a read job must lay it out first
    size: int
    block_size: int
    region_start: int
    region_len: int  # a multiple of bs

    def close(self) -> None:
        self.device.close()


def _needed_bytes(job: Job) -> int | None:
    """Bytes the target must have when --size/--offset are absolute."""
    if isinstance(job.size, int) and isinstance(job.offset, int):
        return job.offset + job.size
    return None


def open_target(job: Job, queue_depth: int) -> Target:
    fx = core()
    path = local_path(job.filename)
    created = False
    is_blockdev = False
    kwargs: dict[str, Any] = {"direct": job.direct, "queue_depth": queue_depth}
    if path is not None:
        kwargs["engine"] = job.ioengine
        needed = _needed_bytes(job)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        except OSError as e:
            raise BenchError(f"job {job.name!r}: --filename={job.filename}: {e.strerror}") from None
        if st is None:
            if needed is None:
                raise BenchError(
                    f"job {job.name!r}: {job.filename} does not exist; give --size (in bytes, not %) to create it"
                )
            kwargs.update(create=True, size=needed)
            created = True
        elif stat.S_ISBLK(st.st_mode):
            is_blockdev = True
        elif stat.S_ISREG(st.st_mode):
            if needed is not None and st.st_size < needed:
                # fio extends a short file (and lays it out for reads).
                try:
                    os.truncate(path, needed)
                except OSError as e:
                    raise BenchError(
                        f"job {job.name!r}: cannot extend {path} to {needed} bytes: {e.strerror}"
                    ) from None
                created = True
        else:
            raise BenchError(
                f"job {job.name!r}: --filename={job.filename} is neither a file nor a block device"
            )
    try:
        device = fx.open_device(job.filename, **kwargs)
    except OSError as e:
        raise BenchError(
            f"job {job.name!r}: cannot open {redact(job.filename)} with ioengine={job.ioengine}: {e}"
        ) from None

    try:
        size = int(device.size)
        block_size = int(device.block_size)
        start, length = resolve_region(job, size, block_size)
    except BaseException:
        device.close()
        raise
    return Target(device, redact(job.filename), path, is_blockdev, created, size, block_size, start,
                  length)


def resolve_region(job: Job, dev_size: int, block_size: int) -> tuple[int, int]:
    """(start, length) of the job's region, checked against the target."""
    offset = int(dev_size * job.offset) if isinstance(job.offset, float) else job.offset
    if isinstance(job.offset, float):
        offset -= offset % job.bs  # a percentage lands on a block boundary
    if job.size is None:
        size = dev_size - offset
    elif isinstance(job.size, float):
        size = int(dev_size * job.size)
    else:
        size = job.size
    if offset >= dev_size:
        raise BenchError(
            f"job {job.name!r}: --offset={offset} is at or past the end of {job.filename} ({dev_size} bytes)"
        )
    if offset + size > dev_size:
        raise BenchError(
            f"job {job.name!r}: --offset + --size = {offset + size} bytes runs past the end of "
            f"{job.filename} ({dev_size} bytes)"
        )
    if job.direct or job.ioengine in ("nvme+tcp", "nvme+rdma"):
        if job.bs % block_size:
            raise BenchError(
                f"--bs={job.bs}: must be a multiple of the target's block size {block_size} for direct I/O"
            )
        if offset % block_size:
            raise BenchError(
                f"--offset={offset}: must be a multiple of the target's block size {block_size} for direct I/O"
            )
    length = size - size % job.bs
    if length == 0:
        raise BenchError(f"job {job.name!r}: --size={size} is smaller than --bs={job.bs}; nothing to do")
    return offset, length


def drop_page_cache(path: str) -> None:
    """fio's invalidate=1: start a buffered job from a cold page cache."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass  # best effort, as in fio: some files (pipes, some FUSE) refuse
    finally:
        os.close(fd)

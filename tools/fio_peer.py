"""fio as the peer of the benchmark scripts in this folder: sequential O_DIRECT
reads through io_uring with registered buffers and files.

Registered, as the engines under test use them: without them fio pins and
faults in a fresh buffer per I/O, which for 32 MiB reads on a RAM-backed
device alone costs it 3x at iodepth 32 and would make a poor yardstick.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess


def write_random_file(path: str, size: int) -> None:
    """Real bytes on the device, written and synced just before fio reads them, as the
    engines under test read chunks they stored: holes or unwritten extents would read
    without I/O, and bytes another run just read may come from a cache below us."""
    block = os.urandom(16 << 20)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            left -= f.write(block[: min(left, len(block))])
        f.flush()
        os.fsync(f.fileno())


def fio_read(path: str, size: int, bs: str | int, iodepth: int, offset: int = 0) -> tuple[int, int]:
    """(bytes read, bytes per second) of one fio sequential read job, by fio's own clock."""
    moved, rate, _cpu = fio_read_cpu(path, size, bs, iodepth, offset)
    return moved, rate


def fio_read_cpu(path: str, size: int, bs: str | int, iodepth: int,
                 offset: int = 0) -> tuple[int, int, float]:
    """(bytes read, bytes per second, user+sys CPU seconds) of one fio sequential read job.
    The CPU time is fio's own account of its job (usr_cpu + sys_cpu percent of the job's
    runtime), so fio's start-up and JSON output are not charged to the I/O."""
    cmd = ["fio", "--name=peer", f"--filename={path}", "--rw=read", f"--bs={bs}",
           f"--iodepth={iodepth}", "--ioengine=io_uring", "--fixedbufs", "--registerfiles",
           "--direct=1", f"--offset={offset}", f"--size={size}", "--output-format=json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip() or p.stdout.strip()}")
    job = json.loads(p.stdout)["jobs"][0]
    read = job["read"]
    return read["io_bytes"], read["bw_bytes"], job_cpu_seconds(job)


def run_measured(cmd: list[str], timeout: float | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run cmd to the end; (its result, user+sys CPU seconds of the process and
    every child it waited for), from the kernel's rusage of our children.
    Everything the process did counts, start-up included."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return p, cpu


def job_cpu_seconds(job: dict) -> float:
    """user+sys CPU seconds of one job of a fio (or fx100io bench) JSON report,
    by the tool's own account of its job: start-up and reporting excluded."""
    return (float(job["usr_cpu"]) + float(job["sys_cpu"])) / 100.0 * float(job["job_runtime"]) / 1000.0

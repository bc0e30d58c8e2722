"""`fx100io bench`: a fio-like microbenchmark of fx100io's I/O paths.

Entry point: main(argv) -> exit code; the `fx100io bench` console script and
`python -m fx100io bench` call it with the arguments after "bench".

Modules, one job each: options (the option table, command line), jobfile
(fio INI job files), sizes (4k/1m/500ms parsing, fio-style number printing),
pattern (offsets and directions), verify (crc32c block headers), targets
(opening and preparing files/devices/URIs), workload (the block I/O loop),
kv (the KV-cache workload over ChunkStore), stats (latency histograms, CPU),
runner (concurrent job processes), report_normal / report_json (fio's two
formats), status_line (live progress), plot (--plot PNG).
"""

from __future__ import annotations

import sys

from .errors import BenchError

__all__ = ["BenchError", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run `fx100io bench` with ``argv`` (without the program name)."""
    from .cli import run

    return run(sys.argv[1:] if argv is None else list(argv))

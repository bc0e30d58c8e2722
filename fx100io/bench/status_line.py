"""The live status line: progress, current bandwidth and IOPS, ETA.

Printed to stderr once a second while jobs run, only when stderr is a
terminal (or --eta=always), so piped and JSON runs stay quiet.  It reads the
shared progress counters from a thread of the parent process; the jobs
themselves never wait for it.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from .errors import BenchError
from .options import Job
from .progress import (
    DONE,
    ELAPSED_MS,
    RAMP,
    RBYTES,
    RIOS,
    RUNNING,
    SETUP,
    STATE,
    VERIFYING,
    WBYTES,
    WIOS,
    SharedProgress,
)
from .sizes import fmt_bytes_bin, fmt_count

_RW_LETTER = {"read": "R", "randread": "r", "write": "W", "randwrite": "w", "rw": "M", "randrw": "m"}
_STATE_LETTER = {SETUP: "I", RAMP: "/", VERIFYING: "V", DONE: "_"}


def job_letter(job: Job, state: int) -> str:
    if state == RUNNING:
        return "K" if job.kv is not None else _RW_LETTER[job.rw]
    return _STATE_LETTER.get(state, "?")


def fraction_done(job: Job, slot: list[int]) -> float | None:
    """How far one instance is, from its bytes or its clock (None: unknown)."""
    if slot[STATE] == DONE:
        return 1.0
    elapsed_ns = slot[ELAPSED_MS] * 1_000_000
    parts = []
    if job.runtime_ns:
        parts.append(min(1.0, elapsed_ns / job.runtime_ns))
    if not job.time_based and job.kv is None and isinstance(job.size, int):
        try:
            ios = job.io_count(job.size)  # (io_size, number_ios)
        except BenchError:
            return None  # (the job itself says why)
        total = job.size * job.loops if ios is None else ios * job.bs
        if total:
            parts.append(min(1.0, (slot[RBYTES] + slot[WBYTES]) / total))
    return max(parts) if parts else None


def format_line(
    instances: list[tuple[Job, int]],
    slots: list[list[int]],
    rates: tuple[float, float, float, float],
    elapsed_s: float,
) -> str:
    letters: dict[str, int] = {}
    order: list[str] = []
    for (job, _), slot in zip(instances, slots):
        letter = job_letter(job, slot[STATE])
        if letter not in letters:
            order.append(letter)
            letters[letter] = 0
        letters[letter] += 1
    running = sum(1 for s in slots if s[STATE] != DONE)
    fracs = [fraction_done(job, s) for (job, _), s in zip(instances, slots)]
    known = [f for f in fracs if f is not None]
    pct = 100.0 * sum(known) / len(known) if known else None
    rbw, wbw, riops, wiops = rates
    line = f"Jobs: {running} (f={running}): [{','.join(f'{k}({letters[k]})' for k in order)}]"
    line += f"[{pct:.1f}%]" if pct is not None else "[-.-%]"
    line += (
        f"[r={fmt_bytes_bin(rbw)}/s,w={fmt_bytes_bin(wbw)}/s][r={fmt_count(riops)},w={fmt_count(wiops)} IOPS]"
    )
    if pct and pct > 0:
        eta = max(0.0, elapsed_s * (100.0 - pct) / pct)
        line += f"[eta {int(eta) // 60:02d}m:{int(eta) % 60:02d}s]"
    else:
        line += "[eta --m:--s]"
    return line


class StatusLine:
    def __init__(
        self,
        progress: SharedProgress,
        instances: list[tuple[Job, int]],
        stream: TextIO | None = None,
        interval: float = 1.0,
    ) -> None:
        self.progress = progress
        self.instances = instances
        self.stream = stream or sys.stderr
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fx100io-bench-status", daemon=True)
        self._printed = False

    def start(self) -> StatusLine:
        self._thread.start()
        return self

    def _totals(self) -> tuple[list[list[int]], tuple[int, int, int, int]]:
        slots = [self.progress.read(i) for i in range(len(self.instances))]
        return slots, (
            sum(s[RBYTES] for s in slots),
            sum(s[WBYTES] for s in slots),
            sum(s[RIOS] for s in slots),
            sum(s[WIOS] for s in slots),
        )

    def _run(self) -> None:
        t0 = last_t = time.monotonic()
        _, last = self._totals()
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            slots, tot = self._totals()
            dt = max(now - last_t, 1e-9)
            rates = tuple((a - b) / dt for a, b in zip(tot, last))
            last, last_t = tot, now
            line = format_line(self.instances, slots, rates, now - t0)  # type: ignore[arg-type]
            try:
                self.stream.write("\r" + line + "\x1b[K")
                self.stream.flush()
                self._printed = True
            except (OSError, ValueError):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        if self._printed:
            try:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
            except (OSError, ValueError):
                pass


def maybe_start(mode: str, stream: TextIO | None = None) -> Any:
    """The on_start hook for runner.run_jobs, or None when the line is off."""
    stream = stream or sys.stderr
    if mode == "never" or (mode == "auto" and not (hasattr(stream, "isatty") and stream.isatty())):
        return None

    def start(progress: SharedProgress, instances: list[tuple[Job, int]]) -> StatusLine:
        return StatusLine(progress, instances, stream).start()

    return start

"""From argv to reports: parse, run, print, exit code.

Bad input and failed jobs end as one line on stderr and exit code 1, never a
traceback: BenchError carries the message that names the option or job.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from . import report_json, report_normal
from .errors import BenchError
from .jobfile import read_jobfile
from .options import Job, help_text, parse_cli, resolve_job
from .results import group_results
from .runner import run_jobs
from .status_line import maybe_start

PROG = "fx100io bench"


def run(argv: list[str], stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        return _run(argv, stdout, stderr)
    except BenchError as e:
        print(f"{PROG}: error: {e}", file=stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=stderr)
        return 130


def _run(argv: list[str], stdout: TextIO, stderr: TextIO) -> int:
    config = parse_cli(argv, read_jobfile)
    if config.show_help:
        stdout.write(help_text())
        return 0
    jobs: list[Job] = [resolve_job(raw) for raw in config.jobs]
    if config.plot:
        from .plot import require_matplotlib

        require_matplotlib()
    if config.output:
        out_dir = os.path.dirname(os.path.abspath(config.output))
        if not os.path.isdir(out_dir):
            raise BenchError(f"--output: directory {out_dir} does not exist")

    live = config.output is None and "normal" in config.output_formats and len(config.output_formats) == 1
    if live:
        # fio shows what it is about to run before it starts.
        stdout.write(report_normal.header(jobs))
        stdout.flush()

    outcome = run_jobs(jobs, on_start=maybe_start(config.eta, stderr))
    results = group_results(outcome.results)

    text = []
    for fmt in config.output_formats:
        if fmt == "normal":
            body = report_normal.render(outcome, results, jobs)
            if live:
                body = body[len(report_normal.header(jobs)) :]
            text.append(body)
        else:
            text.append(report_json.render(outcome, results))
    report = "\n".join(text)
    if config.output:
        try:
            with open(config.output, "w", encoding="utf-8") as f:
                f.write(report)
        except OSError as e:
            raise BenchError(f"--output: cannot write {config.output}: {e.strerror}") from None
    else:
        stdout.write(report)
        stdout.flush()

    if config.plot:
        from .plot import plot

        plot(results, config.plot)

    failed = [r for r in outcome.results if r.error]
    for r in failed:
        print(f"{PROG}: job {r.name!r} (clone {r.clone}): {r.error_msg or f'error {r.error}'}", file=stderr)
    return 1 if failed else 0

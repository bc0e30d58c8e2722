"""fio job files: INI with a [global] section and one section per job.

We read the subset of fio's format that job files in the wild use: comment
lines (';' or '#'), "key=value" and bare "key" (a flag), repeated [global]
sections that apply to the jobs after them, ${VAR} environment expansion
and "include FILE".  configparser is not used because fio's format is not
quite INI: keys repeat, bare keys are allowed and [global] is positional.
"""

from __future__ import annotations

import os
import re

from .errors import BenchError
from .options import OPTIONS, RawJob, canonical, set_option, unknown_option_error

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand_env(text: str, where: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in os.environ:
            raise BenchError(f"{where}: environment variable ${{{name}}} is not set")
        return os.environ[name]

    return _ENV_RE.sub(sub, text)


def _lines(path: str, depth: int = 0) -> list[tuple[str, int, str]]:
    """(file, line number, text) triples with includes spliced in."""
    if depth > 8:
        raise BenchError(f"{path}: include nested too deeply (a loop?)")
    try:
        with open(path, encoding="utf-8") as f:
            raw = f.read().splitlines()
    except FileNotFoundError:
        raise BenchError(f"job file {path!r} not found") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise BenchError(f"job file {path!r} cannot be read: {e}") from None
    out: list[tuple[str, int, str]] = []
    for lineno, text in enumerate(raw, 1):
        stripped = text.strip()
        if stripped.startswith(("include ", "include\t")):
            target = stripped[len("include") :].strip()
            if not os.path.isabs(target):
                target = os.path.join(os.path.dirname(path) or ".", target)
            out.extend(_lines(target, depth + 1))
            continue
        out.append((path, lineno, text))
    return out


def read_jobfile(path: str) -> list[RawJob]:
    """RawJobs of a fio job file, [global] values merged under each job's own."""
    jobs: list[RawJob] = []
    global_values: dict[str, str | None] = {}
    current: RawJob | None = None
    in_global = False
    for fname, lineno, text in _lines(path):
        where = f"{fname}:{lineno}"
        line = text.strip()
        if not line or line[0] in ";#":
            continue
        if line.startswith("["):
            if not line.endswith("]") or len(line) < 3:
                raise BenchError(f"{where}: malformed section header {line!r}")
            section = line[1:-1].strip()
            if section == "global":
                in_global = True
                current = None
            else:
                in_global = False
                # A job sees the globals as they stand where it begins.
                current = RawJob(section, dict(global_values), f"{fname}:[{section}]", dict(global_values))
                jobs.append(current)
            continue
        key, eq, value = line.partition("=")
        key = key.strip()
        value_or_none: str | None = _expand_env(value.strip(), where) if eq else None
        try:
            name = canonical(key)
        except KeyError:
            raise unknown_option_error(key, f"{key!r} in {where}", prefix="") from None
        spec = OPTIONS[name]
        if spec.run_level:
            raise BenchError(f"{where}: {key!r} is a command-line option (--{name}), not a job option")
        if name == "name":
            # fio lets name= rename the section's job.
            if current is None:
                raise BenchError(f"{where}: name= belongs in a job section")
            if not value_or_none:
                raise BenchError(f"{where}: name= needs a value")
            current.name = value_or_none
            continue
        if value_or_none is None and not spec.flag:
            raise BenchError(f"{where}: option {key!r} needs a value ({key}=VALUE)")
        if in_global:
            set_option(global_values, name, value_or_none)
        elif current is not None:
            set_option(current.values, name, value_or_none)
            set_option(current.shown, name, value_or_none)
        else:
            raise BenchError(f"{where}: option {key!r} appears before any [section]")
    if not jobs:
        raise BenchError(f"job file {path!r} defines no job (only [global]?)")
    return jobs

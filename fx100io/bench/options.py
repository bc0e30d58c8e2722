"""The option table and the command-line parser of `fx100io bench`.

Options keep fio's names and meanings so job files and habits carry over.
Values stay raw strings until every source (defaults, job-file [global],
job section, command line) has been merged; only then does resolve_job()
turn them into a typed Job, so an error message can name the option and the
value exactly as the user wrote it.

Precedence, lowest first: built-in defaults, a job file's [global], the job's
own section, command-line options given before any --name (these override
job files, which lets one reuse a job file and change one knob), and for
command-line jobs the options after that job's --name.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from fx100io.uri_redact import redact

from .errors import BenchError
from .sizes import (
    parse_bool,
    parse_int,
    parse_size,
    parse_size_or_percent,
    parse_time_ns,
)

# --------------------------------------------------------------- the table


@dataclass(frozen=True)
class OptionSpec:
    name: str
    kind: str  # str, size, size_pct, int, bool, time, choice, list, percentiles
    help: str
    default: str | None = None
    choices: tuple[str, ...] = ()
    flag: bool = False  # may be given without a value (--time_based)
    run_level: bool = False  # applies to the whole run, not to one job


RW_CHOICES = ("read", "write", "randread", "randwrite", "rw", "readwrite", "randrw")
ENGINE_CHOICES = ("io_uring", "psync", "sync", "pvsync", "nvme+tcp", "nvme+rdma")
VERIFY_CHOICES = ("crc32c", "crc32c-intel", "0", "null", "none")
FORMAT_CHOICES = ("normal", "json")
ETA_CHOICES = ("auto", "always", "never")

# fio's default percentile list (the one its JSON carries).
DEFAULT_PERCENTILES = "1:5:10:20:30:40:50:60:70:80:90:95:99:99.5:99.9:99.95:99.99"

_SPECS = [
    # ---- job identity and target
    OptionSpec("name", "str", "job name; on the command line it starts a new job"),
    OptionSpec("description", "str", "free text shown in the normal output"),
    OptionSpec("filename", "str", "file, block device or URI (file://, nvme+tcp://, nvme+rdma://)"),
    OptionSpec(
        "ioengine",
        "choice",
        "I/O path: io_uring (files, block devices), psync (plain pread/pwrite fallback; "
        "sync and pvsync are aliases), nvme+tcp, nvme+rdma (userspace NVMe-oF; "
        "the filename must be such a URI)",
        "io_uring",
        ENGINE_CHOICES,
    ),
    # ---- workload shape
    OptionSpec("rw", "choice", "read|write|randread|randwrite|rw|randrw", "read", RW_CHOICES),
    OptionSpec("readwrite", "choice", "alias of --rw", None, RW_CHOICES),
    OptionSpec("rwmixread", "int", "percentage of a mixed workload that reads", "50"),
    OptionSpec("rwmixwrite", "int", "percentage of a mixed workload that writes (sets rwmixread)"),
    OptionSpec("bs", "size", "block size of each I/O (k/m/g suffixes: 4k = 4096)", "4k"),
    OptionSpec("blocksize", "size", "alias of --bs"),
    OptionSpec("size", "size_pct", "bytes of the target each job covers (or NN% of it)"),
    OptionSpec("offset", "size_pct", "where in the target the job's region starts (or NN%)", "0"),
    OptionSpec("iodepth", "int", "I/Os in flight per job", "1"),
    OptionSpec("numjobs", "int", "clones of this job, each its own process", "1"),
    OptionSpec("loops", "int", "passes over the region when not --time_based", "1"),
    OptionSpec(
        "io_size",
        "size_pct",
        "bytes of I/O per loop (or NN% of the region), in place of one pass over it: less "
        "ends early, more wraps around the region (fio's option; the clock ends a "
        "--time_based job)",
    ),
    OptionSpec("io_limit", "size_pct", "alias of --io_size"),
    OptionSpec("number_ios", "int", "at most this many I/Os per loop (0: no such limit)", "0"),
    OptionSpec("runtime", "time", "stop after this long (seconds unless suffixed: 500ms, 2m)"),
    OptionSpec("time_based", "bool", "run for --runtime, wrapping around the region", "0", flag=True),
    OptionSpec("ramp_time", "time", "run this long before measuring", "0"),
    OptionSpec("direct", "bool", "O_DIRECT (bypass the page cache); fio's default is 0", "0", flag=True),
    OptionSpec("buffered", "bool", "inverse of --direct"),
    OptionSpec(
        "invalidate", "bool", "drop the file's page cache before the job (files only)", "1", flag=True
    ),
    OptionSpec(
        "verify",
        "choice",
        "crc32c: stamp every written block with offset + CRC32C, check every block read "
        "and read written blocks back after the job",
        "0",
        VERIFY_CHOICES,
    ),
    OptionSpec("randrepeat", "bool", "same random sequence on every run", "1", flag=True),
    OptionSpec("randseed", "int", "seed of the random sequence"),
    OptionSpec(
        "norandommap",
        "bool",
        "random offsets may repeat (default: every block once per pass)",
        "0",
        flag=True,
    ),
    OptionSpec(
        "thread",
        "bool",
        "accepted for job-file compatibility; fx100io runs every job in its own process",
        "0",
        flag=True,
    ),
    # ---- io_uring options (fio's names); the C I/O loop of files and block devices
    OptionSpec(
        "sqthread_poll",
        "bool",
        "io_uring: a kernel thread polls the submission queue (SQPOLL; costs a core). Unlike fio, "
        "which then spins on the completion queue, fx100io still waits for completions in "
        "io_uring_enter (one call per wakeup)",
        "0",
        flag=True,
    ),
    OptionSpec("sqpoll", "bool", "alias of --sqthread_poll", flag=True),
    OptionSpec(
        "registerfiles", "bool", "io_uring: register the file with the ring (fixed file)", "1", flag=True
    ),
    OptionSpec(
        "fixedbufs",
        "bool",
        "io_uring: register the I/O buffers with the ring (READ/WRITE_FIXED)",
        "1",
        flag=True,
    ),
    OptionSpec(
        "iodepth_batch_submit",
        "int",
        "I/Os handed over per submission, as soon as that many are ready (fio's option and "
        "default for files and block devices: 1, each I/O at once; 0 = all of a refill "
        "together, as fio's 0 = iodepth). NVMe-oF queues default to 0: there one submission "
        "is one send. Only the C I/O loop takes it; jobs on the Python loop (psync, --verify, "
        "KV jobs) submit as they always do",
    ),
    OptionSpec("iodepth_batch", "int", "alias of --iodepth_batch_submit"),
    OptionSpec(
        "percentile_list", "percentiles", "clat percentiles to report, colon separated", DEFAULT_PERCENTILES
    ),
    OptionSpec("kb_base", "int", "1024 (fio's default: 4k = 4096, 1ki = 1000) or 1000 (SI)", "1024"),
    OptionSpec("group_reporting", "bool", "report numjobs clones as one job", "0", flag=True),
    # ---- KV-cache workload
    OptionSpec(
        "kv-model",
        "str",
        "KV-cache workload through ChunkStore: llama3-8b, qwen2.5-7b, qwen2.5-32b, llama3-70b, "
        "deepseek-v3, or custom (with --kv-layers/--kv-heads/--kv-head-dim/--kv-dtype)",
    ),
    OptionSpec("kv-layers", "int", "custom model: transformer layers"),
    OptionSpec("kv-heads", "int", "custom model: KV heads"),
    OptionSpec("kv-head-dim", "int", "custom model: head dimension"),
    OptionSpec("kv-dtype", "str", "custom model: bf16, fp16, fp32, fp8", "bf16"),
    OptionSpec(
        "kv-mla", "bool", "custom model: one latent vector per token (MLA), not K and V", "0", flag=True
    ),
    OptionSpec("kv-chunk-tokens", "int", "tokens per stored chunk", "256"),
    OptionSpec("kv-prompt-tokens", "int", "tokens per prompt (prefix) loaded as a whole", "32768"),
    OptionSpec("kv-prompts", "int", "distinct prompts stored (default: --size / prompt bytes, else 4)"),
    OptionSpec("kv-concurrency", "int", "prompts stored / loaded concurrently", "1"),
    OptionSpec("kv-buffer", "size", "pinned memory per job for chunk transfers", "1g"),
    OptionSpec("kv-store-writers", "int",
               "writers that keep storing chunks while prompts load (a store storm: the "
               "prefix load percentiles under stores)", "0"),
    OptionSpec("kv-load-priority", "str",
               "class of the loads: load (before stores), store (first come, first served "
               "with the storm), background", "load"),
    # ---- whole-run options
    OptionSpec("output", "str", "write the report to this file instead of stdout", run_level=True),
    OptionSpec(
        "output-format",
        "list",
        "normal, json, or both comma separated",
        "normal",
        FORMAT_CHOICES,
        run_level=True,
    ),
    OptionSpec(
        "eta",
        "choice",
        "live status line: auto (on a terminal), always, never",
        "auto",
        ETA_CHOICES,
        run_level=True,
    ),
    OptionSpec(
        "plot", "str", "write a PNG with the latency histogram and bandwidth over time", run_level=True
    ),
]

OPTIONS: dict[str, OptionSpec] = {s.name: s for s in _SPECS}


def canonical(name: str) -> str:
    """Option names match with '-' and '_' interchangeable (fio mixes both)."""
    n = name.strip().lower().replace("_", "-")
    for spec_name in OPTIONS:
        if spec_name.replace("_", "-") == n:
            return spec_name
    raise KeyError(name)


def unknown_option_error(name: str, where: str, prefix: str = "--") -> BenchError:
    """'unknown option ...' naming what the user wrote, with a near match if any."""
    candidates = difflib.get_close_matches(
        name.lower().replace("_", "-"), [n.replace("_", "-") for n in OPTIONS], n=1, cutoff=0.75
    )
    hint = f" (did you mean {prefix}{canonical(candidates[0])}?)" if candidates else ""
    return BenchError(f"unknown option {where}{hint}; see 'fx100io bench --help'")


# ------------------------------------------------------------- raw sources


@dataclass
class RawJob:
    """One job's merged option strings, plus where it came from for messages."""

    name: str
    values: dict[str, str | None]
    origin: str  # "command line" or "jobs.fio:[section]"
    shown: dict[str, str | None] = field(default_factory=dict)  # as written, for JSON "job options"


@dataclass
class RunConfig:
    jobs: list[RawJob]
    output: str | None = None
    output_formats: tuple[str, ...] = ("normal",)
    eta: str = "auto"
    plot: str | None = None
    show_help: bool = False


def parse_cli(argv: list[str], read_jobfile: Callable[[str], list[RawJob]] | None = None) -> RunConfig:
    """Split argv into run-level options, command-line jobs and job files.

    ``read_jobfile`` is injected (jobfile.read_jobfile) so this module stays
    about the command line alone.
    """
    cli_global: dict[str, str | None] = {}
    cli_jobs: list[RawJob] = []
    run_values: dict[str, str | None] = {}
    jobfiles: list[str] = []
    show_help = False

    i = 0
    while i < len(argv):
        tok = argv[i]
        i += 1
        if tok in ("-h", "--help"):
            show_help = True
            continue
        if tok == "--":
            jobfiles.extend(argv[i:])
            break
        if not tok.startswith("-") or tok == "-":
            jobfiles.append(tok)
            continue
        if not tok.startswith("--"):
            raise BenchError(f"unknown option {tok!r}: options are written --name=value")
        body = tok[2:]
        key, eq, value = body.partition("=")
        try:
            name = canonical(key)
        except KeyError:
            raise unknown_option_error(key, f"'--{key}'") from None
        spec = OPTIONS[name]
        if not eq:
            # "--opt value" is accepted for value options; flags stand alone.
            if spec.flag:
                value_or_none: str | None = None
            elif i < len(argv) and not argv[i].startswith("--"):
                value_or_none = argv[i]
                i += 1
            else:
                raise BenchError(f"--{name}: needs a value (--{name}=VALUE)")
        else:
            value_or_none = value
        if spec.run_level:
            run_values[name] = value_or_none
        elif name == "name":
            if not value_or_none:
                raise BenchError("--name: needs a value (--name=JOBNAME)")
            cli_jobs.append(RawJob(value_or_none, {}, "command line"))
        elif cli_jobs:
            set_option(cli_jobs[-1].values, name, value_or_none)
        else:
            set_option(cli_global, name, value_or_none)

    config = RunConfig(jobs=[], show_help=show_help)
    _apply_run_values(config, run_values)
    if show_help:
        return config

    file_jobs: list[RawJob] = []
    for path in jobfiles:
        if read_jobfile is None:
            raise BenchError(f"job file {path!r} given but job files are not supported here")
        file_jobs.extend(read_jobfile(path))
    for job in file_jobs:
        job.values = overlay(job.values, cli_global)
        job.shown = overlay(job.shown, cli_global)
    for job in cli_jobs:
        merged = overlay(cli_global, job.values)
        job.shown = {"name": job.name, **merged}  # fio echoes --name among the job options
        job.values = merged
    jobs = file_jobs + cli_jobs
    if not jobs and cli_global:
        # fio insists on --name; a nameless command line is still clearly one
        # job, so run it under a default name rather than refuse.
        jobs = [RawJob("fx100io", dict(cli_global), "command line", dict(cli_global))]
    if not jobs:
        raise BenchError("no job given: pass --name=NAME --filename=PATH ... or a job file (see --help)")
    config.jobs = jobs
    return config


def _apply_run_values(config: RunConfig, values: dict[str, str | None]) -> None:
    if "output" in values:
        if not values["output"]:
            raise BenchError("--output: needs a file name")
        config.output = values["output"]
    if "output-format" in values:
        raw = values["output-format"] or ""
        formats = tuple(f.strip().lower() for f in raw.split(",") if f.strip())
        if not formats:
            raise BenchError("--output-format: needs a value: normal, json or normal,json")
        for f in formats:
            if f not in FORMAT_CHOICES:
                raise BenchError(f"--output-format: unsupported format {f!r} (choose normal or json)")
        config.output_formats = formats
    if "eta" in values:
        eta = (values["eta"] or "").lower()
        if eta not in ETA_CHOICES:
            raise BenchError(f"--eta: must be auto, always or never, not {values['eta']!r}")
        config.eta = eta
    if "plot" in values:
        if not values["plot"]:
            raise BenchError("--plot: needs a file name (FILE.png)")
        config.plot = values["plot"]


def help_text() -> str:
    lines = [
        "usage: fx100io bench [--option=value ...] [--name=JOB [--option=value ...]] ... [JOBFILE ...]",
        "",
        "A fio-like microbenchmark of fx100io's I/O paths.  Option names and meanings follow",
        "fio; job files use fio's INI format ([global] plus one section per job).",
        "Jobs (sections, and numjobs clones) run concurrently, each in its own process;",
        "within a job, iodepth I/Os are kept in flight (files and block devices through",
        "io_uring, and NVMe-oF: by a C loop that reaps every completion there is per",
        "wakeup and hands each refill's I/Os over as --iodepth_batch_submit says).",
        "",
        "options:",
    ]
    for spec in _SPECS:
        default = f" [default: {spec.default}]" if spec.default not in (None, "") else ""
        lines.append(f"  --{spec.name:<17} {spec.help}{default}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------- typed job


@dataclass
class KvModel:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    mla: bool  # one latent per token per layer instead of separate K and V

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def bytes_per_token(self) -> int:
        kv = 1 if self.mla else 2
        return kv * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def chunk_bytes(self, tokens: int) -> int:
        return self.bytes_per_token * tokens


DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}


@dataclass
class Job:
    name: str
    origin: str
    filename: str
    ioengine: str  # canonical: io_uring, psync, nvme+tcp, nvme+rdma
    rw: str  # canonical: read, write, randread, randwrite, rw, randrw
    rwmixread: int
    bs: int
    size: int | float | None  # bytes, or fraction of target, or None = rest of target
    offset: int | float
    iodepth: int
    numjobs: int
    loops: int
    runtime_ns: int | None
    time_based: bool
    ramp_ns: int
    direct: bool
    invalidate: bool
    verify: bool
    seed: int
    random_map: bool
    percentiles: tuple[float, ...]
    group_reporting: bool
    description: str | None
    kv: KvSpec | None
    shown: dict[str, str | None]
    sqpoll: bool = False
    registerfiles: bool = True
    fixedbufs: bool = True
    # None: the backend's default (1 on io_uring, 0 on an NVMe-oF queue)
    batch_submit: int | None = None
    # bytes of I/O per loop, or a fraction of the region; None: one pass over it
    io_size: int | float | None = None
    number_ios: int = 0  # 0: no limit

    def io_count(self, region_len: int) -> int | None:
        """I/Os the measured phase does over a region of region_len bytes, or
        None for one pass per loop (or a time_based job, which the clock
        ends).  As in fio: io_size is bytes per loop (a percentage of the
        region's bytes), and I/O goes on until at least io_size x loops is
        done (so the total is rounded up to whole blocks, not each loop);
        number_ios caps each loop.  (A run passes its region, whole blocks:
        where --size is not a multiple of --bs, fio takes a percentage of
        --size itself, and may do one I/O more.)"""
        if self.time_based or (self.io_size is None and not self.number_ios):
            return None
        nblocks = region_len // self.bs
        if self.io_size is None:
            total = nblocks * self.loops
        else:
            # (a percentage's bytes rounded to the nearest byte: 7% as a
            # float times the region is a hair off a whole number)
            per_loop = round(self.io_size * region_len) if isinstance(self.io_size, float) else self.io_size
            total = max(1, -(-per_loop * self.loops // self.bs))
        if self.number_ios:
            total = min(total, self.number_ios * self.loops)
        if total > _MAX_IOS:
            raise BenchError(f"job {self.name!r}: {total} I/Os is more than a job can count "
                             "(--io_size, --number_ios, --loops)")
        return total

    @property
    def is_random(self) -> bool:
        return self.rw.startswith("rand")

    @property
    def reads(self) -> bool:
        return self.rw in ("read", "randread") or (self.rw in ("rw", "randrw") and self.rwmixread > 0)

    @property
    def writes(self) -> bool:
        return self.rw in ("write", "randwrite") or (self.rw in ("rw", "randrw") and self.rwmixread < 100)

    @property
    def read_fraction(self) -> float:
        if self.rw in ("read", "randread"):
            return 1.0
        if self.rw in ("write", "randwrite"):
            return 0.0
        return self.rwmixread / 100.0


@dataclass
class KvSpec:
    model: KvModel
    chunk_tokens: int
    prompt_tokens: int
    prompts: int | None
    concurrency: int
    buffer_bytes: int
    store_writers: int = 0
    load_priority: str = "load"


# Values read from the models' published configs (num_hidden_layers,
# num_key_value_heads, hidden_size / num_attention_heads); DeepSeek-V3 caches
# the MLA latent: kv_lora_rank 512 + qk_rope_head_dim 64 = 576 per token.
KV_MODELS: dict[str, KvModel] = {
    "llama3-8b": KvModel("llama3-8b", 32, 8, 128, "bf16", False),
    "qwen2.5-7b": KvModel("qwen2.5-7b", 28, 4, 128, "bf16", False),
    "qwen2.5-32b": KvModel("qwen2.5-32b", 64, 8, 128, "bf16", False),
    "llama3-70b": KvModel("llama3-70b", 80, 8, 128, "bf16", False),
    "deepseek-v3": KvModel("deepseek-v3", 61, 1, 576, "bf16", True),
}

_ENGINE_ALIASES = {"sync": "psync", "pvsync": "psync"}
_MAX_IOS = (1 << 63) - 1  # what the I/O loops count in (a signed 64-bit count)
_MAX_LOOPS = (1 << 32) - 1  # fio's loops is an unsigned int
# Options with two names, or two forms (direct/buffered, rwmixread/
# rwmixwrite), are one option (as in fio): setting either drops the other,
# so the usual order decides between them (a job's own value over [global],
# the command line over a job file) whichever each place used, and the value
# keeps the name it was written with (errors and the JSON "job options" say
# what the user wrote).
SAME_OPTION = ({"rw", "readwrite"}, {"bs", "blocksize"}, {"sqthread_poll", "sqpoll"},
               {"iodepth_batch_submit", "iodepth_batch"}, {"direct", "buffered"},
               {"rwmixread", "rwmixwrite"}, {"io_size", "io_limit"})


def _names_of(name: str) -> set[str]:
    return next((group for group in SAME_OPTION if name in group), {name})


def set_option(values: dict[str, str | None], name: str, value: str | None) -> None:
    """values[name] = value, replacing the option's value under its other name."""
    for other in _names_of(name):
        values.pop(other, None)
    values[name] = value


def overlay(base: dict[str, str | None], top: dict[str, str | None]) -> dict[str, str | None]:
    """base with top's options set over it (top wins, whichever names they use)."""
    out = dict(base)
    for name, value in top.items():
        set_option(out, name, value)
    return out
_RW_ALIASES = {"readwrite": "rw"}


def _pct_list(text: str, option: str) -> tuple[float, ...]:
    out = []
    for part in str(text).split(":"):
        try:
            p = float(part)
        except ValueError:
            raise BenchError(f"--{option}: cannot parse {part!r} in {text!r} (example: 50:99:99.9)") from None
        if not 0 < p <= 100:
            raise BenchError(f"--{option}: percentiles must be in (0, 100], not {part}")
        out.append(p)
    return tuple(sorted(set(out)))


def resolve_job(raw: RawJob) -> Job:
    """Typed, validated Job from merged strings; errors name the option."""
    v = dict(raw.values)
    for name, spec in OPTIONS.items():
        if spec.default is not None and name not in v:
            v[name] = spec.default

    def get(name: str) -> str:
        val = v.get(name)
        if val is None:
            raise BenchError(f"--{name}: needs a value")
        return val

    kb_base = parse_int(get("kb_base"), "kb_base")
    if kb_base not in (1000, 1024):
        raise BenchError(f"--kb_base: must be 1000 or 1024, not {kb_base}")

    def choice(name: str) -> str:
        val = get(name).strip().lower()
        if val not in OPTIONS[name].choices:
            raise BenchError(f"--{name}: {val!r} is not one of {', '.join(OPTIONS[name].choices)}")
        return val

    # (errors name the option as written; a RawJob built by hand may hold
    # both names: then the main one)
    rw_key = "readwrite" if "readwrite" in raw.values and "rw" not in raw.values else "rw"
    rw = _RW_ALIASES.get(choice(rw_key), choice(rw_key))
    ioengine = _ENGINE_ALIASES.get(choice("ioengine"), choice("ioengine"))
    bs_key = "blocksize" if "blocksize" in raw.values and "bs" not in raw.values else "bs"
    bs_text = get(bs_key)
    if "," in bs_text or ":" in bs_text or "-" in bs_text.strip().lstrip("-"):
        raise BenchError(
            f"--{bs_key}: per-direction or ranged block sizes ({bs_text!r}) are not supported; give one size"
        )
    bs = parse_size(bs_text, bs_key, kb_base)
    if bs <= 0:
        raise BenchError(f"--{bs_key}: must be positive, not {bs_text!r}")

    rwmixread = parse_int(get("rwmixread"), "rwmixread", 0, 100)
    if raw.values.get("rwmixwrite") is not None:
        w = parse_int(get("rwmixwrite"), "rwmixwrite", 0, 100)
        if "rwmixread" in raw.values and rwmixread + w != 100:
            raise BenchError(f"--rwmixwrite: {w} and --rwmixread {rwmixread} do not add up to 100")
        rwmixread = 100 - w

    size: int | float | None = None
    if v.get("size") is not None:
        size = parse_size_or_percent(get("size"), "size", kb_base)
        if size == 0:
            raise BenchError("--size: must be positive")
    offset = parse_size_or_percent(get("offset"), "offset", kb_base)
    io_size: int | float | None = None
    io_key = "io_limit" if "io_limit" in raw.values and "io_size" not in raw.values else "io_size"
    if v.get(io_key) is not None:
        # (0 or 0%: unset, as in fio)
        io_size = parse_size_or_percent(get(io_key), io_key, kb_base) or None

    runtime_ns = None
    if v.get("runtime") is not None:
        runtime_ns = parse_time_ns(get("runtime"), "runtime")
        if runtime_ns <= 0:
            # fio treats runtime=0 as "no limit"; keep that meaning.
            runtime_ns = None
    time_based = parse_bool(v.get("time_based"), "time_based")
    if time_based and runtime_ns is None:
        raise BenchError("--time_based: needs --runtime (how long to run)")
    number_ios = parse_int(get("number_ios"), "number_ios", 0, _MAX_IOS)
    loops = parse_int(get("loops"), "loops", 1, _MAX_LOOPS)
    if isinstance(io_size, int) and -(-io_size * loops // bs) > _MAX_IOS and not time_based:
        raise BenchError(f"--{io_key}: {get(io_key)!r} x --loops {loops} is more I/Os than a job can count")

    sqpoll = parse_bool(v.get("sqthread_poll"), "sqthread_poll")
    if "sqpoll" in raw.values:
        sqpoll = parse_bool(raw.values.get("sqpoll"), "sqpoll")
    batch_submit = None
    for key in ("iodepth_batch", "iodepth_batch_submit"):  # (both, by hand: the full name)
        if v.get(key) is not None:
            batch_submit = parse_int(get(key), key, 0, 65536)
    direct = parse_bool(v.get("direct"), "direct")
    if "buffered" in raw.values:
        direct = not parse_bool(raw.values.get("buffered"), "buffered")

    verify_text = choice("verify")
    verify = verify_text in ("crc32c", "crc32c-intel")

    randrepeat = parse_bool(v.get("randrepeat"), "randrepeat")
    if v.get("randseed") is not None:
        seed = parse_int(get("randseed"), "randseed", 0)
    elif randrepeat:
        seed = 0x5EED  # fixed: the same sequence on every run, like fio's default
    else:
        seed = int.from_bytes(os.urandom(8), "little")

    filename = v.get("filename")
    kv = _resolve_kv(raw, v, kb_base)
    if kv is not None and (io_size is not None or number_ios):
        raise BenchError(f"--{io_key if io_size is not None else 'number_ios'}: not with --kv-model "
                         "(a KV job's prompts set what it moves)")
    if not filename:
        raise BenchError(
            f"job {raw.name!r} ({raw.origin}): --filename is required (a file, block device or URI)"
        )
    if ioengine in ("nvme+tcp", "nvme+rdma") and not filename.startswith(ioengine + "://"):
        raise BenchError(f"--ioengine={ioengine}: --filename must be a {ioengine}:// URI, not "
                         f"{redact(filename)!r}")
    for scheme in ("nvme+tcp", "nvme+rdma"):
        if filename.startswith(scheme + "://") and ioengine not in (scheme,):
            if "ioengine" in raw.values:
                raise BenchError(f"--ioengine={ioengine} cannot open {redact(filename)!r}; use "
                                 f"--ioengine={scheme}")
            ioengine = scheme  # the URI says which transport; no need to repeat it

    return Job(
        name=raw.name,
        origin=raw.origin,
        filename=filename,
        ioengine=ioengine,
        rw=rw,
        rwmixread=rwmixread,
        bs=bs,
        size=size,
        offset=offset,
        iodepth=parse_int(get("iodepth"), "iodepth", 1, 65536),
        numjobs=parse_int(get("numjobs"), "numjobs", 1, 1024),
        loops=loops,
        io_size=io_size,
        number_ios=number_ios,
        runtime_ns=runtime_ns,
        time_based=time_based,
        ramp_ns=parse_time_ns(get("ramp_time"), "ramp_time"),
        direct=direct,
        invalidate=parse_bool(v.get("invalidate"), "invalidate"),
        verify=verify,
        seed=seed,
        random_map=not parse_bool(v.get("norandommap"), "norandommap"),
        percentiles=_pct_list(get("percentile_list"), "percentile_list"),
        group_reporting=parse_bool(v.get("group_reporting"), "group_reporting"),
        description=v.get("description"),
        kv=kv,
        shown=dict(raw.shown),
        sqpoll=sqpoll,
        registerfiles=parse_bool(v.get("registerfiles"), "registerfiles"),
        fixedbufs=parse_bool(v.get("fixedbufs"), "fixedbufs"),
        batch_submit=batch_submit,
    )


def _resolve_kv(raw: RawJob, v: dict[str, str | None], kb_base: int) -> KvSpec | None:
    custom_keys = ("kv-layers", "kv-heads", "kv-head-dim")
    kv_keys = [k for k in raw.values if k.startswith("kv-")]
    if not kv_keys:
        return None
    name = (raw.values.get("kv-model") or "").strip().lower()
    if not name:
        name = "custom" if any(k in raw.values for k in custom_keys) else ""
    if not name:
        raise BenchError(f"--{kv_keys[0]}: only meaningful with --kv-model (the KV-cache workload)")
    if name == "custom":
        missing = [k for k in custom_keys if raw.values.get(k) is None]
        if missing:
            raise BenchError(f"--kv-model=custom: also give --{', --'.join(missing)}")
        dtype = (v.get("kv-dtype") or "bf16").lower()
        if dtype not in DTYPE_BYTES:
            raise BenchError(f"--kv-dtype: {dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
        model = KvModel(
            "custom",
            parse_int(v["kv-layers"] or "", "kv-layers", 1),
            parse_int(v["kv-heads"] or "", "kv-heads", 1),
            parse_int(v["kv-head-dim"] or "", "kv-head-dim", 1),
            dtype,
            parse_bool(v.get("kv-mla"), "kv-mla"),
        )
    elif name in KV_MODELS:
        for k in custom_keys + ("kv-dtype", "kv-mla"):
            if k in raw.values:
                raise BenchError(
                    f"--{k}: conflicts with --kv-model={name}; use --kv-model=custom to give the shape"
                )
        model = KV_MODELS[name]
    else:
        raise BenchError(f"--kv-model: unknown model {name!r} (choose {', '.join(KV_MODELS)} or custom)")
    prompts = None
    if v.get("kv-prompts") is not None:
        prompts = parse_int(v["kv-prompts"] or "", "kv-prompts", 1)
    return KvSpec(
        model=model,
        chunk_tokens=parse_int(v.get("kv-chunk-tokens") or "", "kv-chunk-tokens", 1),
        prompt_tokens=parse_int(v.get("kv-prompt-tokens") or "", "kv-prompt-tokens", 1),
        prompts=prompts,
        concurrency=parse_int(v.get("kv-concurrency") or "", "kv-concurrency", 1, 4096),
        buffer_bytes=parse_size(v.get("kv-buffer") or "", "kv-buffer", kb_base),
        store_writers=parse_int(v.get("kv-store-writers") or "0", "kv-store-writers", 0, 64),
        load_priority=_kv_priority(v.get("kv-load-priority") or "load"),
    )


def _kv_priority(text: str) -> str:
    if text.lower() not in ("load", "store", "background"):
        raise BenchError(f"--kv-load-priority: {text!r} is not load, store or background")
    return text.lower()

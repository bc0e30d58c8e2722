"""`fx100io bench` option parsing: size and time suffixes, the command line,
typed validation, the KV model table.  No I/O here."""

from __future__ import annotations

import pytest

from fx100io.bench.errors import BenchError
from fx100io.bench.options import KV_MODELS, RawJob, parse_cli, resolve_job
from fx100io.bench.sizes import (
    fmt_bytes_bin,
    fmt_bytes_dec,
    fmt_count,
    parse_bool,
    parse_size,
    parse_size_or_percent,
    parse_time_ns,
)

MiB = 1 << 20


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4096", 4096),
        ("4k", 4096),
        ("4K", 4096),
        ("4kb", 4096),
        ("4KB", 4096),
        ("1m", MiB),
        ("1024k", MiB),
        ("2g", 2 << 30),
        ("1t", 1 << 40),
        ("1.5g", 3 << 29),
        ("0x1000", 4096),
        ("4096b", 4096),
        # fio's default kb_base=1024 inverts the IEC prefixes: "i" is decimal.
        ("1mi", 1_000_000),
        ("4ki", 4000),
        ("4KiB", 4000),
    ],
)
def test_size_suffixes_follow_fio_default_kb_base(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_kb_base_1000_is_si() -> None:
    assert parse_size("4k", kb_base=1000) == 4000
    assert parse_size("4ki", kb_base=1000) == 4096
    assert parse_size("1m", kb_base=1000) == 1_000_000


@pytest.mark.parametrize("bad", ["4x", "", "k", "-4k", "4 kk", "1e9"])
def test_bad_size_names_the_option(bad: str) -> None:
    with pytest.raises(BenchError, match=r"--bs: cannot parse size"):
        parse_size(bad, "bs")


def test_size_percent() -> None:
    assert parse_size_or_percent("50%", "size") == 0.5
    assert parse_size_or_percent("8m", "size") == 8 * MiB
    with pytest.raises(BenchError, match="--offset"):
        parse_size_or_percent("150%", "offset")


@pytest.mark.parametrize(
    "text, ns",
    [
        ("10", 10_000_000_000),
        ("10s", 10_000_000_000),
        ("500ms", 500_000_000),
        ("500msec", 500_000_000),
        ("100us", 100_000),
        ("2m", 120_000_000_000),
        ("1h", 3_600_000_000_000),
        ("1.5", 1_500_000_000),
    ],
)
def test_time_suffixes(text: str, ns: int) -> None:
    assert parse_time_ns(text, "runtime") == ns


def test_bad_time_names_the_option() -> None:
    with pytest.raises(BenchError, match="--runtime: cannot parse time '5y'"):
        parse_time_ns("5y", "runtime")


def test_bool_values() -> None:
    assert parse_bool(None, "direct") is True  # a bare flag
    assert parse_bool("1", "direct") and not parse_bool("0", "direct")
    with pytest.raises(BenchError, match="--direct: expected 1 or 0"):
        parse_bool("maybe", "direct")


# ------------------------------------------------------------ printing


def test_numbers_print_like_fio_summary() -> None:
    # Pairs read off a real fio 3.33 run: 1426 IOs in 21 ms etc.
    assert fmt_count(67_900) == "67.9k"
    assert fmt_count(1426) == "1426"
    assert fmt_bytes_bin(5_840_896) == "5704KiB"
    assert fmt_bytes_dec(5_840_896) == "5841kB"
    assert fmt_bytes_bin(4 * MiB) == "4096KiB"
    assert fmt_bytes_bin(16 * MiB) == "16.0MiB"
    assert fmt_bytes_dec(278_000_000) == "278MB"
    assert fmt_count(99_970) == "100k"  # rounding carries into the next digit


# --------------------------------------------------------- command line


def test_cli_globals_then_jobs() -> None:
    cfg = parse_cli(["--bs=8k", "--filename=/x", "--name=a", "--rw=write", "--name=b", "--iodepth", "16"])
    assert [j.name for j in cfg.jobs] == ["a", "b"]
    a, b = (resolve_job(j) for j in cfg.jobs)
    assert a.bs == b.bs == 8192
    assert a.rw == "write" and b.rw == "read"
    assert b.iodepth == 16 and a.iodepth == 1


def test_cli_nameless_job_gets_a_default_name() -> None:
    cfg = parse_cli(["--filename=/x", "--rw=randread"])
    assert len(cfg.jobs) == 1 and cfg.jobs[0].name == "fx100io"


def test_cli_run_level_options() -> None:
    cfg = parse_cli(
        ["--name=a", "--filename=/x", "--output-format=json,normal", "--output=/tmp/o", "--eta=never"]
    )
    assert cfg.output_formats == ("json", "normal")
    assert cfg.output == "/tmp/o" and cfg.eta == "never"


def test_cli_flags_without_value() -> None:
    cfg = parse_cli(
        ["--name=a", "--filename=/x", "--time_based", "--runtime=1", "--direct", "--group_reporting"]
    )
    job = resolve_job(cfg.jobs[0])
    assert job.time_based and job.direct and job.group_reporting


@pytest.mark.parametrize("argv", [["--bogus=1"], ["--name=a", "--filename=/x", "--bogus"]])
def test_unknown_option_is_named(argv: list[str]) -> None:
    with pytest.raises(BenchError, match=r"unknown option '--bogus'"):
        parse_cli(argv)


def test_unknown_option_suggests_a_near_name() -> None:
    with pytest.raises(BenchError, match=r"did you mean --iodepth\?"):
        parse_cli(["--iodpeth=4"])


def test_bad_output_format_named() -> None:
    with pytest.raises(BenchError, match="--output-format: unsupported format 'terse'"):
        parse_cli(["--name=a", "--output-format=terse"])


def test_no_job_at_all() -> None:
    with pytest.raises(BenchError, match="no job given"):
        parse_cli([])


def test_help_says_how_sqthread_poll_differs_from_fio() -> None:
    from fx100io.bench.options import help_text

    text = " ".join(help_text().split())
    assert "Unlike fio, which then spins on the completion queue" in text


def test_help() -> None:
    assert parse_cli(["--help"]).show_help


# -------------------------------------------------------------- typed


def raw(**values: str | None) -> RawJob:
    values.setdefault("filename", "/tmp/x")
    return RawJob("j", dict(values), "test", dict(values))


@pytest.mark.parametrize(
    "values, message",
    [
        ({"rw": "trim"}, "--rw: 'trim' is not one of"),
        ({"bs": "4k,8k"}, "--bs: per-direction or ranged"),
        ({"bs": "0"}, "--bs: must be positive"),
        ({"rwmixread": "101"}, "--rwmixread: must be at most 100"),
        ({"iodepth": "0"}, "--iodepth: must be at least 1"),
        ({"numjobs": "x"}, "--numjobs: expected an integer"),
        ({"time_based": None}, "--time_based: needs --runtime"),
        ({"ioengine": "libaio"}, "--ioengine: 'libaio' is not one of"),
        ({"ioengine": "nvme+tcp"}, "--filename must be a nvme\\+tcp:// URI"),
        ({"verify": "md5"}, "--verify: 'md5' is not one of"),
        ({"kv-prompts": "3"}, "--kv-prompts: only meaningful with --kv-model"),
        ({"kv-model": "gpt5"}, "--kv-model: unknown model 'gpt5'"),
        ({"kv-model": "custom", "kv-layers": "2"}, "--kv-model=custom: also give --kv-heads, --kv-head-dim"),
        ({"kv-model": "llama3-8b", "kv-layers": "2"}, "--kv-layers: conflicts with --kv-model=llama3-8b"),
        ({"percentile_list": "50:abc"}, "--percentile_list: cannot parse 'abc'"),
        ({"iodepth_batch_submit": "-1"}, "--iodepth_batch_submit: must be at least 0"),
        ({"iodepth_batch": "x"}, "--iodepth_batch: expected an integer"),
        ({"io_size": "99999999999999999999999"}, "--io_size: .* more I/Os than a job can count"),
        ({"io_limit": "1e", "loops": "1000000"}, "--io_limit: .* more I/Os than a job can count"),
        ({"number_ios": str(1 << 63)}, "--number_ios: must be at most"),
        ({"loops": "99999999999999999999"}, "--loops: must be at most"),
        ({"number_ios": "-1"}, "--number_ios: must be at least 0"),
        ({"kv-model": "llama3-8b", "io_size": "1g"}, "--io_size: not with --kv-model"),
        ({"kv-model": "llama3-8b", "number_ios": "3"}, "--number_ios: not with --kv-model"),
    ],
)
def test_resolve_errors_name_the_option(values: dict, message: str) -> None:
    with pytest.raises(BenchError, match=message):
        resolve_job(raw(**values))


def test_missing_filename() -> None:
    with pytest.raises(BenchError, match="--filename is required"):
        resolve_job(RawJob("j", {}, "test"))


def test_resolve_aliases_and_defaults() -> None:
    job = resolve_job(
        raw(readwrite="randrw", rwmixwrite="30", blocksize="64k", ioengine="sync", buffered="0")
    )
    assert job.rw == "randrw" and job.rwmixread == 70 and job.bs == 65536
    assert job.ioengine == "psync" and job.direct
    assert job.percentiles[0] == 1.0 and job.percentiles[-1] == 99.99  # fio's default list
    assert not job.time_based and job.loops == 1 and job.random_map


def test_iodepth_batch_submit_and_its_alias() -> None:
    assert resolve_job(raw()).batch_submit is None  # the backend's default
    assert resolve_job(raw(iodepth_batch="8")).batch_submit == 8
    assert resolve_job(raw(iodepth_batch_submit="0")).batch_submit == 0
    # fio's full name wins over the alias
    assert resolve_job(raw(iodepth_batch="8", iodepth_batch_submit="2")).batch_submit == 2


def test_uri_scheme_picks_the_transport() -> None:
    job = resolve_job(raw(filename="nvme+tcp://127.0.0.1:4420/nqn.x/1"))
    assert job.ioengine == "nvme+tcp"
    with pytest.raises(BenchError, match="--ioengine=psync cannot open"):
        resolve_job(raw(filename="nvme+tcp://127.0.0.1:4420/nqn.x/1", ioengine="psync"))


# ------------------------------------------------------------ KV models

MODEL_CHUNK_BYTES = {
    # bf16, 256 tokens, [2, layers, tokens, kv_heads * head_dim]
    "llama3-8b": 32 * MiB,  # 32 layers, 8 KV heads, 128
    "qwen2.5-7b": 14 * MiB,  # 28 layers, 4 KV heads, 128
    "qwen2.5-32b": 64 * MiB,  # 64 layers, 8 KV heads, 128
    "llama3-70b": 80 * MiB,  # 80 layers, 8 KV heads, 128
    "deepseek-v3": 61 * 256 * 576 * 2,  # MLA latent, not doubled: 17.16 MiB
}


@pytest.mark.parametrize("name, nbytes", sorted(MODEL_CHUNK_BYTES.items()))
def test_kv_model_chunk_sizes(name: str, nbytes: int) -> None:
    assert KV_MODELS[name].chunk_bytes(256) == nbytes


def test_deepseek_chunk_is_about_17_2_mib() -> None:
    assert round(KV_MODELS["deepseek-v3"].chunk_bytes(256) / MiB, 1) == 17.2


def test_custom_kv_model() -> None:
    job = resolve_job(raw(**{"kv-layers": "2", "kv-heads": "1", "kv-head-dim": "64", "kv-dtype": "fp32"}))
    assert job.kv is not None
    assert job.kv.model.name == "custom"
    assert job.kv.model.bytes_per_token == 2 * 2 * 1 * 64 * 4
    assert job.kv.chunk_tokens == 256 and job.kv.concurrency == 1


def test_io_size_and_number_ios_count_the_ios() -> None:
    """fio's io_size (io_limit) replaces one pass per loop: less ends early,
    more wraps; a percentage is of the region's bytes; the total is rounded
    up to whole blocks; number_ios caps each loop.  (Counts checked against
    fio 3.33's.)"""
    def count(**values: str) -> int | None:
        return resolve_job(raw(bs="4k", **values)).io_count(4 * MiB)

    assert count() is None  # one pass per loop, as before
    assert count(io_size="1m") == 256
    assert count(io_size="8m") == 2048
    assert count(io_limit="8m", loops="3") == 3 * 2048
    assert count(io_size="50%") == 512
    # as fio: rounded up to whole blocks; 0 is unset; number_ios caps each loop
    assert count(io_size="6k") == 2 and count(io_size="2k") == 1
    assert count(io_size="0") is None and count(io_size="0%") is None
    assert count(number_ios="10") == 10
    assert count(number_ios="7", loops="3") == 21
    assert count(number_ios="5000", loops="2") == 2048
    assert count(io_size="8m", number_ios="100") == 100
    assert count(io_size="1m", number_ios="100", loops="2") == 200
    assert count(number_ios="0") is None
    # the total is rounded up, not each loop
    assert count(io_size="6k", loops="3") == 5
    assert count(io_size="2k", loops="4") == 2
    assert count(io_size="10k", loops="4") == 10
    # a percentage: of the region's bytes, without float error
    job = resolve_job(raw(bs="4k", io_size="7%"))
    assert job.io_count(400 * 1024) == 7 and job.io_count(43008) == 1  # 7% of 10.5 blocks
    assert resolve_job(raw(bs="4k", io_size="55%")).io_count(400 * 1024) == 55
    assert resolve_job(raw(bs="4k", io_size="50%")).io_count(43008) == 6
    assert resolve_job(raw(bs="4k", io_size="7%", loops="2")).io_count(400 * 1024) == 14
    # a time_based job runs on the clock, as in fio (which takes both)
    assert count(io_size="1m", time_based="1", runtime="1") is None
    assert count(number_ios=str(1 << 62), time_based="1", runtime="1") is None
    # a KV job refuses them, but not when they say "unset"
    for unset in ({"number_ios": "00"}, {"io_size": "0%"}, {"io_size": "0k"}):
        assert resolve_job(raw(**{"kv-model": "llama3-8b"}, **unset)).kv is not None

"""fio job files: [global] inheritance, flags, comments, includes, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from fx100io.bench.errors import BenchError
from fx100io.bench.jobfile import read_jobfile
from fx100io.bench.options import parse_cli, resolve_job


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_globals_apply_to_jobs_after_them(tmp_path: Path) -> None:
    f = write(
        tmp_path / "a.fio",
        """
; a comment
# another
[global]
ioengine=io_uring
bs=64k
direct=1
filename=/tmp/target

[seq-read]
rw=read
iodepth=16

[global]
bs=1m

[rand-write]
rw=randwrite
time_based
runtime=2
""",
    )
    jobs = [resolve_job(r) for r in read_jobfile(f)]
    assert [j.name for j in jobs] == ["seq-read", "rand-write"]
    a, b = jobs
    assert a.bs == 65536 and a.iodepth == 16 and a.direct and a.rw == "read"
    assert b.bs == 1 << 20 and b.time_based and b.runtime_ns == 2_000_000_000 and b.rw == "randwrite"
    assert a.filename == b.filename == "/tmp/target"
    assert a.shown == {
        "ioengine": "io_uring",
        "bs": "64k",
        "direct": "1",
        "filename": "/tmp/target",
        "rw": "read",
        "iodepth": "16",
    }


def test_env_expansion_and_include(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FXB_DEPTH", "32")
    write(tmp_path / "common.fio", "[global]\nbs=8k\nfilename=/tmp/t\n")
    f = write(tmp_path / "main.fio", "include common.fio\n[j]\niodepth=${FXB_DEPTH}\n")
    (job,) = [resolve_job(r) for r in read_jobfile(f)]
    assert job.iodepth == 32 and job.bs == 8192


def test_unset_env_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FXB_NOPE", raising=False)
    f = write(tmp_path / "a.fio", "[j]\nfilename=${FXB_NOPE}\n")
    with pytest.raises(BenchError, match=r"a.fio:2: environment variable \$\{FXB_NOPE\} is not set"):
        read_jobfile(f)


def test_unknown_option_names_file_and_line(tmp_path: Path) -> None:
    f = write(tmp_path / "bad.fio", "[global]\nbs=4k\n\n[j]\nfilename=/x\niodpeth=4\n")
    with pytest.raises(
        BenchError, match=r"unknown option 'iodpeth' in .*bad.fio:6 \(did you mean iodepth\?\)"
    ):
        read_jobfile(f)


@pytest.mark.parametrize(
    "text, message",
    [
        ("bs=4k\n[j]\n", "appears before any \\[section\\]"),
        ("[global]\nbs=4k\n", "defines no job"),
        ("[j\nbs=4k\n", "malformed section header"),
        ("[j]\nbs\n", "option 'bs' needs a value"),
        ("[j]\noutput-format=json\n", "is a command-line option"),
    ],
)
def test_malformed_job_files(tmp_path: Path, text: str, message: str) -> None:
    f = write(tmp_path / "m.fio", text)
    with pytest.raises(BenchError, match=message):
        read_jobfile(f)


def test_missing_job_file() -> None:
    with pytest.raises(BenchError, match="job file '/nonexistent/x.fio' not found"):
        read_jobfile("/nonexistent/x.fio")


def test_command_line_overrides_job_file(tmp_path: Path) -> None:
    f = write(tmp_path / "a.fio", "[global]\nfilename=/tmp/t\n[j]\nrw=read\niodepth=4\n")
    cfg = parse_cli(["--iodepth=64", f, "--output-format=json"], read_jobfile)
    (job,) = [resolve_job(r) for r in cfg.jobs]
    assert job.iodepth == 64 and job.rw == "read"
    assert cfg.output_formats == ("json",)


def test_an_option_and_its_alias_are_one_option(tmp_path: Path) -> None:
    """Whichever of an option's two names each place used, a job's own value
    beats [global] and the command line beats the job file (as in fio)."""
    f = write(tmp_path / "a.fio", "[global]\nfilename=/tmp/t\niodepth_batch_submit=1\nbs=8k\n"
                                  "[a]\niodepth_batch=16\nblocksize=16k\nreadwrite=randread\n"
                                  "[b]\nsqpoll\n")
    a, b = (resolve_job(r) for r in read_jobfile(f))
    assert (a.batch_submit, a.bs, a.rw) == (16, 16384, "randread")
    assert (b.batch_submit, b.bs, b.sqpoll) == (1, 8192, True)
    cfg = parse_cli(["--iodepth_batch=32", "--sqthread_poll=0", "--rw=write", f], read_jobfile)
    a, b = (resolve_job(r) for r in cfg.jobs)
    assert (a.batch_submit, a.rw, b.batch_submit, b.sqpoll) == (32, "write", 32, False)
    # the job options echo one value per option, under the name it was written with
    assert a.shown["iodepth_batch"] == "32" and "iodepth_batch_submit" not in a.shown
    assert a.shown["rw"] == "write" and "readwrite" not in a.shown
    # and an error names the option as the user wrote it
    with pytest.raises(BenchError, match="--iodepth_batch: must be at least 0"):
        resolve_job(parse_cli(["--iodepth_batch=-1", f], read_jobfile).jobs[0])
    with pytest.raises(BenchError, match="--readwrite: 'foo' is not one of"):
        resolve_job(parse_cli(["--readwrite=foo", f], read_jobfile).jobs[0])
    with pytest.raises(BenchError, match="--blocksize: must be positive"):
        resolve_job(parse_cli(["--blocksize=0", f], read_jobfile).jobs[0])


def test_two_forms_of_one_option_follow_the_same_order(tmp_path: Path) -> None:
    """direct/buffered and rwmixread/rwmixwrite are each one option set two
    ways: the later place wins whichever form it used."""
    f = write(tmp_path / "b.fio", "[global]\nfilename=/tmp/t\nbuffered=1\nrwmixread=70\n"
                                  "[j]\nrw=randrw\nrwmixwrite=20\n")
    (j,) = (resolve_job(r) for r in read_jobfile(f))
    assert not j.direct and j.rwmixread == 80
    (j,) = (resolve_job(r) for r in parse_cli(["--direct=1", "--rwmixread=10", f], read_jobfile).jobs)
    assert j.direct and j.rwmixread == 10


def test_name_option_renames_the_section(tmp_path: Path) -> None:
    f = write(tmp_path / "a.fio", "[section]\nname=renamed\nfilename=/x\n")
    (raw,) = read_jobfile(f)
    assert raw.name == "renamed"

"""`fx100io bench` end to end on real files, a loop device and every transport
this build has.  Jobs are tiny (a few MiB, well under 2 s each)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.bench import bench, popen_until_jobs_run

from fx100io.bench import verify
from fx100io.bench.options import KV_MODELS

REPO = Path(__file__).resolve().parents[2]
KiB, MiB = 1 << 10, 1 << 20


def _core_missing() -> str | None:
    try:
        import fx100io

        fx100io.open_device  # noqa: B018
        fx100io.ChunkStore  # noqa: B018
    except (ImportError, AttributeError) as e:
        return f"fx100io core not built ({e})"
    return None


pytestmark = pytest.mark.skipif(_core_missing() is not None, reason=str(_core_missing()))


def bench_json(*argv: str, expect_rc: int = 0) -> dict:
    rc, out, err = bench(*argv, "--output-format=json")
    assert rc == expect_rc, err
    return json.loads(out)


def test_write_job_bytes_counted_equal_bytes_moved(tmp_path: Path) -> None:
    f = tmp_path / "w.img"
    doc = bench_json(
        "--name=w",
        f"--filename={f}",
        "--rw=randwrite",
        "--bs=4k",
        "--size=1m",
        "--iodepth=8",
        "--direct=1",
        "--verify=crc32c",
    )
    w = doc["jobs"][0]["write"]
    assert (w["io_bytes"], w["total_ios"], w["io_kbytes"]) == (MiB, 256, 1024)
    assert doc["jobs"][0]["read"]["io_bytes"] == 0
    # Bytes moved: every block of the file now carries a verify header for
    # its own offset, written by this job, and nothing else was written.
    data = f.read_bytes()
    assert len(data) == MiB
    good = sum(verify.check(data[o : o + 4096], o, 4096) is None for o in range(0, MiB, 4096))
    assert good * 4096 == w["io_bytes"]
    v = doc["jobs"][0]["fx100io"]["verify"]
    assert (v["blocks"], v["errors"]) == (256, 0)


def test_read_job_bytes_counted_equal_bytes_moved(tmp_path: Path) -> None:
    f = tmp_path / "r.img"
    # A new file is laid out first (with verify headers), like fio does.
    doc = bench_json(
        "--name=r", f"--filename={f}", "--rw=read", "--bs=16k", "--size=2m", "--iodepth=4", "--verify=crc32c"
    )
    job = doc["jobs"][0]
    r = job["read"]
    assert (r["io_bytes"], r["total_ios"]) == (2 * MiB, 128)
    # Every block read landed in our buffer intact and from the right offset.
    v = job["fx100io"]["verify"]
    assert v["bytes"] == r["io_bytes"] and v["errors"] == 0
    assert job["error"] == 0


def test_verify_catches_a_corrupted_block(tmp_path: Path) -> None:
    f = tmp_path / "c.img"
    bench_json(
        "--name=w", f"--filename={f}", "--rw=write", "--bs=4k", "--size=512k", "--verify=crc32c", "--direct=1"
    )
    with open(f, "r+b") as fh:  # one flipped bit in block 37's payload
        fh.seek(37 * 4096 + 1000)
        b = fh.read(1)
        fh.seek(37 * 4096 + 1000)
        fh.write(bytes([b[0] ^ 0x10]))
    rc, out, err = bench(
        "--name=r",
        f"--filename={f}",
        "--rw=randread",
        "--bs=4k",
        "--verify=crc32c",
        "--iodepth=4",
        "--output-format=json",
    )
    assert rc == 1
    assert f"offset {37 * 4096}" in err and "crc32c mismatch" in err
    assert "Traceback" not in err
    job = json.loads(out)["jobs"][0]
    assert job["error"] == 84
    assert job["fx100io"]["verify"]["errors"] == 1 and job["fx100io"]["verify"]["blocks"] == 128


def test_verify_catches_a_misplaced_block(tmp_path: Path) -> None:
    f = tmp_path / "m.img"
    bench_json("--name=w", f"--filename={f}", "--rw=write", "--bs=4k", "--size=64k", "--verify=crc32c")
    data = bytearray(f.read_bytes())
    data[3 * 4096 : 4 * 4096] = data[5 * 4096 : 6 * 4096]  # a "misdirected write"
    f.write_bytes(bytes(data))
    rc, _, err = bench("--name=r", f"--filename={f}", "--rw=read", "--bs=4k", "--verify=crc32c")
    assert rc == 1 and "landed at the wrong place" in err


def _transports() -> list:
    params = [pytest.param("io_uring", id="io_uring-file"), pytest.param("psync", id="psync-file")]
    params.append(pytest.param("file-uri", id="io_uring-file-uri"))
    params.append(pytest.param("loop", id="io_uring-loop-blockdev"))
    params.append(pytest.param("nvme+tcp", id="nvme+tcp"))
    # nvme+rdma: tests/guest/test_nvme_rdma.py (this host has no RDMA; the lab guest has)
    return params


@pytest.mark.parametrize("transport", _transports())
def test_short_job_on_every_transport(transport: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    args = ["--rw=randrw", "--bs=4k", "--iodepth=8", "--runtime=1", "--direct=1"]
    if transport == "nvme+tcp":
        # our own target on loopback, over a real file
        from support.target_process import serve

        backing = tmp_path / "ns.img"
        backing.write_bytes(b"\0" * (8 * MiB))
        with serve([str(backing)], "nqn.2026-11.io.fx100:bench", block_size=4096) as (host, port, _):
            doc = bench_json("--name=t", *args, "--size=4m", "--ioengine=nvme+tcp",
                             f"--filename=nvme+tcp://{host}:{port}/nqn.2026-11.io.fx100:bench")
        job = doc["jobs"][0]
        assert job["read"]["io_bytes"] + job["write"]["io_bytes"] == 4 * MiB
        assert job["error"] == 0 and job["fx100io"]["ioengine"] == "nvme+tcp"
        return
    if transport == "loop":
        dev = request.getfixturevalue("loop_device")
        args += [f"--filename={dev}", "--size=4m", "--ioengine=io_uring"]
    elif transport == "file-uri":
        args += [f"--filename=file://{tmp_path / 't.img'}", "--size=4m"]
    else:
        args += [f"--filename={tmp_path / 't.img'}", "--size=4m", f"--ioengine={transport}"]
    doc = bench_json("--name=t", *args)
    job = doc["jobs"][0]
    total = job["read"]["io_bytes"] + job["write"]["io_bytes"]
    assert total == 4 * MiB  # not time_based: exactly --size, once
    assert job["read"]["total_ios"] + job["write"]["total_ios"] == 1024
    assert job["error"] == 0
    expected_engine = "psync" if transport == "psync" else "io_uring"
    assert job["fx100io"]["ioengine"] == expected_engine
    if transport == "psync":
        assert job["iodepth_level"]["1"] == 100.0  # synchronous: one at a time
        assert "psync is synchronous" in job["fx100io"]["engine_note"]
    else:
        assert job["iodepth_level"]["8"] > 90.0


def test_time_based_runs_for_runtime_after_ramp(tmp_path: Path) -> None:
    f = tmp_path / "t.img"
    doc = bench_json(
        "--name=t",
        f"--filename={f}",
        "--size=1m",
        "--rw=read",
        "--bs=4k",
        "--time_based",
        "--runtime=400ms",
        "--ramp_time=200ms",
        "--iodepth=2",
    )
    r = doc["jobs"][0]["read"]
    assert 400 <= r["runtime"] <= 700
    assert r["io_bytes"] > MiB  # wrapped around the 1 MiB region
    assert r["io_bytes"] == r["total_ios"] * 4096
    assert r["bw"] == r["bw_bytes"] // 1024
    assert r["bw_samples"] >= 0 and r["clat_ns"]["N"] == r["total_ios"]


def test_numjobs_and_group_reporting(tmp_path: Path) -> None:
    f = tmp_path / "n.img"
    common = ["--name=n", f"--filename={f}", "--size=1m", "--rw=randread", "--bs=4k", "--numjobs=2"]
    doc = bench_json(*common)
    assert len(doc["jobs"]) == 2
    assert [j["read"]["io_bytes"] for j in doc["jobs"]] == [MiB, MiB]
    doc = bench_json(*common, "--group_reporting")
    (job,) = doc["jobs"]
    assert job["read"]["io_bytes"] == 2 * MiB and job["read"]["total_ios"] == 512
    assert job["fx100io"]["jobs"] == 2


def test_job_file_with_two_jobs(tmp_path: Path) -> None:
    jf = tmp_path / "two.fio"
    jf.write_text(
        f"""[global]
bs=8k
size=1m
direct=1
iodepth=4

[reader]
filename={tmp_path / "a.img"}
rw=read

[writer]
filename={tmp_path / "b.img"}
rw=randwrite
"""
    )
    doc = bench_json(str(jf))
    jobs = {j["jobname"]: j for j in doc["jobs"]}
    assert jobs["reader"]["read"]["io_bytes"] == MiB and jobs["writer"]["write"]["io_bytes"] == MiB
    assert jobs["reader"]["job options"]["rw"] == "read"
    assert jobs["reader"]["job options"]["bs"] == "8k"


def test_normal_output_and_output_file(tmp_path: Path) -> None:
    out = tmp_path / "report.txt"
    rc, stdout, err = bench(
        "--name=t",
        f"--filename={tmp_path / 't.img'}",
        "--size=1m",
        "--rw=randrw",
        "--bs=4k",
        f"--output={out}",
    )
    assert rc == 0, err
    assert stdout == ""
    text = out.read_text()
    for expected in (
        "t: (groupid=0, jobs=1): err= 0",
        "read: IOPS=",
        "write: IOPS=",
        "clat percentiles (",
        "99.00th=[",
        "cpu          : usr=",
        "system cpu   :",
        "Run status group 0 (all jobs):",
        "READ: bw=",
        "WRITE: bw=",
    ):
        assert expected in text, expected


def test_both_formats(tmp_path: Path) -> None:
    rc, out, err = bench(
        "--name=t", f"--filename={tmp_path / 't.img'}", "--size=256k", "--output-format=normal,json"
    )
    assert rc == 0, err
    text, _, rest = out.partition("\n{")
    assert "read: IOPS=" in text
    assert json.loads("{" + rest)["jobs"][0]["read"]["io_bytes"] == 256 * KiB


def test_bad_input_fails_clearly_in_a_subprocess(tmp_path: Path) -> None:
    small = tmp_path / "small.img"
    small.write_bytes(b"\0" * 4096)
    for argv, message in (
        (["--name=t", "--filename=/tmp/x", "--bogus=1"], "unknown option '--bogus'"),
        (["--name=t", "--filename=/nonexistent-dir/x"], "does not exist; give --size"),
        (
            ["--name=t", f"--filename={tmp_path / 'x'}", "--size=1m", "--bs=1000", "--direct=1"],
            "--bs=1000: must be a multiple",
        ),
        (
            ["--name=t", f"--filename={small}", "--size=50%", "--offset=8k", "--rw=write"],
            "is at or past the end",
        ),
        (["--name=t", f"--filename={small}", "--size=1k"], "--size=1024 is smaller than --bs=4096"),
    ):
        p = subprocess.run(
            [sys.executable, "-m", "fx100io.bench", *argv],
            check=False,
            capture_output=True,
            text=True,
            cwd=str(REPO),
            timeout=60,
        )
        assert p.returncode == 1, (argv, p.stderr)
        assert message in p.stderr, (argv, p.stderr)
        assert "Traceback" not in p.stderr


def test_console_entry_point_if_wired() -> None:
    """`python -m fx100io bench` and the `fx100io bench` console script."""
    if not (REPO / "fx100io" / "__main__.py").exists():
        pytest.skip("fx100io's top-level CLI (fx100io/__main__.py) is not in this checkout yet")
    commands = [[sys.executable, "-m", "fx100io", "bench", "--help"]]
    script = shutil.which("fx100io")
    if script:
        commands.append([script, "bench", "--help"])
    for cmd in commands:
        p = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=str(REPO), timeout=60)
        assert p.returncode == 0, (cmd, p.stderr)
        assert "usage: fx100io bench" in p.stdout
    p = subprocess.run(
        [sys.executable, "-m", "fx100io", "bench", "--nope"],
        check=False,
        capture_output=True,
        text=True,
        cwd=str(REPO),
    )
    assert p.returncode == 1 and "unknown option '--nope'" in p.stderr and "Traceback" not in p.stderr


def test_kv_workload_custom_model(tmp_path: Path) -> None:
    f = tmp_path / "kv.store"
    doc = bench_json(
        "--name=kv", f"--filename={f}", "--kv-model=custom", "--kv-layers=2", "--kv-heads=2", "--kv-head-dim=64",
        "--kv-prompt-tokens=2000", "--kv-prompts=3", "--kv-concurrency=2", "--verify=crc32c", "--kv-buffer=1m",
    )  # fmt: skip
    job = doc["jobs"][0]
    kv = job["fx100io"]["kv"]
    assert kv["bytes_per_token"] == 2 * 2 * 2 * 64 * 2
    assert kv["chunk_bytes"] == 256 * 1024 and kv["chunks_per_prompt"] == 8  # 7 full + one of 208 tokens
    assert kv["prompt_bytes"] == 2000 * 1024
    assert kv["chunks_stored"] == kv["chunks_loaded"] == 24
    assert kv["bytes_stored"] == kv["bytes_loaded"] == 3 * 2000 * 1024
    assert kv["misses"] == 0 and kv["prompts_loaded"] == 3
    assert kv["window_chunks"] == 2  # 1 MiB of buffers / 2 prompts / 256 KiB chunks
    assert job["write"]["io_bytes"] == job["read"]["io_bytes"] == kv["bytes_loaded"]
    assert job["read"]["total_ios"] == 24
    assert kv["prefix_load_ns"]["N"] == 3 and "99.000000" in kv["prefix_load_ns"]["percentile"]
    assert job["fx100io"]["verify"]["blocks"] == 24 and job["fx100io"]["verify"]["errors"] == 0


def test_kv_default_prompts_fit_the_size_given(tmp_path: Path) -> None:
    """Without --kv-prompts, as many prompts as --size holds once the store's own room is
    counted: 4 prompts' bytes + 64 MiB holds 3 (it used to plan size // prompt, 12, and
    refuse its own plan)."""
    f = tmp_path / "kv.store"
    prompt = 8192 * 1024  # 8192 tokens of 1 KiB (the custom model below)
    doc = bench_json(
        "--name=kv", f"--filename={f}", "--kv-model=custom", "--kv-layers=2", "--kv-heads=2", "--kv-head-dim=64",
        "--kv-prompt-tokens=8192", f"--size={4 * prompt + (64 << 20)}", "--kv-buffer=2m",
    )  # fmt: skip
    kv = doc["jobs"][0]["fx100io"]["kv"]
    assert kv["prompt_bytes"] == prompt
    assert kv["prompts"] == 3 and kv["prompts_loaded"] == 3 and kv["misses"] == 0


def test_kv_mixed_job_loads_under_a_store_storm(tmp_path: Path) -> None:
    """--kv-store-writers: writers keep storing chunks while the prompts load; the
    loads are all there and verified, the storm's chunks and GB/s are reported, and the
    loads' class is what --kv-load-priority says."""
    f = tmp_path / "mix.store"
    doc = bench_json(
        "--name=mix", f"--filename={f}", "--kv-model=custom", "--kv-layers=2", "--kv-heads=2",
        "--kv-head-dim=64", "--kv-prompt-tokens=2048", "--kv-prompts=4", "--kv-buffer=2m",
        "--kv-store-writers=2", "--kv-load-priority=load", "--verify=crc32c",
    )  # fmt: skip
    kv = doc["jobs"][0]["fx100io"]["kv"]
    assert kv["store_writers"] == 2 and kv["load_priority"] == "load"
    assert kv["chunks_loaded"] == 4 * 8 and kv["misses"] == 0
    assert kv["storm_chunks"] >= 0 and kv["storm_bytes"] == kv["storm_chunks"] * 256 * 1024
    assert doc["jobs"][0]["fx100io"]["verify"]["errors"] == 0
    rc, _out, err = bench("--name=m", f"--filename={tmp_path / 'm.store'}", "--kv-model=custom",
                          "--kv-layers=2", "--kv-heads=2", "--kv-head-dim=64",
                          "--kv-load-priority=urgent")
    assert rc == 1 and "--kv-load-priority" in err


def test_kv_workload_named_model(tmp_path: Path) -> None:
    f = tmp_path / "kv7b.store"
    rc, out, err = bench(
        "--name=q",
        f"--filename={f}",
        "--kv-model=qwen2.5-7b",
        "--kv-prompt-tokens=512",
        "--kv-prompts=1",
        "--kv-buffer=32m",
    )
    assert rc == 0, err
    assert "model=qwen2.5-7b, chunk=256 tokens = 14.0MiB" in out
    assert "time to load a 512-token prefix" in out
    assert KV_MODELS["qwen2.5-7b"].chunk_bytes(256) == 14 * MiB


def test_status_line_when_forced(tmp_path: Path) -> None:
    rc, _, err = bench(
        "--name=s",
        f"--filename={tmp_path / 's.img'}",
        "--size=1m",
        "--time_based",
        "--runtime=1300ms",
        "--eta=always",
    )
    assert rc == 0
    assert "Jobs: 1 (f=1): [R(1)]" in err and "IOPS][eta" in err


def test_quiet_when_not_a_terminal(tmp_path: Path) -> None:
    rc, _, err = bench("--name=s", f"--filename={tmp_path / 's.img'}", "--size=64k")
    assert rc == 0 and err == ""


def test_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is the optional [plot] extra")
    png = tmp_path / "p.png"
    rc, _, err = bench(
        "--name=p", f"--filename={tmp_path / 'p.img'}", "--size=1m", "--rw=randrw", f"--plot={png}"
    )
    assert rc == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_offset_and_percent_size(tmp_path: Path) -> None:
    f = tmp_path / "o.img"
    with open(f, "wb") as fh:
        fh.truncate(4 * MiB)
    doc = bench_json("--name=o", f"--filename={f}", "--offset=1m", "--size=50%", "--rw=write", "--bs=64k")
    job = doc["jobs"][0]
    assert job["fx100io"]["region_offset"] == MiB and job["fx100io"]["region_bytes"] == 2 * MiB
    assert job["write"]["io_bytes"] == 2 * MiB
    assert os.path.getsize(f) == 4 * MiB


@pytest.mark.parametrize("numjobs", [1, 2])
def test_ctrl_c_stops_jobs_and_still_reports(tmp_path: Path, numjobs: int) -> None:
    argv = [
        sys.executable,
        "-m",
        "fx100io.bench",
        "--name=c",
        f"--filename={tmp_path / 'c.img'}",
        "--size=1m",
    ]
    argv += [
        "--time_based",
        "--runtime=30",
        f"--numjobs={numjobs}",
        "--group_reporting",
        "--output-format=json",
        "--eta=always",
    ]
    # Ctrl-C once the jobs run (the status line starts then), not after a fixed sleep: on
    # a loaded machine a signal during Python's start-up would be an ordinary interrupt.
    p, seen, reader = popen_until_jobs_run(argv)
    p.send_signal(signal.SIGINT)
    out = p.stdout.read().decode() if p.stdout else ""
    p.wait(timeout=60)
    reader.join(10)
    err = seen.decode(errors="replace")
    assert p.returncode == 0, err
    job = json.loads(out)["jobs"][0]
    assert job["read"]["io_bytes"] > 0
    assert job["read"]["runtime"] < 10_000  # stopped early, not after 30 s


def test_setup_failure_in_one_of_several_jobs(tmp_path: Path) -> None:
    rc, _, err = bench(
        "--size=1m",
        "--name=good",
        f"--filename={tmp_path / 'g.img'}",
        "--name=bad",
        f"--filename={tmp_path / 'no-such-dir' / 'b.img'}",
    )
    assert rc == 1
    assert "bad" in err and "Traceback" not in err


def test_disk_saw_at_least_the_bytes_we_counted(tmp_path: Path) -> None:
    """Direct I/O reaches the disk: its /proc/diskstats counters over the run
    (shared with anything else writing to that disk) cover our io_bytes."""
    doc = bench_json(
        "--name=d", f"--filename={tmp_path / 'd.img'}", "--size=2m", "--bs=64k", "--rw=write", "--direct=1"
    )
    if not doc["disk_util"]:
        pytest.skip(f"{tmp_path} is not on a block device (tmpfs/overlay): no disk stats to compare")
    (disk,) = doc["disk_util"]
    assert disk["write_ios"] >= 32
    assert disk["write_bytes"] >= doc["jobs"][0]["write"]["io_bytes"] == 2 * MiB
    doc = bench_json(
        "--name=d", f"--filename={tmp_path / 'd.img'}", "--size=2m", "--bs=64k", "--rw=read", "--direct=1"
    )
    assert doc["disk_util"][0]["read_bytes"] >= doc["jobs"][0]["read"]["io_bytes"] == 2 * MiB


def test_status_line_progress_counts_io_size_and_number_ios() -> None:
    """The status line's done fraction is of what the job will move: its
    --io_size (or --number_ios), not its region."""
    from fx100io.bench.options import RawJob, resolve_job
    from fx100io.bench.progress import ELAPSED_MS, RBYTES, RUNNING, SLOT, STATE
    from fx100io.bench.status_line import fraction_done

    def done_at(moved: int, **values: str) -> float | None:
        job = resolve_job(RawJob("j", {"filename": "/tmp/x", "size": "4m", "bs": "4k", **values}, "test"))
        slot = [0] * SLOT
        slot[RBYTES], slot[STATE], slot[ELAPSED_MS] = moved, RUNNING, 1
        return fraction_done(job, slot)

    assert done_at(2 * MiB) == pytest.approx(0.5)
    assert done_at(2 * MiB, io_size="16m") == pytest.approx(0.125)
    assert done_at(2 * MiB, io_size="50%") == pytest.approx(1.0)
    assert done_at(40 * 1024, number_ios="20") == pytest.approx(0.5)

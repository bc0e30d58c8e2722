"""tools/compare_fio: one job file under fio and fx100io bench, side by side."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "compare_fio"


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (apt-get install fio)")
def test_compare_fio_table_and_json(tmp_path: Path) -> None:
    jf = tmp_path / "job.fio"
    jf.write_text(
        f"[global]\nfilename={tmp_path / 't.img'}\nsize=1m\nbs=4k\n\n[r]\nrw=randread\niodepth=4\nioengine=libaio\n"
    )
    p = subprocess.run(
        [sys.executable, str(TOOL), str(jf), "--repeat=1"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "fio ioengine=io_uring" in lines[0]
    row = next(line for line in lines if line.startswith("read IOPS"))
    assert len(row.split()) == 5  # metric (2 words), fio, fx100io, ratio
    assert float(row.split()[-1]) > 0
    p = subprocess.run(
        [sys.executable, str(TOOL), str(jf), "--repeat=1", "--json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    # Same job, same size: both tools moved 1 MiB of 4 KiB reads.
    for tool in ("fio", "fx100io"):
        assert doc["median"][tool]["read IOPS"] > 0
        assert "machine CPUs busy" in doc["median"][tool]


def test_compare_fio_refuses_bad_job_files(tmp_path: Path) -> None:
    jf = tmp_path / "bad.fio"
    jf.write_text("[j]\nfilename=/tmp/x\nbogus=1\n")
    p = subprocess.run(
        [sys.executable, str(TOOL), str(jf), "--repeat=1", "--fio=/bin/true"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 1
    assert "unknown option 'bogus'" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (apt-get install fio)")
def test_compare_fio_standard_jobs_print_both_ratios(tmp_path: Path) -> None:
    """--standard runs the 4k QD32 and 128k QD8 random-read jobs; each ends
    with the IOPS ratio and the CPU-per-I/O ratio (values not asserted)."""
    target = tmp_path / "std.img"
    p = subprocess.run(
        [sys.executable, str(TOOL), f"--standard={target}", "--size=1m", "--repeat=1"],
        check=False, capture_output=True, text=True, timeout=180,
    )
    assert p.returncode == 0, p.stderr
    for name in ("randread-4k-qd32", "randread-128k-qd8"):
        assert any(line.startswith(f"{name}: IOPS ratio fx100io/fio ") for line in p.stdout.splitlines())
        assert any(line.startswith(f"{name}: CPU per I/O ratio fx100io/fio ") for line in p.stdout.splitlines())
    p = subprocess.run(
        [sys.executable, str(TOOL), f"--standard={target}", "--size=1m", "--repeat=1", "--json"],
        check=False, capture_output=True, text=True, timeout=180,
    )
    assert p.returncode == 0, p.stderr
    docs = json.loads(p.stdout)["comparisons"]
    assert [d["jobfile"] for d in docs] == ["randread-4k-qd32", "randread-128k-qd8"]
    for d in docs:
        # same job, same region: both tools did the same number of I/Os
        want = (1 << 20) // (4096 if d["jobfile"] == "randread-4k-qd32" else 128 * 1024)
        assert {t: d["runs"][t][0]["I/Os"] for t in ("fio", "fx100io")} == {"fio": want, "fx100io": want}
        assert all(d["runs"][t][0]["IOPS"] > 0 for t in ("fio", "fx100io"))
        # and with the same io_uring registrations, written out for both
        assert d["features"]["fio"][:2] == ["fixedbufs=1", "registerfiles=1"]
        assert {"fixedbufs", "registerfiles"} <= set(d["features"]["fx100io"])
        assert d["features"]["fx100io"][0] == "loop=c"
        assert d["ratios"]["iops"] > 0 and d["ratios"]["cpu_per_io_process"] > 0
        assert "cpu_per_io_job" in d["ratios"]  # None when a tiny job shows 0% CPU


def test_compare_fio_needs_a_job(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(TOOL), "--fio=/bin/true"], check=False, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1 and "give a job file or --standard" in p.stderr


def load_tool():
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("compare_fio_tool", str(TOOL))
    spec = importlib.util.spec_from_loader("compare_fio_tool", loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_normalised_jobfile_sets_the_registrations_for_both_tools(tmp_path: Path) -> None:
    """fio's defaults for fixedbufs and registerfiles are off, fx100io's on:
    the normalised job file spells out the values fx100io runs with, for
    both tools, and keeps a job's own choice."""
    tool = load_tool()
    jf = tmp_path / "job.fio"
    jf.write_text(f"[a]\nfilename={tmp_path / 'a.img'}\nsize=1m\nrw=randread\n\n"
                  f"[b]\nfilename={tmp_path / 'b.img'}\nsize=1m\nrw=randread\nfixedbufs=0\n")
    text = tool.normalised_jobfile(str(jf), "io_uring")
    a, b = text.split("[a]")[1].split("[b]")
    assert a.count("fixedbufs=1") == 1 and a.count("registerfiles=1") == 1
    assert b.count("fixedbufs=0") == 1 and "fixedbufs=1" not in b and b.count("registerfiles=1") == 1
    assert "fixedbufs" not in tool.normalised_jobfile(str(jf), "psync")


def test_standard_target_laid_out_before_the_rounds(tmp_path: Path) -> None:
    """--standard writes its file target out to full size before the first
    round, so no tool's measured run pays for creating it.  A stand-in fio
    (fx100io bench, which reads the same files and writes fio's JSON) notes
    the target's size each time it starts."""
    target = tmp_path / "std.img"
    log = tmp_path / "sizes.log"
    fake = tmp_path / "fio"
    fake.write_text(
        "#!/bin/sh\n"
        f"stat -c %s {target} >> {log} 2>/dev/null || echo missing >> {log}\n"
        f"exec {sys.executable} -m fx100io.bench \"$@\"\n"
    )
    fake.chmod(0o755)
    p = subprocess.run(
        [sys.executable, str(TOOL), f"--standard={target}", "--size=1m", "--repeat=1", f"--fio={fake}"],
        check=False, capture_output=True, text=True, timeout=180, cwd=str(REPO),
    )
    assert p.returncode == 0, p.stderr
    sizes = log.read_text().split()
    assert len(sizes) == 4 and set(sizes) == {str(1 << 20)}, sizes

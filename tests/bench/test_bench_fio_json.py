"""Our --output-format=json next to what the real fio writes for the same job.

Each job runs under fio (io_uring engine) and under `fx100io bench`, on
separate files, and the two documents are compared field by field: the same
keys (less a documented few we cannot measure), the same types, the same
units, and for fixed-size jobs the same byte and I/O counts.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fx100io.bench import cli

FIO = shutil.which("fio")

pytestmark = pytest.mark.skipif(
    FIO is None, reason="fio is not installed (apt-get install fio); it is the reference"
)

# Keys fio has that we leave out, and why:
#  iodepth_submit / iodepth_complete: how many I/Os each submit / reap call
#    carried happens inside the core, which does not report it.
NOT_MEASURED = {"iodepth_submit", "iodepth_complete"}

JOBS = {
    "seqread": "rw=read\nbs=4k\nsize=2m\niodepth=4\ndirect=1\n",
    "randwrite": "rw=randwrite\nbs=16k\nsize=2m\niodepth=8\ndirect=1\n",
    "randrw": "rw=randrw\nrwmixread=70\nbs=4k\nsize=2m\niodepth=8\ndirect=1\n",
}


def run_fio(jobfile: Path) -> dict[str, Any]:
    p = subprocess.run(
        [FIO, "--output-format=json", str(jobfile)], check=False, capture_output=True, text=True, timeout=60
    )
    if p.returncode != 0 and "io_uring" in p.stderr:
        pytest.skip(f"fio cannot use io_uring here: {p.stderr.strip()[:200]}")
    assert p.returncode == 0, p.stderr
    # fio may print notes before the JSON document.
    return json.loads(p.stdout[p.stdout.index("{") :])


def run_ours(jobfile: Path) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    rc = cli.run(["--output-format=json", str(jobfile)], stdout=out, stderr=err)
    assert rc == 0, err.getvalue()
    return json.loads(out.getvalue())


def shape(doc: Any, prefix: str = "") -> dict[str, str]:
    """path -> JSON type of every leaf ("number" for int and float alike)."""
    out: dict[str, str] = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.update(shape(v, f"{prefix}/{k}"))
    elif isinstance(doc, list):
        out[prefix] = "list"
        for v in doc[:1]:
            out.update(shape(v, prefix + "[]"))
    else:
        out[prefix] = (
            "number" if isinstance(doc, (int, float)) and not isinstance(doc, bool) else type(doc).__name__
        )
    return out


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, dict]]:
    base = tmp_path_factory.mktemp("fiojson")
    out = {}
    for name, body in JOBS.items():
        docs = []
        for tool in ("fio", "fx"):
            jf = base / f"{name}.{tool}.fio"
            jf.write_text(
                f"[global]\nioengine=io_uring\nfilename={base / (name + '.' + tool + '.img')}\n\n[{name}]\n{body}"
            )
            docs.append(run_fio(jf) if tool == "fio" else run_ours(jf))
        out[name] = (docs[0], docs[1])
    return out


@pytest.mark.parametrize("name", sorted(JOBS))
def test_same_fields_and_types(pairs: dict, name: str) -> None:
    fio_doc, ours = pairs[name]
    fio_shape = shape(fio_doc["jobs"][0])
    our_shape = shape(ours["jobs"][0])
    missing = sorted(k for k in fio_shape if k not in our_shape and k.split("/")[1] not in NOT_MEASURED)
    assert missing == [], f"fio has fields we lack: {missing}"
    wrong_type = sorted(
        (k, fio_shape[k], our_shape[k]) for k in fio_shape if k in our_shape and fio_shape[k] != our_shape[k]
    )
    assert wrong_type == []
    for key in ("jobs", "timestamp", "timestamp_ms", "time", "fio version", "disk_util"):
        assert key in ours
        assert type(ours[key]) is type(fio_doc[key])
    # Disk stats: the same disk, with fio's fields, when fio found one.
    if fio_doc["disk_util"]:
        assert [d["name"] for d in ours["disk_util"]] == [d["name"] for d in fio_doc["disk_util"]]
        assert set(fio_doc["disk_util"][0]) <= set(ours["disk_util"][0])


@pytest.mark.parametrize("name", sorted(JOBS))
def test_same_counts_for_a_fixed_size_job(pairs: dict, name: str) -> None:
    fio_doc, ours = pairs[name]
    f, o = fio_doc["jobs"][0], ours["jobs"][0]
    assert o["jobname"] == f["jobname"] == name
    assert o["error"] == f["error"] == 0
    total = {doc: sum(j[d]["io_bytes"] for d in ("read", "write")) for doc, j in (("fio", f), ("ours", o))}
    assert total["ours"] == total["fio"] == 2 << 20
    ios = {doc: sum(j[d]["total_ios"] for d in ("read", "write")) for doc, j in (("fio", f), ("ours", o))}
    assert ios["ours"] == ios["fio"]
    if name != "randrw":  # the read/write split of a mixed job is random in both
        for d in ("read", "write"):
            for key in ("io_bytes", "io_kbytes", "total_ios", "short_ios", "drop_ios"):
                assert o[d][key] == f[d][key], (d, key)
    for key, value in f["job options"].items():
        if key != "name":
            assert o["job options"].get(key) == value, key


@pytest.mark.parametrize("name", sorted(JOBS))
@pytest.mark.parametrize("tool", ["fio", "ours"])
def test_units_are_fios(pairs: dict, name: str, tool: str) -> None:
    """The unit relations hold in both documents: bw KiB/s, bw_bytes B/s,
    runtime ms, latencies ns; the checks run on fio's output too, so they
    are fio's conventions and not our assumptions."""
    doc = pairs[name][0 if tool == "fio" else 1]
    job = doc["jobs"][0]
    for d in ("read", "write"):
        s = job[d]
        if not s["total_ios"]:
            continue
        assert s["io_kbytes"] == s["io_bytes"] // 1024
        assert abs(s["bw"] - s["bw_bytes"] / 1024) <= 1
        ms = max(s["runtime"], 1)
        assert abs(s["bw_bytes"] - s["io_bytes"] * 1000 / ms) <= 1
        assert s["iops"] == pytest.approx(s["total_ios"] * 1000 / ms, rel=1e-6)
        clat = s["clat_ns"]
        assert clat["N"] == s["total_ios"]
        assert 0 < clat["min"] <= clat["mean"] <= clat["max"]
        pct = clat["percentile"]
        assert list(pct) == ["1.000000", "5.000000", "10.000000", "20.000000", "30.000000", "40.000000", "50.000000",
                             "60.000000", "70.000000", "80.000000", "90.000000", "95.000000", "99.000000", "99.500000",
                             "99.900000", "99.950000", "99.990000"]  # fmt: skip
        values = list(pct.values())
        assert values == sorted(values)
        # Percentiles are within the latency range (fio's histogram
        # rounding may put a bucket value a few percent past max).
        assert clat["min"] * 0.9 <= values[0] and values[-1] <= clat["max"] * 1.1
        # Latencies are ns: a 4-16 KiB I/O takes between 100 ns and 10 s.
        assert 100 < clat["mean"] < 10e9
    # Percent of one CPU over the job's runtime; io_uring's io-wq workers are
    # threads of the process, so a short job can pass 100 on a multi-core box.
    ncpu = os.cpu_count() or 1
    assert 0 <= job["usr_cpu"] <= 100 * ncpu and 0 <= job["sys_cpu"] <= 100 * ncpu
    assert job["job_runtime"] >= 0
    levels = job["iodepth_level"]
    assert list(levels) == ["1", "2", "4", "8", "16", "32", ">=64"]
    assert sum(levels.values()) == pytest.approx(100.0, abs=0.5)
    lat = [*job["latency_ns"].values(), *job["latency_us"].values(), *job["latency_ms"].values()]
    assert sum(lat) == pytest.approx(100.0, abs=1.0)


def test_latency_in_the_same_ballpark(pairs: dict) -> None:
    """Same job, same machine: median completion latency within 20x of fio
    (a sanity check on units and timing points, not a performance claim)."""
    for name in JOBS:
        fio_doc, ours = pairs[name]
        for d in ("read", "write"):
            f, o = fio_doc["jobs"][0][d], ours["jobs"][0][d]
            if f["total_ios"] and o["total_ios"]:
                fm, om = f["clat_ns"]["percentile"]["50.000000"], o["clat_ns"]["percentile"]["50.000000"]
                assert fm / 20 < om < fm * 20, (name, d, fm, om)


def test_system_cpu_extra_field(pairs: dict) -> None:
    _, ours = pairs["seqread"]
    s = ours["jobs"][0]["system_cpu"]
    assert set(s) >= {"usr", "sys", "irq", "softirq", "iowait", "idle", "busy", "cpus", "busy_cpus"}
    assert 0.0 <= s["busy"] <= 100.0 and s["cpus"] >= 1
    assert ours["system_cpu"] == s

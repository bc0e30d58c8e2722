"""`fx100io bench` on a multipath URI (issue 27: per-path stats in the bench's report).

Two `fx100io target` processes serve one file under one NQN (two paths to one
namespace, as tests/fabric/test_multipath.py sets them up).  The job runs on
the Python I/O loop (a request may move between paths), and the report shows
per path what it carried: the per-path commands and bytes add up to the job's
I/Os and bytes exactly, in the JSON and in the normal report's table.
"""

from __future__ import annotations

import json
from pathlib import Path

from support.bench import bench
from support.target_process import serve

NQN = "nqn.2026-12.io.fx100:bench-multipath"
KiB, MiB = 1 << 10, 1 << 20


def test_bench_reports_each_path(tmp_path: Path) -> None:
    ns = tmp_path / "ns.img"
    ns.write_bytes(b"\0" * (4 * MiB))
    with serve([str(ns)], NQN, block_size=4096) as (_, pa, _a), \
            serve([str(ns)], NQN, block_size=4096) as (_, pb, _b):
        uri = f"nvme+tcp://127.0.0.1:{pa},127.0.0.1:{pb}/{NQN}"
        size, bs = 2 * MiB, 16 * KiB
        n = size // bs
        args = ["--name=mp", "--rw=randrw", f"--bs={bs}", "--iodepth=8", f"--size={size}",
                "--randseed=7", "--ioengine=nvme+tcp", f"--filename={uri}"]
        rc, out, err = bench(*args, "--output-format=json")
        assert rc == 0, err
        job = json.loads(out)["jobs"][0]
        assert job["error"] == 0
        fx = job["fx100io"]
        assert fx["io_loop"] == "python"
        paths = fx["paths"]
        assert [p["path"].split("/")[2] for p in paths] == [f"127.0.0.1:{pa}", f"127.0.0.1:{pb}"]
        r, w = job["read"], job["write"]
        assert r["total_ios"] + w["total_ios"] == n
        # every command of the job (no layout: the file exists) ran on one path
        assert sum(p["commands"] for p in paths) == n
        assert sum(p["bytes"] for p in paths) == n * bs == r["io_bytes"] + w["io_bytes"]
        assert all(p["commands"] > 0 for p in paths), paths  # round-robin uses both
        assert all(p["state"] == "live" and p["errors"] == 0 and p["failovers"] == 0 for p in paths)

        rc, out, err = bench(*args)
        assert rc == 0, err
        lines = out.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("  paths        : 2"))
        head = lines[at + 1].split()
        assert head == ["address", "state", "ana", "commands", "bytes", "errors", "failovers"]
        rows = [lines[at + 2].split(), lines[at + 3].split()]
        assert [row[0] for row in rows] == [f"127.0.0.1:{pa}", f"127.0.0.1:{pb}"]
        assert sum(int(row[3]) for row in rows) == n
        assert all(row[1] == "live" for row in rows)


def test_group_reporting_sums_paths_path_by_path() -> None:
    from fx100io.bench.results import merge_paths

    a = [{"path": "A", "state": "live", "ana_state": "optimized", "commands": 3, "bytes": 30,
          "errors": 0, "failovers": 0},
         {"path": "B", "state": "down", "ana_state": "none", "commands": 1, "bytes": 10,
          "errors": 1, "failovers": 1}]
    b = [{"path": "B", "state": "live", "ana_state": "optimized", "commands": 2, "bytes": 20,
          "errors": 0, "failovers": 0},
         {"path": "C", "state": "live", "ana_state": "none", "commands": 5, "bytes": 50,
          "errors": 0, "failovers": 0}]
    got = merge_paths(merge_paths([], a), b)
    assert [(p["path"], p["commands"], p["bytes"], p["errors"], p["failovers"], p["state"])
            for p in got] == [("A", 3, 30, 0, 0, "live"), ("B", 3, 30, 1, 1, "live"),
                              ("C", 5, 50, 0, 0, "live")]
    assert a[1]["commands"] == 1  # the inputs are left as they were

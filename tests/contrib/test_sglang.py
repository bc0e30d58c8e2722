"""fx100io's SGLang HiCache backend, loaded by the real sglang package's own backend
factory (``--hicache-storage-backend dynamic``) in the venv of tools/install_sglang.sh.

sglang pins its own torch and many packages, so it lives in a venv of its own: each test
here runs tests/support/sglang_driver.py with that venv's python, on this checkout's fx100io,
and asserts what the driver found (byte-exact pages, hit counts, errors)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.target_process import serve

import fx100io

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("FX100IO_SGLANG_VENV", "/var/cache/fx100io/venv-sglang"))
DRIVER = Path(__file__).resolve().parents[1] / "support" / "sglang_driver.py"
# the fx100io the suite runs on (the checkout, or the ASan suite's copy of it)
PKG_ROOT = Path(fx100io.__file__).resolve().parent.parent

CHECKS = [
    "round_trip_page_first",
    "round_trip_layer_first",
    "round_trip_bounced",
    "leading_hits",
    "concurrent_backup_and_prefetch",
    "mla_non_writer_does_not_write",
    "corrupt_chunk_is_false",
    "bad_config",
    "close_and_recreate",
    "tensor_api",
    "restart_write",
    "mla_tp_needs_shared_index",
    "page_first_direct_not_aliased",
    "keys_scoped_by_name_geometry_namespace",
    "interface_v1_string",
    "close_with_call_in_flight",
    "timeout_bounds_calls",
    "priorities_passed",
    "metrics_bounded",
    "page_meta_checked",
    "wrong_size_chunk_replaced",
    "hybrid_refused",
    "breaker_device_errors_only",
    "world_size_counts_dp",
    "clear_own_scope_off_loop",
    "store_bounce_on_whole_block_device",
    "cancelled_read_never_lands_after_return",
]


def venv_python() -> Path:
    py = VENV / "bin" / "python"
    if not py.exists():
        # tools/test.sh builds it first; a targeted run tries here (needs the network)
        p = subprocess.run([str(ROOT / "tools" / "install_sglang.sh"), sys.executable],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0 or not py.exists():
            pytest.skip(f"no sglang venv at {VENV} and tools/install_sglang.sh could not "
                        f"build it: {p.stderr.strip()[-300:]}")
    return py


def drive(mode: str, workdir: Path | str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(PKG_ROOT), FX100IO_EXPECT=str(PKG_ROOT))
    p = subprocess.run([str(venv_python()), str(DRIVER), mode, str(workdir)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    d = tmp_path_factory.mktemp("sglang")
    return d, drive("suite", d)


@pytest.mark.parametrize("check", CHECKS)
def test_sglang_backend(suite, check):
    _d, results = suite
    assert results.get(check) == "ok", results.get(check, f"{check} did not run")


@pytest.mark.parametrize("block_size", [512, 4096])
def test_sglang_over_nvme_tcp(tmp_path, block_size):
    """A blank NVMe/TCP namespace of our own target: formatted on first use (create:
    auto), pages byte-exact in place or through the bounce buffer, found again."""
    backing = tmp_path / "ns.img"
    with open(backing, "wb") as f:
        f.truncate(64 << 20)
    nqn = "nqn.2026-12.io.fx100:sglang"
    with serve([str(backing)], nqn, block_size=block_size) as (host, port, _):
        assert drive("fabric", f"nvme+tcp://{host}:{port}/{nqn}") == {"fabric": "ok"}


def test_sglang_restart_new_process_finds_every_page(suite):
    d, results = suite
    assert results["restart_write"] == "ok"
    assert drive("reopen", d) == {"reopen": "ok"}

"""fx100io's vLLM secondary tier, loaded by the real vllm package's own tier loader.

vllm 0.33 pins a CUDA build of torch, so it lives in a venv of its own
(tools/install_vllm.sh); tests/vllm_tier_driver.py runs there once per session, loads the
tier through SecondaryTierFactory over vLLM's own primary memory, and reports one JSON
line per check. Each test below asserts one of those checks.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("FX100IO_VLLM_VENV", "/var/cache/fx100io/venv-vllm"))
VPY = VENV / "bin" / "python"


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    if not VPY.exists():
        pytest.skip(f"no vllm venv at {VENV}: run tools/install_vllm.sh (tools/test.sh does)")
    work = tmp_path_factory.mktemp("vllm")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [str(VPY), str(ROOT / "tests" / "vllm_tier_driver.py"), str(work)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    checks = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            checks[rec["check"]] = rec
    if not checks:
        pytest.fail(f"driver produced no checks (rc {proc.returncode}):\n{proc.stdout[-4000:]}"
                    f"\n{proc.stderr[-8000:]}")
    checks["_stderr"] = {"detail": proc.stderr[-8000:]}
    return checks


CHECKS = [
    "loaded_by_vllm_factory",
    "roundtrip_lookup_jobs",
    "each_job_once",
    "load_of_absent_key_fails",
    "verdicts_live_per_request",
    "namespaced_by_model_dtype_layout",
    "restart_same_file",
    "corrupt_chunk_is_a_failed_load",
    "bad_config_clear_error",
    "late_answer_for_finished_request_kept_nowhere",
    "eviction_keeps_other_verdicts",
    "shutdown_with_job_in_flight_raises",
    "shared_store_uses_async_index",
    "shutdown_then_recreate",
]


@pytest.mark.parametrize("name", CHECKS)
def test_vllm_tier(driver: dict[str, dict], name: str) -> None:
    rec = driver.get(name)
    assert rec is not None, f"check {name} never ran; driver stderr:\n{driver['_stderr']['detail']}"
    assert rec["ok"], rec["detail"]


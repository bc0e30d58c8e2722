"""fx100io's vLLM secondary tier, loaded by the real vllm package's own tier loader.

vllm 0.33 pins a CUDA build of torch, so it lives in a venv of its own
(tools/install_vllm.sh); tests/support/vllm_tier_driver.py runs there once per session, loads the
tier through SecondaryTierFactory over vLLM's own primary memory, and reports one JSON
line per check. Each test below asserts one of those checks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("FX100IO_VLLM_VENV", "/var/cache/fx100io/venv-vllm"))
VPY = VENV / "bin" / "python"


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    if not VPY.exists():
        pytest.skip(f"no vllm venv at {VENV}: run tools/install_vllm.sh (tools/test.sh does)")
    # A venv left half-made (an offline machine: install_vllm.sh exits 3) is not ready.
    ready = subprocess.run(
        ["bash", str(ROOT / "tools" / "install_vllm.sh")],
        env=dict(os.environ, FX100IO_VLLM_CHECK_ONLY="1"), capture_output=True, text=True,
        timeout=600,
    )
    if ready.returncode != 0:
        pytest.skip(f"the vllm venv at {VENV} is not ready (tools/install_vllm.sh): "
                    f"{ready.stderr.strip()[-400:]}")
    work = tmp_path_factory.mktemp("vllm")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [str(VPY), str(ROOT / "tests" / "support" / "vllm_tier_driver.py"), str(work)],
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
    "priorities_passed",
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
    "failing_store_trips_breaker_logs_once",
    "hung_job_trips_breaker",
    "dp_rank_placeholder_and_namespace_setting",
    "out_of_range_chunk_ids_fail_the_job",
    "chunk_of_another_size_is_a_miss",
    "through_vllm_tiering_manager",
    "shutdown_closes_the_store_with_aclose",
    "verdicts_random_orderings_against_a_model",
    "touch_keeps_a_chunk_from_eviction",
    "kv_events_stored_and_evicted",
    "kv_events_off_unless_asked_and_on_globally",
    "load_never_lands_after_the_job_is_reported",
    "shutdown_then_recreate",
]


@pytest.mark.parametrize("name", CHECKS)
def test_vllm_tier(driver: dict[str, dict], name: str) -> None:
    rec = driver.get(name)
    assert rec is not None, f"check {name} never ran; driver stderr:\n{driver['_stderr']['detail']}"
    assert rec["ok"], rec["detail"]



def _fake_venv(tmp: Path) -> Path:
    """A venv that shares the real one's packages (its python and site-packages linked),
    so the install script can be run against it without touching the real one."""
    fake = tmp / "venv"
    (fake / "bin").mkdir(parents=True)
    (fake / "pyvenv.cfg").write_text((VENV / "pyvenv.cfg").read_text())
    for name in ("python", "python3"):
        (fake / "bin" / name).symlink_to(os.path.realpath(VPY))
    for lib in (VENV / "lib").iterdir():
        (fake / "lib").mkdir(exist_ok=True)
        (fake / "lib" / lib.name).symlink_to(lib)
    return fake


def test_install_stamp_tracks_wanted_versions(tmp_path: Path) -> None:
    """The 'ready' stamp holds the versions the script wants: bumping one in the script
    makes an already stamped venv not ready (check-only mode installs nothing)."""
    if not VPY.exists():
        pytest.skip(f"no vllm venv at {VENV}: run tools/install_vllm.sh (tools/test.sh does)")
    fake = _fake_venv(tmp_path)
    script = (ROOT / "tools" / "install_vllm.sh").read_text()
    env = dict(os.environ, FX100IO_VLLM_VENV=str(fake), FX100IO_VLLM_CHECK_ONLY="1")
    py = os.path.realpath(VPY)

    def run(text: str) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "install_vllm.sh"
        path.write_text(text)
        return subprocess.run(["bash", str(path), py], env=env, capture_output=True, text=True,
                              timeout=600)

    first = run(script)
    assert first.returncode == 0, first.stdout + first.stderr
    assert (fake / ".fx100io-ready").read_text().strip()
    again = run(script)
    assert again.returncode == 0 and "checked before" in again.stdout, again.stdout + again.stderr
    for var in ("VLLM_VERSION", "TORCH_VERSION"):
        bumped = re.sub(rf'^{var}="[^"]*"', f'{var}="0.0.1"', script, count=1, flags=re.M)
        assert bumped != script, var
        res = run(bumped)
        assert res.returncode != 0 and "ready" not in res.stdout, (var, res.stdout, res.stderr)
    # Another list of dependencies is another venv too.
    deps = script.replace("  numpy regex requests", "  numpy regex requests six", 1)
    assert deps != script
    res = run(deps)
    assert res.returncode != 0 and "ready" not in res.stdout, (res.stdout, res.stderr)

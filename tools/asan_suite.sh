#!/usr/bin/env bash
# Runs the core test suite against an ASan+UBSan build of the extension.
# The build happens in a scratch copy so the normal in-place build is untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
scratch=$(mktemp -d /tmp/fx100io-asan.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
git ls-files -z --cached --others --exclude-standard | \
  grep -zv '\.so$' | xargs -0 cp --parents -t "$scratch"
cd "$scratch"
FX100IO_SANITIZE=1 "$PY" setup.py -q build_clib build_ext --inplace >/dev/null
libasan=$(gcc -print-file-name=libasan.so)
libubsan=$(gcc -print-file-name=libubsan.so)
# Python itself is not instrumented and leaks by design at exit: leak
# checking is for the C unit tests (tests/c, SANITIZE=1), not here.
export LD_PRELOAD="$libasan:$libubsan"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export PYTHONPATH="$scratch"
# Left out here: tests that mostly wait (kills and restarts, timeouts, installs)
# and run no C the kept ones do not (the plain suite runs them).
"$PY" -m pytest -q -p no:cacheprovider --durations=25 "$@" \
  --deselect tests/store/test_crash.py::test_sigkill_twenty_times \
  --deselect tests/fabric/test_nvme_tcp_ours.py::test_stalled_target_times_out \
  --deselect tests/contrib/test_vllm_tier.py::test_install_stamp_tracks_wanted_versions \
  tests/device/test_device.py tests/device/test_device_errors.py tests/store/test_store.py tests/store/test_crash.py \
  tests/device/test_crc_on_landing.py tests/device/test_close_inflight.py tests/fabric/test_nvme_tcp_ours.py tests/fabric/test_nvme_tcp_hostile.py tests/fabric/test_nvme_tcp_rx.py \
  tests/target/test_target.py tests/target/test_target_hostile.py tests/target/test_target_inflight.py tests/target/test_target_ana.py tests/target/test_target_ana_events.py tests/target/test_target_control.py \
  tests/fabric/test_reconnect.py tests/fabric/test_fabric_uri_fuzz.py tests/store/test_index_log.py tests/store/test_store_loop.py tests/store/test_store_model.py \
  tests/kernel/test_kernel_unit.py tests/shared/test_shared_store.py tests/shared/test_shared_store_model.py tests/shared/test_shared_store_safety.py tests/shared/test_shared_store_index.py \
  tests/fabric/test_dhchap_host.py tests/target/test_target_auth.py tests/fabric/test_tls_io.py tests/fabric/test_tls_uri.py tests/bench/test_bench_loop.py tests/bench/test_bench_queue_loop.py tests/store/test_store_pieces.py tests/contrib/test_lmcache_mp.py tests/contrib/test_lmcache_mp_failures.py tests/store/test_store_crc.py tests/contrib/test_vllm_tier.py
